"""The sending rules as a pure unit: queues, runs, numbering, the outbox's outcomes
(settle, resend, deadline, overflow, a seat's goodbye, a refusal, closing). No socket:
each call takes ``now`` and the test reads the actions it returns."""

from __future__ import annotations

from porter_mesh.core.as2 import Activity
from porter_mesh.core.constants import CHANNEL_CONTROL, ROLE_SEAT
from porter_mesh.core.envelope import decode_payload
from porter_mesh.core.session.frames import (
    BroadcastFrame,
    Count,
    DirectFrame,
    Fail,
    SendFrame,
    Settle,
)
from porter_mesh.core.session.sending import SendAction, Sender
from porter_mesh.core.tracecontext import TraceContext

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def sender(**settings: int) -> Sender[int]:
    opts = dict(retry_initial=0.2, retry_max=2.0, max_pending=8, batch_max=4)
    opts.update(settings)
    return Sender("a", 0x42, **opts)  # type: ignore[arg-type]


def note(i: int) -> Activity:
    return Activity.from_dict({"type": "Announce", "actor": "a", "summary": str(i)})


def direct(actions: list[SendAction[int]]) -> list[DirectFrame]:
    return [a.frame for a in actions
            if isinstance(a, SendFrame) and isinstance(a.frame, DirectFrame)]


def summaries(frame: DirectFrame | BroadcastFrame) -> list[str | None]:
    return [a.summary for a in decode_payload(frame.payload, frame.count)]


def test_a_queue_becomes_numbered_runs_of_at_most_batch_max_in_order() -> None:
    s = sender()
    for i in range(10):
        s.queue("b", note(i), i, 10.0)
    actions = s.flush(0.0, {"b"})
    frames = direct(actions)
    assert [(f.seq, f.count) for f in frames] == [(1, 4), (5, 4), (9, 2)]
    assert [x for f in frames for x in summaries(f)] == [str(i) for i in range(10)]
    assert actions[-1] == Count("sent.direct", 10)
    assert not s.direct_queued and len(s.outbox) == 3


def test_keyed_and_traced_activities_travel_alone_in_their_place() -> None:
    s = sender()
    s.queue("b", note(0), 0, 10.0)
    s.queue("b", note(1), 1, 10.0, key="order-1")
    s.queue("b", note(2), 2, 10.0)
    s.queue("b", note(3), 3, 10.0, trace=TraceContext(TP))
    s.queue("b", note(4), 4, 10.0)
    s.queue("b", note(5), 5, 10.0)
    frames = direct(s.flush(0.0, {"b"}))
    assert [summaries(f) for f in frames] == [["0"], ["1"], ["2"], ["3"], ["4", "5"]]
    assert frames[1].msg_id == "k:order-1"
    assert frames[3].trace == TraceContext(TP) and frames[4].trace is None
    assert [f.seq for f in frames] == [1, 2, 3, 4, 5]


def test_an_ack_settles_every_token_of_its_message_once() -> None:
    s = sender()
    for i in range(3):
        s.queue("b", note(i), i, 10.0)
    s.flush(0.0, {"b"})
    assert s.acked("b", (1,), 0.1) == [Settle((0, 1, 2))]
    assert s.acked("b", (1,), 0.2) == []  # a repeated ack
    assert s.acked("c", (1,), 0.2) == []  # an ack from someone else


def test_too_much_in_flight_fails_at_once_with_overflow() -> None:
    s = sender(max_pending=2, batch_max=1)
    for i in range(3):
        s.queue("b", note(i), i, 10.0)
    actions = s.flush(0.0, {"b"})
    assert len(direct(actions)) == 2
    assert Fail((2,), "b", "overflow", 0, 1) in actions
    assert Count("sent.direct", 2) in actions
    s.queue("b", note(3), 3, 10.0)  # a lone activity (its own path) fails the same way
    assert s.flush(0.0, {"b"}) == [Fail((3,), "b", "overflow", 0, 1)]


def test_a_message_to_an_unreachable_recipient_waits_and_goes_when_it_joins() -> None:
    s = sender()
    s.queue("b", note(0), 0, 10.0)
    assert direct(s.flush(0.0, set())) == []
    assert direct(s.timer(s.next_due, set())) == []  # no resend to nowhere
    resent = direct(s.joined("b", 0.5))
    assert [f.seq for f in resent] == [1]
    assert s.acked("b", (1,), 0.6) == [Settle((0,))]


