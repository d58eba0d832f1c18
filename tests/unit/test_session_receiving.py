"""The receiver's verdict on each arrival of a direct message, with no socket: new,
duplicate, held, refused for room, and the retries that follow a full disk."""

from __future__ import annotations

from porter_mesh.core.session.keys import KEY_PREFIX
from porter_mesh.core.session.receiving import DirectReceiver, Verdict

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
