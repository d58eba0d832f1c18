"""The pure knowledge core: identity, validation, sync codec, replica state and merge."""

from __future__ import annotations

import gc
import random

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from porter_mesh.core.constants import MAX_MESSAGE_BYTES
from porter_mesh.core.knowledge import (
    DIGEST_BUCKETS,
    MAX_PULL_SPAN,
    MAX_RECORDS_PER_MESSAGE,
    MAX_SEQ_AHEAD,
    BucketEntries,
    CatchupChunk,
    CatchupRequest,
    Digest,
    Observation,
    PullReply,
    PullRequest,
    Record,
    Records,
    ReplicaState,
    Retraction,
    decode_record,
    decode_sync,
    encode_record,
    encode_sync,
    format_timestamp,
    observation_id_from_iri,
    pull_requests_for,
    record_from_journal,
    record_signing_bytes,
)
from porter_mesh.errors import KnowledgeError, SyncError
from tests.fuzzing import examples

T0 = "2026-01-31T12:00:00.000000Z"


def obs(i: int, origin: str = "worker-1", at: str = T0, **extra: str) -> Observation:
    return Observation(f"urn:porter:file:f{i}.ts", f"finding number {i}", origin, at, **extra)


def rec(origin: str, seq: int, i: int | None = None, at: str = T0) -> Record:
    return Record(origin, seq, obs(seq if i is None else i, origin, at))


def retraction(origin: str, seq: int, target: Observation) -> Record:
    return Record(origin, seq, Retraction(target.id, origin, T0))


class Model:
    """A replica: the pure state plus a set standing in for the graph store."""

    def __init__(self) -> None:
        self.state = ReplicaState()
        self.graph: set[bytes] = set()
        self.log: list[Record] = []  # locator = index in this list

    def merge(self, records: list[Record], **kw: object) -> int:
        plan = self.state.plan(records, **kw)  # type: ignore[arg-type]
        locators = list(range(len(self.log), len(self.log) + len(plan.accepted)))
        self.log.extend(plan.accepted)
        self.state.apply(plan, locators)
        self.graph -= set(plan.remove)
        self.graph |= {o.id for o in plan.add}
        return len(plan.accepted)

    def snapshot(self) -> tuple[object, ...]:
        return (self.state.version_vector(), self.state.digest().top, frozenset(self.graph),
                self.state.retracted)


# --- identity and validation -----------------------------------------------------------


def test_identity_is_content_derived() -> None:
    a, b = obs(1), obs(1)
    assert a.id == b.id and len(a.id) == 32
    assert a.iri == "urn:porter:obs:" + a.id.hex()
    assert observation_id_from_iri(a.iri) == a.id == observation_id_from_iri(a.id.hex())
    variants = [
        Observation("urn:porter:file:f2.ts", "finding number 1", "worker-1", T0),
        Observation("urn:porter:file:f1.ts", "finding number 2", "worker-1", T0),
        Observation("urn:porter:file:f1.ts", "finding number 1", "worker-2", T0),
        obs(1, at="2026-01-31T12:00:00.000001Z"),
        obs(1, context="urn:porter:task:a3f9"),
        obs(1, severity="high"),
    ]
    assert len({a.id, *(v.id for v in variants)}) == 7


def test_fields_are_length_prefixed_so_boundaries_cannot_shift() -> None:
    a = Observation("ab", "c", "w", T0)
    b = Observation("a", "bc", "w", T0)
    assert a.id != b.id


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"about": ""}, "about"),
        ({"finding": "x" * 16385}, "finding"),
        ({"discovered_by": "Worker One"}, "agent name"),
        ({"generated_at": "2026-01-31 12:00:00"}, "xsd:dateTime"),
        ({"generated_at": "2026-02-30T12:00:00Z"}, "not a real date"),
        ({"generated_at": "2026-01-31T24:00:00Z"}, "xsd:dateTime"),
        ({"generated_at": "2026-01-31T12:00:00+01:00"}, "UTC"),
        ({"severity": "very bad!"}, "severity"),
        ({"context": "x" * 300}, "context"),
        ({"finding": "bad \ud800 surrogate"}, "Unicode"),
        ({"about": 42}, "about"),
    ],
)
def test_invalid_observations_are_refused_clearly(kwargs: dict[str, object],
                                                  fragment: str) -> None:
    fields: dict[str, object] = {"about": "a", "finding": "f", "discovered_by": "w",
                                 "generated_at": T0}
    fields.update(kwargs)
    with pytest.raises(KnowledgeError, match=fragment):
        Observation(**fields)  # type: ignore[arg-type]


