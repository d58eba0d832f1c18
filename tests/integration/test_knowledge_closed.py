"""A knowledge replica closed while its node runs on, over real nodes on loopback: the
peers' broadcasts that keep arriving are not queued for a merge that never comes."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path

import pytest

from porter_mesh.adapters.shard import Shard
from porter_mesh.core import constants as C
from porter_mesh.node.knowledge import Knowledge
from porter_mesh.node.node import Node
from tests.integration.test_view_client import _until

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]

_meshes = itertools.count()
RECORDS = 50


async def _scenario(tmp_path: Path) -> None:
    mesh = f"kgclosed{os.getpid()}-{next(_meshes)}"
    first = Node(name="first", mesh=mesh, discovery=False, data_dir=tmp_path / "first")
    async with first:
        second = Node(name="second", mesh=mesh, discovery=False, data_dir=tmp_path / "second",
                      seeds=(f"127.0.0.1:{first.router_port}",))
        closed = Knowledge(first, Shard(tmp_path / "first-kg", agent="first"))
        writer = Knowledge(second, Shard(tmp_path / "second-kg", agent="second"))
        closed.start()
        writer.start()
        try:
            async with second:
                await second.wait_for_subscribers(C.CHANNEL_CONTROL, 1, 20)
                await closed.aclose()  # the replica goes; its node stays on the mesh
                for i in range(RECORDS):
                    writer.async_observe("closed replica", f"finding {i}")
                # The broadcasts still reach the node, which hands them to the replica.
                await _until(lambda: closed.counters["dropped.closed"]
                             + closed.counters["received.Records"] >= RECORDS, 20,
                             "the broadcasts reaching the closed replica's node")
                assert closed._inbound == []  # nothing held for a merge that never runs
                assert closed.counters["dropped.closed"] == RECORDS
        finally:
            await writer.aclose()


def test_a_closed_replica_queues_nothing_while_its_node_runs_on(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))
