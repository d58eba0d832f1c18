"""A knowledge replica closed while its node runs on, over real nodes on loopback: its
kind is unregistered, so the peers' broadcasts that keep arriving are not queued for a
merge that never comes, and a peer that asks it for records is told it has no replica."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from porter_mesh.adapters.shard import Shard
from porter_mesh.core import constants as C
from porter_mesh.core.as2 import Activity
from porter_mesh.core.control import KIND_HELLO
from porter_mesh.core.envelope import KIND_SYNC
from porter_mesh.errors import ConfigError
from porter_mesh.node.knowledge import Knowledge
from porter_mesh.node.node import Node
from tests.integration.test_view_client import _until

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]

_meshes = itertools.count()
RECORDS = 50


@contextlib.asynccontextmanager
async def replica_pair(tmp_path: Path, writer_kg: Path | None = None
                       ) -> AsyncIterator[tuple[Node, Knowledge, Knowledge]]:
    """Two linked nodes with a replica each; yields the first node, its replica (to be
    closed by the caller) and the second's (the writer, whose shard is in ``writer_kg``
    when given)."""
    mesh = f"kgclosed{os.getpid()}-{next(_meshes)}"
    first = Node(name="first", mesh=mesh, discovery=False, data_dir=tmp_path / "first")
    async with first:
        second = Node(name="second", mesh=mesh, discovery=False, data_dir=tmp_path / "second",
                      seeds=(f"127.0.0.1:{first.router_port}",))
        closed = Knowledge(first, Shard(tmp_path / "first-kg", agent="first"))
        writer = Knowledge(second, Shard(writer_kg or tmp_path / "second-kg", agent="second"))
        closed.start()
        writer.start()
        try:
            async with second:
                await second.wait_for_subscribers(C.CHANNEL_CONTROL, 1, 20)
                yield first, closed, writer
        finally:
            await writer.aclose()


def remember_activity(finding: str, about: str = "urn:porter:file:a") -> Activity:
    """A ``Remember`` by the writer of :func:`replica_pair` (``second``)."""
    return Activity.from_dict({"type": "Remember", "actor": "second", "summary": "a finding",
                               "object": {"type": "Note", "about": about, "content": finding}})


async def _broadcasts(tmp_path: Path) -> None:
    async with replica_pair(tmp_path) as (first, closed, writer):
        seen: list[str] = []
        first.add_control_listener(lambda kind, sender, body: seen.append(kind))
        await closed.aclose()  # the replica goes; its node stays on the mesh
        for i in range(RECORDS):
            writer.async_observe("closed replica", f"finding {i}")
        # The broadcasts still reach the node, which no longer hands them to the
        # replica: they go where any kind the node does not run goes.
        await _until(lambda: seen.count(KIND_SYNC) >= RECORDS, 20,
                     "the broadcasts reaching the closed replica's node")
        assert closed._inbound == []  # nothing held for a merge that never runs
        assert closed.counters["received.Records"] == 0


async def _requests(tmp_path: Path) -> None:
    async with replica_pair(tmp_path) as (_, closed, writer):
        # The catch-ups each side starts when the other joins finish first: one still in
        # flight when the replica closes would be answered 'unsupported' before the pull
        # this test makes, and the check below would not be about that pull.
        await writer.wait_caught_up(1, 20)
        await closed.wait_caught_up(1, 20)
        await closed.aclose()
        assert "first" not in writer.without_replica()
        record = writer.async_observe("closed replica", "asked of a closed replica")
        # A one-record pull: the answer is ``unsupported``, as from a node that never ran
        # a replica, and the writer leaves the first node alone from then on.
        ask = asyncio.ensure_future(writer.peer_holds("first", record.origin, record.seq, 30))
        try:
            await _until(lambda: "first" in writer.without_replica(), 20,
                         "the closed replica's node answering 'unsupported'")
        finally:
            ask.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await ask


async def _starting(tmp_path: Path) -> None:
    mesh = f"kgclosed{os.getpid()}-{next(_meshes)}"
    first = Node(name="first", mesh=mesh, discovery=False, data_dir=tmp_path / "first")
    Knowledge.expect(first)  # its replica starts once the node is on the mesh
    async with first:
        second = Node(name="second", mesh=mesh, discovery=False, data_dir=tmp_path / "second",
                      seeds=(f"127.0.0.1:{first.router_port}",))
        writer = Knowledge(second, Shard(tmp_path / "second-kg", agent="second"))
        writer.start()
        replica: Knowledge | None = None
        try:
            async with second:
                await second.wait_for_subscribers(C.CHANNEL_CONTROL, 1, 20)
                record = writer.async_observe("starting replica", "asked while it starts")
                # Not yet there: the request waits for the replica (counted), where a node
                # without one would have answered 'unsupported'.
                ask = asyncio.ensure_future(
                    writer.peer_holds("first", record.origin, record.seq, 20))
                await _until(lambda: first.counters["held.kind-starting"] >= 1, 20,
                             "the request held for the starting replica")
                assert not ask.done()
                assert "first" not in writer.without_replica()
                # Once it starts, the held request is answered by it, and the answer is
                # about the record (the replica holds it after catching up, or says not).
                replica = Knowledge(first, Shard(tmp_path / "first-kg", agent="first"))
                replica.start()
                await ask  # answered, not timed out
                assert "first" in writer.answered_by()
                assert "first" not in writer.without_replica()
                # And the record reaches it (its broadcast was held too, or a pull brings it).
                started = replica
                await _until(lambda: started.shard.state.top_seq("second") >= record.seq, 20,
                             "the started replica holding the record")
        finally:
            await writer.aclose()
            if replica is not None:
                await replica.aclose()


def test_what_a_starting_replica_is_sent_waits_for_it(
        tmp_path: Path) -> None:
    asyncio.run(_starting(tmp_path))


def test_a_closed_replica_queues_nothing_while_its_node_runs_on(tmp_path: Path) -> None:
    asyncio.run(_broadcasts(tmp_path))


def test_a_closed_replica_is_answered_for_as_unsupported(tmp_path: Path) -> None:
    asyncio.run(_requests(tmp_path))


def test_the_nodes_own_kinds_cannot_be_unregistered(tmp_path: Path) -> None:
    node = Node(name="own", mesh=f"kgclosed{os.getpid()}-{next(_meshes)}", discovery=False,
                data_dir=tmp_path / "own")
    with pytest.raises(ConfigError, match="the node's own"):
        node.unregister_kind(KIND_HELLO)
    node.unregister_kind("never-registered")  # idempotent: nothing to remove is no error
