"""``porter-mesh control``: ask agents to drain (finish work, take nothing new) or halt."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from porter_mesh.cli.common import add_mesh_options, agent_name, run, seat_config, seconds
from porter_mesh.cli.seat import wait_for_peers
from porter_mesh.core import constants as C
from porter_mesh.core.control import KIND_DRAIN, KIND_HALT
from porter_mesh.node.node import Node


def register(sub: Any) -> None:
    parser = sub.add_parser("control", help="send drain or halt to agents")
    parser.add_argument("kind", choices=[KIND_DRAIN, KIND_HALT])
    parser.add_argument("--to", type=agent_name,
                        help="one agent (default: every agent on the mesh)")
    parser.add_argument("--wait", type=seconds, default=5.0, metavar="SECONDS",
                        help="how long to look for the agents (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="report as one JSON object")
    add_mesh_options(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    # As the human (a seat porter-ui-<hex>), like 'send': on a secured mesh the seat
    # speaks with the key bound to porter-ui, so the agents accept the request.
    config = seat_config(args)

    async def body() -> int:
        async with Node(config) as node:
            try:
                await wait_for_peers(node, [args.to] if args.to else 1, args.wait)
                await node.wait_for_subscribers(C.CHANNEL_CONTROL, len(node.peers()), args.wait)
            except TimeoutError as exc:
                print(f"porter-mesh control: {exc}", file=sys.stderr)
                return 1
            node.async_control(args.kind, target=args.to)
            reached = sorted(node.subscribers(C.CHANNEL_CONTROL))
            if args.json:
                print(orjson.dumps({"kind": args.kind, "to": args.to,
                                    "reached": reached}).decode())
            else:
                print(f"{args.kind} sent to {args.to or 'every agent'}", file=sys.stderr)
        return 0

    return run(body)
