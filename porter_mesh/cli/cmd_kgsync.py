"""``porter-mesh kgsync``: bring the human user's knowledge replica up to date from the mesh.

The command-line user (``porter-ui``) keeps its own replica of the knowledge graph, in
``$PORTER_MESH_DATA/<mesh>/porter-ui`` (else ``~/.local/share/porter-mesh/<mesh>/porter-ui``)
unless ``--data-dir`` says otherwise. ``kgsync`` joins the mesh, catches up from a peer
(progress on stderr) and prints the replica's summary. The online ``remember`` and
``recall`` commands use the same steps, from :func:`online_replica` and :func:`catch_up`.
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from porter_mesh.adapters.shard import Shard
from porter_mesh.cli.common import add_mesh_options, node_config, run
from porter_mesh.core import constants as C
from porter_mesh.errors import KnowledgeError
from porter_mesh.node.config import default_data_dir
from porter_mesh.node.knowledge import Knowledge
from porter_mesh.node.node import Node

#: Seconds to look for a peer, and to catch up from one, unless told otherwise.
DEFAULT_WAIT = 5.0
DEFAULT_CATCHUP_TIMEOUT = 60.0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "kgsync", help="catch the local porter-ui knowledge replica up from the mesh",
        description="Join the mesh as porter-ui, catch its knowledge replica up from a peer "
        "(progress on stderr), and print the replica's summary.",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object")
    add_mesh_options(parser)
    add_online_options(parser)
    parser.set_defaults(func=main)


def add_online_options(parser: argparse.ArgumentParser, *, data_dir: bool = True) -> None:
    """``--wait`` (finding a peer), ``--catchup-timeout`` and, unless the parser has one,
    ``--data-dir`` (the porter-ui replica)."""
    parser.add_argument("--wait", type=float, default=DEFAULT_WAIT, metavar="SECONDS",
                        help="how long to look for a peer (default %(default)s)")
    parser.add_argument("--catchup-timeout", type=float, default=DEFAULT_CATCHUP_TIMEOUT,
                        metavar="SECONDS", help="how long catching up from a peer may take "
                        "(default %(default)s)")
    if data_dir:
        parser.add_argument("--data-dir", metavar="DIR", type=pathlib.Path,
                            help="porter-ui's replica (default: $PORTER_MESH_DATA/<mesh>/"
                            "porter-ui)")


def replica_dir(args: argparse.Namespace) -> pathlib.Path:
    """The porter-ui replica's directory the options name."""
    if getattr(args, "data_dir", None) is not None:
        return pathlib.Path(args.data_dir)
    return default_data_dir(args.mesh, C.HUMAN_AGENT)


@contextlib.asynccontextmanager
async def online_replica(args: argparse.Namespace) -> AsyncIterator[Knowledge]:
    """Join the mesh as ``porter-ui`` with its replica; leave and close it afterwards.

    Args:
        args: parsed options (mesh, network, ``--data-dir``).

    Yields:
        The replica, replicating, its node started.

    Raises:
        KnowledgeError: the replica cannot be opened (in use by another command...).
        ConfigError: bad network options.
    """
    config = node_config(args, name=C.HUMAN_AGENT, role="human", advertise=False,
                         channels=(), inbox_size=0)
    node = Node(config)
    knowledge = Knowledge(node, Shard(replica_dir(args), agent=C.HUMAN_AGENT))
    try:
        knowledge.start()  # before the node starts: no peer is missed
        await node.astart()
        yield knowledge
    finally:
        await knowledge.aclose()
        await node.aclose()


async def find_peer(knowledge: Knowledge, wait: float) -> list[str]:
    """Wait for at least one peer on the mesh; their names.

    Raises:
        KnowledgeError: nobody within ``wait`` seconds.
    """
    node = knowledge.node
    try:
        await node.wait_for_peers(1, wait)
    except TimeoutError:
        raise KnowledgeError(
            f"no peer found on mesh {node.config.mesh!r} within {wait}s; start a node (or "
            "check --mesh, --interface, --peer), or give --data-dir to read a stopped "
            "node's shard"
        ) from None
    return sorted(p.name for p in node.peers())


async def catch_up(knowledge: Knowledge, timeout: float, *, quiet: bool = False) -> None:
    """Wait until a catch-up from one peer has finished, reporting progress on stderr.

    Raises:
        KnowledgeError: it did not finish within ``timeout`` seconds.
    """
    started = time.monotonic()
    last = [0.0]

    def show(event: str, detail: Any) -> None:
        now = time.monotonic()
        if event == "progress" and detail[1] and now - last[0] >= 0.5:
            last[0] = now
            print(f"catching up: {detail[0]}/{detail[1]} records", file=sys.stderr, flush=True)

    remove = knowledge.add_listener(show)
    try:
        await knowledge.wait_caught_up(1, timeout)
    except TimeoutError as exc:
        raise KnowledgeError(f"{exc}; retry, or raise --catchup-timeout") from None
    finally:
        remove()
    if not quiet:
        done = knowledge.progress[0] if knowledge.progress else 0
        print(f"caught up from {', '.join(sorted(knowledge.caught_up_from()))}: {done} new "
              f"record(s) in {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)


def main(args: argparse.Namespace) -> int:
    async def body() -> int:
        async with online_replica(args) as knowledge:
            await find_peer(knowledge, args.wait)
            await catch_up(knowledge, args.catchup_timeout)
            stats = knowledge.stats()
        if args.json:
            print(orjson.dumps({k: stats[k] for k in (
                "observations", "observation_records", "retractions", "version_vector",
                "digest")}).decode())
        else:
            print(f"observations   {stats['observations']} in the graph "
                  f"({stats['observation_records']} recorded, {stats['retractions']} "
                  "retractions)")
            print(f"digest         {stats['digest']}")
        return 0

    return run(body)
