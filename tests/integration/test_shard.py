"""The shard on real disk: durability, restart, sync handling, rdflib view, CLI."""

from __future__ import annotations

import io
import itertools
import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout

import msgpack
import pyoxigraph as ox
import pytest
import rdflib

from porter_mesh.adapters.security import (
    RecordSigner,
    RecordVerifier,
    TrustStore,
    load_identity,
    provision_mesh,
)
from porter_mesh.adapters.shard import Durability, Index, Shard
from porter_mesh.cli.main import main as cli_main
from porter_mesh.core.knowledge import (
    MAX_RECORDS_PER_MESSAGE,
    CatchupChunk,
    CatchupRequest,
    Observation,
    PullReply,
    PullRequest,
    Record,
    Records,
    Retraction,
    decode_sync,
    encode_record,
    encode_sync,
    record_link,
)
from porter_mesh.errors import ConfigError, KnowledgeError, SyncError

PROFILE_QUERY = (
    "SELECT ?about ?finding WHERE { ?obs <https://porter.chapeaux.io/vocab#about> ?about ; "
    "<https://porter.chapeaux.io/vocab#finding> ?finding }"
)
PROFILE_BINDING = {"about": "urn:porter:file:server.ts",
                   "finding": "depends on express module for HTTP routing"}
T0 = "2026-01-31T12:00:00.000000Z"


@pytest.fixture
def shard(tmp_path: pathlib.Path) -> Iterator[Shard]:
    s = Shard(tmp_path / "a", agent="worker-1")
    yield s
    s.close()


def fill(s: Shard, n: int, prefix: str = "f") -> list[Record]:
    return [s.remember(f"urn:porter:file:{prefix}{i}.ts", f"finding {prefix}{i}")
            for i in range(n)]


def fingerprint(s: Shard) -> tuple[object, ...]:
    stats = s.stats()
    rows = sorted(tuple(sorted(r.items())) for r in s.query(PROFILE_QUERY, row_limit=100_000)
                  .items())
    return stats.version_vector, stats.digest, stats.observations, rows


def exchange(src: Shard, dst: Shard, message: object, asked: object = None) -> object:
    """Carry one message as bytes (as the node will) and hand it to ``dst``."""
    return dst.handle(decode_sync(encode_sync(message)), asked=asked)  # type: ignore[arg-type]


def catch_up(server: Shard, client: Shard, limit: int = 50) -> list[tuple[int, int]]:
    request = client.catchup_request(limit=limit)
    progress = []
    for _ in range(10_000):
        chunk = decode_sync(encode_sync(server.handle(request).replies[0]))
        outcome = client.handle(chunk, asked=request)
        assert outcome.progress is not None
        progress.append(outcome.progress)
        if outcome.finished:
            return progress
        request = outcome.replies[0]  # type: ignore[assignment]
    raise AssertionError("catch-up did not finish")


# --- the profile example -----------------------------------------------------------------


def test_profile_example_query_returns_the_profile_binding(shard: Shard) -> None:
    assert shard.query(PROFILE_QUERY).items() == []
    shard.remember("urn:porter:file:server.ts", "depends on express module for HTTP routing")
    result = shard.query(PROFILE_QUERY)
    assert result.items() == [PROFILE_BINDING]
    assert not result.truncated and not result.isolated
    about, _ = result.rows[0]
    assert isinstance(about, ox.Literal) and about.datatype.value.endswith("#string")
    with_limit = shard.query(PROFILE_QUERY + " LIMIT 10")
    assert with_limit.items() == [PROFILE_BINDING]


def test_observation_vocabulary(shard: Shard) -> None:
    record = shard.remember("urn:porter:file:a.ts", "uses pg", severity="high",
                            context="urn:porter:task:a3f9")
    rows = shard.query(
        "SELECT ?type ?by ?at ?ctx ?sev WHERE { ?o a ?type ; porter:discoveredBy ?by ; "
        "prov:generatedAtTime ?at ; porter:context ?ctx ; porter:severity ?sev }").rows
    (kind, by, at, ctx, sev), = rows
    assert kind.value == "https://porter.chapeaux.io/vocab#Observation"
    assert by.value == "worker-1" and ctx.value == "urn:porter:task:a3f9"
    assert sev.value == "high"
    assert at.datatype.value == "http://www.w3.org/2001/XMLSchema#dateTime"
    subject = shard.query("SELECT ?o WHERE { ?o porter:about ?a }").rows[0][0]
    assert subject.value == record.body.iri  # type: ignore[union-attr]


