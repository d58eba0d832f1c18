"""Sequence tracking: every verdict, bounds, and the exactly-once property."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from porter_mesh.core.sequence import (
    RETIRED_INCARNATIONS,
    SeqResult,
    SequenceTracker,
    SeqVerdict,
)
from porter_mesh.errors import ConfigError, FrameError
from tests.fuzzing import examples

V = SeqVerdict
INC = 0x1234_5678_9ABC
OTHER_INC = 0x0FED_CBA9


def feed(tracker: SequenceTracker, seqs: list[int], inc: int = INC) -> list[SeqResult]:
    return [tracker.observe("w1", "log", inc, s) for s in seqs]


def verdicts(results: list[SeqResult]) -> list[SeqVerdict]:
    return [r.verdict for r in results]


# -- verdicts ----------------------------------------------------------------------------


def test_in_order_stream() -> None:
    t = SequenceTracker()
    assert verdicts(feed(t, [1, 2, 3])) == [V.FIRST, V.IN_ORDER, V.IN_ORDER]
    assert t.missing("w1", "log") == []
    s = t.stats()
    assert (s.received, s.gaps, s.lost, s.duplicates) == (3, 0, 0, 0)


def test_gap_then_late_fill() -> None:
    t = SequenceTracker()
    results = feed(t, [1, 2, 6])
    assert results[2] == SeqResult(V.GAP, (3, 5))
    assert t.missing("w1", "log") == [(3, 5)]
    assert t.observe("w1", "log", INC, 4).verdict is V.LATE
    assert t.missing("w1", "log") == [(3, 3), (5, 5)]
    assert verdicts(feed(t, [3, 5, 7])) == [V.LATE, V.LATE, V.IN_ORDER]
    assert t.missing("w1", "log") == []
    s = t.stats()
    assert (s.gaps, s.lost, s.late, s.received) == (1, 3, 3, 7)


def test_duplicates_below_and_inside_the_window() -> None:
    t = SequenceTracker()
    feed(t, [1, 2, 5])
    assert verdicts(feed(t, [1, 2, 5])) == [V.DUPLICATE] * 3
    assert t.stats().duplicates == 3
    assert not t.observe("w1", "log", INC, 2).is_new


def test_streams_and_senders_are_independent() -> None:
    t = SequenceTracker()
    assert t.observe("w1", "log", INC, 1).verdict is V.FIRST
    assert t.observe("w1", "task", INC, 1).verdict is V.FIRST
    assert t.observe("w2", "log", OTHER_INC, 1).verdict is V.FIRST
    assert t.observe("w1", "log", INC, 2).verdict is V.IN_ORDER
    assert len(t) == 3


def test_first_above_one_expects_earlier_sequences_by_default() -> None:
    t = SequenceTracker()
    first = t.observe("w1", "task:w2", INC, 4)
    assert first == SeqResult(V.FIRST, (1, 3))
    # Retries that overtook one another still run once each.
    assert verdicts([t.observe("w1", "task:w2", INC, s) for s in (2, 1, 3, 2)]) == [
        V.LATE,
        V.LATE,
        V.LATE,
        V.DUPLICATE,
    ]


def test_late_joiner_starts_where_it_joins() -> None:
    t = SequenceTracker(from_start=False)
    assert t.observe("w1", "log", INC, 500) == SeqResult(V.FIRST)
    assert t.observe("w1", "log", INC, 499).verdict is V.DUPLICATE
    assert t.observe("w1", "log", INC, 501).verdict is V.IN_ORDER
    assert t.stats().lost == 0


def test_new_incarnation_resets_every_stream_of_the_sender() -> None:
    t = SequenceTracker()
    feed(t, [1, 2, 3])
    t.observe("w1", "task", INC, 1)
    assert t.observe("w1", "log", OTHER_INC, 1).verdict is V.NEW_INCARNATION
    assert t.incarnation("w1") == OTHER_INC
    assert t.observe("w1", "task", OTHER_INC, 1).verdict is V.FIRST
    assert t.observe("w1", "log", OTHER_INC, 2).verdict is V.IN_ORDER
    assert t.stats().restarts == 1


def test_stale_incarnation_after_a_restart() -> None:
    t = SequenceTracker()
    feed(t, [1, 2])
    t.observe("w1", "log", OTHER_INC, 1)
    result = t.observe("w1", "log", INC, 3)
    assert result.verdict is V.STALE_INCARNATION
    assert not result.is_new
    assert t.stats().stale == 1
    # The current incarnation's state is untouched.
    assert t.observe("w1", "log", OTHER_INC, 2).verdict is V.IN_ORDER


def test_only_recent_incarnations_are_remembered() -> None:
    t = SequenceTracker()
    incs = list(range(1, RETIRED_INCARNATIONS + 3))
    for inc in incs:
        t.observe("w1", "log", inc, 1)
    assert t.observe("w1", "log", incs[-2], 5).verdict is V.STALE_INCARNATION
    # The oldest fell out of memory: it reads as another restart.
    assert t.observe("w1", "log", incs[0], 5).verdict is V.NEW_INCARNATION


def test_observe_last_detects_tail_loss_without_marking_received() -> None:
    t = SequenceTracker()
    feed(t, [1, 2])
    assert t.observe_last("w1", "log", INC, 2) == SeqResult(V.IN_ORDER)
    assert t.observe_last("w1", "log", INC, 5) == SeqResult(V.GAP, (3, 5))
    assert t.missing("w1", "log") == [(3, 5)]
    assert t.observe_last("w1", "log", INC, 5) == SeqResult(V.IN_ORDER)
    assert t.observe("w1", "log", INC, 4).verdict is V.LATE
    assert t.observe("w1", "log", INC, 6).verdict is V.IN_ORDER
    assert t.missing("w1", "log") == [(3, 3), (5, 5)]
    assert t.stats().received == 4


def test_observe_last_on_unknown_stream() -> None:
    strict = SequenceTracker()
    assert strict.observe_last("w1", "log", INC, 3) == SeqResult(V.FIRST, (1, 3))
    assert strict.observe("w1", "log", INC, 1).verdict is V.LATE
    assert strict.observe_last("w1", "task", INC, 0) == SeqResult(V.FIRST)
    assert strict.observe("w1", "task", INC, 1).verdict is V.IN_ORDER
    lenient = SequenceTracker(from_start=False)
    assert lenient.observe_last("w1", "log", INC, 3) == SeqResult(V.FIRST)
    assert lenient.observe("w1", "log", INC, 4).verdict is V.IN_ORDER
    assert strict.observe_last("w1", "log", OTHER_INC, 2).verdict is V.NEW_INCARNATION
    assert strict.observe_last("w1", "log", INC, 9).verdict is V.STALE_INCARNATION


def test_observe_range_batches() -> None:
    t = SequenceTracker()
    assert t.observe_range("w1", "log", INC, 1, 64) == SeqResult(V.FIRST)
    assert t.observe_range("w1", "log", INC, 65, 64) == SeqResult(V.IN_ORDER)
    assert t.observe_range("w1", "log", INC, 65, 64) == SeqResult(V.DUPLICATE)
    assert t.observe_range("w1", "log", INC, 200, 10) == SeqResult(V.GAP, (129, 199))
    # A batch overlapping what was seen reports how much of it was old.
    assert t.observe_range("w1", "log", INC, 205, 10) == SeqResult(V.IN_ORDER, None, 5)
    assert t.observe_range("w1", "log", INC, 129, 3).verdict is V.LATE
    assert t.stats().received == 64 + 64 + 10 + 5 + 3
    t.observe("w1", "log", OTHER_INC, 1)
    assert t.observe_range("w1", "log", INC, 300, 2).verdict is V.STALE_INCARNATION


def test_window_bounds_tracking_and_fails_safe() -> None:
    t = SequenceTracker(window=8)
    t.observe("w1", "log", INC, 1)
    assert t.observe("w1", "log", INC, 20) == SeqResult(V.GAP, (2, 19))
    # Only the last 8 sequences are tracked: the older part of the gap is given up...
    assert t.missing("w1", "log") == [(13, 19)]
    # ...and an arrival there is refused rather than risk running it twice.
    assert t.observe("w1", "log", INC, 5).verdict is V.DUPLICATE
    assert t.observe("w1", "log", INC, 13).verdict is V.LATE
    assert t.stats().lost == 18


def test_huge_jump_does_not_allocate_a_huge_bitmap() -> None:
    t = SequenceTracker()
    t.observe("w1", "log", INC, 1)
    result = t.observe("w1", "log", INC, 2**62)
    assert result == SeqResult(V.GAP, (2, 2**62 - 1))
    assert len(t.missing("w1", "log")) == 1
    first = SequenceTracker().observe("w1", "log", INC, 2**63 - 1)
    assert first.missing == (1, 2**63 - 2)


def test_lru_eviction_bounds_streams() -> None:
    t = SequenceTracker(max_streams=2)
    t.observe("w1", "a", INC, 1)
    t.observe("w2", "b", INC, 1)
    t.observe("w1", "a", INC, 2)  # touches a: b is now least recently used
    t.observe("w3", "c", INC, 1)
    assert len(t) == 2
    assert t.incarnation("w2") is None
    assert t.missing("w2", "b") == []
    assert t.observe("w1", "a", INC, 3).verdict is V.IN_ORDER
    assert t.stats().evicted == 1


def test_forget_drops_a_sender() -> None:
    t = SequenceTracker()
    feed(t, [1, 2])
    t.observe("w1", "task", INC, 1)
    t.observe("w2", "log", INC, 1)
    t.forget("w1")
    t.forget("nobody")
    assert len(t) == 1
    assert t.incarnation("w1") is None
    assert t.observe("w1", "log", INC, 3) == SeqResult(V.FIRST, (1, 2))


@pytest.mark.parametrize("seq", [0, -1, 2**63, 1.0, "1", None, True])
def test_bad_sequences_raise_frame_error(seq: object) -> None:
    t = SequenceTracker()
    t.observe("w1", "log", INC, 1)  # a known stream takes the fast path first
    for tracker in (t, SequenceTracker()):
        with pytest.raises(FrameError) as info:
            tracker.observe("w1", "log", INC, seq)  # type: ignore[arg-type]
        assert info.value.reason == "bad-seq"


def test_bad_ranges_and_last_raise_frame_error() -> None:
    t = SequenceTracker()
    with pytest.raises(FrameError):
        t.observe_range("w1", "log", INC, 1, 0)
    with pytest.raises(FrameError):
        t.observe_range("w1", "log", INC, 1, 10**9)
    with pytest.raises(FrameError):
        t.observe_range("w1", "log", INC, 2**63 - 1, 2)
    with pytest.raises(FrameError):
        t.observe_last("w1", "log", INC, -1)
    with pytest.raises(FrameError) as info:
        t.observe("w1", "log", "inc", 1)  # type: ignore[arg-type]
    assert info.value.reason == "bad-incarnation"


@pytest.mark.parametrize("kwargs", [{"window": 0}, {"max_streams": 0}, {"window": 1.5}])
def test_bad_config(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        SequenceTracker(**kwargs)  # type: ignore[arg-type]


# -- properties ------------------------------------------------------------------------


@st.composite
def shuffled_with_duplicates(draw: st.DrawFn) -> list[int]:
    n = draw(st.integers(1, 120))
    extra = draw(st.lists(st.integers(1, n), max_size=60))
    return draw(st.permutations(list(range(1, n + 1)) + extra))


@given(shuffled_with_duplicates())
def test_each_sequence_is_new_exactly_once(seqs: list[int]) -> None:
    t = SequenceTracker()
    accepted: list[int] = []
    declared: set[int] = set()
    for seq in seqs:
        result = t.observe("w1", "task:w2", INC, seq)
        if result.is_new:
            accepted.append(seq)
        if result.missing is not None:
            lo, hi = result.missing
            new = set(range(lo, hi + 1))
            assert not new & declared, "a sequence was declared missing twice"
            declared |= new
        if result.verdict is V.LATE:
            assert seq in declared
    assert sorted(accepted) == sorted(set(seqs))
    s = t.stats()
    assert s.received == len(accepted)
    assert s.duplicates == len(seqs) - len(accepted)
    # Everything arrived in the end: each loss was filled, nothing is outstanding.
    assert s.lost == len(declared) == s.late
    assert t.missing("w1", "task:w2") == []


@given(st.integers(1, 40), st.integers(1, 8), st.data())
def test_batches_resent_in_any_order_are_new_once(
    batches: int, size: int, data: st.DataObject
) -> None:
    order = data.draw(
        st.permutations(list(range(batches)) + data.draw(st.lists(st.integers(0, batches - 1))))
    )
    t = SequenceTracker()
    fresh = 0
    for b in order:
        result = t.observe_range("w1", "task:w2", INC, 1 + b * size, size)
        if result.is_new:
            assert result.duplicates == 0  # whole batches only: all new or all seen
            fresh += 1
    assert fresh == batches
    assert t.stats().received == batches * size
    assert t.missing("w1", "task:w2") == []


@given(shuffled_with_duplicates(), st.data())
def test_missing_matches_a_reference_model(seqs: list[int], data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(seqs)))
    t = SequenceTracker()
    for seq in seqs[:cut]:
        t.observe("w1", "log", INC, seq)
    seen = set(seqs[:cut])
    top = max(seen, default=0)
    expected = sorted(set(range(1, top + 1)) - seen)
    flat = [s for lo, hi in t.missing("w1", "log") for s in range(lo, hi + 1)]
    assert flat == expected


@given(st.lists(st.integers(1, 300), max_size=300), st.integers(1, 32))
@settings(max_examples=examples(50))
def test_small_window_never_accepts_twice(seqs: list[int], window: int) -> None:
    t = SequenceTracker(window=window)
    accepted = [s for s in seqs if t.observe("w1", "log", INC, s).is_new]
    assert len(accepted) == len(set(accepted))
    for lo, hi in t.missing("w1", "log"):
        assert lo <= hi


def test_memory_stays_bounded_under_many_streams() -> None:
    t = SequenceTracker(max_streams=1_000)
    for i in range(100_000):
        t.observe(f"agent-{i}", "log", INC, 5)
    assert len(t) == 1_000
    assert t.stats().evicted == 99_000
    # Once full, a further flood of new streams allocates nothing that stays.
    tracemalloc.start()
    try:
        for i in range(100_000, 110_000):
            t.observe(f"agent-{i}", "log", INC, 5)
        full, _ = tracemalloc.get_traced_memory()
        for i in range(110_000, 130_000):
            t.observe(f"agent-{i}", "log", INC, 5)
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(t) == 1_000
    assert full < 2_000 * 1_000, f"1000 streams hold {full} bytes"
    assert after - full < 16 * 1024, f"grew by {after - full} bytes"
