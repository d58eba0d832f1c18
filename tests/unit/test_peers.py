"""The peer liveness state machine and the re-contact schedule, driven with an explicit
clock (and, for the schedule's jitter, an explicit random source)."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from porter_mesh.core.advert import PeerAdvert
from porter_mesh.core.peers import MAX_RECONTACTS, PeerEventKind, PeerState, PeerTable, Recontact


def advert(name: str = "w1", inc: int = 7, port: int = 5000) -> PeerAdvert:
    return PeerAdvert(name=name, role="worker", mesh="m", pub_port=port, router_port=port + 1,
                      version=1, incarnation=inc, addresses=("127.0.0.1",))


def kinds(events: list) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    return [(e.kind.value, e.reason) for e in events]


def test_join_evasive_alive_expire() -> None:
    t = PeerTable(evasive_after=3, expire_after=10)
    assert kinds(t.found(advert(), 0.0)) == [("joined", "")]
    assert t.found(advert(), 0.5) == []
    assert t.tick(2.9) == []
    assert kinds(t.tick(3.0)) == [("evasive", "")]
    assert t.get("w1").state is PeerState.EVASIVE  # type: ignore[union-attr]
    known, ev = t.heard("w1", 7, 4.0)
    assert known and kinds(ev) == [("alive", "")]
    assert t.tick(13.9) != [] and "w1" in t  # evasive again, not yet expired
    assert kinds(t.tick(14.0)) == [("left", "expired")]
    assert "w1" not in t


def test_restart_is_a_new_peer() -> None:
    t = PeerTable(evasive_after=3, expire_after=10)
    t.found(advert(inc=1), 0.0)
    t.get("w1").last_seqs["log"] = 99  # type: ignore[union-attr]
    ev = t.found(advert(inc=2), 1.0)
    assert kinds(ev) == [("left", "restarted"), ("joined", "")]
    assert ev[1].peer.incarnation == 2 and ev[1].peer.last_seqs == {}
    # Traffic from the old incarnation is not attributed to the new one.
    known, _ = t.heard("w1", 1, 2.0)
    assert not known


def test_goodbye_and_updates() -> None:
    t = PeerTable(evasive_after=3, expire_after=10)
    t.found(advert(), 0.0)
    assert kinds(t.found(advert(port=6000), 1.0)) == [("updated", "")]
    assert t.left("w1", 999) == []  # wrong incarnation: ignored
    assert kinds(t.left("w1", 7)) == [("left", "goodbye")]


def test_pause_is_forgiven() -> None:
    t = PeerTable(evasive_after=3, expire_after=10)
    t.found(advert(), 0.0)
    t.shift_clock(100.0)
    assert t.tick(100.5) == []


def test_clock_skew_is_a_live_state_left_on_the_first_timestamp_in_bound() -> None:
    t = PeerTable(evasive_after=3, expire_after=10)
    t.found(advert(), 0.0)
    known, ev = t.heard("w1", 7, 1.0, 90_000_000)
    assert known and kinds(ev) == [("clock-skew", "")]
    info = t.get("w1")
    assert info is not None and info.state is PeerState.CLOCK_SKEW
    assert info.clock_skew_ms == 90_000_000 and info.copy().clock_skew_ms == 90_000_000
    # Still skewed: no new event, the offset follows the latest message.
    assert t.heard("w1", 7, 2.0, 90_000_500) == (True, [])
    assert info.clock_skew_ms == 90_000_500
    # Quiet: evasive like anyone; heard again beyond the bound: clock-skew again.
    assert kinds(t.tick(5.0)) == [("evasive", "")]
    assert kinds(t.heard("w1", 7, 5.5, -90_000_000)[1]) == [("clock-skew", "")]
    # Back within the bound: alive, offset cleared.
    assert kinds(t.heard("w1", 7, 6.0)[1]) == [("alive", "")]
    assert info.state is PeerState.ALIVE and info.clock_skew_ms == 0
    assert kinds(t.tick(16.0)) == [("left", "expired")]


def test_skewed_stale_incarnation_is_not_attributed() -> None:
    t = PeerTable(evasive_after=3, expire_after=10)
    t.found(advert(inc=2), 0.0)
    assert t.heard("w1", 1, 1.0, 5) == (False, [])
    assert t.get("w1").state is PeerState.ALIVE  # type: ignore[union-attr]


# -- re-contact schedule ----------------------------------------------------------------


def fixed(value: float):  # type: ignore[no-untyped-def]
    return lambda: value


def attempt_times(schedule: Recontact[str, None], until: float) -> list[float]:
    """Times at which ``"x"`` is due, polling every 10 ms like the node's timer does."""
    times = []
    for tick in range(round(until * 100) + 1):
        now = tick / 100
        if any(key == "x" for key, _ in schedule.due(now)):
            times.append(now)
    return times


