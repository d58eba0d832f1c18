"""``porter-mesh control``: ask agents to drain (finish work, take nothing new) or halt."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import orjson

from porter_mesh.cli.common import add_mesh_options, agent_name, names, run, seat_config, seconds
from porter_mesh.cli.seat import not_found, wait_for_audience, wait_for_peers
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
            deadline = time.monotonic() + args.wait
            try:
                await wait_for_peers(node, [args.to] if args.to else 1, args.wait)
            except TimeoutError:
                print(f"porter-mesh control: {not_found(node, args.to, args.wait)}",
                      file=sys.stderr)
                return 1
            # The seats of other commands are not waited for (one that has just left
            # may still be listed); the agents are, or only the one named.
            missed = await wait_for_audience(node, deadline, only=args.to)
            if args.to and missed:
                print(f"porter-mesh control: {args.to} has not connected to this command "
                      f"within {args.wait:g}s; nothing sent (try a longer --wait)",
                      file=sys.stderr)
                return 1
            node.async_control(args.kind, target=args.to)
            reached = sorted(node.subscribers(C.CHANNEL_CONTROL))
            if args.json:
                print(orjson.dumps({"kind": args.kind, "to": args.to, "reached": reached,
                                    "missed": sorted(missed)}).decode())
            else:
                print(f"{args.kind} sent to {args.to or 'every agent'}", file=sys.stderr)
            if missed:
                print(f"porter-mesh control: not reached within {args.wait:g}s: "
                      f"{names(missed)} (run it again when they are up, or with a longer "
                      f"--wait)", file=sys.stderr)
                return 1
        return 0

    return run(body)
