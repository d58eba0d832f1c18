"""``porter-mesh node``: run a bare node until SIGINT/SIGTERM (or a ``halt``)."""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys
from typing import Any

from porter_mesh.cli.common import add_mesh_options, node_config, peer_event_line, run
from porter_mesh.core.peers import PeerEvent
from porter_mesh.node.node import Node


def register(sub: Any) -> None:
    parser = sub.add_parser("node", help="run a bare mesh node until interrupted",
                            description="Run a node that joins the mesh, answers heartbeats "
                            "and prints roster changes; leaves gracefully on SIGINT/SIGTERM.")
    parser.add_argument("--name", required=True, help="agent name, unique on the mesh")
    parser.add_argument("--role", default="agent", help="role to advertise")
    parser.add_argument("--pub-port", type=int, default=0, help="PUB port (0: any)")
    parser.add_argument("--router-port", type=int, default=0, help="ROUTER port (0: any)")
    parser.add_argument("--data-dir", type=pathlib.Path, help="durable state directory")
    parser.add_argument("--heartbeat", type=float, default=1.0, help="seconds between beats")
    parser.add_argument("--evasive-after", type=float, default=3.0)
    parser.add_argument("--expire-after", type=float, default=10.0)
    parser.add_argument("--print-messages", action="store_true",
                        help="print every received activity as a JSON line on stdout")
    add_mesh_options(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    config = node_config(
        args, name=args.name, role=args.role, pub_port=args.pub_port,
        router_port=args.router_port, data_dir=args.data_dir,
        heartbeat_interval=args.heartbeat, evasive_after=args.evasive_after,
        expire_after=args.expire_after,
    )

    async def body() -> int:
        node = Node(config)

        def on_peer(event: PeerEvent) -> None:
            line = peer_event_line(event, verbose=args.verbose > 0)
            if line is not None:
                print(line, file=sys.stderr, flush=True)

        # Before starting: peers found while the node starts are news too.
        node.add_peer_listener(on_peer)
        async with node:
            print(f"node {node.name} up: pub {node.pub_port} router {node.router_port} "
                  f"incarnation {node.incarnation:x}", file=sys.stderr, flush=True)
            if args.print_messages:
                from porter_mesh.cli.cmd_tail import message_json

                node.add_handler(lambda m: print(message_json(m), flush=True))
            halted = asyncio.ensure_future(node.wait_halted())
            await halted
            print(f"node {node.name} halted", file=sys.stderr, flush=True)
        return 0

    return run(body)
