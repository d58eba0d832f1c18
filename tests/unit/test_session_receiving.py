"""The receiver's verdict on each arrival of a direct message, with no socket: new,
duplicate, held, refused for room, and the retries that follow a full disk."""

from __future__ import annotations

from porter_mesh.core.session.keys import KEY_PREFIX
from porter_mesh.core.session.receiving import (
    LOST_BROADCAST,
    MISADDRESSED,
    UNKNOWN_SENDER,
    DirectReceiver,
    Receipt,
    Receiving,
    Step,
    Verdict,
)

WALL = 1_700_000_000.0
ROOMY = {"room": None, "consumer": True, "held_full": False}


def admit(rx: DirectReceiver, seq: int, *, msg_id: str = "m", count: int = 1,
          incarnation: int = 7, wall: float = WALL, **capacity: object) -> Verdict:
    kw: dict[str, object] = {**ROOMY, **capacity}
    return rx.admit("alice", incarnation, seq, count, msg_id, wall=wall, **kw)  # type: ignore[arg-type]


def test_a_message_is_new_once_then_a_duplicate_acknowledged_again() -> None:
    rx = DirectReceiver(key_window=600)
    assert admit(rx, 1) is Verdict.NEW
    assert admit(rx, 1) is Verdict.DUPLICATE and Verdict.DUPLICATE.acknowledged
    assert admit(rx, 2, count=3) is Verdict.NEW
    assert admit(rx, 2, count=3) is Verdict.DUPLICATE
    # Retries that overtake each other are still told apart.
    assert admit(rx, 6) is Verdict.NEW and admit(rx, 5) is Verdict.NEW


def test_a_new_incarnation_starts_a_new_stream_once_the_old_is_forgotten() -> None:
    rx = DirectReceiver(key_window=600)
    assert admit(rx, 1) is Verdict.NEW
    rx.forget("alice")
    assert admit(rx, 1, incarnation=8) is Verdict.NEW


def test_no_room_no_consumer_or_too_much_held_refuse_without_recording() -> None:
    rx = DirectReceiver(key_window=600)
    assert admit(rx, 1, room=0) is Verdict.NO_ROOM
    assert admit(rx, 1, count=3, room=2) is Verdict.NO_ROOM
    assert admit(rx, 1, consumer=False) is Verdict.NO_CONSUMER
    assert admit(rx, 1, held_full=True) is Verdict.HELD_FULL
    assert not any(v.acknowledged for v in (Verdict.NO_ROOM, Verdict.NO_CONSUMER,
                                            Verdict.HELD_FULL, Verdict.NEW))
    # None of them counted as seen: the retry, once there is room, is new.
    assert admit(rx, 1, room=1) is Verdict.NEW


def test_an_idempotency_key_inside_and_outside_its_window() -> None:
    rx = DirectReceiver(key_window=600)
    keyed = KEY_PREFIX + "order-1"
    assert admit(rx, 1, msg_id=keyed) is Verdict.NEW
    # The sender restarted and sends the same key under a new sequence.
    assert admit(rx, 1, msg_id=keyed, incarnation=9, wall=WALL + 599) is Verdict.DUPLICATE_KEY
    assert admit(rx, 2, msg_id=keyed, incarnation=9, wall=WALL + 1200) is Verdict.NEW


def test_a_message_refused_by_a_full_disk_is_new_again_key_and_all() -> None:
    rx = DirectReceiver(key_window=600)
    keyed = KEY_PREFIX + "order-1"
    assert admit(rx, 1, msg_id=keyed) is Verdict.NEW
    rx.refused("alice", 7, 1, keyed)  # the journal could not write it
    assert admit(rx, 1, msg_id=keyed) is Verdict.NEW
    assert admit(rx, 1, msg_id=keyed) is Verdict.DUPLICATE  # kept this time


def test_a_declined_message_held_in_memory_is_not_acknowledged_until_taken() -> None:
    rx = DirectReceiver(key_window=600)
    assert admit(rx, 1) is Verdict.NEW
    rx.hold("alice", 7, 1)
    assert admit(rx, 1) is Verdict.HELD and not Verdict.HELD.acknowledged
    rx.taken("alice", 7, 1)
    assert admit(rx, 1) is Verdict.DUPLICATE


def test_messages_journaled_by_an_earlier_run_are_duplicates() -> None:
    rx = DirectReceiver(key_window=600)
    rx.restore("alice", 7, 1, 200_000, None, WALL)  # a compacted run longer than the window
    rx.restore("alice", 7, 200_001, 1, "order-1", WALL - 10)
    assert admit(rx, 200_000) is Verdict.DUPLICATE
    assert admit(rx, 200_001) is Verdict.DUPLICATE
    assert admit(rx, 200_002) is Verdict.NEW
    assert admit(rx, 1, msg_id=KEY_PREFIX + "order-1", incarnation=8) is Verdict.DUPLICATE_KEY


# -- Receiving: each arrival's receipt, which the node and the endpoint carry out -------

def direct(rx: Receiving, seq: int, *, known: bool = True, recipient: str = "bob",
           count: int = 1, msg_id: str = "m", **capacity: object) -> Receipt:
    kw: dict[str, object] = {**ROOMY, **capacity}
    return rx.direct_message("alice", 7, recipient, seq, count, msg_id, known=known,
                             me="bob", wall=WALL, **kw)  # type: ignore[arg-type]


