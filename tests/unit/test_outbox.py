"""Direct-delivery outbox: allocation, acks, backoff, deadlines, bounds."""

from __future__ import annotations

import itertools

import pytest

from porter_mesh.core.outbox import Outbox


def make() -> Outbox[str]:
    return Outbox(retry_initial=0.1, retry_max=0.4, max_pending=3)


def test_sequences_are_contiguous_per_recipient() -> None:
    ob = make()
    assert ob.allocate("a", 5) == 1
    assert ob.allocate("a", 1) == 6
    assert ob.allocate("b", 1) == 1


def test_ack_settles_and_repeated_ack_is_harmless() -> None:
    ob = make()
    first = ob.allocate("a", 2)
    ob.add("a", first, 2, [b"x"], deadline=10, now=0, token="t")
    assert ob.pending_for("a") == 1
    entry = ob.acked("a", first)
    assert entry is not None and entry.token == "t"
    assert ob.acked("a", first) is None
    assert len(ob) == 0 and ob.poll(100) == ([], [])


def test_backoff_doubles_to_the_cap_then_deadline_fails() -> None:
    ob = make()
    ob.add("a", ob.allocate("a", 1), 1, [b"x"], deadline=2.0, now=0.0, token="t")
    times = []
    now = 0.0
    while True:
        now += 0.01
        resend, failed = ob.poll(now)
        if resend:
            times.append(round(now, 2))
        if failed:
            assert failed[0].token == "t"
            break
    gaps = [round(b - a, 2) for a, b in itertools.pairwise(times)]
    assert times[0] == pytest.approx(0.1, abs=0.011)
    assert gaps[:2] == [pytest.approx(0.2, abs=0.011), pytest.approx(0.4, abs=0.011)]
    assert all(g <= 0.41 for g in gaps)
    assert now == pytest.approx(2.0, abs=0.011)


def test_bounded_per_recipient() -> None:
    ob = make()
    for _ in range(3):
        ob.add("a", ob.allocate("a", 1), 1, [b"x"], deadline=9, now=0, token="t")
    with pytest.raises(OverflowError):
        ob.allocate("a", 1)
    ob.allocate("b", 1)  # other recipients are unaffected


def test_retry_now_and_fail_all() -> None:
    ob = make()
    ob.add("a", ob.allocate("a", 1), 1, [b"x"], deadline=9, now=0, token="t1")
    ob.add("b", ob.allocate("b", 1), 1, [b"y"], deadline=9, now=0, token="t2")
    assert [e.token for e in ob.retry_now("a", 0.05)] == ["t1"]
    assert sorted(e.token for e in ob.fail_all()) == ["t1", "t2"]
    assert len(ob) == 0


def test_retransmission_timeout_follows_measured_ack_times() -> None:
    ob = make()  # retry_initial 0.1, retry_max 0.4
    assert ob.rto == 0.1
    for i in range(20):  # acks take 0.3 s: a deep pipeline
        first = ob.allocate("a", 1)
        ob.add("a", first, 1, [b"x"], deadline=99, now=i, token="t")
        ob.acked("a", first, now=i + 0.3)
    assert 0.3 <= ob.rto <= 0.4
    first = ob.allocate("a", 1)
    ob.add("a", first, 1, [b"x"], deadline=999, now=100.0, token="t")
    assert ob.poll(100.25) == ([], [])  # a fixed 0.1 s timer would have resent by now
    for _ in range(40):  # acks become fast again: the timer comes back down
        first = ob.allocate("b", 1)
        ob.add("b", first, 1, [b"x"], deadline=999, now=200, token="t")
        ob.acked("b", first, now=200.001)
    assert ob.rto == 0.1


def test_resent_messages_do_not_skew_the_timer() -> None:
    ob = make()
    first = ob.allocate("a", 1)
    ob.add("a", first, 1, [b"x"], deadline=99, now=0, token="t")
    resend, _ = ob.poll(0.15)
    assert resend
    ob.acked("a", first, now=5.0)  # ambiguous: which send was acknowledged?
    assert ob.rto == 0.1
