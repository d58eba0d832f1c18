"""The mesh session's sending and receiving rules, two or three endpoints wired together
in memory on a virtual clock (no sockets): each case breaks the wire on purpose."""

from __future__ import annotations

from porter_mesh.core.session.endpoint import (
    AckFrame,
    BroadcastFrame,
    Deliver,
    DirectFrame,
    Frame,
    HelloFrame,
    Journal,
    SendFrame,
    WelcomeFrame,
)
from tests.unit.session_wire import SETTINGS, Wire


def joined(wire: Wire) -> Wire:
    wire.advance(0.1)
    for name, side in wire.sides.items():
        assert {p.name for p in side.endpoint.peers} == set(wire.sides) - {name}
    return wire


def test_hello_and_welcome_join_both_rosters() -> None:
    wire = Wire("a", "b")
    kinds = [type(i.frame) for i in wire.in_flight]
    assert kinds.count(HelloFrame) == 2
    joined(wire)
    assert ("joined", "b", "") in wire.sides["a"].events
    assert ("joined", "a", "") in wire.sides["b"].events


def test_one_message_journaled_delivered_acknowledged_in_that_order() -> None:
    wire = joined(Wire("a", "b"))
    token = wire.send("a", "b", b"hi")
    wire.advance(0.1)
    assert wire.outcome(token) == ["settled"]
    trace = [type(a) if not isinstance(a, SendFrame) else type(a.frame)
             for a in wire.sides["b"].trace if isinstance(a, Journal | Deliver | SendFrame)]
    assert trace[-3:] == [Journal, Deliver, AckFrame]
    assert wire.acked_unjournaled == []


def test_a_lost_ack_is_resent_and_delivered_once() -> None:
    lost: list[Frame] = []

    def lose_first_ack(dest: str, frame: Frame) -> list[float]:
        if isinstance(frame, AckFrame) and not lost:
            lost.append(frame)
            return []
        return [0.01]

    wire = joined(Wire("a", "b", fault=lose_first_ack))
    token = wire.send("a", "b")
    wire.advance(0.1)
    assert lost and wire.outcome(token) == []  # the ack was lost: still in flight
    wire.advance(SETTINGS["retry_initial"] * 2)
    assert wire.outcome(token) == ["settled"]
    assert wire.endpoint("a").outbox.resent == 1
    assert len(wire.direct_delivered("b")) == 1
    assert wire.sides["b"].counters["duplicate.direct"] == 1


def test_a_passed_deadline_fails_the_send_once() -> None:
    def lose_directs(dest: str, frame: Frame) -> list[float]:
        return [] if isinstance(frame, DirectFrame) else [0.01]

    wire = joined(Wire("a", "b", fault=lose_directs))
    token = wire.send("a", "b", timeout=3.0)
    wire.advance(2.9)
    assert wire.outcome(token) == []
    assert wire.endpoint("a").outbox.resent >= 2  # backoff, not one try per tick
    wire.advance(0.2)
    assert wire.outcome(token) == ["deadline"]
    wire.advance(5.0)
    assert wire.outcome(token) == ["deadline"]
    assert wire.direct_delivered("b") == []


def test_an_idempotency_key_within_its_window_is_delivered_once() -> None:
    wire = joined(Wire("a", "b"))
    first = wire.send("a", "b", key="order-1")
    wire.advance(1.0)
    again = wire.send("a", "b", key="order-1")  # a new sequence, the same key
    wire.advance(1.0)
    assert wire.outcome(first) == wire.outcome(again) == ["settled"]
    assert len(wire.direct_delivered("b")) == 1
    assert wire.sides["b"].counters["duplicate.key"] == 1


def test_an_idempotency_key_past_its_window_is_delivered_again() -> None:
    wire = joined(Wire("a", "b"))
    wire.send("a", "b", key="order-1")
    wire.advance(SETTINGS["key_window"] + 1.0)
    again = wire.send("a", "b", key="order-1")
    wire.advance(1.0)
    assert wire.outcome(again) == ["settled"]
    assert len(wire.direct_delivered("b")) == 2
    assert wire.sides["b"].counters["duplicate.key"] == 0


def test_an_idempotency_key_outlives_the_receivers_restart() -> None:
    wire = joined(Wire("a", "b"))
    wire.send("a", "b", key="order-1")
    wire.advance(0.5)
    wire.restart("b")  # the key is in its journal, with the wall time it arrived
    wire.advance(0.5)
    again = wire.send("a", "b", key="order-1")
    wire.advance(0.5)
    assert wire.outcome(again) == ["settled"]
    assert len(wire.direct_delivered("b")) == 1
    assert wire.sides["b"].counters["duplicate.key"] == 1