def test_same_observation_twice_is_stored_once(tmp_path: pathlib.Path, shard: Shard) -> None:
    record = shard.remember("urn:porter:file:a.ts", "x", generated_at=T0)
    with Shard(tmp_path / "b", agent="worker-2") as other:
        for _ in range(3):
            other.merge([record])
        other.handle(Records((record,)))
        assert other.stats().observations == 1 and other.stats().observation_records == 1


# --- durability ------------------------------------------------------------------------------


def test_restart_resumes_from_disk_and_never_reuses_a_sequence(tmp_path: pathlib.Path) -> None:
    with Shard(tmp_path / "d", agent="worker-1") as s:
        fill(s, 25)
        before = fingerprint(s)
    with Shard(tmp_path / "d", agent="worker-1") as s:
        assert fingerprint(s) == before
        assert s.remember("urn:x", "after restart").seq == 26


def _wait_line(proc: subprocess.Popen[bytes], deadline: float) -> bytes:
    assert proc.stdout is not None
    buf = b""
    while not buf.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        assert remaining > 0, "the child did not report in time"
        ready, _, _ = select.select([proc.stdout], [], [], remaining)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            assert chunk, "the child exited early"
            buf += chunk
    return buf


CHILD = """
import sys
from porter_mesh.adapters.shard import Shard, Durability
s = Shard(sys.argv[1], agent="worker-1", durability=Durability[sys.argv[2]])
for i in range(int(sys.argv[3])):
    r = s.remember("urn:porter:file:k%d.ts" % i, "stored before the kill %d" % i)
print("stored", r.seq, flush=True)
sys.stdin.read()  # hold the shard open until killed
"""


@pytest.mark.parametrize("durability", ["FSYNC", "OS"])
def test_a_reported_remember_survives_kill_9(tmp_path: pathlib.Path, durability: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "k"), durability,
                             "40"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        line = _wait_line(proc, time.monotonic() + 60)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        proc.stdout.close()
    assert line.split() == [b"stored", b"40"]
    assert proc.returncode == -signal.SIGKILL
    with Shard(tmp_path / "k", agent="worker-1") as s:
        assert s.version_vector() == {"worker-1": 40}
        assert s.stats().observations == 40
        found = s.query("ASK { ?o porter:finding 'stored before the kill 39' }")
        assert found.boolean is True
        assert s.remember("urn:x", "next").seq == 41


def test_torn_journal_tail_is_cut(tmp_path: pathlib.Path) -> None:
    with Shard(tmp_path / "t", agent="worker-1") as s:
        fill(s, 5)
    journal = tmp_path / "t" / "knowledge.journal"
    size = journal.stat().st_size
    with open(journal, "ab") as fh:
        fh.write(b"\x00\x00\x01\x00\xde\xad")  # a frame header promising 256 bytes
    with Shard(tmp_path / "t", agent="worker-1") as s:
        assert s.version_vector() == {"worker-1": 5}
        assert journal.stat().st_size == size
        assert s.remember("urn:x", "y").seq == 6


def test_damage_inside_the_journal_is_reported(tmp_path: pathlib.Path) -> None:
    with Shard(tmp_path / "c", agent="worker-1") as s:
        fill(s, 5)
    journal = tmp_path / "c" / "knowledge.journal"
    data = bytearray(journal.read_bytes())
    data[60] ^= 0xFF
    journal.write_bytes(bytes(data))
    with pytest.raises(KnowledgeError, match="damaged"):
        Shard(tmp_path / "c", agent="worker-1")


@pytest.mark.parametrize("index", list(Index))
def test_store_is_rebuilt_from_the_journal(tmp_path: pathlib.Path, index: Index) -> None:
    with Shard(tmp_path / "r", agent="worker-1", index=index) as s:
        records = fill(s, 30)
        s.retract(records[3].body.iri)  # type: ignore[union-attr]
        before = fingerprint(s)
    if index is Index.DISK:
        # The store lost everything (moved aside): the journal restores it.
        (tmp_path / "r" / "oxigraph").rename(tmp_path / "lost")
    else:
        assert not (tmp_path / "r" / "oxigraph").exists()  # nothing but the journal
    with Shard(tmp_path / "r", agent="worker-1", index=index) as s:
        assert fingerprint(s) == before


