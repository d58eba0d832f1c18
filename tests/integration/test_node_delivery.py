"""Delivery to the application: handlers, batch handlers and the bounded inbox."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from porter_mesh.core.as2 import Activity
from porter_mesh.node.node import Message
from porter_mesh.node.sync import SyncNode

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]
_ids = itertools.count()
COUNT = 300


@pytest.fixture
def pair() -> Iterator[tuple[SyncNode, SyncNode]]:
    """A receiver on channel ``log`` with a small inbox, and a sender seeded to it."""
    mesh = f"d{os.getpid()}-{next(_ids)}"
    receiver = SyncNode(name="rx", mesh=mesh, discovery=False, channels=("log",),
                        inbox_size=100)
    sender = SyncNode(name="tx", mesh=mesh, discovery=False,
                      seeds=(f"127.0.0.1:{receiver.node.router_port}",))
    try:
        receiver.wait_for_peers(["tx"], 10)
        sender.wait_for_peers(["rx"], 10)
        sender.run_coroutine(sender.node.wait_for_subscribers("log", 1, 10), 15)
        yield receiver, sender
    finally:
        sender.close()
        receiver.close()


def burst() -> list[Activity]:
    return [Activity.from_dict({"type": "Announce", "actor": "tx", "summary": f"m{i}",
                                "context": "urn:porter:task:t1"}) for i in range(COUNT)]


def test_batch_and_single_handlers_see_every_message_once_in_order(
        pair: tuple[SyncNode, SyncNode]) -> None:
    receiver, sender = pair
    singles: list[Message] = []
    batches: list[list[Message]] = []
    receiver.call_in_loop(lambda: receiver.node.add_handler(singles.append))
    receiver.call_in_loop(lambda: receiver.node.add_batch_handler(batches.append))

    def publish_all() -> None:
        for activity in burst():
            sender.node.async_publish("log", activity)

    sender.call_in_loop(publish_all)  # one loop turn: the node packs them into batches
    receiver.wait_for_stats(lambda st: st.get("received.broadcast", 0) >= COUNT, 20)

    flat = [m for batch in batches for m in batch]
    summaries = [f"m{i}" for i in range(COUNT)]
    assert [m.activity.summary for m in flat] == summaries
    assert [m.activity.summary for m in singles] == summaries
    assert [m.seq for m in flat] == list(range(1, COUNT + 1))
    assert all(m.sender == "tx" and m.channel == "log" and not m.direct for m in flat)
    assert len(batches) < COUNT  # delivered a ZeroMQ message at a time, not one by one
    assert all(len({(m.sender, m.envelope.msg_id) for m in b}) == 1 for b in batches)
    # Decoded on demand, the fields are all there.
    assert flat[5].activity.to_dict() == burst()[5].to_dict()


def test_inbox_keeps_what_fits_and_counts_the_rest(pair: tuple[SyncNode, SyncNode]) -> None:
    receiver, sender = pair

    def publish_all() -> None:
        for activity in burst():
            sender.node.async_publish("log", activity)

    sender.call_in_loop(publish_all)
    receiver.wait_for_stats(lambda st: st.get("received.broadcast", 0) >= COUNT, 20)
    stats = receiver.stats()
    kept = receiver.drain()
    assert [m.activity.summary for m in kept] == [f"m{i}" for i in range(100)]
    assert stats.get("dropped.inbox-full", 0) == COUNT - 100


def test_batch_handlers_get_their_own_lists_and_may_remove_themselves(
        pair: tuple[SyncNode, SyncNode]) -> None:
    receiver, sender = pair
    seen: dict[str, int] = {"once": 0, "other": 0}
    removers: list[object] = []

    def once(msgs: list[Message]) -> None:
        seen["once"] += len(msgs)
        msgs.clear()  # its own list: the inbox and the other handler keep theirs
        remove = removers[0]
        assert callable(remove)
        remove()

    def other(msgs: list[Message]) -> None:
        seen["other"] += len(msgs)

    def attach() -> None:
        removers.append(receiver.node.add_batch_handler(once))
        receiver.node.add_batch_handler(other)

    receiver.call_in_loop(attach)

    def publish_all() -> None:
        for activity in burst()[:50]:
            sender.node.async_publish("log", activity)

    sender.call_in_loop(publish_all)
    receiver.wait_for_stats(lambda st: st.get("received.broadcast", 0) >= 50, 20)
    assert seen["other"] == 50  # never skipped, though "once" removed itself mid-loop
    assert seen["once"] >= 1  # it saw the first batch, then left
    assert len(receiver.drain()) == 50


def test_activities_too_big_to_share_a_message_are_split_across_several(
        pair: tuple[SyncNode, SyncNode]) -> None:
    receiver, sender = pair
    big = [Activity.from_dict({"type": "Create", "actor": "tx", "summary": f"big {i}",
                               "content": str(i) * 900_000}) for i in range(5)]

    def publish_all() -> None:
        for activity in big:
            sender.node.async_publish("log", activity)

    sender.call_in_loop(publish_all)  # one turn: together they pass one message's limit
    got = [receiver.receive(20) for _ in big]
    assert [m.activity.summary for m in got] == [f"big {i}" for i in range(5)]
    assert [len(m.activity.content or "") for m in got] == [900_000] * 5
    async def send_all() -> None:
        await sender.node.async_send_many("rx", big, timeout=20)

    sender.run_coroutine(send_all(), 30)
    got = [receiver.receive(20) for _ in big]
    assert [m.activity.summary for m in got] == [f"big {i}" for i in range(5)]
    assert all(m.direct for m in got)
