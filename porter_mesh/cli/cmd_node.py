"""``porter-mesh node``: run a bare node until SIGINT/SIGTERM (or a ``halt``).

The node keeps a knowledge shard by default (``--no-knowledge`` to run without one), in
its data directory: ``--data-dir``, else ``<data root>/<mesh>/<name>`` (the root is
``$PORTER_MESH_DATA``, else the platform's user data directory plus ``porter-mesh``). The
directory is locked while the node runs: a second node on it is refused, naming the pid.

The shard's modules (and the Oxigraph engine under them, about 11 MB of a process's
memory) are imported only when the node keeps one.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, Any

from porter_mesh.cli.common import (
    add_mesh_options,
    node_config,
    peer_event_line,
    run,
)
from porter_mesh.core.peers import PeerEvent
from porter_mesh.entrypoint import add_data_options, data_dir_of
from porter_mesh.node.config import knowledge_dir
from porter_mesh.node.node import Node

if TYPE_CHECKING:
    from porter_mesh.node.knowledge import Knowledge


def register(sub: Any) -> None:
    parser = sub.add_parser("node", help="run a bare mesh node until interrupted",
                            description="Run a node that joins the mesh, answers heartbeats, "
                            "keeps a knowledge shard and prints roster changes; leaves "
                            "gracefully on SIGINT/SIGTERM.")
    parser.add_argument("--name", required=True, help="agent name, unique on the mesh")
    parser.add_argument("--role", default="agent", help="role to advertise")
    parser.add_argument("--pub-port", type=int, default=0, help="PUB port (0: any)")
    parser.add_argument("--router-port", type=int, default=0, help="ROUTER port (0: any)")
    add_data_options(parser)
    parser.add_argument("--heartbeat", type=float, default=1.0, help="seconds between beats")
    parser.add_argument("--evasive-after", type=float, default=3.0)
    parser.add_argument("--expire-after", type=float, default=10.0)
    parser.add_argument("--print-messages", action="store_true",
                        help="print every received activity as a JSON line on stdout")
    add_mesh_options(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    data_dir = data_dir_of(args)
    config = node_config(
        args, name=args.name, role=args.role, pub_port=args.pub_port,
        router_port=args.router_port, data_dir=data_dir,
        heartbeat_interval=args.heartbeat, evasive_after=args.evasive_after,
        expire_after=args.expire_after,
        # Nothing reads an inbox here: messages go to the handlers (--print-messages) only.
        inbox_size=0,
    )
    verbose = getattr(args, "verbose", 0)

    async def body() -> int:
        node = Node(config)
        knowledge: Knowledge | None = None

        def on_peer(event: PeerEvent) -> None:
            line = peer_event_line(event, verbose=verbose > 0)
            if line is not None:
                print(line, file=sys.stderr, flush=True)

        # Before starting: peers found while the node starts are news too.
        node.add_peer_listener(on_peer)
        if not args.no_knowledge:
            # Imported before the node joins: on a machine busy starting many processes,
            # a second of imports once it is on the mesh is a second its heartbeats wait,
            # and its peers would see it go silent.
            from porter_mesh.adapters.shard import Shard
            from porter_mesh.node.knowledge import Knowledge

            Knowledge.expect(node)  # the shard opens once the node is on the mesh
        try:
            await node.astart()  # takes the data directory's lock first
            if not args.no_knowledge:
                # Opened off the loop: the node is on the mesh now, and a shard's files are
                # created with fsyncs, or its index rebuilt from the journal at restart,
                # while the loop must go on beating.
                shard = await asyncio.to_thread(Shard, knowledge_dir(data_dir), agent=node.name)
                knowledge = Knowledge(node, shard)
                knowledge.start()
            kept = "no knowledge shard" if knowledge is None else f"data {data_dir}"
            print(f"node {node.name} up: pub {node.pub_port} router {node.router_port} "
                  f"incarnation {node.incarnation:x}; {kept}", file=sys.stderr, flush=True)
            # Without an inbox the handler is what takes direct messages (a node with
            # no consumer acknowledges none), so a bare node has one even when quiet.
            if args.print_messages:
                from porter_mesh.node.transcript import message_json

                node.add_handler(lambda m: print(message_json(m), flush=True))
            else:
                node.add_handler(lambda m: None)
            halted = asyncio.ensure_future(node.wait_halted())
            await halted
            print(f"node {node.name} halted", file=sys.stderr, flush=True)
        finally:
            if knowledge is not None:
                await knowledge.aclose()
            await node.aclose()
        return 0

    return run(body)
