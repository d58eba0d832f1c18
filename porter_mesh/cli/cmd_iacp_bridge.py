"""``porter-mesh iacp-bridge --listen HOST:PORT``: serve IACP 1.1 foragers as mesh workers.

The bridge plays the queen for every forager that connects (line-delimited JSON over
TCP, the article's port 7421 on loopback by default) and puts each one on the mesh as a
worker named after it (see ``docs/iacp.md``). It prints the address it listens on, one
line (with ``--events``, every event as a JSON line instead, the first being
``listening``), and runs until SIGINT/SIGTERM or a ``halt`` for the bridge.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from typing import Any

from porter_mesh.cli.common import add_mesh_options, agent_name, node_config, run
from porter_mesh.errors import ConfigError, SecurityError
from porter_mesh.gateways.iacp.bridge import IacpBridge, event_line
from porter_mesh.gateways.iacp.protocol import (
    ASSIGN_TIMEOUT,
    BAD_LINE_LIMIT,
    DEFAULT_PORT,
    HEARTBEAT,
    MAX_LINE_BYTES,
    BridgeSettings,
)
from porter_mesh.node.config import data_root


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = text, str(DEFAULT_PORT)
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:{DEFAULT_PORT}; port 0 picks a free "
            "one)")
    return host, int(port)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "iacp-bridge", help="let IACP 1.1 foragers join the mesh as workers",
        description="Accept IACP 1.1 connections (one JSON object per line) and put each "
        "forager on the mesh as a worker named after it; see docs/iacp.md.")
    parser.add_argument("--listen", type=_listen, default=("127.0.0.1", DEFAULT_PORT),
                        metavar="HOST:PORT",
                        help=f"where foragers connect (default 127.0.0.1:{DEFAULT_PORT}; "
                        "port 0 picks a free one)")
    parser.add_argument("--name", type=agent_name, default="iacp-bridge",
                        help="the bridge's own agent name (default %(default)s)")
    parser.add_argument("--assign-timeout", type=float, default=ASSIGN_TIMEOUT,
                        metavar="SECONDS", help="an assign unanswered this long is fenced "
                        "and re-issued to another worker (default %(default)s)")
    parser.add_argument("--heartbeat", type=float, default=HEARTBEAT, metavar="SECONDS",
                        help="hb interval, both ways (default %(default)s)")
    parser.add_argument("--evasive-after", type=float, metavar="SECONDS",
                        help="forager silence before it gets no new work "
                        "(default 2.5 heartbeats)")
    parser.add_argument("--expire-after", type=float, metavar="SECONDS",
                        help="forager silence before it leaves the mesh (default 6 "
                        "heartbeats)")
    parser.add_argument("--reviewer", type=agent_name, default="reviewer",
                        help="who reviews the foragers' results (default %(default)s; tasks "
                        "from porter-ui are reviewed by porter-ui)")
    parser.add_argument("--max-line-bytes", type=int, default=MAX_LINE_BYTES,
                        help="longest line accepted (default %(default)s)")
    parser.add_argument("--bad-line-limit", type=int, default=BAD_LINE_LIMIT,
                        help="bad lines per 10 s before a connection is closed "
                        "(default %(default)s)")
    parser.add_argument("--no-knowledge", action="store_true",
                        help="keep no knowledge replica for the foragers (mem.sync is then "
                        "only published on log)")
    parser.add_argument("--events", action="store_true",
                        help="print every event as a JSON line on stdout")
    add_mesh_options(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    host, port = args.listen
    beat = args.heartbeat
    try:
        settings = BridgeSettings(
            assign_timeout=args.assign_timeout, heartbeat=beat,
            evasive_after=args.evasive_after if args.evasive_after is not None else 2.5 * beat,
            expire_after=args.expire_after if args.expire_after is not None else 6 * beat,
            reviewer=args.reviewer, max_line_bytes=args.max_line_bytes,
            bad_line_limit=max(1, args.bad_line_limit))
        config = node_config(args, name=args.name)
        config.check_protected()
        if not (_loopback(host) or args.insecure):
            raise SecurityError(
                f"refusing to serve IACP on {host} (protected mode): IACP has no "
                "authentication, so anyone who can reach that address could join the mesh "
                "as a worker; listen on loopback, or accept the risk with --insecure")
    except (ConfigError, SecurityError) as exc:
        print(f"porter-mesh iacp-bridge: {exc}", file=sys.stderr)
        return 2

    def on_event(kind: str, fields: dict[str, Any]) -> None:
        sys.stdout.buffer.write(event_line(kind, fields))
        sys.stdout.flush()

    async def body() -> int:
        bridge = IacpBridge(config, host=host, port=port, settings=settings,
                            data_root=data_root(), knowledge=not args.no_knowledge,
                            on_event=on_event if args.events else None)
        try:
            bound_host, bound_port = await bridge.astart()
            if not args.events:
                print(f"{bound_host}:{bound_port}", flush=True)
            print(f"porter-mesh iacp-bridge: serving IACP 1.1 on {bound_host}:{bound_port} "
                  f"as {config.name} on mesh {config.mesh!r}", file=sys.stderr, flush=True)
            await bridge.wait_halted()
            return 0
        finally:
            await bridge.aclose()

    return run(body)