def test_a_new_direct_message_is_journaled_then_delivered_then_acknowledged() -> None:
    rx = Receiving(key_window=600, journal=True)
    assert direct(rx, 1) == Receipt((Step.JOURNAL, Step.DELIVER, Step.ACK))
    # Without a journal it is delivered, and acknowledged once taken.
    rx = Receiving(key_window=600)
    assert direct(rx, 1) == Receipt((Step.DELIVER,))
    assert rx.taken("alice", 7, 1) == Receipt((Step.ACK,))


def test_a_duplicate_is_counted_and_acknowledged_again_never_delivered() -> None:
    rx = Receiving(key_window=600, journal=True)
    direct(rx, 1, count=3)
    assert direct(rx, 1, count=3) == Receipt((Step.ACK,), "duplicate.direct", 3)
    assert direct(rx, 4, msg_id=KEY_PREFIX + "k") == Receipt(
        (Step.JOURNAL, Step.DELIVER, Step.ACK))
    assert direct(rx, 5, msg_id=KEY_PREFIX + "k") == Receipt((Step.ACK,), "duplicate.key", 1)


def test_an_unknown_sender_or_another_recipient_is_counted_and_not_acknowledged() -> None:
    rx = Receiving(key_window=600, journal=True)
    assert direct(rx, 1, known=False) is UNKNOWN_SENDER
    assert Receipt((), "dropped.unknown-peer", 1) == UNKNOWN_SENDER
    assert direct(rx, 1, recipient="carol") is MISADDRESSED
    assert Receipt((), "dropped.misaddressed", 1) == MISADDRESSED
    # Neither was recorded as seen: once introduced, the retry is new.
    assert Step.DELIVER in direct(rx, 1).steps


def test_no_room_is_counted_once_per_arrival_and_not_acknowledged() -> None:
    rx = Receiving(key_window=600, journal=True)
    assert direct(rx, 1, count=5, room=2) == Receipt((), "backpressure.inbox", 1)
    assert direct(rx, 1, count=5, room=None, consumer=False) == Receipt(
        (), "backpressure.no-consumer", 1)
    assert direct(rx, 1, count=5, held_full=True) == Receipt((), "backpressure.held", 1)
    assert Step.DELIVER in direct(rx, 1, count=5).steps


def test_a_declined_message_holds_its_retries_unacknowledged_until_taken() -> None:
    rx = Receiving(key_window=600)
    direct(rx, 1, count=2)
    assert rx.declined("alice", 7, 1) == Receipt((), "declined.direct", 1)
    assert direct(rx, 1, count=2) == Receipt((), "duplicate.held", 2)
    assert rx.taken("alice", 7, 1) == Receipt((Step.ACK,))
    assert direct(rx, 1, count=2) == Receipt((Step.ACK,), "duplicate.direct", 2)


def test_a_failed_journal_write_is_counted_and_its_retry_is_new_again() -> None:
    rx = Receiving(key_window=600, journal=True)
    direct(rx, 1, count=4, msg_id=KEY_PREFIX + "k")
    assert rx.journal_failed("alice", 7, 1, KEY_PREFIX + "k", 4) == Receipt(
        (), "refused.disk", 4)
    assert direct(rx, 1, count=4, msg_id=KEY_PREFIX + "k").steps == (
        Step.JOURNAL, Step.DELIVER, Step.ACK)


def test_a_broadcast_is_delivered_with_its_gaps_and_repeats_counted() -> None:
    rx = Receiving(key_window=600)
    assert rx.broadcast("alice", "log", 7, 1, 1, known=False) is UNKNOWN_SENDER
    # A late joiner starts where it joins.
    assert rx.broadcast("alice", "log", 7, 10, 2, known=True) == Receipt((Step.DELIVER,))
    assert rx.broadcast("alice", "log", 7, 12, 1, known=True) == Receipt((Step.DELIVER,))
    assert rx.broadcast("alice", "log", 7, 16, 1, known=True) == Receipt(
        (Step.DELIVER,), LOST_BROADCAST, 3)
    assert rx.broadcast("alice", "log", 7, 16, 1, known=True) == Receipt(
        (Step.DELIVER,), "duplicate.broadcast", 1)
    # Each channel is numbered apart.
    assert rx.broadcast("alice", "task", 7, 1, 1, known=True) == Receipt((Step.DELIVER,))


def test_a_heartbeat_position_past_what_arrived_counts_the_tail_as_lost() -> None:
    rx = Receiving(key_window=600)
    rx.broadcast("alice", "log", 7, 1, 1, known=True)
    assert rx.position("alice", "log", 7, 1) == Receipt(())
    assert rx.position("alice", "log", 7, 4) == Receipt((), LOST_BROADCAST, 3)
    assert rx.position("alice", "log", 7, 4) == Receipt(())


def test_a_restarted_sender_is_forgotten_on_both_sides() -> None:
    rx = Receiving(key_window=600, journal=True)
    direct(rx, 1)
    rx.broadcast("alice", "log", 7, 5, 1, known=True)
    rx.forget("alice")
    assert rx.direct.tracker.incarnation("alice") is None
    assert rx.broadcasts.incarnation("alice") is None
