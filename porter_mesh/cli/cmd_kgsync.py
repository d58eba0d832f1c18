"""``porter-mesh kgsync``: catch a porter-ui knowledge replica up from the mesh.

The command line joins the mesh as the human user (a seat ``porter-ui-<hex>``), short-lived
(:func:`~porter_mesh.cli.common.seat_config`). Its replica is a throw-away copy in a
temporary directory, caught up from one peer, unless ``--data-dir`` names porter-ui's
data directory (the replica is then kept in its ``knowledge/``). Nodes never catch up from
a seat. ``kgsync`` joins, catches up (progress on stderr) and prints the replica's
summary. The online ``remember`` and ``recall`` commands use the same steps, from
:func:`online_replica`, :func:`find_replica` and :func:`catch_up`.

When no peer keeps a replica (every peer answered that it runs none, or none answered
within ``--wait``), these commands fail at once with the reason and what to start.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import pathlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from porter_mesh.adapters.dirlock import DirLock
from porter_mesh.adapters.shard import Shard
from porter_mesh.cli.common import add_mesh_options, refuse_negative, run, seat_config
from porter_mesh.cli.seat import raise_refusal
from porter_mesh.core import constants as C
from porter_mesh.errors import KnowledgeError
from porter_mesh.node.config import default_data_dir, knowledge_dir
from porter_mesh.node.knowledge import Knowledge
from porter_mesh.node.node import Node

#: Seconds to look for a peer that keeps a replica, and to catch up from one, unless
#: told otherwise.
DEFAULT_WAIT = 5.0
DEFAULT_CATCHUP_TIMEOUT = 60.0
#: What to tell a user whose mesh has no replica to read or write.
START_HINT = ("start a node that keeps one: 'porter-mesh node --name NAME' or 'porter-mesh "
              "agent worker --name NAME' (both keep a knowledge shard unless "
              "--no-knowledge)")


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
                        help="how long to look for a peer that keeps a knowledge replica "
                        "(default %(default)s)")
    parser.add_argument("--catchup-timeout", type=float, default=DEFAULT_CATCHUP_TIMEOUT,
                        metavar="SECONDS", help="how long catching up from a peer may take "
                        "(default %(default)s)")
    if data_dir:
        parser.add_argument("--data-dir", metavar="DIR", type=pathlib.Path,
                            help="porter-ui's data directory, to keep its replica (default: "
                            "a throw-away replica)")


#: The options of seconds these commands refuse when negative.
SECONDS_OPTIONS = ("wait", "catchup_timeout", "timeout")


@contextlib.asynccontextmanager
async def online_replica(args: argparse.Namespace, *,
                         writes: bool = False) -> AsyncIterator[Knowledge]:
    """Join the mesh as ``porter-ui`` with a replica; leave and close it afterwards.

    The replica is kept in ``--data-dir``'s ``knowledge/`` when given (the seat's node
    locks that directory), else it is a throw-away copy in a temporary directory. A
    command that ``writes`` as porter-ui holds porter-ui's default data directory
    meanwhile, so that two such commands on one machine never pick the same sequence
    number.

    Args:
        args: parsed options (mesh, network, ``--data-dir``).
        writes: the command writes records as porter-ui.

    Yields:
        The replica, replicating, its node started.

    Raises:
        ConfigError: the data directory is in use (the message names the pid), or bad
            network options.
        KnowledgeError: the replica cannot be opened.
    """
    data_dir = getattr(args, "data_dir", None)
    with contextlib.ExitStack() as stack:
        if data_dir is not None:
            replica = knowledge_dir(pathlib.Path(data_dir))
        else:
            if writes:
                stack.enter_context(DirLock(default_data_dir(args.mesh, C.HUMAN_AGENT),
                                            filename="node.lock",
                                            what="porter-ui's data directory"))
            replica = pathlib.Path(stack.enter_context(
                tempfile.TemporaryDirectory(prefix="porter-ui-"))) / "knowledge"
        node = Node(seat_config(args, inbox_size=0, data_dir=data_dir))
        knowledge = Knowledge(node, Shard(replica, agent=C.HUMAN_AGENT))
        try:
            knowledge.start()  # before the node starts: no peer is missed
            await node.astart()
            yield knowledge
        finally:
            # The node first: a peer's sync that arrives while the replica closes would
            # be refused (and logged) for nothing.
            await node.aclose()
            await knowledge.aclose()


async def find_replica(knowledge: Knowledge, wait: float) -> list[str]:
    """Wait until a peer that keeps a replica answers; the names of the peers found.

    Raises:
        KnowledgeError: nobody found within ``wait`` seconds; every peer answered that
            it keeps no replica; or none answered.
    """
    node = knowledge.node
    mesh = node.config.mesh
    deadline = time.monotonic() + wait
    while True:
        raise_refusal(node)
        peers = {p.name for p in node.peers() if p.advert.role != C.ROLE_SEAT}
        without = knowledge.without_replica()
        if knowledge.caught_up_from() or knowledge.answered_by() - without:
            return sorted(peers)
        if peers and peers <= without:
            they = "it runs" if len(peers) == 1 else "they run"
            raise KnowledgeError(
                f"no peer on mesh {mesh!r} keeps a knowledge replica ({', '.join(sorted(peers))}"
                f" answered that {they} none); {START_HINT}")
        if time.monotonic() >= deadline:
            if not peers:
                raise KnowledgeError(
                    f"no peer found on mesh {mesh!r} within {wait}s; {START_HINT} (or check "
                    "--mesh, --interface, --peer), or give --data-dir to read a stopped "
                    "node's shard")
            raise KnowledgeError(
                f"no peer on mesh {mesh!r} answered for the knowledge graph within {wait}s "
                f"(found {', '.join(sorted(peers))}); {START_HINT}, or raise --wait")
        await asyncio.sleep(0.02)


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
    refused = refuse_negative(args, *SECONDS_OPTIONS)
    if refused is not None:
        return refused

    async def body() -> int:
        async with online_replica(args) as knowledge:
            await find_replica(knowledge, args.wait)
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