def test_store_behind_its_watermark_is_caught_up(tmp_path: pathlib.Path) -> None:
    with Shard(tmp_path / "w", agent="worker-1", index=Index.DISK) as s:
        fill(s, 10)
        before = fingerprint(s)
        last_frame = s.state.locator("worker-1", 10)
    # Simulate a crash after the journal write but before the store write: roll the
    # store back by deleting the last observations and moving the watermark back.
    store = ox.Store(str(tmp_path / "w" / "oxigraph"))
    meta = ox.NamedNode("urn:porter:shard:meta")
    (mark,) = list(store.quads_for_pattern(None, None, None, meta))
    store.remove(mark)
    store.add(ox.Quad(mark.subject, mark.predicate,
                      ox.Literal(str(last_frame), datatype=mark.object.datatype),  # type: ignore[union-attr]
                      meta))
    store.update("DELETE WHERE { ?o <https://porter.chapeaux.io/vocab#finding> 'finding f9' ;"
                 " ?p ?v }")
    del store
    with Shard(tmp_path / "w", agent="worker-1", index=Index.DISK) as s:
        assert fingerprint(s) == before


def test_one_process_at_a_time(shard: Shard) -> None:
    with pytest.raises(KnowledgeError, match="another process"):
        Shard(shard.data_dir, agent="worker-1")


def test_a_data_directory_belongs_to_one_agent(tmp_path: pathlib.Path) -> None:
    Shard(tmp_path / "o", agent="worker-1").close()
    with pytest.raises(ConfigError, match="belongs to agent 'worker-1'"):
        Shard(tmp_path / "o", agent="worker-2")
    with Shard(tmp_path / "o") as s:  # a reader without a name gets the owner's
        assert s.agent == "worker-1"


def test_fsync_policy_is_selectable(tmp_path: pathlib.Path) -> None:
    with Shard(tmp_path / "n", agent="worker-1", durability=Durability.OS) as s:
        fill(s, 3)
    with Shard(tmp_path / "n", agent="worker-1") as s:
        assert s.version_vector() == {"worker-1": 3}


# --- writing rules ---------------------------------------------------------------------------


def test_retract_rules(shard: Shard) -> None:
    record = shard.remember("urn:porter:file:server.ts",
                            "depends on express module for HTTP routing")
    iri = record.body.iri  # type: ignore[union-attr]
    gone = shard.retract(iri)
    assert isinstance(gone.body, Retraction) and gone.seq == 2
    assert shard.query(PROFILE_QUERY).items() == []
    with pytest.raises(KnowledgeError, match="already retracted"):
        shard.retract(iri)
    with pytest.raises(KnowledgeError, match="no observation"):
        shard.retract("urn:porter:obs:" + "0" * 64)
    stats = shard.stats()
    assert (stats.observations, stats.observation_records, stats.retractions) == (0, 1, 1)


def test_reader_without_agent_cannot_write(tmp_path: pathlib.Path) -> None:
    with Shard(tmp_path / "x") as s, pytest.raises(KnowledgeError, match="agent"):
        s.remember("a", "b")


def test_invalid_remember_is_refused(shard: Shard) -> None:
    with pytest.raises(KnowledgeError, match="severity"):
        shard.remember("a", "b", severity="!!")
    assert shard.version_vector() == {}


def test_strings_with_quotes_newlines_and_controls_survive(shard: Shard) -> None:
    text = 'he said "hi"\\n\nthen\ttabbed \x01 \u2028 \U0001F600 \\ done'
    shard.remember("urn:weird", text)
    (row,) = shard.query("SELECT ?f WHERE { ?o porter:about 'urn:weird' ; porter:finding ?f }"
                         ).items()
    assert row["f"] == text


# --- replication between shards --------------------------------------------------------------


def test_catch_up_and_snapshot_between_shards(tmp_path: pathlib.Path) -> None:
    with Shard(tmp_path / "s", agent="worker-1") as server, \
            Shard(tmp_path / "c", agent="worker-2") as client:
        records = fill(server, 120)
        server.retract(records[7].body.iri)  # type: ignore[union-attr]
        client.merge(records[:30])
        progress = catch_up(server, client, limit=25)
        assert progress[-1][0] == progress[-1][1] == 121 - 30
        assert len(progress) == 4
        assert fingerprint(client) == fingerprint(server)
        # A node that lost everything takes a snapshot (catch-up from nothing).
        with Shard(tmp_path / "fresh", agent="worker-3") as fresh:
            catch_up(server, fresh, limit=MAX_RECORDS_PER_MESSAGE)
            assert fingerprint(fresh) == fingerprint(server)


