"""Options and helpers shared by the sub-commands that join a mesh."""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from porter_mesh.core import constants as C
from porter_mesh.errors import PorterError
from porter_mesh.node.config import NodeConfig

T = TypeVar("T")


def add_mesh_options(parser: argparse.ArgumentParser) -> None:
    """``--mesh``, ``--interface`` (repeatable) and ``--peer`` (repeatable)."""
    parser.add_argument("--mesh", default=os.environ.get("PORTER_MESH", C.DEFAULT_MESH),
                        help="mesh name (default: $PORTER_MESH or %(default)s)")
    parser.add_argument("--interface", action="append", dest="interfaces", metavar="IP",
                        help="address to bind and announce on (repeatable; default 127.0.0.1)")
    parser.add_argument("--peer", action="append", dest="peers", metavar="HOST:PORT",
                        default=[], help="static seed peer (its ROUTER port), for networks "
                        "without multicast (repeatable)")
    parser.add_argument("--no-discovery", action="store_true",
                        help="do not use zeroconf; rely on --peer seeds")
    parser.add_argument("--insecure", action="store_true",
                        help="allow binding beyond loopback without keys (protected mode "
                        "refuses it otherwise; see docs/security.md)")


def node_config(args: argparse.Namespace, **settings: Any) -> NodeConfig:
    """A :class:`NodeConfig` from the common options plus ``settings``."""
    if getattr(args, "insecure", False):
        settings["insecure"] = True
    return NodeConfig(
        mesh=args.mesh,
        interfaces=tuple(args.interfaces or ("127.0.0.1",)),
        seeds=tuple(args.peers),
        discovery=not args.no_discovery,
        **settings,
    )


def ephemeral_name(prefix: str) -> str:
    """A name for a short-lived observer process."""
    return f"{prefix}-{os.getpid()}"


def run(main: Callable[[], Awaitable[int]]) -> int:
    """Run ``main`` until it returns or SIGINT/SIGTERM arrives; report errors plainly."""

    async def runner() -> int:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(main())
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        try:
            return await task
        except asyncio.CancelledError:
            return 0

    try:
        return asyncio.run(runner())
    except PorterError as exc:
        print(f"porter-mesh: {exc}", file=sys.stderr)
        return 1


def default_data_root() -> pathlib.Path:
    """Where nodes keep their data unless told otherwise."""
    base = os.environ.get("PORTER_MESH_DATA")
    return pathlib.Path(base) if base else pathlib.Path.home() / ".local/share/porter-mesh"