def test_the_first_field_at_fault_is_named_whichever_path_decodes_it() -> None:
    with pytest.raises(KnowledgeError, match="about"):
        Observation(42, "", "Worker One", "yesterday")  # type: ignore[arg-type]
    with pytest.raises(KnowledgeError, match="context"):
        Observation("a", "f", "w", "yesterday", context="", severity="very bad!")
    good = msgpack.unpackb(encode_record(rec("worker-1", 1)), raw=False)
    for index, value, fragment in ((5, "", "finding"), (7, 42, "context"),
                                   (8, "x" * 40, "severity"), (6, "noon", "xsd:dateTime")):
        item = list(good)
        item[index] = value
        with pytest.raises(SyncError, match=fragment):
            decode_sync(msgpack.packb({"t": "rec", "r": [item]}, use_bin_type=True))


def test_record_origin_must_be_the_author() -> None:
    with pytest.raises(KnowledgeError, match="author"):
        Record("worker-2", 1, obs(1, "worker-1"))
    with pytest.raises(KnowledgeError, match="seq"):
        Record("worker-1", 0, obs(1))
    with pytest.raises(KnowledgeError):
        Retraction(b"short", "worker-1", T0)


def test_format_timestamp_is_canonical() -> None:
    text = format_timestamp(0.5)
    assert text == "1970-01-01T00:00:00.500000Z"
    Observation("a", "f", "w", text)  # accepted as generatedAtTime


def test_bad_iri_is_refused() -> None:
    with pytest.raises(KnowledgeError, match="observation id"):
        observation_id_from_iri("urn:porter:obs:nothex")


# --- record codec ------------------------------------------------------------------------


def test_record_round_trip() -> None:
    for record in (rec("worker-1", 7), Record("w", 3, obs(3, "w", context="urn:porter:task:1",
                                                            severity="info")),
                   retraction("reviewer", 2, obs(1))):
        back = decode_record(encode_record(record))
        assert back == record and back.key == record.key
        assert encode_record(back) == encode_record(record)


def test_tampered_content_does_not_match_its_id() -> None:
    item = msgpack.unpackb(encode_record(rec("worker-1", 1)))
    item[5] = "a different finding"
    with pytest.raises(SyncError, match="does not hash"):
        decode_record(msgpack.packb(item))


@pytest.mark.parametrize(
    "mutate",
    [
        lambda i: i.__setitem__(2, 0),           # seq 0
        lambda i: i.__setitem__(2, 1 << 60),     # seq beyond MAX_SEQ
        lambda i: i.__setitem__(2, "1"),         # seq as text
        lambda i: i.__setitem__(2, True),        # bool is not an int here
        lambda i: i.__setitem__(1, "Bad Name"),  # origin
        lambda i: i.__setitem__(3, b"x" * 31),   # id length
        lambda i: i.__setitem__(0, 9),           # kind
        lambda i: i.pop(),                       # arity
        lambda i: i.__setitem__(4, None),        # about missing
        lambda i: i.__setitem__(6, "yesterday"),  # timestamp
    ],
)
def test_malformed_records_are_sync_errors(mutate: object) -> None:
    item = msgpack.unpackb(encode_record(rec("worker-1", 1)))
    mutate(item)  # type: ignore[operator]
    with pytest.raises(SyncError):
        decode_record(msgpack.packb(item))


@pytest.mark.parametrize("data", [b"", b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([])])
def test_garbage_is_not_a_record(data: bytes) -> None:
    with pytest.raises(SyncError):
        decode_record(data)


# --- sync messages -----------------------------------------------------------------------


def _messages() -> list[object]:
    state = ReplicaState()
    state.apply(state.plan([rec("worker-1", 1), rec("worker-1", 2)]), [0, 1])
    return [
        Records((rec("worker-1", 1), retraction("reviewer", 1, obs(1)))),
        PullRequest("worker-1", 3, 9),
        PullReply("worker-1", 1, 4, (rec("worker-1", 1), rec("worker-1", 4))),
        CatchupRequest({"worker-1": 5, "reviewer": 0}, ("worker-2", 3), 10, 500),
        CatchupRequest({}),
        CatchupChunk((rec("worker-2", 3),), 11, 20, ("worker-2", 4)),
        CatchupChunk((), 0, 0, None),
        state.digest(),
        state.bucket_entries(range(DIGEST_BUCKETS)),
    ]


