"""``porter-mesh peers``: show the mesh's roster.

The command watches the mesh as an observer (on no roster) for ``--wait`` seconds, with
zeroconf or from ``--peer`` seeds, then asks every agent it saw for its view (as
``porter-mesh stats`` does) to show what each has lost and dropped: ``LOST`` counts the
broadcasts that agent missed (sequence gaps), ``DROPPED`` the messages it refused.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson

from porter_mesh.cli.cmd_stats import observer_config
from porter_mesh.cli.common import add_mesh_options, refuse_negative, run
from porter_mesh.core.peers import PeerInfo, PeerState
from porter_mesh.node.node import Node
from porter_mesh.node.views import ViewClient

#: Seconds each agent may take to answer for its loss counts.
VIEW_TIMEOUT = 2.0


def register(sub: Any) -> None:
    parser = sub.add_parser("peers", help="list the agents on the mesh",
                            description="Watch the mesh for a while and print its roster.")
    parser.add_argument("--json", action="store_true", help="one JSON object per agent")
    parser.add_argument("--wait", type=float, default=2.0, metavar="SECONDS",
                        help="how long to listen before printing (default %(default)s)")
    add_mesh_options(parser)
    parser.set_defaults(func=main)


def peer_row(info: PeerInfo, now: float) -> dict[str, Any]:
    """A roster entry as plain values (``lost``/``dropped`` unknown until asked)."""
    a = info.advert
    return {
        "name": a.name, "role": a.role, "state": info.state.value,
        "address": f"{a.addresses[0] if a.addresses else '?'}:{a.router_port}",
        "pub_port": a.pub_port, "router_port": a.router_port,
        "last_heard": round(now - info.last_heard, 2),
        "incarnation": f"{a.incarnation:x}", "draining": info.draining,
        "lost": None, "dropped": None,
        # How far its clock is from ours, while beyond the node's max_clock_skew.
        "clock_skew": (round(info.clock_skew_ms / 1000, 1)
                       if info.state is PeerState.CLOCK_SKEW else None),
    }


def _count(value: Any) -> str:
    return "?" if value is None else str(value)


def main(args: argparse.Namespace) -> int:
    refused = refuse_negative(args, "wait")
    if refused is not None:
        return refused
    config = observer_config(args, "porter-peers")

    async def body() -> int:
        async with Node(config) as node:
            client = ViewClient(node)
            await asyncio.sleep(args.wait)  # listening period chosen by the user
            now = time.monotonic()
            rows = [peer_row(p, now) for p in node.peers()]
            views = await client.ask_all([r["name"] for r in rows], VIEW_TIMEOUT)
        for row in rows:
            view = views.get(row["name"])
            if isinstance(view, dict):
                row["lost"], row["dropped"] = view.get("lost"), view.get("dropped")
                storage = view.get("storage")
                if isinstance(storage, dict):
                    row["storage"] = storage.get("state")
        if args.json:
            for row in rows:
                print(orjson.dumps(row).decode())
            return 0
        if not rows:
            print(f"no agents seen on mesh {args.mesh!r} within {args.wait}s")
            return 0
        print(f"{'NAME':20} {'ROLE':12} {'STATE':10} {'DRAIN':5} {'ADDRESS':22} {'HEARD':>7} "
              f"{'LOST':>6} {'DROPPED':>7} INCARNATION")
        for r in rows:
            skew = f"  clock {r['clock_skew']:+.0f}s" if r["clock_skew"] is not None else ""
            print(f"{r['name']:20} {r['role']:12} {r['state']:10} "
                  f"{'yes' if r['draining'] else 'no':5} {r['address']:22} "
                  f"{r['last_heard']:>6.1f}s {_count(r['lost']):>6} {_count(r['dropped']):>7} "
                  f"{r['incarnation']}{skew}")
        for r in rows:
            if r.get("storage") == "full":
                print(f"{r['name']}: storage full, direct messages to it are refused until "
                      f"it has space again ('porter-mesh stats {r['name']}' says where)")
        return 0

    return run(body)
