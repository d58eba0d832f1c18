"""The peer liveness state machine, driven with an explicit clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from porter_mesh.core.advert import PeerAdvert
from porter_mesh.core.peers import PeerEventKind, PeerState, PeerTable


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
            _, events = t.heard("w1", inc, now)
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
