"""The roster's rules as a pure unit: which adverts are accepted (mesh, version,
addresses, a secured node's trusted directory, hearsay that would move a live peer), and
what each change of the roster asks of the node, in order. No socket."""

from __future__ import annotations

import dataclasses

from porter_mesh.core.advert import PeerAdvert
from porter_mesh.core.constants import PROTOCOL_VERSION, ROLE_SEAT
from porter_mesh.core.session.frames import DirectFrame, Fail, SendFrame
from porter_mesh.core.session.roster import (
    Connect,
    Disconnect,
    Drop,
    PeerChanged,
    Reconnect,
    Refuse,
    Roster,
)
from porter_mesh.core.session.sending import Sender


def advert(name: str = "b", incarnation: int = 1, **changes: object) -> PeerAdvert:
    base = PeerAdvert(name=name, role="worker", mesh="m", pub_port=5000, router_port=5001,
                      version=PROTOCOL_VERSION, incarnation=incarnation,
                      addresses=("127.0.0.1",), public_key="K" * 40)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def roster() -> Roster[int]:
    sending: Sender[int] = Sender("a", 7, retry_initial=0.2, retry_max=2.0, max_pending=8)
    return Roster("a", "m", sending, evasive_after=3.0, expire_after=8.0)


def kinds(actions: list[object]) -> list[str]:
    out = []
    for action in actions:
        if isinstance(action, PeerChanged):
            out.append(f"changed:{action.event.kind.value}")
        elif isinstance(action, SendFrame) and isinstance(action.frame, DirectFrame):
            out.append("resend")
        else:
            out.append(type(action).__name__)
    return out


class Trust:
    """A trusted directory that objects to the keys it is told to."""

    def __init__(self, *untrusted: str) -> None:
        self.untrusted = set(untrusted)

    def advert_problem(self, advert: PeerAdvert) -> tuple[str, str] | None:
        if advert.public_key in self.untrusted:
            return ("untrusted-advert", f"advert of {advert.name!r} carries an untrusted key")
        return None


def test_adverts_of_another_mesh_or_of_this_node_are_not_ours() -> None:
    r = roster()
    assert r.found(advert(mesh="other"), 0.0) == []
    assert r.found(advert(name="a"), 0.0) == []
    assert len(r.peers) == 0


def test_another_version_or_no_address_is_dropped_with_what_to_do() -> None:
    r = roster()
    [drop] = r.found(advert(version=PROTOCOL_VERSION + 1), 0.0)
    assert isinstance(drop, Drop) and drop.reason == "version" and "upgrade" in drop.detail
    [drop] = r.found(advert(addresses=()), 0.0)
    assert isinstance(drop, Drop) and drop.reason == "bad-advert"
    assert len(r.peers) == 0


def test_a_secured_node_refuses_a_key_its_directory_does_not_trust() -> None:
    r = roster()
    [refuse] = r.found(advert(), 0.0, trust=Trust("K" * 40))
    assert refuse == Refuse("untrusted-advert", "b",
                            "advert of 'b' carries an untrusted key", "K" * 40)
    assert len(r.peers) == 0
    assert kinds(r.found(advert(), 0.0, trust=Trust())) == ["Connect", "changed:joined"]


def test_hearsay_may_introduce_a_peer_but_only_the_peer_itself_may_move_it() -> None:
    r = roster()
    r.found(advert(), 0.0, trust=Trust())  # hearsay, of a peer not on the roster: fine
    moved = advert(incarnation=2, pub_port=6000)
    [drop] = r.found(moved, 1.0, trust=Trust())
    assert isinstance(drop, Drop) and drop.reason == "unverified-advert"
    assert r.peers.get("b") is not None and r.peers.get("b").incarnation == 1  # type: ignore[union-attr]
    # Unsecured, or first-hand over the authenticated link: the restart is taken.
    assert kinds(r.found(moved, 1.0, verified=True, trust=Trust())) == [
        "Disconnect", "Forget", "changed:left", "Connect", "changed:joined"]