def test_a_duplicated_message_is_delivered_once_and_settles_once() -> None:
    def twice(dest: str, frame: Frame) -> list[float]:
        return [0.01, 0.05] if isinstance(frame, DirectFrame) else [0.01]

    wire = joined(Wire("a", "b", fault=twice))
    token = wire.send("a", "b")
    wire.advance(1.0)
    assert wire.outcome(token) == ["settled"]  # the second ack settles nothing
    assert len(wire.direct_delivered("b")) == 1
    assert wire.sides["b"].counters["duplicate.direct"] == 1


def test_reordered_messages_are_each_delivered_once() -> None:
    wire = joined(Wire("a", "b"))
    tokens = [wire.send("a", "b", bytes([i])) for i in range(3)]
    wire.in_flight.reverse()
    for item in list(wire.in_flight):
        wire.arrive(item)
    wire.advance(1.0)
    assert sorted(s for _, _, s in wire.direct_delivered("b")) == [1, 2, 3]
    assert [wire.outcome(t) for t in tokens] == [["settled"]] * 3


def test_a_restarted_sender_is_a_new_stream_and_its_old_frames_are_refused() -> None:
    delayed: list[Frame] = []

    def hold_the_second(dest: str, frame: Frame) -> list[float]:
        if isinstance(frame, DirectFrame) and frame.seq == 2 and not delayed:
            delayed.append(frame)
            return [30.0]  # arrives long after the restart
        return [0.01]

    wire = joined(Wire("a", "b", fault=hold_the_second))
    wire.send("a", "b", b"one")
    wire.send("a", "b", b"two")
    wire.advance(0.1)  # killed before its first resend of "two"
    old = wire.endpoint("a").incarnation
    wire.restart("a")
    new = wire.endpoint("a").incarnation
    assert new != old
    wire.advance(0.5)
    assert ("left", "a", "restarted") in wire.sides["b"].events
    # The old incarnation's stream is dropped with it, before the new one sends.
    assert wire.endpoint("b").receiver.tracker.incarnation("a") is None
    token = wire.send("a", "b", b"one again")  # seq 1 of the new incarnation
    wire.advance(31.0)
    assert wire.outcome(token) == ["settled"]
    assert sorted(wire.direct_delivered("b")) == sorted([("a", old, 1), ("a", new, 1)])
    assert wire.sides["b"].counters["dropped.unknown-peer"] >= 1  # the late old frame


def test_a_restarted_receiver_does_not_deliver_its_journal_twice() -> None:
    def lose_acks(dest: str, frame: Frame) -> list[float]:
        return [] if isinstance(frame, AckFrame) else [0.01]

    wire = joined(Wire("a", "b", fault=lose_acks))
    token = wire.send("a", "b")
    wire.advance(0.1)
    assert len(wire.direct_delivered("b")) == 1
    wire.fault = None
    wire.restart("b")  # journaled, not acknowledged: a's resend meets the new b
    wire.advance(1.0)
    assert wire.outcome(token) == ["settled"]
    assert len(wire.direct_delivered("b")) == 1
    assert wire.sides["b"].counters["duplicate.direct"] >= 1


def test_a_restarted_receiver_gets_what_is_in_flight_at_once() -> None:
    def lose_directs_to_the_first_b(dest: str, frame: Frame) -> list[float]:
        if isinstance(frame, DirectFrame) and wire.sides["b"].restarts == 0:
            return []
        return [0.01]

    wire = joined(Wire("a", "b", fault=lose_directs_to_the_first_b))
    token = wire.send("a", "b", timeout=20.0)
    wire.advance(6.0)
    outbox = wire.endpoint("a").outbox
    wire.run(outbox.next_due + 0.001)  # just after a resend: the next is far
    assert outbox.next_due - wire.now > 1.0
    resent = outbox.resent
    wire.restart("b")
    wire.advance(0.1)  # its hello: everything in flight goes to the new b now
    assert wire.outcome(token) == ["settled"]
    assert outbox.resent == resent + 1


def test_a_dropped_broadcast_is_counted_as_a_gap() -> None:
    def lose_second(dest: str, frame: Frame) -> list[float]:
        return [] if isinstance(frame, BroadcastFrame) and frame.seq == 2 else [0.01]

    wire = joined(Wire("a", "b", "c", fault=lose_second))
    for _ in range(3):
        wire.broadcast("a", "log")
    wire.advance(0.1)
    for name in ("b", "c"):
        seqs = [f.seq for f in wire.sides[name].delivered if isinstance(f, BroadcastFrame)]
        assert seqs == [1, 3]
        assert wire.sides[name].counters["lost.broadcast"] == 1


def test_a_full_inbox_refuses_until_there_is_room() -> None:
    wire = joined(Wire("a", "b"))
    wire.sides["b"].room = 0
    token = wire.send("a", "b")
    wire.advance(1.0)
    assert wire.outcome(token) == [] and wire.direct_delivered("b") == []
    assert wire.sides["b"].counters["backpressure.inbox"] >= 2  # the first try and a retry
    wire.sides["b"].room = 10
    wire.advance(3.0)
    assert wire.outcome(token) == ["settled"]
    assert len(wire.direct_delivered("b")) == 1


