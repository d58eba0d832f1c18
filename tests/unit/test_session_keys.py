"""The receiver's idempotency-key window, on a virtual wall clock (no sockets)."""

from __future__ import annotations

from porter_mesh.core.session.keys import KEY_PREFIX, IdempotencyKeys, key_of

T0 = 1_700_000_000.0


def test_a_key_inside_its_window_is_a_duplicate() -> None:
    keys = IdempotencyKeys(window=600)
    assert not keys.seen("alice", "order-1", T0)
    assert keys.seen("alice", "order-1", T0 + 599.9)
    # The same key from another sender is another message.
    assert not keys.seen("bob", "order-1", T0 + 1)


def test_a_key_outside_its_window_is_new_again() -> None:
    keys = IdempotencyKeys(window=600)
    assert not keys.seen("alice", "order-1", T0)
    assert not keys.seen("alice", "order-1", T0 + 600)
    # ... and its window starts again from that arrival.
    assert keys.seen("alice", "order-1", T0 + 1199)


def test_expired_keys_leave_as_new_ones_come() -> None:
    keys = IdempotencyKeys(window=10)
    for i in range(5):
        keys.seen("alice", f"k{i}", T0 + i)
    assert len(keys) == 5
    keys.seen("alice", "late", T0 + 13)  # k0..k3 expired by now
    assert len(keys) == 2


def test_past_the_limit_the_oldest_key_goes_first() -> None:
    keys = IdempotencyKeys(window=600, limit=3)
    for i in range(4):
        assert not keys.seen("alice", f"k{i}", T0 + i)
    assert len(keys) == 3
    assert not keys.seen("alice", "k0", T0 + 5)  # forgotten: delivered again
    assert keys.seen("alice", "k3", T0 + 5)


def test_keys_restored_from_an_earlier_run_keep_their_arrival_time() -> None:
    keys = IdempotencyKeys(window=600)
    keys.restore("alice", "order-1", T0)
    assert keys.seen("alice", "order-1", T0 + 500)
    assert not keys.seen("alice", "order-1", T0 + 601)


def test_a_forgotten_key_lets_its_retry_land() -> None:
    keys = IdempotencyKeys(window=600)
    assert not keys.seen("alice", "order-1", T0)
    keys.forget("alice", "order-1")  # its message could not be journaled
    assert not keys.seen("alice", "order-1", T0 + 1)


def test_the_key_travels_as_the_message_id() -> None:
    assert key_of(KEY_PREFIX + "order-1") == "order-1"
    assert key_of("0123abcd:task:bob:1") is None