@pytest.mark.parametrize("message", _messages(), ids=lambda m: type(m).__name__)
def test_sync_messages_round_trip(message: object) -> None:
    data = encode_sync(message)  # type: ignore[arg-type]
    assert decode_sync(data) == message


def test_records_keep_the_bytes_they_arrived_in() -> None:
    records = (rec("worker-1", 1), retraction("reviewer", 1, obs(1)))
    decoded = decode_sync(encode_sync(Records(records)))
    assert isinstance(decoded, Records)
    for original, back in zip(records, decoded.records, strict=True):
        assert back.wire == encode_record(original)


def test_a_record_sent_in_another_msgpack_form_is_kept_in_its_canonical_bytes() -> None:
    record = rec("worker-1", 1)
    canonical = encode_record(record)
    assert canonical[:2] == b"\x99\x00" and canonical[2:11] == b"\xa8worker-1"
    # The same array with seq 1 written as a 64-bit integer instead of a fixint.
    wide = canonical[:11] + b"\xcf" + (1).to_bytes(8, "big") + canonical[12:]
    message = b"\x82\xa1t\xa3rec\xa1r\x91" + wide
    decoded = decode_sync(message)
    assert isinstance(decoded, Records) and decoded.records == (record,)
    assert decoded.records[0].wire == canonical


@pytest.mark.parametrize("enabled", [True, False])
def test_decoding_leaves_the_garbage_collector_as_it_found_it(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        if not enabled:
            gc.disable()
        decode_sync(encode_sync(Records((rec("worker-1", 1), rec("worker-1", 2)))))
        assert gc.isenabled() is enabled
        with pytest.raises(SyncError):
            decode_sync(msgpack.packb({"t": "rec", "r": [[0, "worker-1", 1]]}))
        assert gc.isenabled() is enabled
    finally:
        if was:
            gc.enable()


def _raw(message: object) -> dict[str, object]:
    out = msgpack.unpackb(encode_sync(message), raw=False)  # type: ignore[arg-type]
    assert isinstance(out, dict)
    return out


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"\xc1garbage", "not a map"),
        (msgpack.packb([1, 2]), "map"),
        (msgpack.packb({"t": "pull", "o": "w", "f": 1, "l": 2}) + b"\x00", "trailing"),
        (msgpack.packb({"t": "nope"}), "unknown sync message"),
        (msgpack.packb({"t": "pull", "o": "w"}), "lacks field"),
        (msgpack.packb({"t": "pull", "o": "w", "f": 9, "l": 3}), "inverted"),
        (msgpack.packb({"t": "pull", "o": "w", "f": 1, "l": MAX_PULL_SPAN + 1}), "spans"),
        (msgpack.packb({"t": "pull", "o": "w", "f": -1, "l": 3}), "first"),
        (msgpack.packb({"t": "rec", "r": "x"}), "array of records"),
        (msgpack.packb({"t": "cu", "vv": [1]}), "version vector"),
        (msgpack.packb({"t": "cu", "vv": {"w": -4}}), "version vector entry"),
        (msgpack.packb({"t": "cu", "vv": {}, "n": 0}), "limit"),
        (msgpack.packb({"t": "cc", "r": [], "d": 5, "tot": 4}), "done=5 > total=4"),
        (msgpack.packb({"t": "cc", "r": [], "d": 0, "tot": 0, "c": ["w"]}), "cursor"),
        (msgpack.packb({"t": "dg", "n": 1, "b": [b"x" * 16] * 3}), "fingerprints"),
        (msgpack.packb({"t": "be", "b": [999], "e": []}), "bucket numbers"),
        (msgpack.packb({"t": "be", "b": [0], "e": [["w", 1, b"\x01" + b"\x00" * 15]]}),
         "not listed"),
    ],
)
def test_bad_sync_messages_are_refused(raw: bytes, fragment: str) -> None:
    with pytest.raises(SyncError, match=fragment):
        decode_sync(raw)


def test_pull_reply_outside_its_range_is_refused() -> None:
    raw = _raw(PullReply("worker-1", 1, 2, (rec("worker-1", 1),)))
    raw["r"] = [msgpack.unpackb(encode_record(rec("worker-1", 3)))]
    with pytest.raises(SyncError, match="outside"):
        decode_sync(msgpack.packb(raw))