def test_a_full_disk_refuses_without_ack_until_it_has_space() -> None:
    wire = joined(Wire("a", "b"))
    wire.sides["b"].disk_full = True
    token = wire.send("a", "b", key="k1")
    wire.advance(1.0)
    assert wire.outcome(token) == [] and wire.direct_delivered("b") == []
    assert wire.sides["b"].counters["refused.disk"] >= 2
    wire.sides["b"].disk_full = False
    wire.advance(3.0)
    assert wire.outcome(token) == ["settled"]  # its key was forgotten with the refusal
    assert len(wire.direct_delivered("b")) == 1
    assert wire.acked_unjournaled == []


def test_without_a_journal_a_declined_message_stays_unacknowledged_until_taken() -> None:
    wire = joined(Wire("a", "b", journal=False))
    token = wire.send("a", "b")
    wire.advance(0.05)
    [frame] = [f for f in wire.sides["b"].delivered if isinstance(f, DirectFrame)]
    wire.carry("b", wire.endpoint("b").declined(frame))
    wire.advance(1.0)
    assert wire.outcome(token) == []
    assert wire.sides["b"].counters["duplicate.held"] >= 1
    wire.carry("b", wire.endpoint("b").taken(frame))
    wire.advance(0.1)
    assert wire.outcome(token) == ["settled"]
    assert len(wire.direct_delivered("b")) == 1


def test_a_silent_peer_turns_evasive_then_expires() -> None:
    wire = joined(Wire("a", "b"))
    wire.sides["b"].paused = True  # SIGSTOP: no heartbeats, reads nothing
    wire.advance(SETTINGS["evasive_after"] + 1.0)
    assert ("evasive", "b", "") in wire.sides["a"].events
    assert "b" in wire.endpoint("a").peers
    wire.advance(SETTINGS["expire_after"] - SETTINGS["evasive_after"])
    assert ("left", "b", "expired") in wire.sides["a"].events
    assert "b" not in wire.endpoint("a").peers
    token = wire.send("a", "b", timeout=2.0)  # no link: waits, then fails at its deadline
    assert not any(i.dest == "b" and isinstance(i.frame, DirectFrame) for i in wire.in_flight)
    wire.advance(2.5)
    assert wire.outcome(token) == ["deadline"]


def test_a_heartbeat_keeps_a_quiet_peer_alive() -> None:
    wire = joined(Wire("a", "b"))
    wire.advance(SETTINGS["expire_after"] * 3)
    assert [e for e in wire.sides["a"].events if e[0] != "joined"] == []


def test_a_seats_goodbye_fails_its_replies_at_once() -> None:
    wire = joined(Wire("a", "seat", roles={"seat": "cli"}))
    wire.sides["seat"].paused = True
    token = wire.send("a", "seat", timeout=30.0)
    wire.advance(0.5)
    wire.sides["seat"].paused = False
    wire.carry("seat", wire.endpoint("seat").close())
    wire.advance(0.1)
    assert wire.outcome(token) == ["left"]


def test_an_unknown_sender_is_not_acknowledged_until_it_has_said_hello() -> None:
    lose_hellos = [True]

    def no_hello_to_b(dest: str, frame: Frame) -> list[float]:
        if dest == "b" and isinstance(frame, HelloFrame | WelcomeFrame) and lose_hellos[0]:
            return []
        return [0.01]

    wire = Wire("a", "b", fault=no_hello_to_b)
    wire.advance(0.1)
    assert "b" in wire.endpoint("a").peers and "a" not in wire.endpoint("b").peers
    token = wire.send("a", "b", timeout=5.0)
    wire.advance(0.5)
    assert wire.sides["b"].counters["dropped.unknown-peer"] >= 1
    assert wire.outcome(token) == []
    lose_hellos[0] = False
    wire.carry("a", wire.endpoint("a").hello("b"))  # re-contact introduces it
    wire.advance(2.0)
    assert wire.outcome(token) == ["settled"]


def test_too_much_in_flight_fails_the_next_send_at_once() -> None:
    wire = joined(Wire("a", "b", max_pending=2))
    wire.pause("b")
    waiting = [wire.send("a", "b"), wire.send("a", "b")]
    over = wire.send("a", "b")
    assert wire.outcome(over) == ["overflow"]
    wire.resume("b")
    wire.advance(3.0)
    assert [wire.outcome(t) for t in waiting] == [["settled"]] * 2


def test_closing_says_goodbye_and_fails_what_is_in_flight() -> None:
    wire = joined(Wire("a", "b"))
    wire.pause("b")
    token = wire.send("a", "b")
    wire.resume("b")
    wire.carry("a", wire.endpoint("a").close())
    assert wire.outcome(token) == ["closed"]
    wire.advance(0.1)
    assert ("left", "a", "goodbye") in wire.sides["b"].events
