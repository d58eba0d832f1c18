"""Trace context through real nodes: a traced message carries its context, in order with
the untraced ones around it, on broadcast and direct delivery alike."""

from __future__ import annotations

import pytest

from porter_mesh.core.as2 import Activity
from porter_mesh.core.tracecontext import TraceContext
from porter_mesh.node.sync import SyncNode
from tests.integration.test_node_delivery import pair  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]

TRACE = TraceContext("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "rojo=1,congo=t")


def note(i: int) -> Activity:
    return Activity.from_dict({"type": "Announce", "actor": "tx", "summary": f"m{i}",
                               "context": "urn:porter:task:t1"})


def test_traced_broadcasts_and_direct_sends_keep_context_and_order(
        pair: tuple[SyncNode, SyncNode]) -> None:  # noqa: F811
    receiver, sender = pair
    traced = {3, 4, 9}

    def publish_all() -> None:
        # One loop turn: the untraced ones would share a message; a traced one may not.
        for i in range(12):
            sender.node.async_publish("log", note(i), trace=TRACE if i in traced else None)

    sender.call_in_loop(publish_all)
    got = [receiver.receive(20) for _ in range(12)]
    assert [m.activity.summary for m in got] == [f"m{i}" for i in range(12)]
    assert [m.seq for m in got] == list(range(1, 13))
    assert [i for i, m in enumerate(got) if m.trace == TRACE] == sorted(traced)
    assert all(m.trace is None for i, m in enumerate(got) if i not in traced)

    async def send_all() -> None:
        futs = [sender.node.async_send_nowait("rx", note(i),
                                              trace=TRACE if i in traced else None,
                                              key="k5" if i == 5 else None)
                for i in range(12)]
        for fut in futs:
            await fut

    sender.run_coroutine(send_all(), 30)
    got = [receiver.receive(20) for _ in range(12)]
    assert all(m.direct for m in got)
    assert [m.activity.summary for m in got] == [f"m{i}" for i in range(12)]
    assert [i for i, m in enumerate(got) if m.trace == TRACE] == sorted(traced)
    assert got[5].envelope.msg_id == "k:k5" and got[5].trace is None
    # The sync facade passes it through as well.
    sender.send("rx", note(99), trace=TRACE, timeout=10)
    assert receiver.receive(20).trace == TRACE