def test_huge_messages_are_refused() -> None:
    one = msgpack.unpackb(encode_record(rec("worker-1", 1)))
    too_many = {"t": "rec", "r": [one] * (MAX_RECORDS_PER_MESSAGE + 1)}
    with pytest.raises(SyncError, match="exceed the limit"):
        decode_sync(msgpack.packb(too_many))
    with pytest.raises(SyncError, match="exceeds"):
        decode_sync(b"\x00" * (MAX_MESSAGE_BYTES + 1))
    big = tuple(Record("w", i, Observation("a", "x" * 16000, "w", T0, context=str(i)))
                for i in range(1, 400))
    with pytest.raises(SyncError, match="exceeds"):
        encode_sync(Records(big))


# --- replica state: merge rules ------------------------------------------------------------


def test_merge_is_idempotent_and_dedups() -> None:
    m = Model()
    batch = [rec("worker-1", s) for s in (1, 2, 3)]
    assert m.merge(batch) == 3
    before = m.snapshot()
    assert m.merge(batch) == 0
    assert m.merge(batch + batch) == 0
    assert m.snapshot() == before
    plan = m.state.plan([rec("worker-1", 4), rec("worker-1", 4)])
    assert len(plan.accepted) == 1 and plan.duplicates == 1


def test_conflicting_record_is_refused_and_changes_nothing() -> None:
    m = Model()
    m.merge([rec("worker-1", 1)])
    before = m.snapshot()
    forged = Record("worker-1", 1, obs(99))
    with pytest.raises(SyncError, match="conflicts"):
        m.merge([rec("worker-1", 2), forged])
    assert m.snapshot() == before
    with pytest.raises(SyncError, match="two different records"):
        m.merge([rec("worker-1", 5), Record("worker-1", 5, obs(77))])
    assert m.snapshot() == before


def test_forged_far_ahead_sequence_is_refused() -> None:
    m = Model()
    m.merge([rec("worker-1", 1)])
    with pytest.raises(SyncError, match="forged"):
        m.merge([rec("worker-1", 2 + MAX_SEQ_AHEAD + 1)])
    assert m.merge([rec("worker-1", 1 + MAX_SEQ_AHEAD)]) == 1  # within the allowance


def test_retraction_is_permanent_and_never_resurrected() -> None:
    target = obs(1)
    m = Model()
    m.merge([Record("worker-1", 1, target)])
    assert m.graph == {target.id}
    m.merge([retraction("reviewer", 1, target)])
    assert m.graph == set()
    m.merge([Record("worker-1", 1, target)])  # the same record again: a duplicate
    assert m.graph == set()
    # The retraction arrives first on another replica: the observation never shows.
    other = Model()
    other.merge([retraction("reviewer", 1, target)])
    other.merge([Record("worker-1", 1, target)])
    assert other.graph == set() and other.snapshot() == m.snapshot()
    # ... nor within one batch, in either order.
    third = Model()
    third.merge([Record("worker-1", 1, target), retraction("reviewer", 1, target)])
    assert third.graph == set()


def test_catchup_chunk_must_lie_beyond_the_requested_vector() -> None:
    m = Model()
    with pytest.raises(SyncError, match="not what the catch-up asked for"):
        m.merge([rec("worker-1", 3)], after={"worker-1": 5})
    assert m.merge([rec("worker-1", 6)], after={"worker-1": 5}) == 1


def test_version_vector_gaps_and_next_seq() -> None:
    m = Model()
    m.merge([rec("worker-1", s) for s in (1, 2, 5, 6, 9)] + [rec("worker-2", 1)])
    assert m.state.version_vector() == {"worker-1": 2, "worker-2": 1}
    assert [(p.origin, p.first, p.last) for p in m.state.missing_ranges()] == [
        ("worker-1", 3, 4), ("worker-1", 7, 8)]
    assert m.state.next_seq("worker-1") == 10 and m.state.next_seq("nobody") == 1
    m.merge([rec("worker-1", 3), rec("worker-1", 4)])
    assert m.state.version_vector()["worker-1"] == 6
    assert m.state.lag({"worker-1": 20, "worker-3": 4}) == 14 + 4
    behind = m.state.ranges_behind({"worker-1": 12, "worker-3": 2})
    assert [(p.origin, p.first, p.last) for p in behind] == [
        ("worker-1", 7, 8), ("worker-1", 10, 12), ("worker-3", 1, 2)]


