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
from porter_mesh.node.config import NodeConfig, data_root, default_data_dir

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


def seat_config(args: argparse.Namespace, **settings: Any) -> NodeConfig:
    """The :class:`NodeConfig` of the command line's short-lived ``porter-ui`` seat.

    It is not announced in mDNS and advertises the role :data:`~porter_mesh.core.
    constants.SEAT_ROLE`, so that nodes neither catch up from it nor log its joins and
    leaves at the default level.
    """
    settings.setdefault("channels", ())
    return node_config(args, name=C.HUMAN_AGENT, role=C.SEAT_ROLE, advertise=False,
                       **settings)


def add_data_options(parser: argparse.ArgumentParser) -> None:
    """``--data-dir`` and ``--no-knowledge``, as ``node`` and ``agent`` take them."""
    parser.add_argument("--data-dir", type=pathlib.Path, metavar="DIR",
                        help="the node's data directory: knowledge shard, delivery journal "
                        "(default: $PORTER_MESH_DATA/<mesh>/<name>, else the user data "
                        "directory, e.g. ~/.local/share/porter-mesh/<mesh>/<name>)")
    parser.add_argument("--no-knowledge", action="store_true",
                        help="keep no knowledge shard (remember/recall then need another "
                        "node that keeps one)")


def data_dir_of(args: argparse.Namespace) -> pathlib.Path:
    """The data directory the options name (``--data-dir`` or the default)."""
    if args.data_dir is not None:
        return pathlib.Path(args.data_dir)
    return default_data_dir(args.mesh, args.name)


def refuse_negative(args: argparse.Namespace, *options: str) -> int | None:
    """Exit status 2, after a one-line complaint, when one of ``options`` (attribute
    names, e.g. ``"wait"``) is a negative number of seconds; else ``None``."""
    for option in options:
        value = getattr(args, option, None)
        if value is not None and value < 0:
            print(f"porter-mesh: --{option.replace('_', '-')} must be 0 or more seconds, "
                  f"not {value}", file=sys.stderr)
            return 2
    return None


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
    return data_root()
