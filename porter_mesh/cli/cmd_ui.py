"""``porter-mesh ui``: run the human's dashboard (the ``porter-ui`` node and its page)."""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import re
import sys
from typing import Any

from porter_mesh.adapters.dirlock import lock_holder
from porter_mesh.adapters.shard import SHARD_LOCK, Shard
from porter_mesh.cli.common import add_mesh_options, node_config, run
from porter_mesh.core import constants as C
from porter_mesh.errors import ConfigError, KnowledgeError, SecurityError
from porter_mesh.gateways.ui.server import Dashboard, new_token
from porter_mesh.gateways.ui.state import DEFAULT_HISTORY, MessageLog
from porter_mesh.node.config import default_data_dir, knowledge_dir
from porter_mesh.node.knowledge import Knowledge
from porter_mesh.node.node import Node
from porter_mesh.tracing.seat import SeatSpans, seat_spans

DEFAULT_PORT = 8765
_TOKEN_RE = re.compile(r"[A-Za-z0-9._~-]{8,200}")


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "ui", help="serve the human's dashboard (porter-ui) in the browser",
        description="Join the mesh as porter-ui (role human), watch every channel and "
        "direct message, and serve the dashboard page and its API. Prints the address to "
        "open (with its token) on stdout.")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help="HTTP port (0: any free port; default %(default)s)")
    parser.add_argument("--token", help="the secret the page and API calls carry "
                        "(default: a new random one per start)")
    parser.add_argument("--data-dir", type=pathlib.Path,
                        help="message log, knowledge replica and delivery journal (default: "
                        "$PORTER_MESH_DATA/<mesh>/porter-ui)")
    parser.add_argument("--history", type=int, default=DEFAULT_HISTORY,
                        help="messages kept in memory and served (default %(default)s)")
    add_mesh_options(parser)
    parser.set_defaults(func=main)


def _usage(message: str) -> int:
    print(f"porter-mesh ui: {message}", file=sys.stderr)
    return 2


def main(args: argparse.Namespace) -> int:
    token = args.token or new_token()
    if not _TOKEN_RE.fullmatch(token):
        return _usage("--token must be 8-200 characters of letters, digits and . _ ~ - "
                      "(it travels in a URL)")
    if not 0 <= args.port <= 65535:
        return _usage(f"--port {args.port} is not a TCP port (0-65535; 0 picks a free one)")
    if args.history < 1:
        return _usage("--history must be at least 1")
    data_dir: pathlib.Path = args.data_dir or default_data_dir(args.mesh, C.HUMAN_AGENT)
    try:
        config = node_config(args, name=C.HUMAN_AGENT, role="human", inbox_size=0,
                             data_dir=data_dir)
        config.check_protected()
    except (ConfigError, SecurityError) as exc:
        return _usage(str(exc))

    async def body() -> int:
        try:
            log = MessageLog(data_dir / "ui", history=args.history)
        except OSError as exc:
            return _usage(f"cannot open the message log in {data_dir / 'ui'}: {exc}")
        try:
            shard = Shard(knowledge_dir(data_dir), agent=C.HUMAN_AGENT)
        except KnowledgeError as exc:
            log.close()
            holder = lock_holder(knowledge_dir(data_dir), filename=SHARD_LOCK)
            if holder is None:
                return _usage(str(exc))
            # Another --data-dir would not help: the dashboard's node is named porter-ui,
            # and a name is one node's per mesh.
            return _usage(f"another porter-mesh ui (pid {holder}) already serves mesh "
                          f"{args.mesh!r} from {data_dir}: open the address it printed, "
                          f"stop it (kill {holder}), or run this one on another --mesh")
        with seat_spans(C.HUMAN_AGENT) as spans:
            return await serve(log, shard, spans)

    async def serve(log: MessageLog, shard: Shard, spans: SeatSpans | None) -> int:
        node = Node(config)
        knowledge = Knowledge(node, shard)
        dashboard = Dashboard(node, log, token=token, knowledge=knowledge,
                              hosts=config.interfaces, port=args.port, spans=spans)
        knowledge.start()
        try:
            async with node:
                node.observe_direct()
                try:
                    await dashboard.astart()
                except OSError as exc:
                    return _usage(f"cannot serve HTTP on port {args.port}: {exc.strerror or exc}"
                                  " (use another --port, or --port 0 for any free one)")
                print(f"porter-ui: open {dashboard.url}", flush=True)
                await asyncio.Event().wait()  # until SIGINT/SIGTERM cancels us
        finally:
            await dashboard.aclose()
            await knowledge.aclose()
        return 0

    return run(body)
