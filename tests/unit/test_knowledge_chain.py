"""Chained record signatures: one real Ed25519 check proves a run of one author's records.

Pure: the records, their links and :func:`authenticate` from the core, with real keys
from ``cryptography``; the check counts how many signatures it verified.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgpack
import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from porter_mesh.core.knowledge import (
    LINK_BYTES,
    Observation,
    Record,
    Records,
    Retraction,
    authenticate,
    decode_record,
    decode_sync,
    encode_record,
    encode_sync,
    record_from_journal,
    record_link,
    record_signing_bytes,
    sign_record,
)
from porter_mesh.errors import KnowledgeError, SyncError

T0 = "2026-01-31T12:00:00.000000Z"
KEYS = {name: Ed25519PrivateKey.generate() for name in ("alice", "bob", "mallory")}


class Checker:
    """Checks a record's signature with the key of its origin, counting the checks."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def __call__(self, record: Record) -> str | None:
        self.calls.append((record.origin, record.seq))
        if record.sig is None:
            return "unsigned"
        try:
            KEYS[record.origin].public_key().verify(record.sig, record_signing_bytes(record))
        except InvalidSignature:
            return "bad-signature"
        return None


def plain(origin: str, seq: int, finding: str | None = None) -> Record:
    return Record(origin, seq, Observation(
        f"urn:porter:file:f{seq}.ts", finding or f"finding {seq}", origin, T0))


def chain(origin: str, first: int, last: int, *, by: str | None = None,
          prev: bytes | None = None) -> list[Record]:
    """Records ``first..last`` of ``origin``, chained and signed with ``by``'s key."""
    out = []
    for seq in range(first, last + 1):
        record = sign_record(plain(origin, seq), prev, KEYS[by or origin].sign)
        prev = record_link(record)
        out.append(record)
    return out


def run(records: Sequence[Record], *, held: Sequence[Record] = ()
        ) -> tuple[dict[int, str], list[tuple[str, int]]]:
    check = Checker()
    held_slots = {(r.origin, r.seq, r.key) for r in held}
    refused = authenticate(records, check,
                           held=lambda r: (r.origin, r.seq, r.key) in held_slots)
    return refused, check.calls


def test_a_genuine_run_costs_one_check_whatever_its_order() -> None:
    records = chain("alice", 1, 200)
    refused, calls = run(records)
    assert (refused, calls) == ({}, [("alice", 200)])
    shuffled = records[100:] + records[:100]
    assert run(shuffled) == ({}, [("alice", 200)])


def test_a_single_record_costs_one_check_as_before() -> None:
    (one,) = chain("alice", 7, 7, prev=bytes(LINK_BYTES))
    assert run([one]) == ({}, [("alice", 7)])


def test_runs_of_several_authors_cost_one_check_each() -> None:
    alice, bob = chain("alice", 1, 50), chain("bob", 1, 50)
    interleaved = [r for pair in zip(alice, bob, strict=True) for r in pair]
    refused, calls = run(interleaved)
    assert refused == {} and sorted(calls) == [("alice", 50), ("bob", 50)]


def test_a_record_replaced_inside_a_run_is_refused_alone() -> None:
    records = chain("alice", 1, 10)
    # An insider relays the genuine run with record 5 replaced by its own record in
    # alice's name, signed with its own key (it has no other).
    forged = sign_record(plain("alice", 5, "deploy the backdoor"), records[3].prev,
                         KEYS["mallory"].sign)
    relayed = [*records[:4], forged, *records[5:]]
    refused, calls = run(relayed)
    assert refused == {4: "bad-signature"}
    # The top proves 10..6; 6 no longer vouches for 5, which fails on its own; 4 is
    # proved by its own signature and vouches for 3..1.
    assert calls == [("alice", 10), ("alice", 5), ("alice", 4)]
    # The same forgery with no signature at all, and one with a copied signature.
    for bad, reason in ((Record("alice", 5, forged.body, prev=forged.prev), "unsigned"),
                        (Record("alice", 5, forged.body, sig=records[4].sig,
                                prev=records[4].prev), "bad-signature")):
        assert run([*records[:4], bad, *records[5:]])[0] == {4: reason}


def test_a_genuine_record_carrying_another_signature_is_refused() -> None:
    # The link covers the signature, so a replica never keeps a signature it has not
    # proved (and would later serve alone) just because the content is genuine.
    records = chain("alice", 1, 6)
    swapped = Record("alice", 3, records[2].body, sig=records[1].sig, prev=records[2].prev)
    assert run([*records[:2], swapped, *records[3:]])[0] == {2: "bad-signature"}