def test_pull_repairs_a_gap(tmp_path: pathlib.Path) -> None:
    with Shard(tmp_path / "s", agent="worker-1") as server, \
            Shard(tmp_path / "c", agent="worker-2") as client:
        records = fill(server, 10)
        client.merge(records[:3] + records[6:])  # 4..6 were lost in transit
        (gap,) = client.missing_ranges()
        assert (gap.origin, gap.first, gap.last) == ("worker-1", 4, 6)
        reply = server.handle(decode_sync(encode_sync(gap))).replies[0]
        outcome = exchange(server, client, reply, asked=gap)
        assert outcome.merged.accepted == 3  # type: ignore[attr-defined]
        assert client.missing_ranges() == [] and fingerprint(client) == fingerprint(server)


def test_digest_exchange_repairs_both_ways(tmp_path: pathlib.Path) -> None:
    with Shard(tmp_path / "a", agent="worker-1") as a, \
            Shard(tmp_path / "b", agent="worker-2") as b:
        shared = fill(a, 20)
        b.merge(shared)
        mine = fill(a, 3, prefix="a-only")
        theirs = fill(b, 4, prefix="b-only")
        assert a.digest() != b.digest()
        for left, right in ((a, b), (b, a)):
            # left sends its digest; right lists the differing buckets; left pulls.
            listing = right.handle(decode_sync(encode_sync(left.digest()))).replies
            (entries,) = listing
            pulls = left.handle(decode_sync(encode_sync(entries))).replies
            for pull in pulls:
                reply = right.handle(decode_sync(encode_sync(pull))).replies[0]
                left.handle(decode_sync(encode_sync(reply)), asked=pull)
        assert a.digest() == b.digest()
        assert a.handle(b.digest()).replies == ()
        assert fingerprint(a)[1:] == fingerprint(b)[1:]
        assert a.stats().observations == 20 + len(mine) + len(theirs)


def test_retraction_replicates_and_is_not_undone(tmp_path: pathlib.Path) -> None:
    with Shard(tmp_path / "a", agent="worker-1") as a, \
            Shard(tmp_path / "b", agent="reviewer") as b, \
            Shard(tmp_path / "c", agent="worker-3") as c:
        record = a.remember("urn:porter:file:server.ts",
                            "depends on express module for HTTP routing")
        b.handle(Records((record,)))
        gone = b.retract(record.body.iri)  # type: ignore[union-attr]
        a.handle(decode_sync(encode_sync(Records((gone,)))))
        assert a.query(PROFILE_QUERY).items() == [] == b.query(PROFILE_QUERY).items()
        a.handle(Records((record,)))  # the observation again, late: no resurrection
        assert a.query(PROFILE_QUERY).items() == []
        c.handle(Records((gone,)))  # retraction before the observation
        c.handle(Records((record,)))
        assert c.query(PROFILE_QUERY).items() == []
        assert a.digest() == b.digest() == c.digest()


def test_clock_skew_across_shards(tmp_path: pathlib.Path) -> None:
    with Shard(tmp_path / "a", agent="worker-1") as a, \
            Shard(tmp_path / "b", agent="worker-2") as b, \
            Shard(tmp_path / "m", agent="merger") as m:
        late = [a.remember(f"urn:a{i}", "slow clock", generated_at=f"2020-01-01T00:00:{i:02d}Z")
                for i in range(10)]
        early = [b.remember(f"urn:b{i}", "fast clock", generated_at=f"2030-01-01T00:00:{i:02d}Z")
                 for i in range(10)]
        m.merge(list(reversed(late)) + early[::2])
        m.merge(early[1::2])
        assert m.version_vector() == {"worker-1": 10, "worker-2": 10}
        assert m.stats().observations == 20


# --- garbage on the sync path ------------------------------------------------------------------


def _forged_chunk_bytes(records: list[Record], mutate_index: int) -> bytes:
    raw = msgpack.unpackb(encode_sync(CatchupChunk(tuple(records), len(records),
                                                   len(records), None)), raw=False)
    raw["r"][mutate_index][5] = "forged finding"
    return msgpack.packb(raw, use_bin_type=True)