def test_backoff_doubles_from_initial_to_the_cap() -> None:
    schedule: Recontact[str, None] = Recontact(initial=1.0, cap=5.0, rand=fixed(0.0))
    schedule.start("x", None, 0.0, delay=0)
    assert attempt_times(schedule, 30.0) == [0.0, 1.0, 3.0, 7.0, 12.0, 17.0, 22.0, 27.0]


def test_jitter_only_shortens_delays() -> None:
    schedule: Recontact[str, None] = Recontact(initial=1.0, cap=4.0, jitter=0.5,
                                               rand=fixed(0.999))
    schedule.start("x", None, 0.0)
    times = attempt_times(schedule, 20.0)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert times[0] == 1.0
    assert all(0.5 <= g <= 4.0 for g in gaps), gaps
    assert gaps[-1] < 2.1  # the cap less half of it


def test_stop_reports_since_and_attempts_and_ends_the_attempts() -> None:
    schedule: Recontact[str, str] = Recontact(initial=1.0, cap=2.0, rand=fixed(0.0))
    schedule.start("x", "advert", 10.0)
    assert schedule.due(10.5) == []
    assert schedule.due(11.0) == [("x", "advert")]
    assert schedule.due(12.0) == [("x", "advert")]
    assert schedule.stop("x") == (10.0, 2)
    assert schedule.stop("x") is None
    assert "x" not in schedule and schedule.due(100.0) == []
    assert schedule.next_due == float("inf")


def test_starting_again_keeps_the_schedule_and_takes_the_new_value() -> None:
    schedule: Recontact[str, str] = Recontact(initial=1.0, cap=8.0, rand=fixed(0.0))
    schedule.start("x", "old", 0.0)
    schedule.due(1.0)
    schedule.due(2.0)
    schedule.start("x", "new", 2.5)
    assert schedule.due(3.5) == []  # still on its backoff: next at 2 + 2
    assert schedule.due(4.0) == [("x", "new")]


def test_restart_makes_everything_due_with_backoff_reset() -> None:
    schedule: Recontact[str, None] = Recontact(initial=1.0, cap=8.0, rand=fixed(0.0))
    schedule.start("a", None, 0.0)
    schedule.start("b", None, 0.0)
    for now in (1.0, 2.0, 4.0, 8.0):
        schedule.due(now)
    schedule.restart(9.0)
    assert sorted(k for k, _ in schedule.due(9.0)) == ["a", "b"]
    assert sorted(k for k, _ in schedule.due(10.0)) == ["a", "b"]


def test_the_oldest_unpinned_target_is_forgotten_past_the_limit() -> None:
    schedule: Recontact[str, None] = Recontact(initial=1.0, cap=2.0, limit=2)
    schedule.start("seed", None, 0.0, pinned=True)
    assert schedule.start("p1", None, 1.0) == []
    assert schedule.start("p2", None, 2.0) == []
    assert schedule.start("p3", None, 3.0) == ["p1"]
    assert len(schedule) == 3 and "seed" in schedule and "p1" not in schedule
    assert Recontact(initial=1, cap=1).limit == MAX_RECONTACTS


def test_idle_schedule_does_no_work() -> None:
    calls = []
    schedule: Recontact[str, None] = Recontact(initial=1.0, cap=5.0,
                                               rand=lambda: calls.append(1) or 0.0)
    schedule.start("x", None, 0.0)
    schedule.due(1.0)
    assert len(calls) == 1
    for i in range(1000):
        assert schedule.due(1.0 + i * 0.0001) == []
    assert len(calls) == 1


@given(st.lists(st.tuples(st.sampled_from(["found", "heard", "tick", "left"]),
                          st.integers(1, 3), st.floats(0, 5)), max_size=60))
def test_random_histories_keep_invariants(ops: list[tuple[str, int, float]]) -> None:
    t = PeerTable(evasive_after=1, expire_after=3)
    now = 0.0
    for op, inc, dt in ops:
        now += dt
        if op == "found":
            events = t.found(advert(inc=inc), now)
        elif op == "heard":
            # Odd incarnations' timestamps are beyond the clock bound.
            _, events = t.heard("w1", inc, now, 10**8 if inc % 2 else None)
        elif op == "tick":
            events = t.tick(now)
        else:
            events = t.left("w1", inc)
        for e in events:
            if e.kind is PeerEventKind.LEFT:
                assert e.peer.state is PeerState.EXPIRED
        info = t.get("w1")
        if info is not None:
            assert info.state is not PeerState.EXPIRED
            assert now - info.last_heard < 3 or op != "tick"
            if op == "heard" and info.incarnation == inc:
                skewed = PeerState.CLOCK_SKEW if inc % 2 else PeerState.ALIVE
                assert info.state is skewed
