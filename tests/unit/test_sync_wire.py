"""The knowledge sync session's rules, one case each, over an in-memory wire on a virtual
clock between real shards (``tests/unit/sync_wire.py``): no socket, no sleep."""

from __future__ import annotations

import itertools
import math
import pathlib
from collections.abc import Iterator

import msgpack
import pytest

from porter_mesh.core.knowledge import (
    BucketEntries,
    CatchupChunk,
    CatchupRequest,
    Digest,
    Observation,
    PullReply,
    PullRequest,
    Record,
    Records,
    SyncMessage,
    encode_record,
    encode_sync,
)
from porter_mesh.core.session.sync import (
    CATCHUP_ATTEMPTS,
    Abandoned,
    CaughtUp,
    Merge,
    Progress,
    PullAnswered,
    Send,
    SyncSession,
    reply_refusal,
)
from porter_mesh.errors import SyncError
from tests.unit.sync_wire import InFlight, SyncWire

T0 = "2026-01-01T00:00:00Z"


@pytest.fixture
def wires(tmp_path: pathlib.Path) -> Iterator[list[SyncWire]]:
    made: list[SyncWire] = []
    yield made
    for wire in made:
        wire.close()


def make(wires: list[SyncWire], tmp_path: pathlib.Path, *names: str,
         **options: object) -> SyncWire:
    wire = SyncWire(tmp_path, *names, **options)  # type: ignore[arg-type]
    wires.append(wire)
    return wire


def held(wire: SyncWire, name: str) -> dict[str, int]:
    return wire.nodes[name].shard.state.version_vector()


# -- catch-up -----------------------------------------------------------------------------


