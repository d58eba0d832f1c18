"""``porter-mesh control``: ask agents to drain (finish work, take nothing new) or halt."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from porter_mesh.cli.common import add_mesh_options, node_config, run
from porter_mesh.core import constants as C
from porter_mesh.node.node import K_DRAIN, K_HALT, Node


def register(sub: Any) -> None:
    parser = sub.add_parser("control", help="send drain or halt to agents")
    parser.add_argument("kind", choices=[K_DRAIN, K_HALT])
    parser.add_argument("--to", help="one agent (default: every agent on the mesh)")
    parser.add_argument("--wait", type=float, default=5.0, metavar="SECONDS")
    add_mesh_options(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    # As the human (porter-ui), like 'send': on a secured mesh that name is bound to the
    # operator's key, so the agents accept the request.
    config = node_config(args, name=C.HUMAN_AGENT, role="human", advertise=False,
                         channels=())

    async def body() -> int:
        async with Node(config) as node:
            try:
                if args.to:
                    await node.wait_for_peers([args.to], args.wait)
                else:
                    await node.wait_for_peers(1, args.wait)
                await node.wait_for_subscribers(C.CHANNEL_CONTROL, len(node.peers()), args.wait)
            except TimeoutError as exc:
                print(f"porter-mesh: {exc}", file=sys.stderr)
                return 1
            node.async_control(args.kind, target=args.to)
            print(f"{args.kind} sent to {args.to or 'every agent'}", file=sys.stderr)
        return 0

    return run(body)
