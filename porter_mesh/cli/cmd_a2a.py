"""``porter-mesh a2a``: mesh agents served to A2A clients, or an A2A agent joined to the mesh.

``porter-mesh a2a --agent W`` serves mesh agent W over A2A 1.0 (JSON-RPC and REST, SSE
streaming, its card at ``/.well-known/agent-card.json``); with several ``--agent`` each
is served under ``/agents/<name>`` and the root card lists them. ``porter-mesh a2a
--join URL --name N`` puts the A2A agent at URL on the mesh as worker N. See
``docs/a2a.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import secrets
import sys
from typing import Any

from porter_mesh.cli.common import (
    add_mesh_options,
    agent_name,
    default_data_root,
    node_config,
    run,
    seconds,
)
from porter_mesh.core import constants as C
from porter_mesh.core.advert import seat_name

#: The gateway's node name: a seat of the human user, so workers ask it for review.
DEFAULT_NAME = seat_name("a2a")


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "a2a", help="serve mesh agents to A2A clients, or join an A2A agent to the mesh",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", action="append", dest="agents", default=[],
                        type=agent_name, metavar="NAME",
                        help="a mesh agent to serve over A2A (repeatable)")
    parser.add_argument("--listen", default="127.0.0.1:0", metavar="HOST:PORT",
                        help="where the A2A server listens (default %(default)s: loopback, "
                        "a free port)")
    parser.add_argument("--token", metavar="TOKEN",
                        help="bearer token every A2A call must carry (default: none on "
                        "loopback, a random one printed otherwise)")
    parser.add_argument("--join", metavar="URL",
                        help="instead of serving: put the A2A agent at URL on the mesh as "
                        "worker --name")
    parser.add_argument("--name", type=agent_name,
                        help="the node's name (default: porter-ui-a2a when serving; "
                        "required with --join)")
    parser.add_argument("--slots", type=int, default=4,
                        help="tasks a joined agent holds at once (default %(default)s)")
    parser.add_argument("--reviewer", type=agent_name, default="reviewer",
                        help="with --join: the agent asked to review the joined agent's "
                        "results (default %(default)s; tasks the human offered are "
                        "reviewed by the human)")
    parser.add_argument("--data-dir", type=pathlib.Path, metavar="DIR",
                        help="where tasks and their numbered events are kept across "
                        "restarts (default: $PORTER_MESH_DATA/<mesh>/<name>)")
    parser.add_argument("--settle", type=seconds, default=10.0, metavar="SECONDS",
                        help="how long a first message waits for its agent to appear on "
                        "the mesh (default %(default)s)")
    add_mesh_options(parser)
    parser.set_defaults(func=main)


def _usage(message: str) -> int:
    print(f"porter-mesh a2a: {message}", file=sys.stderr)
    return 2


def _listen(text: str) -> tuple[str, int] | None:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        return None
    return host.strip("[]"), int(port)


def main(args: argparse.Namespace) -> int:
    try:
        import a2a  # noqa: F401
        import starlette  # noqa: F401
    except ImportError as exc:
        return _usage(f"the A2A SDK is missing ({exc}); install it with: pip install "
                      "'porter-mesh[a2a]'")
    if args.join is not None:
        return _join(args)
    if not args.agents:
        return _usage("name the mesh agent(s) to serve with --agent NAME, or join an A2A "
                      "agent with --join URL --name N")
    listen = _listen(args.listen)
    if listen is None:
        return _usage(f"--listen {args.listen!r} is not HOST:PORT (e.g. 127.0.0.1:8080)")
    host, port = listen
    token = args.token
    if token is None and host not in ("127.0.0.1", "::1", "localhost"):
        token = secrets.token_urlsafe(24)
    name = args.name or DEFAULT_NAME
    data_dir = args.data_dir or default_data_root() / args.mesh / name
    from porter_mesh.gateways.a2a.server import A2AGateway
    from porter_mesh.node.node import Node
    from porter_mesh.tracing.seat import SeatSpans

    config = node_config(args, name=name, role="gateway", inbox_size=0,
                         channels=(C.CHANNEL_LOG, C.CHANNEL_TASK, C.CHANNEL_REVIEW),
                         data_dir=data_dir / "node")
    config.check_protected()

    async def body() -> int:
        try:
            gateway = A2AGateway(Node(config), args.agents, data_dir=data_dir, host=host,
                                 port=port, token=token, settle=args.settle,
                                 spans=SeatSpans.start(name))
        except OSError as exc:
            print(f"porter-mesh a2a: cannot listen on {args.listen}: {exc.strerror or exc}"
                  "; pick another --listen port", file=sys.stderr)
            return 2
        try:
            await gateway.astart()
            for agent in gateway.agents:
                print(f"porter-mesh a2a: serving {agent} at {gateway.url(agent)}/ "
                      f"(card {gateway.url(agent)}/.well-known/agent-card.json)", flush=True)
            if token is not None and args.token is None:
                print(f"porter-mesh a2a: bearer token {token}", flush=True)
            print(f"porter-mesh a2a: listening on {host}:{gateway.port} as {name} on mesh "
                  f"{args.mesh!r}, data in {data_dir}", file=sys.stderr, flush=True)
            await gateway.wait_closed()
        except asyncio.CancelledError:
            pass
        finally:
            await gateway.aclose()
        return 0

    return run(body)


def _join(args: argparse.Namespace) -> int:
    if args.name is None:
        return _usage("--join needs --name N, the worker's name on the mesh")
    if args.slots < 1:
        return _usage("--slots must be at least 1")
    from porter_mesh.gateways.a2a.join import run_joined

    status: int = run_joined(args)
    return status