def test_a_new_link_gets_what_waited_for_the_peer_after_the_connect() -> None:
    r = roster()
    r.sending.send_run("b", b"{}", 1, (1,), now=0.0, deadline=10.0, reachable=())
    actions = r.found(advert(), 0.5)
    assert kinds(actions) == ["Connect", "resend", "changed:joined"]
    assert actions[0] == Connect(advert())


def test_a_seat_that_says_goodbye_is_disconnected_and_its_sends_fail() -> None:
    r = roster()
    seat = advert(name="seat", role=ROLE_SEAT)
    r.found(seat, 0.0)
    r.sending.send_run("seat", b"{}", 1, (1,), now=0.0, deadline=10.0, reachable={"seat"})
    actions = r.left("seat", 1, 1.0)
    assert actions[:2] == [Disconnect("seat"), Fail((1,), "seat", "left", 1, 1)]
    assert kinds(actions)[-1] == "changed:left"
    # A worker's goodbye keeps its sends: it may come back before their deadline.
    r.found(advert(), 0.0)
    r.sending.send_run("b", b"{}", 1, (2,), now=0.0, deadline=10.0, reachable={"b"})
    assert kinds(r.left("b", 1, 1.0)) == ["Disconnect", "changed:left"]


def test_a_peer_that_moved_is_reconnected_and_a_detail_change_is_only_told() -> None:
    r = roster()
    r.found(advert(), 0.0)
    r.sending.send_run("b", b"{}", 1, (1,), now=0.0, deadline=10.0, reachable={"b"})
    assert kinds(r.found(advert(slots=3), 0.5, verified=True)) == ["changed:updated"]
    actions = r.found(advert(router_port=7001, slots=3), 0.6, verified=True)
    assert kinds(actions) == ["Reconnect", "resend", "changed:updated"]
    assert actions[0] == Reconnect(advert(router_port=7001, slots=3))


def test_a_link_the_node_closed_itself_is_not_closed_again_nor_reconnected() -> None:
    r = roster()
    r.found(advert(), 0.0)
    r.unlinked("b")  # e.g. the peer refused this node's key
    assert kinds(r.found(advert(router_port=7001), 0.5, verified=True)) == ["changed:updated"]
    actions = r.left("b", 1, 1.0)
    assert kinds(actions) == ["changed:left"]


def test_silence_expires_a_peer_and_a_restart_forgets_its_streams() -> None:
    r = roster()
    r.found(advert(), 0.0)
    assert kinds(r.tick(4.0)) == ["changed:evasive"]
    assert kinds(r.tick(9.0)) == ["Disconnect", "changed:left"]  # expired: no Forget
    r.found(advert(), 10.0)
    actions = r.found(advert(incarnation=2), 11.0)
    assert kinds(actions) == ["Disconnect", "Forget", "changed:left", "Connect",
                              "changed:joined"]
    known, heard = r.heard("b", 2, 12.0)
    assert known and heard == []
    assert r.heard("b", 1, 12.0) == (False, [])  # the old incarnation is not heard


def test_an_incarnation_that_said_goodbye_is_not_brought_back_by_a_late_advert() -> None:
    r = roster()
    r.found(advert(), 0.0)
    assert kinds(r.left("b", 1, 1.0)) == ["Disconnect", "changed:left"]
    # Its welcome or heartbeat read after the goodbye, an mDNS cache, another's hearsay.
    assert r.found(advert(), 1.1, verified=True) == []
    assert r.found(advert(), 1.2) == []
    assert len(r.peers) == 0
    # The same agent started again has a new incarnation, and joins.
    assert kinds(r.found(advert(incarnation=2), 2.0)) == ["Connect", "changed:joined"]


def test_an_expired_peer_comes_back_with_the_same_incarnation() -> None:
    # Silence is not a goodbye: the other side of a partition is still that process.
    r = roster()
    r.found(advert(), 0.0)
    assert kinds(r.tick(9.0)) == ["Disconnect", "changed:left"]
    assert kinds(r.found(advert(), 10.0)) == ["Connect", "changed:joined"]
