"""Waiting in ``receive()``: a deadline, several readers at once, a cancelled reader, a
node closing under its readers, between real nodes over real sockets."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from porter_mesh.core.as2 import Activity
from porter_mesh.errors import NodeClosedError
from porter_mesh.node.node import Node
from tests.integration.harness import seeded_by

pytestmark = [pytest.mark.network, pytest.mark.timeout(90)]


def note(i: int) -> Activity:
    return Activity.from_dict({"type": "Announce", "actor": "sender", "summary": f"n{i}"})


@contextlib.asynccontextmanager
async def pair(mesh: str) -> AsyncIterator[tuple[Node, Node]]:
    """``sender`` linked to ``reader``, both started; both closed on the way out."""
    async with Node(name="reader", mesh=mesh, discovery=False, channels=()) as reader, \
            seeded_by(reader, "sender") as sender:
        yield sender, reader


def waiting_readers(node: Node) -> int:
    """How many readers the node's inbox would wake (none may linger once they left)."""
    return len(node._inbox._waiters)


def test_receive_times_out_and_leaves_no_reader_behind(mesh: str) -> None:
    async def run() -> None:
        async with pair(mesh) as (sender, reader):
            loop = asyncio.get_running_loop()
            for _ in range(20):
                started = loop.time()
                with pytest.raises(TimeoutError):
                    await reader.receive(timeout=0.05)
                assert loop.time() - started >= 0.05
            assert waiting_readers(reader) == 0
            # Nothing was lost meanwhile: a message sent now is received.
            await sender.send("reader", note(1), timeout=30)
            msg = await reader.receive(timeout=30)
            assert msg.activity.summary == "n1"
            assert waiting_readers(reader) == 0

    asyncio.run(run())


def test_a_cancelled_reader_leaves_and_the_next_one_gets_the_message(mesh: str) -> None:
    async def run() -> None:
        async with pair(mesh) as (sender, reader):
            for _ in range(20):
                task = asyncio.ensure_future(reader.receive())
                await asyncio.sleep(0)  # let it start waiting
                assert waiting_readers(reader) == 1
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            assert waiting_readers(reader) == 0
            await sender.send("reader", note(2), timeout=30)
            assert (await reader.receive(timeout=30)).activity.summary == "n2"

    asyncio.run(run())


def test_several_readers_each_get_one_message(mesh: str) -> None:
    async def run() -> None:
        async with pair(mesh) as (sender, reader):
            tasks = [asyncio.ensure_future(reader.receive(timeout=30)) for _ in range(3)]
            await asyncio.sleep(0)
            for i in range(3):
                await sender.send("reader", note(i), timeout=30)
            got = await asyncio.wait_for(asyncio.gather(*tasks), 30)
            assert sorted(m.activity.summary for m in got) == ["n0", "n1", "n2"]
            assert waiting_readers(reader) == 0

    asyncio.run(run())


def test_closing_wakes_every_reader_with_node_closed(mesh: str) -> None:
    async def run() -> None:
        async with pair(mesh) as (_, reader):
            tasks = [asyncio.ensure_future(reader.receive(timeout=60)) for _ in range(2)]
            tasks.append(asyncio.ensure_future(reader.receive()))
            await asyncio.sleep(0)
            await reader.aclose()
            results = await asyncio.wait_for(
                asyncio.gather(*tasks, return_exceptions=True), 30)
            assert all(isinstance(r, NodeClosedError) for r in results), results

    asyncio.run(run())


def test_wait_readable_wakes_on_a_message_and_a_timed_out_wait_leaves(mesh: str) -> None:
    async def run() -> None:
        async with pair(mesh) as (sender, reader):
            for _ in range(20):  # as the sync facade waits: wait_for() cancels it
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(reader.wait_readable(), 0.02)
            assert waiting_readers(reader) == 0
            waiting = asyncio.ensure_future(reader.wait_readable())
            await sender.send("reader", note(3), timeout=30)
            await asyncio.wait_for(waiting, 30)
            assert waiting_readers(reader) == 0
            assert reader.drain()[0].activity.summary == "n3"

    asyncio.run(run())