def test_a_late_joiner_catches_up_chunk_by_chunk_one_peer_at_a_time(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a", "b", catchup_chunk=8)
    wire.write("a", 30)
    wire.write("b", 20)
    wire.advance(1.0)
    assert held(wire, "b") == held(wire, "a") == {"a": 30, "b": 20}

    wire.add("c")
    wire.join("c", "a")
    wire.join("c", "b")
    wire.advance(5.0)

    c = wire.nodes["c"]
    assert wire.digests()["c"] == wire.digests()["a"] == wire.digests()["b"]
    # One peer at a time: the catch-up from b starts only once a's is finished.
    requests = [(a.peer, a.message) for a in c.trace
                if isinstance(a, Send) and isinstance(a.message, CatchupRequest)]
    caught = [i for i, a in enumerate(c.trace) if isinstance(a, CaughtUp)]
    first_to_b = next(i for i, a in enumerate(c.trace) if isinstance(a, Send)
                      and isinstance(a.message, CatchupRequest) and a.peer == "b")
    assert c.trace[caught[0]] == CaughtUp("a") and caught[0] < first_to_b
    # Chunk by chunk from a (50 records in chunks of 8, each next chunk asked before the
    # last one was merged), then one empty chunk from b: everything was held by then.
    from_a = [m for p, m in requests if p == "a"]
    assert len(from_a) == math.ceil(50 / 8)
    assert [m.done for m in from_a] == list(range(0, 50, 8))  # type: ignore[union-attr]
    progress = [(e.done, e.total) for e in c.events if isinstance(e, Progress) and e.peer == "a"]
    assert progress == [(min(d, 50), 50) for d in range(8, 57, 8)]
    assert c.session.caught_up == {"a", "b"} and c.counters["catchups"] == 2
    # No gap was pulled while the catch-ups ran: they bring the same records, in order.
    assert wire.sent("c", PullRequest) == []


def test_gap_pulls_wait_while_a_catch_up_runs(tmp_path: pathlib.Path,
                                              wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a", catchup_chunk=4)
    wire.write("a", 12)
    wire.add("c")
    wire.join("c", "a")
    # While c's catch-up runs, a writes more and one broadcast is lost: a gap shows.
    wire.advance(0.015)
    assert wire.nodes["c"].session.catchup_peer == "a"
    wire.fault = lambda item: [] if item.broadcast else [0.01]
    wire.write("a", 1, prefix="lost")
    wire.fault = None
    wire.write("a", 1, prefix="after")
    wire.advance(5.0)
    c = wire.nodes["c"]
    pulls = [i for i, a in enumerate(c.trace) if isinstance(a, Send)
             and isinstance(a.message, PullRequest)]
    done = next(i for i, a in enumerate(c.trace) if isinstance(a, CaughtUp))
    assert all(i > done for i in pulls)
    assert held(wire, "c") == {"a": 14} and wire.digests()["c"] == wire.digests()["a"]


def test_a_timed_out_chunk_fails_the_attempt_and_the_catch_up_starts_over(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    # Digests far apart: a's digest would repair c behind the catch-up's back.
    wire = make(wires, tmp_path, "a", catchup_chunk=5, anti_entropy_interval=100.0)
    wire.write("a", 20)
    wire.add("c")
    chunks = {"n": 0}

    def lose_the_second_chunk(item: InFlight) -> list[float]:
        if item.dest == "c" and isinstance(item.message(), CatchupChunk):
            chunks["n"] += 1
            if chunks["n"] == 2:
                return []
        return [0.01]

    wire.fault = lose_the_second_chunk
    wire.join("c", "a")
    wire.advance(2.0)
    c = wire.nodes["c"]
    # Stuck behind the lost chunk: the catch-up waits for the one it asked.
    assert c.session.catchup_peer == "a" and held(wire, "c") == {"a": 5}
    assert c.counters["timeout.CatchupRequest"] == 0
    wire.advance(5.0)
    assert c.counters["timeout.CatchupRequest"] == 1
    restart = [m for m in wire.sent("c", CatchupRequest) if m.cursor is None]  # type: ignore[union-attr]
    assert [dict(m.vv) for m in restart] == [{}, {"a": 5}]  # type: ignore[union-attr]
    assert c.events[-1] == CaughtUp("a") and held(wire, "c") == {"a": 20}
    assert wire.digests()["c"] == wire.digests()["a"]


def test_a_peer_that_answers_garbage_is_skipped_after_its_attempts(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "good")
    wire.write("good", 10)
    forged = Record("good", 3, Observation("urn:x", "not good's", "good", T0))
    answers = iter([
        # Counts that do not follow what was asked (stale), then silence.
        encode_sync(CatchupChunk((), 99, 99, None)),
        # Bytes that are not a sync message at all.
        b"\xc1 garbage",
        # A record that clashes with one held: the merge is refused.
        encode_sync(CatchupChunk((forged,), 1, 1, None)),
    ])
    asked: list[SyncMessage] = []

    def hostile(src: str, message: SyncMessage) -> list[bytes]:
        asked.append(message)
        if isinstance(message, CatchupRequest):
            return [next(answers, b"")]
        return []

    wire.add_hostile("evil", hostile)
    wire.add("victim")
    # The victim already holds good's first three, so the forged third clashes.
    wire.nodes["victim"].shard.merge(wire.nodes["good"].shard.answer_pull(
        PullRequest("good", 1, 3)).records)
    wire.join("victim", "evil")
    wire.join("victim", "good")
    wire.advance(30.0)

    victim = wire.nodes["victim"]
    assert sum(isinstance(m, CatchupRequest) for m in asked) == CATCHUP_ATTEMPTS
    abandoned = [e for e in victim.events if isinstance(e, Abandoned)]
    assert [(e.peer, e.attempts) for e in abandoned] == [("evil", CATCHUP_ATTEMPTS)]
    assert "requested starting point" in abandoned[0].why
    assert victim.counters["catchup.abandoned"] == 1
    assert (victim.refused["stale"], victim.refused["malformed"],
            victim.refused["refused"]) == (1, 1, 1)
    assert victim.counters["timeout.CatchupRequest"] == 2
    # The catch-up queue moved on to the honest peer, and nothing forged went in.
    assert CaughtUp("good") in victim.events and held(wire, "victim") == {"good": 10}
    assert wire.digests()["victim"] == wire.digests()["good"]
    assert victim.session.caught_up == {"good"}
    # Joining again gives the peer its attempts back.
    wire.leave("victim", "evil")
    wire.join("victim", "evil")
    wire.advance(0.1)
    assert victim.session.catchup_peer == "evil"


def test_a_lost_pull_times_out_and_its_gap_is_asked_again(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    # Digests far apart: only the gap pulls can repair.
    wire = make(wires, tmp_path, "a", "b", anti_entropy_interval=100.0)
    wire.advance(0.5)
    wire.fault = lambda item: [] if item.broadcast else [0.01]
    wire.write("a", 2)  # lost
    pulls = {"n": 0}

    def lose_the_first_pull(item: InFlight) -> list[float]:
        if isinstance(item.message(), PullRequest):
            pulls["n"] += 1
            if pulls["n"] == 1:
                return []
        return [0.01]

    wire.fault = lose_the_first_pull
    wire.write("a", 1)  # arrives: b sees the gap 1..2 and pulls it from a
    wire.advance(0.5)
    b = wire.nodes["b"]
    assert held(wire, "b") == {"a": 0} and b.session.asked("a", PullRequest("a", 1, 2))
    # Asked once per request_timeout, not before.
    assert wire.sent("b", PullRequest) == [PullRequest("a", 1, 2)]
    wire.advance(1.0)
    assert b.counters["timeout.PullRequest"] == 1
    assert wire.sent("b", PullRequest) == [PullRequest("a", 1, 2)] * 2
    assert held(wire, "b") == {"a": 3}


# -- anti-entropy --------------------------------------------------------------------------


def test_a_lost_last_record_is_repaired_by_anti_entropy(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a", "b")
    wire.advance(0.5)
    wire.write("a", 2)
    wire.fault = lambda item: [] if item.broadcast else [0.01]
    wire.write("a", 1, prefix="last")  # its broadcast is lost; nothing comes after it
    wire.fault = None
    wire.advance(0.1)
    b = wire.nodes["b"]
    # The version vector shows no gap: only the digests can tell.
    assert held(wire, "b") == {"a": 2} and b.session.state.missing_ranges() == []
    wire.advance(3.0)
    assert held(wire, "b") == {"a": 3} and wire.digests()["a"] == wire.digests()["b"]
    assert b.counters["received.BucketEntries"] + b.counters["received.Digest"] >= 1
    assert any(m == PullRequest("a", 3, 3) for m in wire.sent("b", PullRequest))


def test_one_digest_exchange_repairs_both_sides(tmp_path: pathlib.Path,
                                                wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a")
    wire.advance(0.5)
    wire.add("b")  # b's first digest is due at 1.5, a's at 1.0
    wire.join("a", "b")
    wire.advance(0.1)
    wire.fault = lambda item: [] if item.broadcast else [0.01]
    wire.write("a", 1, prefix="a-only")
    wire.write("b", 1, prefix="b-only")
    wire.fault = None
    assert wire.digests()["a"] != wire.digests()["b"]
    wire.advance(0.7)  # a's digest goes out at 1.0; the exchange does the rest
    assert wire.digests()["a"] == wire.digests()["b"]
    assert held(wire, "a") == held(wire, "b") == {"a": 1, "b": 1}
    digests = len(wire.sent("a", Digest)) + len(wire.sent("b", Digest))
    assert digests == 2  # one on its turn, one sent back with the listing


def test_digests_whose_vectors_differ_pull_what_they_show_and_list_nothing(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a", "b", "c")
    wire.advance(0.5)
    # c misses every broadcast of a burst: wherever it compares digests the vectors differ.
    wire.fault = lambda item: [] if item.broadcast and item.dest == "c" else [0.01]
    wire.write("a", 40)
    wire.write("b", 30)
    wire.fault = None
    wire.advance(3.0)
    assert held(wire, "c") == {"a": 40, "b": 30}
    assert len(set(wire.digests().values())) == 1
    assert any(isinstance(m, PullRequest) for m in wire.sent("c", PullRequest))
    for name in "abc":
        assert wire.sent(name, BucketEntries) == [], name


def test_equal_vectors_with_different_digests_are_still_listed(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "b", "c")
    wire.advance(0.1)
    # c holds x's second record but not its first: no vector shows it (x's is 0 on both).
    wire.inject("x", "c", Records((Record("x", 2, Observation(
        "urn:porter:file:x.ts", "the second", "x", "2026-01-01T00:00:00Z")),)), broadcast=True)
    wire.advance(0.1)
    assert held(wire, "c") == {"x": 0} and wire.digests()["b"] != wire.digests()["c"]
    wire.advance(3.0)
    assert wire.sent("b", BucketEntries) or wire.sent("c", BucketEntries)
    assert wire.nodes["b"].shard.state.holds("x", 2)
    assert wire.digests()["b"] == wire.digests()["c"]


def test_a_digest_without_a_vector_gets_a_listing(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a", "b")
    wire.advance(0.1)
    wire.fault = lambda item: [] if item.broadcast else [0.01]
    wire.write("a", 3)
    wire.fault = None
    a = wire.nodes["a"].shard.state.digest()
    assert a.vv is None  # the state's own digest; a sender before vectors sends it so
    wire.inject("a", "b", a)
    wire.advance(0.05)
    assert wire.sent("b", BucketEntries)


def test_digests_go_round_robin_and_not_while_a_catch_up_runs(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a", "b", "c")
    wire.advance(10.5)
    to = [a.peer for a in wire.nodes["a"].trace
          if isinstance(a, Send) and isinstance(a.message, Digest)]
    assert len(to) == 10 and set(to) == {"b", "c"}
    assert all(x != y for x, y in itertools.pairwise(to))
    # While a catch-up runs, no digest leaves.
    a = wire.nodes["a"].session
    wire.fault = lambda item: [] if isinstance(item.message(), CatchupChunk) else [0.01]
    wire.leave("a", "b")
    wire.join("a", "b")
    assert a.catchup_peer == "b"
    before = len(wire.sent("a", Digest))
    wire.advance(2.9)
    assert a.catchup_peer == "b" and len(wire.sent("a", Digest)) == before


def test_an_idle_lonely_session_needs_no_timer(tmp_path: pathlib.Path,
                                              wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a")
    assert wire.nodes["a"].session.next_deadline() == math.inf
    wire.add("b")
    wire.join("a", "b")
    wire.advance(0.5)
    assert wire.nodes["a"].session.next_deadline() == pytest.approx(1.0)
    wire.leave("a", "b")
    assert wire.nodes["a"].session.next_deadline() == math.inf


# -- refusals ------------------------------------------------------------------------------


def test_unasked_replies_are_refused_and_change_nothing(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a", "b")
    wire.write("b", 5)
    wire.advance(0.5)
    records = wire.nodes["b"].shard.answer_pull(PullRequest("b", 1, 5)).records
    fresh = wire.add("c")
    before = fresh.shard.digest()
    for message in (PullReply("b", 1, 5, records), CatchupChunk(records, 5, 5, None),
                    BucketEntries((), ())):
        wire.inject("b", "c", message)
    wire.inject("stranger", "c", PullReply("b", 1, 5, records))
    wire.advance(0.1)
    assert fresh.refused == {"unasked": 4}
    assert fresh.shard.digest() == before
    assert not any(isinstance(a, Merge) for a in fresh.trace)


def test_records_outside_the_asked_range_are_refused(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a", "b")
    wire.write("a", 6)
    wire.advance(0.5)
    b = wire.nodes["b"]
    records = wire.nodes["a"].shard.answer_pull(PullRequest("a", 1, 6)).records
    # b asks a for 2..3 (a probe); the reply comes for 2..4 instead: not the range asked.
    wire.carry("b", b.session.probe("a", "a", 2, now=wire.now))
    assert b.session.asked("a", PullRequest("a", 2, 2))
    wire.in_flight.clear()
    wire.inject("a", "b", PullReply("a", 2, 4, records[1:4]))
    # A reply that claims the asked range but carries a record outside it never decodes.
    raw = msgpack.unpackb(encode_sync(PullReply("a", 2, 2, (records[1],))), raw=False)
    raw["r"] = [msgpack.unpackb(encode_record(records[4]), raw=False)]
    wire.inject("a", "b", msgpack.packb(raw, use_bin_type=True))
    wire.advance(0.05)
    assert b.refused == {"unasked": 1, "malformed": 1}
    # A catch-up chunk with records at or below the version vector it was asked from.
    c = wire.add("c")
    c.shard.merge(records[:3])
    drops = [1]

    def drop_one_chunk(item: InFlight) -> list[float]:
        if drops and isinstance(item.message(), CatchupChunk):
            return [] if drops.pop() else [0.01]
        return [0.01]

    wire.fault = drop_one_chunk
    wire.join("c", "a")
    (request,) = wire.sent("c", CatchupRequest)
    assert dict(request.vv) == {"a": 3}  # type: ignore[union-attr]
    wire.inject("a", "c", CatchupChunk(records[:4], 4, 4, None))
    wire.advance(0.05)
    assert c.refused == {"refused": 1}
    # Nothing of that chunk went in; the refusal failed the attempt, and the catch-up
    # started over at once and succeeded.
    starts = [m for m in wire.sent("c", CatchupRequest) if m.cursor is None]  # type: ignore[union-attr]
    assert len(starts) == 2 and c.session.caught_up == {"a"}
    assert held(wire, "c") == {"a": 6} and wire.digests()["c"] == wire.digests()["a"]


def test_only_a_senders_own_records_are_taken_and_only_by_broadcast(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a", "b")
    wire.advance(0.5)
    b = wire.nodes["b"]
    own = Record("a", 1, Observation("urn:x", "mine", "a", T0))
    other = Record("c", 1, Observation("urn:x", "not a's", "c", T0))
    wire.inject("a", "b", Records((own,)), broadcast=False)
    wire.inject("a", "b", Records((other,)), broadcast=True)
    wire.inject("a", "b", b"\x93 junk", broadcast=True)
    wire.advance(0.05)
    assert b.refused == {"not-broadcast": 1, "wrong-origin": 1, "malformed": 1}
    assert held(wire, "b") == {}
    wire.inject("a", "b", Records((own,)), broadcast=True)
    wire.advance(0.05)
    assert held(wire, "b") == {"a": 1}


def test_a_probe_says_whether_the_peer_holds_a_record(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a", "b")
    wire.write("a", 2)
    wire.advance(0.5)
    b = wire.nodes["b"]
    wire.carry("b", b.session.probe("a", "a", 2, now=wire.now))
    wire.carry("b", b.session.probe("a", "a", 9, now=wire.now))
    wire.advance(0.1)
    answers = [e for e in b.events if isinstance(e, PullAnswered)]
    assert [(e.request.first, e.records) for e in answers] == [(2, 1), (9, 0)]


def test_a_full_disk_fails_catch_up_attempts_and_anti_entropy_repairs_after(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a", catchup_chunk=4)
    wire.write("a", 10)
    c = wire.add("c")
    c.disk_full = True
    wire.join("c", "a")
    wire.advance(0.5)
    # Each attempt's first chunk cannot be stored: the attempts run out.
    assert c.counters["storage.write-failed"] == CATCHUP_ATTEMPTS
    assert c.counters["catchup.abandoned"] == 1 and held(wire, "c") == {}
    c.disk_full = False
    wire.advance(2.0)  # anti-entropy brings it all once the disk takes writes again
    assert held(wire, "c") == {"a": 10} and wire.digests()["c"] == wire.digests()["a"]


def test_a_peer_without_a_replica_is_left_alone_for_a_while(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a")
    wire.add_hostile("tool", lambda src, message: [])
    wire.join("a", "tool")
    a = wire.nodes["a"]
    assert a.session.catchup_peer == "tool"
    wire.carry("a", a.session.peer_without_replica("tool", now=wire.now))
    assert a.session.catchup_peer is None and a.session.without_replica == {"tool"}
    wire.advance(4.9)
    assert wire.sent("a", Digest) == [] and len(wire.sent("a", CatchupRequest)) == 1
    wire.advance(0.2)  # the back-off is over: tried again
    assert a.session.without_replica == frozenset() and a.session.catchup_peer == "tool"


# -- pure pieces ---------------------------------------------------------------------------


def test_reply_refusal_matches_replies_to_requests() -> None:
    ask = PullRequest("a", 2, 4)
    assert reply_refusal(PullReply("a", 2, 4, ()), ask) is None
    assert reply_refusal(PullReply("a", 2, 5, ()), ask) == (
        "refused", "pull reply does not match the range that was asked for")
    cu = CatchupRequest({}, None, 4, 8)
    assert reply_refusal(CatchupChunk((), 4, 4, None), cu) is None
    assert reply_refusal(CatchupChunk((), 4, 4, None), None)[0] == "unasked"  # type: ignore[index]
    assert reply_refusal(CatchupChunk((), 9, 9, None), cu)[0] == "stale"  # type: ignore[index]


def test_settings_out_of_range_are_refused(tmp_path: pathlib.Path,
                                           wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a")
    state = wire.nodes["a"].shard.state
    with pytest.raises(SyncError, match="positive"):
        SyncSession(state, anti_entropy_interval=0, request_timeout=1, catchup_timeout=1,
                    now=0.0)
    with pytest.raises(SyncError, match="catchup_chunk"):
        SyncSession(state, anti_entropy_interval=1, request_timeout=1, catchup_timeout=1,
                    now=0.0, catchup_chunk=0)


def test_a_seat_is_never_caught_up_from_nor_sent_a_digest(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a")
    a = wire.nodes["a"].session
    assert a.peer_joined("porter-ui-1", seat=True, now=wire.now) == []
    assert a.catchup_peer is None and a.next_deadline() == math.inf
    assert a.timer(wire.now + 10.0) == []


def test_a_range_in_flight_is_not_asked_again(tmp_path: pathlib.Path,
                                              wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a", "c")
    wire.advance(0.5)
    wire.fault = lambda item: [] if item.broadcast else [0.01]
    wire.write("a", 1, prefix="lost")
    # Pull replies take longer than a digest's turn but less than a request's timeout.
    wire.fault = lambda item: [0.9] if isinstance(item.message(), PullReply) else [0.01]
    wire.write("a", 1, prefix="after")
    wire.advance(2.0)
    assert held(wire, "c") == {"a": 2} and wire.digests()["c"] == wire.digests()["a"]
    assert wire.sent("c", PullRequest) == [PullRequest("a", 1, 1)]
    c = wire.nodes["c"]
    assert c.counters["timeout.PullRequest"] == 0 and c.refused == {}


def test_a_listing_that_shows_much_missing_turns_into_a_catch_up(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a", "c", catchup_after_pulls=0)
    wire.advance(0.5)
    assert wire.nodes["c"].session.caught_up == {"a"}
    wire.fault = lambda item: [] if item.broadcast else [0.01]
    wire.write("a", 3, prefix="unseen")  # c learns of them only from a listing
    wire.fault = None
    wire.advance(3.0)
    assert held(wire, "c") == {"a": 3} and wire.digests()["c"] == wire.digests()["a"]
    assert wire.sent("c", PullRequest) == []  # one catch-up rather than pulls
    assert len(wire.sent("c", CatchupRequest)) == 2  # on joining, then for the listing


def test_listed_records_that_clash_with_held_ones_are_refused_and_the_rest_repairs(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a", "c")
    wire.advance(0.5)
    # A forger fed each side its own version of record (x, 1).
    for dest, finding in (("a", "one version"), ("c", "another")):
        wire.inject("x", dest, Records((Record("x", 1, Observation("urn:x", finding, "x",
                                                                   T0)),)), broadcast=True)
    wire.fault = lambda item: [] if item.broadcast else [0.01]
    wire.write("a", 1, prefix="lost")  # a record c misses, listed beside the clash
    wire.fault = None
    wire.advance(3.0)
    assert held(wire, "c") == held(wire, "a") == {"a": 1, "x": 1}
    assert wire.nodes["c"].refused["conflict"] >= 1


def test_a_failed_attempt_starts_over_at_the_head_of_the_queue(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    wire = make(wires, tmp_path, "a", "b", catchup_chunk=5, anti_entropy_interval=100.0)
    wire.write("a", 10)
    wire.write("b", 10)
    wire.advance(0.5)
    wire.add("c")
    lost: list[InFlight] = []

    def lose_as_first_chunk(item: InFlight) -> list[float]:
        if not lost and item.src == "a" and isinstance(item.message(), CatchupChunk):
            lost.append(item)
            return []
        return [0.01]

    wire.fault = lose_as_first_chunk
    wire.join("c", "a")
    wire.join("c", "b")  # queued behind a
    wire.advance(10.0)
    c = wire.nodes["c"]
    starts = [a.peer for a in c.trace if isinstance(a, Send)
              and isinstance(a.message, CatchupRequest) and a.message.cursor is None]
    assert lost and starts == ["a", "a", "b"]  # a again first, b still waits its turn
    assert c.session.caught_up == {"a", "b"} and held(wire, "c") == {"a": 10, "b": 10}


def test_a_gap_is_asked_of_its_origin_while_it_is_connected(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    # Digests far apart: only the gap pulls and their timeouts act here.
    wire = make(wires, tmp_path, "a", "b", "c", anti_entropy_interval=100.0)
    wire.advance(0.5)
    wire.fault = lambda item: [] if item.broadcast and item.dest == "c" else [0.01]
    wire.write("a", 1, prefix="lost")
    lost: list[InFlight] = []

    def lose_three_replies(item: InFlight) -> list[float]:
        if len(lost) < 3 and isinstance(item.message(), PullReply):
            lost.append(item)
            return []
        return [0.01]

    wire.fault = lose_three_replies
    wire.write("a", 1, prefix="after")  # c sees the gap; its pulls time out three times
    wire.advance(6.0)
    c = wire.nodes["c"]
    asked = [a.peer for a in c.trace if isinstance(a, Send)
             and isinstance(a.message, PullRequest)]
    assert len(lost) == 3 and asked == ["a"] * 4, asked
    assert c.counters["timeout.PullRequest"] == 3 and held(wire, "c") == {"a": 2}


def test_a_peer_given_up_on_is_not_caught_up_from_again_until_it_joins_again(
        tmp_path: pathlib.Path, wires: list[SyncWire]) -> None:
    # Every pull a listing asks for would turn into a catch-up: the rule under test
    # must hold against it.
    wire = make(wires, tmp_path, "good", catchup_after_pulls=0)
    wire.write("good", 10)
    good = wire.nodes["good"].shard.state
    asked: list[SyncMessage] = []

    def listing_then_garbage(src: str, message: SyncMessage) -> list[bytes]:
        # Garbage for every chunk; for every digest, good's records as its own listing.
        asked.append(message)
        if isinstance(message, CatchupRequest):
            return [b"\xc1 garbage"]
        if isinstance(message, Digest):
            return [encode_sync(good.bucket_entries(good.differing_buckets(message)))]
        return []

    wire.add_hostile("evil", listing_then_garbage)
    wire.add("victim")
    wire.join("victim", "evil")
    wire.advance(30.0)
    victim = wire.nodes["victim"]
    assert [(e.peer, e.attempts) for e in victim.events if isinstance(e, Abandoned)] == [
        ("evil", CATCHUP_ATTEMPTS)]
    assert sum(isinstance(m, CatchupRequest) for m in asked) == CATCHUP_ATTEMPTS
    # Anti-entropy goes on with it: its listings are pulled, not caught up.
    assert any(isinstance(m, Digest) for m in asked)
    assert any(isinstance(m, PullRequest) for m in asked)
    wire.leave("victim", "evil")
    wire.join("victim", "evil")
    assert victim.session.catchup_peer == "evil"  # joining again gives its attempts back


def test_a_group_of_own_records_is_broadcast_in_as_few_messages_as_the_limits_allow() -> None:
    from porter_mesh.core.constants import MAX_MESSAGE_BYTES
    from porter_mesh.core.knowledge import MAX_FINDING_CHARS, ReplicaState, decode_sync
    from porter_mesh.core.session.sync import Broadcast

    session = SyncSession(ReplicaState(), anti_entropy_interval=1, request_timeout=1,
                          catchup_timeout=1, now=0.0)
    small = [Record("a", s, Observation("urn:porter:file:x", f"f{s}", "a", T0))
             for s in range(1, 101)]
    one = session.local_records(small)
    assert len(one) == 1 and isinstance(one[0], Broadcast)
    assert isinstance(one[0].message, Records) and one[0].message.records == tuple(small)
    assert session.local_records([]) == []
    # Findings of the largest size, in characters of four UTF-8 bytes each: no message
    # may exceed the limit, and the records keep their order across messages.
    big = [Record("a", s, Observation("urn:porter:file:x", "\U0001F600" * MAX_FINDING_CHARS,
                                      "a", T0))
           for s in range(1, 81)]
    actions = session.local_records(big)
    assert len(actions) > 1
    carried: list[Record] = []
    for action in actions:
        assert isinstance(action, Broadcast) and isinstance(action.message, Records)
        data = encode_sync(action.message)
        assert len(data) <= MAX_MESSAGE_BYTES
        decoded = decode_sync(data)
        assert isinstance(decoded, Records)
        carried.extend(decoded.records)
    assert [r.seq for r in carried] == list(range(1, 81))
