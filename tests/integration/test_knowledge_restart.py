"""A restarted node answers queries from the copy of its index on disk while the index
loads into memory, and loses nothing however it is killed (real processes, kill -9).

Every test starts from one shard of 100k observations built once for this file (its
load into memory takes seconds, long enough to act during it), copied per test. The
``mesh`` and ``procs`` fixtures are conftest's.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from porter_mesh.adapters.shard import Durability, Shard
from porter_mesh.core.knowledge import Observation, Record, format_timestamp, observation_iri
from tests.integration.kg_proc import KgProcess, poll, wait_stderr

pytestmark = pytest.mark.slow  # each test loads 100k observations several times

N = 100_000
ORIGINS = ("alpha", "beta", "gamma")
FINDINGS = "SELECT ?f WHERE {{ ?o porter:finding ?f FILTER(STRSTARTS(?f, '{}')) }}"

@pytest.fixture(scope="module")
def big_shard(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, frozenset[str]]:
    """A closed shard of ``N`` observations with its copy of the index on disk, and the
    IRIs of its observations."""
    path = tmp_path_factory.mktemp("restart") / "shard"
    seqs = dict.fromkeys(ORIGINS, 0)
    records = []
    for i in range(N):
        origin = ORIGINS[i % len(ORIGINS)]
        seqs[origin] += 1
        records.append(Record(origin, seqs[origin], Observation(
            f"urn:porter:file:src/m{i % 500}.ts", f"finding {i} about request routing",
            origin, format_timestamp(1_700_000_000 + i * 0.001))))
    with Shard(path, durability=Durability.OS) as shard:
        for start in range(0, N, 16384):
            shard.merge(records[start:start + 16384])
    assert (path / "index-copy").is_dir(), "closing a large shard wrote no copy of its index"
    return path, frozenset(observation_iri(r.body.id) for r in records)


def start(procs: list[KgProcess], name: str, data: Path, mesh: str) -> KgProcess:
    p = KgProcess(f"{name}-{mesh}", data, "--no-discovery", "--log", "INFO", mesh=mesh)
    procs.append(p)
    return p


def fresh_copy(big_shard: tuple[Path, frozenset[str]], tmp_path: Path) -> Path:
    data = tmp_path / "shard"
    shutil.copytree(big_shard[0], data)
    return data


def live(p: KgProcess) -> set[str]:
    """The IRIs of every observation the node's queries see."""
    dump = p.ask("dump", "dump", timeout=120)
    assert not dump["truncated"]
    return {iri for iri, _ in dump["live"]}


def findings(p: KgProcess, prefix: str) -> set[str]:
    rows = p.ask("query", "rows", sparql=FINDINGS.format(prefix), limit=100_000)["items"]
    return {r["f"] for r in rows}



def test_kill_9_while_the_copy_of_the_index_is_written_loses_nothing(
        big_shard: tuple[Path, frozenset[str]], procs: list[KgProcess], mesh: str,
        tmp_path: Path) -> None:
    data = fresh_copy(big_shard, tmp_path)
    shutil.rmtree(data / "index-copy")  # none yet: closing writes one (some seconds)
    a = start(procs, "a", data, mesh)
    assert not a.ask("index", "index")["from_copy"]
    assert a.ask("remember", "stored-batch", n=50, prefix="late-")["top"] == 50

    a.command(op="quit")
    wait_stderr(a, "writing the copy of the index on disk", 60)
    a.kill()
    assert "the copy of the index on disk is up to date" not in a.stderr, \
        "the copy was finished before the kill: nothing was tested"

    b = start(procs, "a", data, mesh)
    assert len(findings(b, "late-")) == 50
    assert live(b) == big_shard[1] | {f"urn:porter:obs:{e['id']}" for e in a.stored()}
    wait_stderr(b, "removing an unfinished copy of the index", 30)
    assert not b.ask("index", "index")["from_copy"]

    # A clean close now writes the copy, and the next start answers from it at once.
    b.stop()
    c = start(procs, "a", data, mesh)
    assert c.ask("index", "index")["from_copy"]
    assert len(findings(c, "late-")) == 50
    assert live(c) == big_shard[1] | {f"urn:porter:obs:{e['id']}" for e in a.stored()}


def test_kill_9_during_the_load_after_a_restart_loses_nothing(
        big_shard: tuple[Path, frozenset[str]], procs: list[KgProcess], mesh: str,
        tmp_path: Path) -> None:
    data = fresh_copy(big_shard, tmp_path)
    a = start(procs, "a", data, mesh)
    state = a.ask("index", "index")
    assert state["loading"] and state["from_copy"], state

    # Written while the index loads: acknowledged, so every query from now on sees them,
    # whichever index answers it.
    a.ask("remember", "stored-batch", n=30, prefix="during-")
    retracted = sorted(big_shard[1])[7].rsplit(":", 1)[1]
    a.ask("retract", "retracted", id=retracted)
    assert len(findings(a, "during-")) == 30
    assert a.ask("query", "rows", sparql=f"SELECT ?f WHERE {{ <urn:porter:obs:{retracted}> "
                 "porter:finding ?f }")["items"] == []
    state = a.ask("index", "index")
    assert state["from_copy"], "the index loaded before the writes were read: nothing tested"
    a.kill()
    expected = (big_shard[1] - {f"urn:porter:obs:{retracted}"}) | {
        f"urn:porter:obs:{e['id']}" for e in a.stored()}
    assert len(expected) == N + 29

    b = start(procs, "a", data, mesh)
    assert b.ask("index", "index")["from_copy"]
    assert len(findings(b, "during-")) == 30
    assert live(b) == expected
    assert b.ask("remember", "stored-batch", n=5, prefix="after-")["top"] == 36
    poll(lambda: not b.ask("index", "index")["loading"], 120, "the index loads")
    assert live(b) == expected | {f"urn:porter:obs:{e['id']}" for e in b.stored()}


def test_a_copy_older_than_the_journal_still_gives_every_record(
        big_shard: tuple[Path, frozenset[str]], procs: list[KgProcess], mesh: str,
        tmp_path: Path) -> None:
    data = fresh_copy(big_shard, tmp_path)
    a = start(procs, "a", data, mesh)
    poll(lambda: not a.ask("index", "index")["loading"], 120, "the index loads")
    # The copy is closed now: these reach the journal and the in-memory index only.
    a.ask("remember", "stored-batch", n=200, prefix="past-")
    old = sorted(big_shard[1])[11].rsplit(":", 1)[1]  # in the copy, retracted past it
    new = a.stored()[3]["id"]  # written and retracted past the copy
    a.ask("retract", "retracted", id=old)
    a.ask("retract", "retracted", id=new)
    a.kill()
    expected = (big_shard[1] | {f"urn:porter:obs:{e['id']}" for e in a.stored()}) - {
        f"urn:porter:obs:{old}", f"urn:porter:obs:{new}"}

    b = start(procs, "a", data, mesh)
    assert b.ask("index", "index")["from_copy"]
    wait_stderr(b, "bytes of journal past the copy are applied to it first", 30)
    assert "(0 bytes of journal past the copy" not in b.stderr
    assert len(findings(b, "past-")) == 199
    assert live(b) == expected
    poll(lambda: not b.ask("index", "index")["loading"], 120, "the index loads")
    assert live(b) == expected