def test_ranges_behind_is_bounded_whatever_the_peer_claims() -> None:
    m = Model()
    requests = m.state.ranges_behind({"worker-1": (1 << 53) - 1}, limit=5)
    assert len(requests) == 5
    assert all(p.last - p.first + 1 == MAX_PULL_SPAN for p in requests)


def test_pull_requests_for_groups_runs_and_splits_long_ones() -> None:
    reqs = pull_requests_for({"b": [5, 1, 2, 3], "a": range(1, MAX_PULL_SPAN + 3)})
    assert [(p.origin, p.first, p.last) for p in reqs] == [
        ("a", 1, MAX_PULL_SPAN), ("a", MAX_PULL_SPAN + 1, MAX_PULL_SPAN + 2),
        ("b", 1, 3), ("b", 5, 5)]


# --- two pure replicas driven against each other ------------------------------------------


def serve_pull(server: Model, req: PullRequest) -> PullReply:
    locs = server.state.locators_in(req.origin, req.first, req.last)
    return PullReply(req.origin, req.first, req.last, tuple(server.log[i] for i in locs))


def run_catchup(server: Model, client: Model, limit: int) -> list[tuple[int, int]]:
    request = CatchupRequest(client.state.version_vector(), None, 0, limit)
    progress = []
    for _ in range(10_000):
        items, remaining, exhausted = server.state.catchup_slice(request)
        records = tuple(server.log[loc] for _, _, loc in items)
        cursor = None if exhausted else (items[-1][0], items[-1][1] + 1)
        chunk = decode_sync(encode_sync(CatchupChunk(
            records, request.done + len(records), request.done + remaining, cursor)))
        assert isinstance(chunk, CatchupChunk)
        client.merge(list(chunk.records), after=request.vv)
        progress.append((chunk.done, chunk.total))
        if chunk.cursor is None:
            return progress
        request = CatchupRequest(request.vv, chunk.cursor, chunk.done, limit)
    raise AssertionError("catch-up did not finish")


def test_catchup_brings_a_late_joiner_level_with_progress() -> None:
    server, client = Model(), Model()
    server.merge([rec(o, s) for o in ("alpha", "beta", "gamma") for s in range(1, 41)])
    server.merge([retraction("beta", 41, obs(3, "alpha"))])
    client.merge([rec("alpha", s) for s in range(1, 11)])
    progress = run_catchup(server, client, limit=7)
    assert client.snapshot() == server.snapshot()
    assert progress[-1][0] == progress[-1][1] == 30 + 41 + 40
    assert all(done <= total for done, total in progress)
    assert [d for d, _ in progress] == sorted(d for d, _ in progress)
    # A snapshot is a catch-up from an empty vector.
    fresh = Model()
    run_catchup(server, fresh, limit=50)
    assert fresh.snapshot() == server.snapshot()


def test_digest_repair_finds_what_the_version_vector_cannot() -> None:
    a, b = Model(), Model()
    common = [rec("worker-1", s) for s in range(1, 201)]
    a.merge(common)
    b.merge(common)
    # b holds records above a hole that nobody advertises in a version vector.
    extra = [rec("worker-2", s) for s in (5, 9, 30)] + [rec("worker-1", 205)]
    b.merge(extra)
    assert a.state.version_vector()["worker-1"] == b.state.version_vector()["worker-1"]
    assert a.state.digest().top != b.state.digest().top
    digest = decode_sync(encode_sync(a.state.digest()))
    assert isinstance(digest, Digest)
    differ = b.state.differing_buckets(digest)
    assert 0 < len(differ) <= len(extra)
    listing = decode_sync(encode_sync(b.state.bucket_entries(differ)))
    assert isinstance(listing, BucketEntries)
    for req in a.state.lacking(listing):
        a.merge(list(serve_pull(b, req).records))
    assert a.state.digest() == b.state.digest()
    assert a.snapshot() == b.snapshot()


def test_digest_listing_exposes_a_diverged_history() -> None:
    a, b = Model(), Model()
    a.merge([rec("worker-1", 1)])
    b.merge([Record("worker-1", 1, obs(42))])  # someone fed b a forged record
    listing = b.state.bucket_entries(b.state.differing_buckets(a.state.digest()))
    with pytest.raises(SyncError, match="conflicting histories"):
        a.state.lacking(listing)