def test_garbage_on_the_sync_path_leaves_the_shard_untouched(tmp_path: pathlib.Path) -> None:
    with Shard(tmp_path / "s", agent="worker-1") as server, \
            Shard(tmp_path / "v", agent="victim") as victim:
        records = fill(server, 20)
        victim.merge(records[:5])
        before = fingerprint(victim)
        journal = victim.data_dir / "knowledge.journal"
        size = journal.stat().st_size
        request = victim.catchup_request()

        def refused(action: object, fragment: str) -> None:
            with pytest.raises(SyncError, match=fragment):
                action()  # type: ignore[operator]
            assert fingerprint(victim) == before and journal.stat().st_size == size

        # A record whose content does not hash to its id.
        refused(lambda: decode_sync(_forged_chunk_bytes(records[5:], 3)), "does not hash")
        # Forged sequence numbers: far beyond anything plausible...
        far = Record("worker-1", 10_000_000, Observation("a", "b", "worker-1", T0))
        refused(lambda: victim.handle(Records((*records[5:], far))), "forged")
        # ... or a different record in a slot already held.
        other = Record("worker-1", 2, Observation("a", "not the real 2", "worker-1", T0))
        refused(lambda: victim.handle(Records((records[6], other))), "conflicts")
        # Wrong ranges: a pull reply for something else, or inverted / oversized.
        pull = PullRequest("worker-1", 6, 8)
        reply = PullReply("worker-1", 9, 12, tuple(records[8:12]))
        refused(lambda: victim.handle(reply, asked=pull), "does not match")
        refused(lambda: decode_sync(msgpack.packb({"t": "pull", "o": "worker-1",
                                                   "f": 8, "l": 6})), "inverted")
        # A catch-up chunk that was never asked for, or that resends what we have.
        chunk = CatchupChunk(tuple(records[5:]), 15, 15, None)
        refused(lambda: victim.handle(chunk), "not asked for")
        stale = CatchupChunk(tuple(records[:8]), 8, 8, None)
        refused(lambda: victim.handle(stale, asked=request), "not what the catch-up")
        lying = CatchupChunk(tuple(records[5:]), 99, 99, None)
        refused(lambda: victim.handle(lying, asked=request), "counts")
        # A huge snapshot chunk: too many records, or too many bytes.
        one = msgpack.unpackb(encode_record(records[5]))
        huge = msgpack.packb({"t": "cc", "r": [one] * (MAX_RECORDS_PER_MESSAGE + 1),
                              "d": 1, "tot": 1})
        refused(lambda: decode_sync(huge), "exceed the limit")
        refused(lambda: decode_sync(b"\x92" * (5 * 1024 * 1024)), "exceeds")
        # Plain junk.
        refused(lambda: decode_sync(b"\xff\x00junk"), "msgpack")
        # After all that, the honest catch-up still works.
        catch_up(server, victim)
        assert fingerprint(victim) == fingerprint(server)


def test_replies_respect_the_message_limit(tmp_path: pathlib.Path) -> None:
    with Shard(tmp_path / "s", agent="worker-1", durability=Durability.OS) as s:
        big = "x" * 16000
        for i in range(300):
            s.remember(f"urn:{i}", big + str(i))
        reply = s.answer_pull(PullRequest("worker-1", 1, 300))
        assert 0 < len(reply.records) < 300
        assert len(encode_sync(reply)) <= 4 * 1024 * 1024
        chunk = s.answer_catchup(CatchupRequest({}))
        assert chunk.cursor == ("worker-1", len(chunk.records) + 1) and chunk.total == 300


# --- the rdflib view --------------------------------------------------------------------------


def test_rdflib_graph_view(shard: Shard) -> None:
    shard.remember("urn:porter:file:server.ts", "depends on express module for HTTP routing")
    g = shard.graph
    assert isinstance(g, rdflib.Graph) and len(g) == 5
    vocab = rdflib.Namespace("https://porter.chapeaux.io/vocab#")
    (about,) = g.objects(None, vocab.about)
    assert about == rdflib.Literal("urn:porter:file:server.ts")
    rows = [{str(k): str(v) for k, v in r.asdict().items()} for r in g.query(PROFILE_QUERY)]
    assert rows == [PROFILE_BINDING]
    assert bool(g.query("ASK { ?o porter:about ?a }").askAnswer)
    again = rdflib.Graph().parse(data=g.serialize(format="turtle"), format="turtle")
    assert len(again) == 5
    with pytest.raises(KnowledgeError, match="read-only"):
        g.add((rdflib.URIRef("urn:a"), vocab.about, rdflib.Literal("x")))
    with pytest.raises(KnowledgeError, match="read-only"):
        g.update("INSERT DATA { <urn:a> <urn:b> <urn:c> }")
    with pytest.raises(KnowledgeError, match="SERVICE"):
        g.query("SELECT * WHERE { SERVICE <http://127.0.0.1:9/sparql> { ?s ?p ?o } }")


