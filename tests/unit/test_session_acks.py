"""Acknowledgements owed, and which ride on a direct message (no sockets)."""

from __future__ import annotations

from porter_mesh.core.session.acks import PendingAcks

ALICE = b"alice/1"


def test_acks_owed_to_a_peer_ride_on_a_message_to_it() -> None:
    acks = PendingAcks()
    acks.seen(ALICE, "alice", 1)
    acks.add(ALICE, 7)
    acks.add(ALICE, 8)
    assert acks.carry("alice", 1) == (ALICE, [7, 8])
    # Taken: nothing is left to go alone, nor to ride twice.
    assert not acks
    assert acks.carry("alice", 1) is None
    assert acks.alone() == []


def test_what_no_message_carried_goes_alone_one_message_per_sender() -> None:
    acks = PendingAcks()
    acks.seen(ALICE, "alice", 1)
    acks.seen(b"bob/2", "bob", 2)
    acks.add(ALICE, 3)
    acks.add(b"bob/2", 4)
    acks.add(ALICE, 5)
    assert acks.carry("carol", 9) is None  # owed nothing
    assert acks.alone() == [(ALICE, [3, 5]), (b"bob/2", [4])]
    assert not acks


def test_an_ack_is_carried_only_to_the_incarnation_it_is_owed_to() -> None:
    acks = PendingAcks()
    acks.seen(ALICE, "alice", 1)
    acks.add(ALICE, 3)
    # alice restarted: her new process must not settle its messages with these numbers.
    assert acks.carry("alice", 2) is None
    assert acks.alone() == [(ALICE, [3])]


def test_an_ack_without_a_known_sender_goes_alone() -> None:
    acks = PendingAcks()
    acks.add(ALICE, 3)  # e.g. owed after a restart's replay, before alice spoke again
    assert acks.carry("alice", 1) is None
    assert acks.alone() == [(ALICE, [3])]


def test_a_new_connection_of_the_same_sender_takes_over() -> None:
    acks = PendingAcks()
    acks.seen(ALICE, "alice", 1)
    acks.seen(b"other", "alice", 1)  # reconnected (a secured ROUTER makes up new ids)
    acks.add(ALICE, 3)
    acks.add(b"other", 4)
    assert acks.carry("alice", 1) == (b"other", [4])
    assert acks.alone() == [(ALICE, [3])]


def test_an_identity_reused_by_another_sender_is_its_own() -> None:
    acks = PendingAcks()
    acks.seen(ALICE, "alice", 1)
    acks.seen(ALICE, "alice", 2)  # same routing id, new incarnation
    acks.add(ALICE, 3)
    assert acks.carry("alice", 1) is None
    assert acks.carry("alice", 2) == (ALICE, [3])


def test_the_owners_kept_are_bounded() -> None:
    acks = PendingAcks()
    for i in range(10_000):
        acks.seen(b"%d" % i, f"peer-{i}", i)
    acks.add(b"9999", 1)
    assert acks.carry("peer-9999", 9999) == (b"9999", [1])
    assert len(acks._owner) <= 4096  # the bound is the point