def test_clock_skew_neither_reorders_nor_loses() -> None:
    # worker-1's clock runs a year behind, worker-2's a year ahead: order comes from
    # (origin, seq) only, so every record lands and the replicas agree.
    slow = [Record("worker-1", s, obs(s, "worker-1", at=f"2025-01-{s:02d}T00:00:00Z"))
            for s in range(1, 21)]
    fast = [Record("worker-2", s, obs(s, "worker-2", at=f"2027-12-{s:02d}T00:00:00Z"))
            for s in range(1, 21)]
    by_time = sorted(slow + fast, key=lambda r: r.body.generated_at, reverse=True)  # type: ignore[union-attr]
    a, b = Model(), Model()
    a.merge(by_time)
    b.merge(slow + fast)
    assert a.snapshot() == b.snapshot()
    assert a.state.version_vector() == {"worker-1": 20, "worker-2": 20}
    assert len(a.graph) == 40


# --- property: convergence whatever the order, duplication or batching ----------------------


@st.composite
def histories(draw: st.DrawFn) -> list[Record]:
    origins = ["ann", "bob", "cy"]
    records: list[Record] = []
    made: list[Observation] = []
    counters = dict.fromkeys(origins, 0)
    for _ in range(draw(st.integers(1, 40))):
        origin = draw(st.sampled_from(origins))
        counters[origin] += 1
        if made and draw(st.booleans()) and draw(st.booleans()):
            target = draw(st.sampled_from(made))
            records.append(Record(origin, counters[origin],
                                  Retraction(target.id, origin, T0)))
        else:
            o = Observation(f"a{draw(st.integers(0, 5))}", f"f{len(made)}", origin, T0)
            made.append(o)
            records.append(Record(origin, counters[origin], o))
    return records


