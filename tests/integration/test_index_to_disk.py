"""An ``Index.AUTO`` shard moves its index from memory to disk once it holds more than
``disk_after`` observations, while it serves, and loses nothing on the way: every query
sees every acknowledged record before, during and after the move, a restart at any
point (kill -9 of a real process) finds every acknowledged record, and a move that a
full disk stops leaves the index in memory.

Real shards on a real disk; the process tests use ``kg_proc`` nodes (conftest's ``mesh``
and ``procs`` fixtures) with ``PORTER_MESH_INDEX_DISK_AFTER`` set low.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from pathlib import Path

import pytest

from porter_mesh.adapters.shard import COMPACT_AFTER, Durability, Index, Shard
from porter_mesh.core.knowledge import Observation, Record, format_timestamp, observation_iri
from tests.integration.kg_proc import KgProcess, poll, wait_stderr
from tests.tinyfs import tiny_filesystem

COUNT = "SELECT (COUNT(?o) AS ?n) WHERE { ?o a porter:Observation }"
FINDINGS = "SELECT ?f WHERE {{ ?o porter:finding ?f FILTER(STRSTARTS(?f, '{}')) }}"


def make_records(n: int, origin: str = "alpha", first: int = 1) -> list[Record]:
    return [Record(origin, first + i, Observation(
        f"urn:porter:file:src/m{i % 97}.ts", f"finding {first + i} of {origin}", origin,
        format_timestamp(1_700_000_000 + (first + i) * 0.001))) for i in range(n)]


def count(shard: Shard) -> int:
    # In process: an isolated query would first write a copy of an in-memory index.
    return int(shard.query(COUNT, isolate=False).rows[0][0].value)


def test_the_index_moves_to_disk_and_every_query_sees_every_acknowledged_write(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="porter_mesh")
    records = make_records(45_000)
    retracted: set[bytes] = set()
    seen_moving = seen_memory = False
    with Shard(tmp_path / "s", agent="me", durability=Durability.OS,
               disk_after=15_000) as shard:
        assert shard.index is Index.MEMORY and shard.auto_index
        for start in range(0, len(records), 300):
            shard.merge(records[start:start + 300])
            if start % 3000 == 0:  # a retraction of a record merged long before
                target = records[start // 3].body.id
                shard.retract(target)
                retracted.add(target)
            moving = shard.index_moving
            seen_moving |= moving
            seen_memory |= shard.index is Index.MEMORY and not moving
            # Acknowledged means seen, whichever index answers.
            assert count(shard) == start + len(records[start:start + 300]) - len(retracted)
        assert seen_memory and seen_moving, "no write was made while the index moved"
        assert shard.wait_settled(120)
        assert shard.index is Index.DISK
        assert count(shard) == len(records) - len(retracted)
        assert shard.stats().index == "disk"
        # And it goes on: writes and retractions after the move.
        more = make_records(500, first=len(records) + 1)
        shard.merge(more)
        shard.retract(more[0].body.id)
        assert count(shard) == len(records) + 499 - len(retracted)
    assert "moving the index to disk (" in caplog.text
    assert "the index is on disk now" in caplog.text
    assert not (tmp_path / "s" / "index-copy").exists()
    assert not (tmp_path / "s" / "oxigraph.tmp").exists()

    with Shard(tmp_path / "s", agent="me", disk_after=15_000) as again:
        assert again.index is Index.DISK
        assert count(again) == len(records) + 499 - len(retracted)
        expected = {observation_iri(r.body.id) for r in [*records, *more]} - {
            observation_iri(t) for t in [*retracted, more[0].body.id]}
        rows = again.query("SELECT ?o WHERE { ?o a porter:Observation }",
                           row_limit=100_000).rows
        assert {r[0].value for r in rows} == expected


def test_a_journal_past_the_threshold_opens_on_disk_and_the_copy_goes(tmp_path: Path) -> None:
    records = make_records(12_000)
    with Shard(tmp_path / "s", agent="me", durability=Durability.OS,
               index=Index.MEMORY) as shard:
        for start in range(0, len(records), 4000):
            shard.merge(records[start:start + 4000])
    assert (tmp_path / "s" / "index-copy").is_dir()
    # Below the threshold it stays in memory (and answers from the copy meanwhile).
    with Shard(tmp_path / "s", agent="me", disk_after=20_000) as shard:
        assert shard.index is Index.MEMORY
        assert count(shard) == len(records)
    with Shard(tmp_path / "s", agent="me", disk_after=10_000) as shard:
        assert shard.index is Index.DISK
        assert count(shard) == len(records)
    assert not (tmp_path / "s" / "index-copy").exists()
    # Once on disk it stays there, however low the count goes.
    with Shard(tmp_path / "s", agent="me", disk_after=10**9) as shard:
        assert shard.index is Index.DISK
        assert count(shard) == len(records)


def test_explicit_memory_index_never_moves(tmp_path: Path) -> None:
    with Shard(tmp_path / "s", agent="me", durability=Durability.OS, index=Index.MEMORY,
               disk_after=1000) as shard:
        shard.merge(make_records(3000))
        assert shard.wait_settled(30)
        assert shard.index is Index.MEMORY and not shard.auto_index
    assert not (tmp_path / "s" / "oxigraph").exists()


def test_a_move_that_the_disk_cannot_hold_leaves_the_index_in_memory(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="porter_mesh")
    records = make_records(30_000)
    # The journal (some 120 B per observation) fits; the on-disk index (RocksDB's files
    # and their logs, several times that) does not.
    with tiny_filesystem(tmp_path / "tiny", size="8m") as root:
        with Shard(root / "s", agent="me", durability=Durability.OS,
                   disk_after=25_000) as shard:
            for start in range(0, 24_000, 4000):
                shard.merge(records[start:start + 4000])
            shard.merge(records[24_000:26_000])  # past the threshold: the move starts
            assert shard.wait_settled(120)
            assert "moving the index to disk failed" in caplog.text, caplog.text[-3000:]
            assert shard.index is Index.MEMORY
            assert not (root / "s" / "oxigraph.tmp").exists()
            assert not (root / "s" / "oxigraph").exists()
            assert count(shard) == 26_000
            # It goes on serving and writing in memory; the move is not tried again at
            # every write.
            moves = caplog.text.count("moving the index to disk (")
            shard.merge(records[26_000:27_000])
            assert shard.wait_settled(60)
            assert count(shard) == 27_000
            assert caplog.text.count("moving the index to disk (") == moves
        with Shard(root / "s", agent="me", disk_after=10**9) as shard:
            assert shard.index is Index.MEMORY
            assert count(shard) == 27_000


# --- kill -9 of a real process at each point of the move ---------------------------------

N = 30_000
THRESHOLD = N + 20  # crossed by the process's own Remembers


@pytest.fixture(scope="module")
def memory_shard(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, frozenset[str]]:
    """A closed shard of ``N`` observations (index in memory), and their IRIs."""
    path = tmp_path_factory.mktemp("move") / "shard"
    records = make_records(N, origin="beta")
    with Shard(path, durability=Durability.OS, index=Index.MEMORY) as shard:
        for start in range(0, N, 10_000):
            shard.merge(records[start:start + 10_000])
    return path, frozenset(observation_iri(r.body.id) for r in records)


def start(procs: list[KgProcess], name: str, data: Path, mesh: str) -> KgProcess:
    p = KgProcess(f"{name}-{mesh}", data, "--no-discovery", "--log", "INFO", mesh=mesh,
                  env={"PORTER_MESH_INDEX_DISK_AFTER": str(THRESHOLD)})
    procs.append(p)
    return p


def live(p: KgProcess) -> set[str]:
    dump = p.ask("dump", "dump", timeout=120)
    assert not dump["truncated"]
    return {iri for iri, _ in dump["live"]}



@pytest.mark.slow
@pytest.mark.parametrize("point", ["building", "built", "moved"])
def test_kill_9_at_each_point_of_the_move_loses_nothing(
        point: str, memory_shard: tuple[Path, frozenset[str]], procs: list[KgProcess],
        mesh: str, tmp_path: Path) -> None:
    data = tmp_path / "shard"
    shutil.copytree(memory_shard[0], data)
    a = start(procs, "a", data, mesh)
    assert a.ask("index", "index")["kind"] == "memory"
    a.ask("remember", "stored-batch", n=30, prefix="before-")  # past the threshold
    mark = {"building": "moving the index to disk (",
            "built": "the on-disk index is built",
            "moved": "the index is on disk now"}[point]
    wait_stderr(a, mark, 60)
    if point == "building":
        tmp = data / "oxigraph.tmp"
        deadline = time.monotonic() + 60
        while not (tmp.is_dir() and any(f.suffix == ".sst" for f in tmp.iterdir())):
            assert time.monotonic() < deadline, "no on-disk index was being built"
            time.sleep(0.002)  # polling the directory the move writes, with a deadline
        a.kill()
        assert "the on-disk index is built" not in a.stderr, \
            "the index was built before the kill: nothing was tested"
    else:
        # Written after that point, acknowledged, then killed.
        a.ask("remember", "stored-batch", n=20, prefix="after-")
        a.kill()
    expected = memory_shard[1] | {f"urn:porter:obs:{e['id']}" for e in a.stored()}
    assert len(expected) == N + (30 if point == "building" else 50)

    b = start(procs, "a", data, mesh)
    # A move cut short before its rename is undone; past the threshold, the next start
    # builds the index on disk from the journal.
    assert b.ask("index", "index")["kind"] == "disk"
    assert live(b) == expected
    assert not (data / "oxigraph.tmp").exists()
    if point == "building":
        assert "removing an unfinished on-disk index" in b.stderr
    b.ask("remember", "stored-batch", n=5, prefix="later-")
    assert live(b) == expected | {f"urn:porter:obs:{e['id']}" for e in b.stored()}


def test_the_node_reports_its_index_and_moves_while_it_serves(
        memory_shard: tuple[Path, frozenset[str]], procs: list[KgProcess], mesh: str,
        tmp_path: Path) -> None:
    data = tmp_path / "shard"
    shutil.copytree(memory_shard[0], data)
    a = start(procs, "a", data, mesh)
    assert a.ask("stats", "stats")["kg"]["index"] == "memory"
    a.ask("remember", "stored-batch", n=30, prefix="x-")
    poll(lambda: a.ask("index", "index")["kind"] == "disk", 60, "the index moves to disk")
    assert a.ask("stats", "stats")["kg"]["index"] == "disk"
    assert len(live(a)) == N + 30


def test_the_disk_index_is_compacted_once_a_large_load_pauses(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="porter_mesh")
    records = make_records(COMPACT_AFTER + 5_000)
    with Shard(tmp_path / "s", agent="me", durability=Durability.OS,
               index=Index.DISK) as shard:
        for start in range(0, len(records), 8_192):
            shard.merge(records[start:start + 8_192])
        assert shard.wait_settled(120)
        assert shard.stats().compactions == 1
        assert "compacted the index on disk after" in caplog.text
        assert count(shard) == len(records)
        # A small write afterwards is not worth another compaction.
        shard.merge(make_records(100, first=len(records) + 1))
        assert shard.wait_settled(30)
        assert shard.stats().compactions == 1


def test_a_move_under_a_stream_of_writes_hands_the_rest_to_the_store_thread(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="porter_mesh")
    records = make_records(90_000)
    acked = 0
    done = threading.Event()
    short: list[tuple[int, int]] = []  # (read, records acknowledged before it)
    moving: list[bool] = []  # per read: whether the index was moving when it began
    reads = 0
    read_one = threading.Event()

    def reader(shard: Shard) -> None:
        # Every query sees what was acknowledged before it began: here, the last record
        # acknowledged (around the swap, the one the new index may still lack).
        nonlocal reads
        while not done.is_set():
            last = acked
            moving.append(shard.index_moving)
            iri = observation_iri(records[last - 1].body.id)
            if not shard.query(f"ASK {{ <{iri}> ?p ?o }}").boolean:
                short.append((reads, last))
            reads += 1
            read_one.set()

    def another_read() -> None:
        # Queries are as slow as the store is to apply what came before them, which a
        # loaded machine makes slow: wait for one that began after this call.
        for _ in range(2):
            read_one.clear()
            assert read_one.wait(60), "no query was answered within 60 s"

    with Shard(tmp_path / "s", agent="me", durability=Durability.OS,
               disk_after=20_000) as shard:
        shard.merge(records[:20_001])  # the move starts; the rest streams in meanwhile
        acked = 20_001
        thread = threading.Thread(target=reader, args=(shard,))
        thread.start()
        try:
            another_read()
            for start in range(20_001, len(records), 2_000):
                shard.merge(records[start:start + 2_000])
                acked = min(start + 2_000, len(records))
            assert shard.wait_settled(120)
            another_read()  # after the move too
        finally:
            done.set()
            thread.join()
        assert not short, f"queries missed acknowledged records: {short[:5]}"
        # Queries were answered while the index moved, and after (how many depends on
        # the machine's speed: thousands on an idle one, a handful on a loaded one).
        assert moving[0] and not moving[-1], moving[:3]
        assert shard.index is Index.DISK
        assert count(shard) == len(records)
    line = next(x for x in caplog.text.splitlines() if "the index is on disk now" in x)
    left = int(line.split("answers queries (")[1].split(" bytes")[0])
    assert left > 0, f"nothing was left for the store thread: nothing tested ({line})"