def test_resends_back_off_then_the_deadline_fails_the_message() -> None:
    s = sender()
    s.queue("b", note(0), 7, 1.0)
    first = direct(s.flush(0.0, {"b"}))
    now, resends = 0.0, []
    failed: list[SendAction[int]] = []
    while not failed:
        now = s.next_due
        actions = s.timer(now, {"b"})
        resends += direct(actions)
        failed = [a for a in actions if isinstance(a, Fail)]
    assert resends and all(f == first[0] for f in resends)  # the same frame each time
    assert now >= 1.0
    assert failed == [Fail((7,), "b", "deadline", 1 + len(resends), 1)]
    assert len(s.outbox) == 0


def test_a_seat_that_says_goodbye_fails_its_replies_and_no_one_else_does() -> None:
    s = sender()
    s.queue("seat", note(0), 0, 10.0)
    s.queue("w", note(1), 1, 10.0)
    s.flush(0.0, {"seat", "w"})
    assert s.left("w", "worker", "goodbye") == []
    assert s.left("seat", ROLE_SEAT, "expired") == []
    assert s.left("seat", ROLE_SEAT, "goodbye") == [Fail((0,), "seat", "left", 1, 1)]
    assert len(s.outbox) == 1


def test_a_refusal_fails_what_waits_for_that_peer() -> None:
    s = sender()
    s.queue("b", note(0), 0, 10.0)
    s.flush(0.0, set())
    assert s.refused("b") == [Fail((0,), "b", "refused", 1, 1)]
    assert s.refused("b") == []


def test_closing_fails_what_is_in_flight_and_what_is_still_queued() -> None:
    s = sender()
    s.queue("b", note(0), 0, 10.0)
    s.flush(0.0, {"b"})
    s.queue("b", note(1), 1, 10.0)
    s.publish("log", note(2))
    assert s.close() == [Fail((0,), "b", "closed", 1, 1), Fail((1,), "b", "closed")]
    assert not s.direct_queued and not s.broadcasts_queued and len(s.outbox) == 0


def test_broadcasts_are_numbered_per_channel_and_cut_by_bytes() -> None:
    s = sender(batch_max=64)
    s.broadcast_bytes = 120
    for i in range(6):
        s.publish("log", note(i))
    s.publish("review", note(9))
    actions = s.flush(0.0, set())
    frames = [a.frame for a in actions if isinstance(a, SendFrame)]
    assert all(isinstance(f, BroadcastFrame) for f in frames)
    log = [f for f in frames if isinstance(f, BroadcastFrame) and f.channel == "log"]
    assert len(log) > 1 and all(len(f.payload) <= 120 for f in log)
    assert [f.seq for f in log] == [1] + [1 + sum(f.count for f in log[:i])
                                          for i in range(1, len(log))]
    assert [x for f in log for x in summaries(f)] == [str(i) for i in range(6)]
    assert Count("sent.broadcast", 6) in actions
    beat = s.broadcast(CHANNEL_CONTROL, b"{}", kind="hb")
    assert isinstance(beat.frame, BroadcastFrame) and beat.frame.seq == 1
    assert s.broadcast_positions() == {"log": 6, "review": 1}  # control is not counted


def test_broadcasts_pack_up_to_their_own_batch_max_direct_messages_up_to_batch_max() -> None:
    s = sender(batch_max=4, broadcast_batch_max=8)
    for i in range(20):
        s.publish("log", note(i))
        s.queue("b", note(i), i, 10.0)
    actions = s.flush(0.0, {"b"})
    frames = [a.frame for a in actions if isinstance(a, SendFrame)]
    log = [f for f in frames if isinstance(f, BroadcastFrame)]
    assert [(f.seq, f.count) for f in log] == [(1, 8), (9, 8), (17, 4)]
    assert [x for f in log for x in summaries(f)] == [str(i) for i in range(20)]
    assert [f.count for f in direct(actions)] == [4] * 5
    assert sender(batch_max=4).broadcast_batch_max == 4  # by default the same bound


def test_a_traced_broadcast_goes_at_once_after_what_waits_on_its_channel() -> None:
    s = sender()
    assert not s.publish_more("log", note(0))
    s.publish("log", note(0))
    assert s.publish_more("log", note(1))
    frames = [a.frame for a in s.publish_now("log", note(2), TraceContext(TP))
              if isinstance(a, SendFrame) and isinstance(a.frame, BroadcastFrame)]
    assert [(f.seq, f.count, f.trace) for f in frames] == [(1, 2, None),
                                                          (3, 1, TraceContext(TP))]
    assert not s.broadcasts_queued
