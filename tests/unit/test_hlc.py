"""Hybrid logical clock: packing, monotonicity, merging within the skew bound, and
leaving the clock alone beyond it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from porter_mesh.core.hlc import (
    DEFAULT_MAX_SKEW_MS,
    HLC_MAX,
    LOGICAL_MAX,
    MAX_SKEW_LIMIT_MS,
    PHYSICAL_MAX,
    HybridClock,
    hlc_pack,
    hlc_physical_ms,
    hlc_unpack,
)
from porter_mesh.errors import ClockError

NOW_MS = 1_778_000_000_000  # a fixed "now" in 2026, in milliseconds
walls = st.integers(min_value=0, max_value=PHYSICAL_MAX - 1)


# -- packing -------------------------------------------------------------------------


def test_pack_puts_physical_in_high_bits() -> None:
    assert hlc_pack(NOW_MS, 7) == NOW_MS << 16 | 7
    assert hlc_unpack(hlc_pack(NOW_MS, 7)) == (NOW_MS, 7)
    assert hlc_physical_ms(hlc_pack(NOW_MS, 7)) == NOW_MS


def test_packed_order_is_physical_then_logical() -> None:
    assert hlc_pack(5, LOGICAL_MAX) < hlc_pack(6, 0)
    assert hlc_pack(5, 1) < hlc_pack(5, 2)


@pytest.mark.parametrize(
    ("physical", "logical"),
    [(-1, 0), (PHYSICAL_MAX + 1, 0), (0, -1), (0, LOGICAL_MAX + 1), (1.5, 0), (True, 0)],
)
def test_pack_rejects_out_of_range(physical: object, logical: object) -> None:
    with pytest.raises(ClockError) as info:
        hlc_pack(physical, logical)  # type: ignore[arg-type]
    assert info.value.reason == "out-of-range"


@pytest.mark.parametrize("ts", [-1, HLC_MAX + 1, "12", None])
def test_unpack_rejects_out_of_range(ts: object) -> None:
    with pytest.raises(ClockError) as info:
        hlc_unpack(ts)  # type: ignore[arg-type]
    assert info.value.reason == "out-of-range"


@given(st.integers(0, PHYSICAL_MAX), st.integers(0, LOGICAL_MAX))
def test_pack_unpack_round_trip(physical: int, logical: int) -> None:
    assert hlc_unpack(hlc_pack(physical, logical)) == (physical, logical)


# -- local events --------------------------------------------------------------------


def test_now_follows_wall_clock_and_resets_logical() -> None:
    clock = HybridClock()
    assert clock.last == 0
    assert clock.now(NOW_MS) == hlc_pack(NOW_MS, 0)
    assert clock.now(NOW_MS) == hlc_pack(NOW_MS, 1)
    assert clock.now(NOW_MS + 1) == hlc_pack(NOW_MS + 1, 0)
    assert clock.last == hlc_pack(NOW_MS + 1, 0)


def test_now_survives_backwards_wall_jump() -> None:
    clock = HybridClock()
    first = clock.now(NOW_MS)
    second = clock.now(NOW_MS - 3_600_000)  # the wall clock jumps back an hour
    assert second == first + 1
    assert hlc_unpack(second) == (NOW_MS, 1)


def test_logical_overflow_advances_physical() -> None:
    clock = HybridClock()
    clock.now(NOW_MS)
    for _ in range(LOGICAL_MAX):
        clock.now(NOW_MS)
    assert hlc_unpack(clock.last) == (NOW_MS, LOGICAL_MAX)
    assert hlc_unpack(clock.now(NOW_MS)) == (NOW_MS + 1, 0)


@pytest.mark.parametrize("wall", [-1, PHYSICAL_MAX + 1, 1.0, "now"])
def test_now_rejects_bad_wall_clock(wall: object) -> None:
    clock = HybridClock()
    with pytest.raises(ClockError) as info:
        clock.now(wall)  # type: ignore[arg-type]
    assert info.value.reason == "bad-wall-clock"
    assert clock.last == 0


def test_exhausted_clock_refuses() -> None:
    clock = HybridClock()
    assert clock.receive(HLC_MAX - 1, PHYSICAL_MAX) is None
    assert clock.last == HLC_MAX
    with pytest.raises(ClockError) as info:
        clock.now(PHYSICAL_MAX)
    assert info.value.reason == "exhausted"
    assert clock.last == HLC_MAX


@pytest.mark.parametrize("bound", [-1, MAX_SKEW_LIMIT_MS + 1, 1.5])
def test_bad_skew_bound_is_refused(bound: object) -> None:
    with pytest.raises(ClockError) as info:
        HybridClock(max_skew_ms=bound)  # type: ignore[arg-type]
    assert info.value.reason == "bad-config"


def test_default_bound_is_a_day() -> None:
    assert HybridClock().max_skew_ms == DEFAULT_MAX_SKEW_MS == 86_400_000


# -- receive events ------------------------------------------------------------------


def test_receive_moves_past_a_remote_ahead() -> None:
    clock = HybridClock()
    clock.now(NOW_MS)
    remote = hlc_pack(NOW_MS + 500, 3)
    assert clock.receive(remote, NOW_MS) is None
    assert clock.last == hlc_pack(NOW_MS + 500, 4)
    # Local events keep counting from the merged time while the wall clock lags.
    assert clock.now(NOW_MS + 1) == hlc_pack(NOW_MS + 500, 5)


def test_receive_with_remote_behind_just_ticks() -> None:
    clock = HybridClock()
    local = clock.now(NOW_MS)
    assert clock.receive(hlc_pack(NOW_MS - 10_000, 9), NOW_MS) is None
    assert clock.last == local + 1


@pytest.mark.parametrize("skew_s", [300, -300, 3600, -3600, 86_400, -86_400])
def test_lab_skews_are_adopted_by_default(skew_s: int) -> None:
    # Minutes (no NTP) and hours (a hardware clock in local time) are within the bound.
    clock = HybridClock()
    remote = hlc_pack(NOW_MS + skew_s * 1000, 0)
    assert clock.receive(remote, NOW_MS) is None
    assert clock.last > remote and clock.last >= hlc_pack(NOW_MS, 0)


@pytest.mark.parametrize("offset", [1_001, -1_001, 10**9, -(NOW_MS - 1)])
def test_receive_beyond_the_bound_reports_the_offset_and_keeps_state(offset: int) -> None:
    clock = HybridClock(max_skew_ms=1_000)
    before = clock.now(NOW_MS)
    assert clock.receive(hlc_pack(NOW_MS + offset, 7), NOW_MS) == offset
    assert clock.last == before
    # Exactly at the bound, either way, is still adopted.
    assert clock.receive(hlc_pack(NOW_MS - 1_000, 0), NOW_MS) is None
    assert clock.receive(hlc_pack(NOW_MS + 1_000, 0), NOW_MS) is None
    assert clock.last == hlc_pack(NOW_MS + 1_000, 1)


def test_receive_rejects_malformed_remote() -> None:
    clock = HybridClock()
    for bad in (-1, HLC_MAX + 1, 2.5):
        with pytest.raises(ClockError) as info:
            clock.receive(bad, NOW_MS)  # type: ignore[arg-type]
        assert info.value.reason == "out-of-range"
    assert clock.last == 0


# -- properties ------------------------------------------------------------------------


@given(st.lists(walls, min_size=1, max_size=200))
def test_now_is_strictly_monotonic_for_any_wall_sequence(wall_seq: list[int]) -> None:
    clock = HybridClock()
    previous = -1
    for wall in wall_seq:
        ts = clock.now(wall)
        assert ts > previous
        assert hlc_physical_ms(ts) >= wall
        previous = ts


@given(
    st.lists(
        st.tuples(st.booleans(), walls, st.integers(-5_000, 5_000), st.integers(0, LOGICAL_MAX)),
        min_size=1,
        max_size=200,
    )
)
def test_merge_exceeds_both_and_beyond_the_bound_keeps_state(
    events: list[tuple[bool, int, int, int]],
) -> None:
    clock = HybridClock(max_skew_ms=2_000)
    for is_receive, wall, skew, logical in events:
        before = clock.last
        if not is_receive:
            assert clock.now(wall) > before
            continue
        remote_ms = min(max(wall + skew, 0), PHYSICAL_MAX)
        remote = hlc_pack(remote_ms, logical)
        if abs(remote_ms - wall) > 2_000:
            assert clock.receive(remote, wall) == remote_ms - wall
            assert clock.last == before
        elif max(remote, before) >= HLC_MAX:
            # The very end of the 64-bit space: nothing can order after it.
            with pytest.raises(ClockError, match="exhausted"):
                clock.receive(remote, wall)
            assert clock.last == before
        else:
            assert clock.receive(remote, wall) is None
            assert clock.last > before
            assert clock.last > remote


def test_two_clocks_order_a_causal_chain() -> None:
    # Node B's wall clock is 5 minutes behind A's; replies must still order after requests.
    a, b = HybridClock(), HybridClock()
    request = a.now(NOW_MS)
    assert b.receive(request, NOW_MS - 300_000) is None
    seen = b.last
    reply = b.now(NOW_MS - 300_000)
    assert request < seen < reply
    assert a.receive(reply, NOW_MS) is None
    assert a.last > reply