@settings(max_examples=examples(150), deadline=None)
@given(histories(), st.randoms(use_true_random=False))
def test_replicas_converge_in_any_delivery_order(history: list[Record],
                                                 rnd: random.Random) -> None:
    reference = Model()
    reference.merge(history)
    deliveries = history + rnd.sample(history, k=len(history) // 2)  # duplicates too
    rnd.shuffle(deliveries)
    replica = Model()
    i = 0
    while i < len(deliveries):
        size = rnd.randint(1, 6)
        replica.merge(deliveries[i:i + size])
        i += size
    assert replica.snapshot() == reference.snapshot()
    retracted = {r.body.target for r in history if isinstance(r.body, Retraction)}
    expected = {r.body.id for r in history if isinstance(r.body, Observation)} - retracted
    assert replica.graph == expected


def test_apply_needs_one_locator_per_record() -> None:
    state = ReplicaState()
    plan = state.plan([rec("w", 1)])
    with pytest.raises(KnowledgeError):
        state.apply(plan, [])


def test_record_from_journal_equals_the_checked_decoding() -> None:
    for record in (rec("worker-1", 3), Record("w", 2, obs(2, "w", context="c", severity="low")),
                   retraction("reviewer", 9, obs(1))):
        data = encode_record(record)
        trusted = record_from_journal(data)
        assert trusted == decode_record(data) == record
        assert trusted.key == record.key and trusted.wire == data
        assert trusted.body.id == record.body.id


# --- signatures (carried and defined here; made and checked by the adapters) -------------------


def test_a_signature_travels_with_its_record_and_is_not_part_of_its_identity() -> None:
    sig = bytes(range(64))
    for record in (Record("w", 4, obs(4, "w"), sig=sig),
                   Record("w", 5, Retraction(obs(1).id, "w", T0), sig=sig)):
        data = encode_record(record)
        for back in (decode_record(data), record_from_journal(data),
                     decode_sync(encode_sync(Records((record,)))).records[0]):  # type: ignore[union-attr]
            assert back.sig == sig and back == record
        unsigned = Record(record.origin, record.seq, record.body)
        assert unsigned == record and encode_record(unsigned) != data
        assert decode_record(encode_record(unsigned)).sig is None


def test_what_is_signed_binds_the_author_the_place_and_the_content() -> None:
    base = record_signing_bytes(rec("alice", 2))
    assert record_signing_bytes(rec("alice", 2)) == base
    others = {record_signing_bytes(r) for r in (
        rec("alice", 3, 2),                       # another place in the same log
        Record("mallory", 2, obs(2, "mallory")),  # another author
        rec("alice", 2, 9),                       # other content
        Record("alice", 2, Retraction(obs(2, "alice").id, "alice", T0)),  # another kind
    )}
    assert base not in others and len(others) == 4


@pytest.mark.parametrize("sig", [b"short", "x" * 64, 7])
def test_a_malformed_signature_is_refused(sig: object) -> None:
    item = msgpack.unpackb(encode_record(rec("w", 1)))
    with pytest.raises(SyncError, match="signature"):
        decode_record(msgpack.packb([*item, sig]))
    with pytest.raises(KnowledgeError, match="signature"):
        Record("w", 1, obs(1, "w"), sig=b"short")


# --- the snapshot a shard saves at close ------------------------------------------------------


def replica_view(state: ReplicaState) -> tuple[object, ...]:
    """Everything a replica answers from its state."""
    origins = sorted(state.version_vector())
    return (state.version_vector(), state.digest(), state.record_count,
            state.observation_records, state.retraction_records, state.retracted,
            state.missing_ranges(), {o: state.next_seq(o) for o in origins},
            {o: state.locators_in(o, 1, 1000) for o in origins},
            state.bucket_entries(range(DIGEST_BUCKETS)))


@settings(max_examples=examples(100), deadline=None)
@given(histories(), st.randoms(use_true_random=False))
def test_a_restored_snapshot_answers_as_the_state_did(history: list[Record],
                                                      rnd: random.Random) -> None:
    replica = Model()
    # Some records held out, so the logs have holes.
    replica.merge([r for r in history if rnd.random() < 0.8])
    restored = ReplicaState.restore(replica.state.snapshot())
    assert replica_view(restored) == replica_view(replica.state)
    # And it goes on as the state would: the rest of the history merges the same.
    again = Model()
    again.state, again.log = restored, list(replica.log)
    assert again.merge(history) == replica.merge(history)
    assert replica_view(again.state) == replica_view(replica.state)


def test_a_snapshot_that_is_not_one_is_refused_with_the_reason() -> None:
    state = ReplicaState()
    state.apply(state.plan([rec("worker-1", 1), rec("worker-1", 3)]), [10, 30])
    good = state.snapshot()
    parts = msgpack.unpackb(good, raw=False)
    assert ReplicaState.restore(good).version_vector() == {"worker-1": 1}

    def spoiled(i: int, value: object) -> bytes:
        changed = list(parts)
        changed[i] = value
        return msgpack.packb(changed, use_bin_type=True)

    origin = parts[6][0]
    for data, reason in [
        (good[:-7], "not a replica state snapshot"),
        (b"\x93\x01\x02\x03", "not a replica state snapshot"),
        (spoiled(0, 99), "version 99"),
        (spoiled(3, b"\0" * 5), "digest buckets"),
        (spoiled(6, [[origin[0], 1, 2, origin[3][:-8], origin[4]]]), "malformed"),
        (spoiled(6, [[origin[0], 3, 2, origin[3], origin[4]]]), "malformed"),
        (spoiled(6, []), "its digest counts 2 records, its logs 0"),
    ]:
        with pytest.raises(KnowledgeError, match=reason):
            ReplicaState.restore(data)


def test_a_digest_carries_its_version_vector_and_a_bad_one_is_refused() -> None:
    state = ReplicaState()
    state.apply(state.plan([rec("worker-1", 1), rec("worker-2", 1), rec("worker-2", 2)]),
                [0, 1, 2])
    plain = state.digest()
    sent = Digest(plain.count, plain.fingerprints, state.version_vector())
    back = decode_sync(encode_sync(sent))
    assert isinstance(back, Digest)
    assert back.vv == {"worker-1": 1, "worker-2": 2} and back.fingerprints == plain.fingerprints
    older = decode_sync(encode_sync(plain))  # a sender before vectors
    assert isinstance(older, Digest) and older.vv is None
    for vv, reason in [([1, 2], "map of origin"), ({"worker-1": -1}, "version vector entry"),
                       ({"bad name!": 1}, "origin")]:
        raw = msgpack.unpackb(encode_sync(plain), raw=False)
        raw["v"] = vv
        with pytest.raises(SyncError, match=reason):
            decode_sync(msgpack.packb(raw, use_bin_type=True))