def test_export_formats(shard: Shard) -> None:
    fill(shard, 3)
    for fmt, parser in (("turtle", "turtle"), ("nt", "nt"), ("jsonld", "json-ld")):
        data = shard.export(fmt)
        assert len(rdflib.Graph().parse(data=data, format=parser)) == 15
    assert b"urn:porter:shard" not in shard.export("nt")  # the private graph stays private
    with pytest.raises(KnowledgeError, match="unknown export format"):
        shard.export("xml")


# --- command line ---------------------------------------------------------------------------


def run_cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli_main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_cli_recall_and_kg(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "default" / "worker-1"
    with Shard(data, agent="worker-1") as s:
        s.remember("urn:porter:file:server.ts", "depends on express module for HTTP routing")
        s.remember("urn:porter:file:db.ts", "uses pg")
    code, out, _ = run_cli("recall", "--data-dir", str(data), PROFILE_QUERY)
    assert code == 0 and "urn:porter:file:server.ts" in out and "2 rows" in out
    code, out, _ = run_cli("recall", "--data-dir", str(data), "--json", "--limit", "1",
                           PROFILE_QUERY)
    doc = json.loads(out)
    assert code == 0 and doc["truncated"] is True and len(doc["items"]) == 1
    code, out, err = run_cli("recall", "--data-dir", str(data), "--csv", "--limit", "1",
                             PROFILE_QUERY)
    assert out.splitlines()[0] == "about,finding" and "row limit" in err
    # A refused or malformed query is the user's mistake: status 2, before anything opens.
    code, _, err = run_cli("recall", "--data-dir", str(data), "LOAD <http://x>")
    assert code == 2 and "LOAD is refused" in err
    code, _, err = run_cli("recall", "--data-dir", str(data), "SELECT * WHERE {\n ?s ?p }")
    assert code == 2 and "line 2" in err
    # The node's default directory is found from --mesh/--agent and PORTER_MESH_DATA.
    monkeypatch.setenv("PORTER_MESH_DATA", str(tmp_path))
    code, out, _ = run_cli("kg", "stats", "--agent", "worker-1", "--json")
    stats = json.loads(out)
    assert code == 0 and stats["observations"] == 2
    assert stats["version_vector"] == {"worker-1": 2}
    code, out, _ = run_cli("kg", "stats", "--agent", "worker-1")
    assert code == 0 and "version vector" in out and "digest" in out
    target = tmp_path / "out.ttl"
    code, _, _ = run_cli("kg", "export", "--agent", "worker-1", "-o", str(target))
    assert code == 0 and len(rdflib.Graph().parse(target, format="turtle")) == 10
    code, _, err = run_cli("kg", "stats", "--data-dir", str(tmp_path / "nothing"))
    assert code == 1 and "no knowledge shard" in err
    with Shard(data, agent="worker-1"):
        code, _, err = run_cli("kg", "stats", "--data-dir", str(data))
        assert code == 1 and "open in another process" in err


# --- the background store writer ---------------------------------------------------------------


def test_batches_that_pile_up_are_joined_in_order(tmp_path: pathlib.Path) -> None:
    """An observation and its retraction joined into one store write stay retracted."""
    import threading

    with Shard(tmp_path / "j", agent="worker-1") as s:
        gate, entered = threading.Event(), threading.Event()
        writes: list[tuple[int, int]] = []
        real = s._applier._write  # type: ignore[attr-defined]

        def held(task: object) -> None:
            writes.append((len(task.add), len(task.remove)))  # type: ignore[attr-defined]
            entered.set()
            assert gate.wait(30)
            real(task)

        s._applier._write = held  # type: ignore[attr-defined]
        first = s.remember("urn:first", "keeps the writer busy")
        assert entered.wait(30)
        doomed = s.remember("urn:porter:file:server.ts",
                            "depends on express module for HTTP routing")
        gone = Record("worker-1", 3, Retraction(doomed.body.id, "worker-1", T0))
        s.merge([gone])
        gate.set()
        s.sync()
        assert writes == [(1, 0), (1, 1)]  # the second write joined two batches
        only_first = [{"about": "urn:first", "finding": "keeps the writer busy"}]
        assert s.query(PROFILE_QUERY).items() == only_first
        assert s.stats().observations == 1 and first.seq == 1
    with Shard(tmp_path / "j", agent="worker-1") as s:
        assert s.query(PROFILE_QUERY).items() == only_first


# --- signatures ------------------------------------------------------------------------------


def signing_keys(tmp_path: pathlib.Path, names: list[str]
                 ) -> tuple[TrustStore, dict[str, RecordSigner]]:
    """A trusted directory holding ``names``' keys, and each one's record signer."""
    trusted, secrets = provision_mesh(tmp_path / "keys", names)
    store = TrustStore(trusted)
    store.refresh()
    return store, {n: RecordSigner(load_identity(p)) for n, p in secrets.items()}


def test_a_shard_that_checks_signatures_keeps_forgeries_out_of_every_path(
        tmp_path: pathlib.Path) -> None:
    from porter_mesh.core.knowledge import record_signing_bytes

    store, signer = signing_keys(tmp_path, ["alice", "bob", "mallory"])

    opened_shards: list[Shard] = []

    def opened(name: str, *, checks: bool = True) -> Shard:
        s = Shard(tmp_path / name, agent=name)
        opened_shards.append(s)
        s.use_signatures(sign=signer.get(name), verify=RecordVerifier(store) if checks else None)
        return s

    def forged(origin: str, seq: int, finding: str, by: str | None) -> Record:
        plain = Record(origin, seq, Observation("urn:porter:file:x", finding, origin, T0))
        if by is None:
            return plain
        return Record(origin, seq, plain.body, sig=signer[by](record_signing_bytes(plain)))

    alice, bob = opened("alice"), opened("bob")
    relay = opened("mallory", checks=False)  # an insider's replica takes anything
    try:
        first = alice.remember("urn:porter:file:x", "genuine one")
        assert first.sig is not None
        fake_two = forged("alice", 2, "backdoor", by="mallory")
        fake_bob = forged("bob", 1, "unsigned", by=None)
        assert relay.merge([first, fake_two, fake_bob]).accepted == 3

        # Broadcast path: the forgery is left out, the good record of the batch goes in.
        report = bob.merge([fake_two, first])
        assert (report.accepted, [(r.origin, r.seq, r.reason) for r in report.refused]) == (
            1, [("alice", 2, "bad-signature")])
        # Pull path and catch-up path, relayed by the insider.
        reply = relay.answer_pull(PullRequest("alice", 1, 2))
        assert len(reply.records) == 2
        outcome = bob.handle(decode_sync(encode_sync(reply)), asked=PullRequest("alice", 1, 2))
        assert outcome.merged is not None and outcome.merged.duplicates == 1
        assert [r.reason for r in outcome.merged.refused] == ["bad-signature"]
        fresh = opened("carol-replica")
        catch_up(relay, fresh)
        assert fresh.state.version_vector() == {"alice": 1}
        assert not fresh.state.holds("bob", 1) and not fresh.state.holds("alice", 2)

        # The forged slot was never taken: alice's own seq 2 goes in everywhere, with no
        # conflict, and a duplicate is not checked again (not even without its signature).
        second = alice.remember("urn:porter:file:x", "genuine two")
        assert second.seq == 2
        assert bob.merge([second]).accepted == 1
        again = bob.merge([Record(second.origin, second.seq, second.body)])
        assert (again.duplicates, again.refused) == (1, ())
        assert {r["finding"] for r in bob.query(
            "SELECT ?finding WHERE { ?o porter:finding ?finding }").items()} == {
            "genuine one", "genuine two"}
    finally:
        for s in opened_shards:
            s.close()


def test_an_author_chains_its_records_across_a_restart_and_a_catch_up_checks_once_per_run(
        tmp_path: pathlib.Path) -> None:
    from porter_mesh.core.knowledge import record_link

    store, signers = signing_keys(tmp_path, ["alice", "bob"])
    verifier = RecordVerifier(store)
    checked: list[str] = []

    def counting(origin: str, data: bytes, sig: bytes | None) -> str | None:
        checked.append(origin)
        return verifier(origin, data, sig)

    sign = signers["alice"]
    written: list[Record] = []
    with Shard(tmp_path / "alice", agent="alice") as alice:
        alice.use_signatures(sign=sign, verify=verifier)
        written += [alice.remember("urn:porter:file:x", f"before {i}") for i in range(3)]
        written.append(alice.retract(written[0].body.id))
    # A restarted author takes its link from the journal, so its chain goes on.
    with Shard(tmp_path / "alice", agent="alice") as alice:
        alice.use_signatures(sign=sign, verify=verifier)
        written += [alice.remember("urn:porter:file:x", f"after {i}") for i in range(3)]
        assert [r.seq for r in written] == list(range(1, 8))
        assert written[0].prev is None
        assert [r.prev for r in written[1:]] == [record_link(r) for r in written[:-1]]
        with Shard(tmp_path / "bob", agent="bob") as bob:
            bob.use_signatures(sign=None, verify=counting)
            # Pull replies and catch-up chunks come from alice's journal: one check each.
            reply = alice.answer_pull(PullRequest("alice", 2, 4))
            outcome = bob.handle(decode_sync(encode_sync(reply)),
                                 asked=PullRequest("alice", 2, 4))
            assert outcome.merged is not None and outcome.merged.accepted == 3
            assert checked == ["alice"]
            checked.clear()
            catch_up(alice, bob)
            assert bob.digest() == alice.digest()
            assert checked == ["alice", "alice"]  # the run below 2 and the run above 4


def test_concurrent_remembers_share_one_fdatasync(tmp_path: pathlib.Path) -> None:
    import threading

    with Shard(tmp_path / "g", agent="worker-1") as s:
        gate = threading.Barrier(8)
        errors: list[BaseException] = []

        def writer(k: int) -> None:
            try:
                gate.wait(10)
                for i in range(50):
                    record = s.remember("urn:porter:file:g", f"w{k}-{i}")
                    # Acknowledged only once a sync covers its frame.
                    loc = s.state.locator("worker-1", record.seq)
                    assert loc is not None and loc < s._journal.synced
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert s.state.top_seq("worker-1") == 400
        # Without group commit every Remember pays its own fdatasync (400).
        assert s.journal_syncs < 400, f"{s.journal_syncs} fdatasyncs for 400 Remembers"


def test_a_group_of_observations_is_chained_and_signed_in_order(
        tmp_path: pathlib.Path) -> None:
    store, signer = signing_keys(tmp_path, ["alice", "bob"])
    with Shard(tmp_path / "alice", agent="alice") as alice, \
            Shard(tmp_path / "bob", agent="bob") as bob:
        alice.use_signatures(sign=signer["alice"], verify=RecordVerifier(store))
        bob.use_signatures(sign=None, verify=RecordVerifier(store))
        first = alice.remember("urn:porter:file:g", "alone")
        group = alice.write_observations(
            [Observation("urn:porter:file:g", f"g{i}", "alice", T0) for i in range(50)])
        assert [r.seq for r in group] == list(range(2, 52))
        # Each record chains to the one before it, the first to what was held before.
        assert group[0].prev == record_link(first)
        assert all(b.prev == record_link(a) for a, b in itertools.pairwise(group))
        # Nothing of the group is served before a sync covers it.
        assert alice.answer_pull(PullRequest("alice", 2, 51)).records == ()
        alice.flush()
        report = bob.merge([first, *group])
        assert (report.accepted, report.refused) == (51, ())
        with pytest.raises(KnowledgeError, match="writes observations by alice only"):
            alice.write_observations([Observation("urn:porter:file:g", "x", "bob", T0)])
        assert alice.write_observations([]) == []


def test_a_record_not_yet_synced_is_served_to_nobody(tmp_path: pathlib.Path) -> None:
    with Shard(tmp_path / "u", agent="worker-1") as s:
        s.remember("urn:porter:file:u", "synced")
        pending = s.remember("urn:porter:file:u", "written, not synced", durable=False)
        ask = PullRequest("worker-1", 1, 2)
        assert [r.seq for r in s.answer_pull(ask).records] == [1]
        chunk = s.answer_catchup(CatchupRequest({}, None, 0, 100))
        assert [r.seq for r in chunk.records] == [1] and chunk.cursor is not None
        s.flush()
        assert [r.seq for r in s.answer_pull(ask).records] == [1, pending.seq]


def test_writes_while_the_in_memory_index_is_rebuilt_land_in_order(
        tmp_path: pathlib.Path) -> None:
    with Shard(tmp_path / "m", agent="worker-1") as s:
        records = fill(s, 3000)
    # Reopened: the index is rebuilt by the store thread; writes queue behind it.
    with Shard(tmp_path / "m", agent="worker-1") as s:
        s.retract(records[5].body.iri)  # type: ignore[union-attr]
        newer = s.remember("urn:porter:file:new.ts", "written during the rebuild")
        s.retract(newer.body.iri)  # type: ignore[union-attr]
        last = s.remember("urn:porter:file:new.ts", "kept")
        assert s.stats().observations == 3000 - 1 + 1
        findings = {r["f"] for r in s.query(
            "SELECT ?f WHERE { ?o porter:about 'urn:porter:file:new.ts' ; porter:finding ?f }"
        ).items()}
        assert findings == {"kept"} and last.seq == 3004
        before = fingerprint(s)
    with Shard(tmp_path / "m", agent="worker-1") as s:
        assert fingerprint(s) == before
