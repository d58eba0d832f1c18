"""Busy polling after a direct send (``NodeConfig.busy_poll``), between real nodes over
real sockets: the loop keeps turning for the window after a direct message leaves,
without sleeping, then sleeps; taking messages in, and traffic that is not direct, never
start it."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable

import pytest

from porter_mesh.core.as2 import Activity
from porter_mesh.node.node import Message, Node
from tests.integration.harness import seeded_by

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]
_ids = itertools.count()


def note(i: int) -> Activity:
    return Activity.from_dict({"type": "Announce", "actor": "ping", "summary": f"n{i}",
                               "context": "urn:porter:task:t1"})


def settled(key: str) -> Callable[[dict[str, int]], bool]:
    """A stats predicate that holds once ``key`` has kept its value for two checks in a
    row (the node's polling turns have stopped)."""
    last: list[int] = []

    def check(stats: dict[str, int]) -> bool:
        last.append(stats.get(key, 0))
        return len(last) >= 3 and last[-1] == last[-2] == last[-3]

    return check


async def exchange(busy_poll: float, trips: int = 3) -> tuple[dict[str, int], dict[str, int],
                                                               float, float]:
    """``trips`` requests from ``ping``, each answered at once by ``echo``; returns both
    nodes' counters once neither polls any more, and the loop thread's CPU seconds and
    the wall seconds from the first request until then."""
    mesh = f"bp{os.getpid()}-{next(_ids)}"
    echo = Node(name="echo", mesh=mesh, discovery=False, channels=(), busy_poll=busy_poll)

    def answer(msg: Message) -> None:
        if msg.direct:
            echo.async_send_nowait(msg.sender, msg.activity)

    echo.add_handler(answer)
    async with echo, seeded_by(echo, "ping", busy_poll=busy_poll) as ping:
        before = ping.stats().get("busy_poll.windows", 0), echo.stats().get(
            "busy_poll.windows", 0)
        assert before == (0, 0), "no direct message sent yet, so no polling"
        cpu, wall = time.thread_time(), time.monotonic()
        for i in range(trips):
            sent = ping.async_send_nowait("echo", note(i))
            reply = await ping.receive(timeout=20)
            assert reply.activity.summary == f"n{i}"
            await sent
        await ping.wait_for_stats(settled("busy_poll.turns"), 20)
        await echo.wait_for_stats(settled("busy_poll.turns"), 20)
        return (ping.stats(), echo.stats(), time.thread_time() - cpu,
                time.monotonic() - wall)


def test_direct_traffic_keeps_the_loop_turning_for_the_window_then_it_sleeps() -> None:
    window = 0.05
    ping, echo, _, wall = asyncio.run(exchange(window))
    for stats in (ping, echo):
        assert stats["busy_poll.windows"] >= 1, stats
        assert stats["busy_poll.turns"] >= 10, stats
    # The loop kept turning through the window, and then the turns ended. (Its CPU
    # time is not asserted: each turn yields the CPU, so on a loaded machine the other
    # threads ready to run take most of the window, as they should.)
    assert wall >= window


def test_without_busy_polling_the_loop_sleeps_at_once() -> None:
    ping, echo, cpu, _ = asyncio.run(exchange(0.0))
    for stats in (ping, echo):
        assert "busy_poll.windows" not in stats and "busy_poll.turns" not in stats, stats
    # Three round trips without polling cost far less than one 50 ms window polled.
    assert cpu < 0.05 / 5, cpu


async def heard_after(node: Node, peer: str, moment: float, timeout: float) -> None:
    """Wait until ``node`` has heard from ``peer`` after ``moment`` (monotonic)."""
    deadline = time.monotonic() + timeout
    while (info := node.peer(peer)) is None or info.last_heard <= moment:
        assert time.monotonic() < deadline, f"{node.name} heard nothing from {peer}"
        await asyncio.sleep(0.01)


async def heartbeats_only() -> tuple[dict[str, int], dict[str, int]]:
    mesh = f"bp{os.getpid()}-{next(_ids)}"
    beat = {"heartbeat_interval": 0.05, "evasive_after": 1.0, "expire_after": 2.0}
    first = Node(name="first", mesh=mesh, discovery=False, channels=("log",), **beat)
    async with first, seeded_by(first, "second", **beat) as second:
        # A broadcast of the application's, then heartbeats each way for a while: the
        # last one heard by each side came well after the first ones.
        await second.publish("log", note(0))
        await first.wait_for_stats(lambda s: s.get("received.broadcast", 0) >= 1, 20)
        later = time.monotonic() + 5 * beat["heartbeat_interval"]
        await heard_after(first, "second", later, 20)
        await heard_after(second, "first", later, 20)
        return first.stats(), second.stats()


def test_heartbeats_and_broadcasts_never_start_it() -> None:
    first, second = asyncio.run(heartbeats_only())
    assert first["received.broadcast"] >= 1
    for stats in (first, second):
        assert stats.get("busy_poll.windows", 0) == 0, stats


async def one_way(n: int = 20) -> tuple[dict[str, int], dict[str, int]]:
    """``n`` direct messages from ``sender`` to ``sink``, whose handler answers nothing;
    both nodes' counters once every one is acknowledged."""
    mesh = f"bp{os.getpid()}-{next(_ids)}"
    sink = Node(name="sink", mesh=mesh, discovery=False, channels=(), inbox_size=0)
    taken: list[str] = []
    sink.add_handler(lambda msg: taken.append(msg.activity.summary))
    async with sink, seeded_by(sink, "sender") as sender:
        await asyncio.gather(*(sender.send("sink", note(i), timeout=20) for i in range(n)))
        assert len(taken) == n
        await sender.wait_for_stats(settled("busy_poll.turns"), 20)
        return sender.stats(), sink.stats()


def test_a_node_that_only_takes_messages_in_never_polls() -> None:
    sender, sink = asyncio.run(one_way())
    assert sender["busy_poll.windows"] >= 1, sender
    assert sink["received.direct"] == 20
    assert "busy_poll.windows" not in sink, sink
