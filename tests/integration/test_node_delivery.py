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