def test_a_forged_run_signed_by_another_key_is_refused_record_by_record() -> None:
    forged = chain("alice", 1, 20, by="mallory")  # a well-formed chain, the wrong key
    refused, calls = run(forged)
    assert refused == dict.fromkeys(range(20), "bad-signature")
    assert len(calls) == 20  # nothing is proved, so nothing vouches for anything


def test_a_genuine_top_does_not_vouch_for_forged_records_below_it() -> None:
    genuine = chain("alice", 1, 10)
    forged_low = chain("alice", 1, 9, by="mallory")
    refused, _ = run([*forged_low, genuine[9]])
    assert refused == dict.fromkeys(range(9), "bad-signature")


def test_a_gap_splits_a_run_into_two_each_proved_by_its_top() -> None:
    records = chain("alice", 1, 9)
    batch = records[:4] + records[5:]  # 5 is missing
    assert run(batch) == ({}, [("alice", 9), ("alice", 4)])
    # The missing record, when it comes alone, is proved by its own signature.
    assert run([records[4]]) == ({}, [("alice", 5)])


def test_a_held_record_is_not_checked_and_vouches_for_nothing() -> None:
    records = chain("alice", 1, 9)
    refused, calls = run(records, held=[records[4]])
    assert (refused, calls) == ({}, [("alice", 9), ("alice", 4)])
    # A held slot's copy in the batch may carry anything: it is not the copy that was
    # proved, so a forged record below it is still checked, and refused.
    forged_four = sign_record(plain("alice", 4, "backdoor"), records[2].prev,
                              KEYS["mallory"].sign)
    tampered_five = Record("alice", 5, records[4].body, sig=records[4].sig,
                           prev=record_link(forged_four))
    refused, _ = run([*records[:3], forged_four, tampered_five, *records[5:]],
                     held=[records[4]])
    assert refused == {3: "bad-signature"}


def test_two_records_claiming_one_slot_are_each_proved_on_their_own() -> None:
    records = chain("alice", 1, 3)
    twin = sign_record(plain("alice", 2, "other"), records[0].prev, KEYS["mallory"].sign)
    refused, _ = run([records[0], records[1], twin, records[2]])
    assert refused == {2: "bad-signature"}


def test_the_chain_reaches_every_earlier_record() -> None:
    records = chain("alice", 1, 3)
    links = [record_link(r) for r in records]
    assert [r.prev for r in records] == [None, links[0], links[1]]
    assert len(set(links)) == 3
    # Each link covers the record's own link: another predecessor, another link.
    moved = Record("alice", 3, records[2].body, sig=records[2].sig, prev=links[0])
    assert record_link(moved) != links[2]
    # What is signed includes the link, so a record cannot be re-hung under another.
    assert record_signing_bytes(moved) != record_signing_bytes(records[2])


def test_links_and_signatures_travel_with_their_records() -> None:
    first, second = chain("alice", 1, 2)
    retraction = sign_record(Record("alice", 3, Retraction(first.body.id, "alice", T0)),
                             record_link(second), KEYS["alice"].sign)
    for record in (first, second, retraction):
        data = encode_record(record)
        for back in (decode_record(data), record_from_journal(data),
                     decode_sync(encode_sync(Records((record,)))).records[0]):  # type: ignore[union-attr]
            assert (back.sig, back.prev) == (record.sig, record.prev)
            assert record_link(back) == record_link(record)


@pytest.mark.parametrize("prev", [b"short", "x" * LINK_BYTES, 7])
def test_a_malformed_link_is_refused(prev: object) -> None:
    (_, second) = chain("alice", 1, 2)
    item = msgpack.unpackb(encode_record(second))
    with pytest.raises(SyncError, match="chain link"):
        decode_record(msgpack.packb([*item[:-1], prev]))
    with pytest.raises(KnowledgeError, match="chain link"):
        Record("alice", 2, second.body, sig=second.sig, prev=b"short")


def test_unsigned_records_carry_no_link_and_keep_their_encoding() -> None:
    observation = plain("alice", 2)
    retraction = Record("alice", 3, Retraction(observation.body.id, "alice", T0))
    for record, fields in ((observation, 9), (retraction, 6)):
        item = msgpack.unpackb(encode_record(record))
        assert len(item) == fields
        back = decode_record(encode_record(record))
        assert (back.sig, back.prev) == (None, None)
