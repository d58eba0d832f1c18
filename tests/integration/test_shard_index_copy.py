"""The copy of the in-memory index on disk: written at close, used at start only when it
matches the journal, and read by queries while the index loads (see ``_IndexCopy`` in
porter_mesh/adapters/shard.py). The crash tests with real processes are in
test_knowledge_restart.py."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pyoxigraph as ox
import pytest

from porter_mesh.adapters.shard import COPY_MIN_JOURNAL_BYTES, Durability, Index, Shard
from porter_mesh.core.knowledge import (
    OBSERVATION_CLASS,
    Observation,
    Record,
    format_timestamp,
    observation_iri,
)
from tests.integration.test_knowledge_full_disk import mounted_tiny

LIVE = "SELECT ?o WHERE { ?o a porter:Observation }"
COUNT = "SELECT (COUNT(?o) AS ?n) WHERE { ?o a porter:Observation }"  # runs isolated


def records(origin: str, n: int, first: int = 1) -> list[Record]:
    return [Record(origin, seq, Observation(
        f"urn:porter:file:m{seq % 50}.ts", f"{origin} finding {seq} about request routing",
        origin, format_timestamp(1_700_000_000 + seq))) for seq in range(first, first + n)]


def build(path: Path, origin: str = "alpha", n: int = 10000, first: int = 1) -> set[str]:
    """Merge ``n`` observations into the shard at ``path`` and close it; their IRIs."""
    batch = records(origin, n, first)
    with Shard(path, durability=Durability.OS) as shard:
        for start in range(0, n, 4096):
            shard.merge(batch[start:start + 4096])
        assert shard.stats().journal_bytes >= COPY_MIN_JOURNAL_BYTES or n < 1000
    return {observation_iri(r.body.id) for r in batch}


def logged(caplog: pytest.LogCaptureFixture, text: str, timeout: float = 30.0) -> None:
    """Wait until the shard has logged ``text`` (some lines come from its threads)."""
    deadline = time.monotonic() + timeout
    while text not in caplog.text:
        assert time.monotonic() < deadline, f"not logged: {text!r}; log: {caplog.text}"
        time.sleep(0.005)  # polling the log other threads write, with a deadline


def in_copy(path: Path) -> set[str]:
    """The observations the copy of the index on disk holds (the shard closed)."""
    copy = ox.Store.read_only(str(path / "index-copy"))
    return {row[0].value for row in copy.query(  # type: ignore[union-attr, index]
        f"SELECT ?o WHERE {{ ?o a <{OBSERVATION_CLASS}> }}")}


def live(shard: Shard) -> set[str]:
    return {row[0].value for row in shard.query(LIVE, row_limit=1_000_000).rows}


def count(shard: Shard) -> int:
    return int(shard.query(COUNT).rows[0][0].value)


def test_a_small_shard_keeps_no_copy(tmp_path: Path) -> None:
    build(tmp_path / "s", n=200)
    assert not (tmp_path / "s" / "index-copy").exists()


def test_the_copy_answers_at_once_and_every_write_made_during_the_load_is_seen(
        tmp_path: Path) -> None:
    iris = build(tmp_path / "s", n=50000)  # its load takes long enough to read during it
    assert (tmp_path / "s" / "index-copy").is_dir()
    shard = Shard(tmp_path / "s", agent="alpha")
    try:
        assert shard.reading_from_copy and shard.index_loading
        # A Remember, a retraction and a merge while the index loads: every read sees them.
        own = shard.remember("urn:porter:file:x.ts", "written during the load")
        gone = sorted(iris)[0]
        shard.retract(gone)
        merged = records("beta", 3)
        shard.merge(merged)
        expected = (iris - {gone}) | {observation_iri(own.body.id)} | {
            observation_iri(r.body.id) for r in merged}
        assert shard.stats().observations == len(expected)
        written = {observation_iri(own.body.id), gone} | {
            observation_iri(r.body.id) for r in merged}
        listed = ", ".join(f"<{iri}>" for iri in written)
        assert {row[0].value for row in shard.query(
            f"SELECT ?o WHERE {{ ?o porter:about ?a FILTER(?o IN ({listed})) }}").rows
        } == written - {gone}
        assert shard.reading_from_copy, "the index loaded before the reads: nothing tested"
        # The whole graph, from the copy or (once loaded) from memory: the same answer.
        assert live(shard) == expected
        assert count(shard) == len(expected)  # an isolated query: on a checkpoint
        assert len(shard.graph) == 5 * len(expected)  # five triples each here
        assert b"written during the load" in shard.export("nt")
        assert shard.wait_index(60)
        assert not shard.reading_from_copy and not shard.index_loading
        assert live(shard) == expected
        assert count(shard) == len(expected)
    finally:
        shard.close()
    # Close brought the copy up to date: the next start answers with all of it at once.
    assert in_copy(tmp_path / "s") == expected


def test_close_during_the_load_stops_it_and_keeps_the_copy_whole(tmp_path: Path) -> None:
    iris = build(tmp_path / "s", n=30000)  # its load takes long enough to read during it
    shard = Shard(tmp_path / "s", agent="alpha")
    own = shard.remember("urn:porter:file:x.ts", "written during the load")
    shard.close()
    assert in_copy(tmp_path / "s") == iris | {observation_iri(own.body.id)}
    with Shard(tmp_path / "s") as again:
        assert live(again) == iris | {observation_iri(own.body.id)}
        assert again.wait_index(60)
        assert live(again) == iris | {observation_iri(own.body.id)}


Damage = Callable[[Path], tuple[str, set[str]]]


def journal_cut(path: Path) -> tuple[str, set[str]]:
    """The journal is replaced by an older one (a backup): the copy is ahead of it."""
    iris = build(path, n=8000)
    older = (path / "knowledge.journal").read_bytes()
    build(path, n=100, first=8001)
    (path / "knowledge.journal").write_bytes(older)
    return "more than the journal's", iris


def other_journal(path: Path) -> tuple[str, set[str]]:
    """The journal is another shard's, longer: the bytes before the mark differ."""
    build(path, n=8000)
    iris = build(path.parent / "other", origin="gamma", n=9000)
    shutil.copyfile(path.parent / "other" / "knowledge.journal", path / "knowledge.journal")
    return "made from another journal", iris


def torn(path: Path) -> tuple[str, set[str]]:
    """The copy's files are damaged."""
    iris = build(path, n=8000)
    for f in (path / "index-copy").iterdir():
        if f.is_file():
            f.write_bytes(b"\0" * 16)
    return "the copy of the index on disk is not used", iris


def far_behind(path: Path) -> tuple[str, set[str]]:
    """An old copy put back: more than a quarter of the journal lies past it."""
    iris = build(path, n=8000)
    shutil.copytree(path / "index-copy", path.parent / "old-copy")
    iris |= build(path, n=3000, first=8001)
    shutil.rmtree(path / "index-copy")
    shutil.copytree(path.parent / "old-copy", path / "index-copy")
    return "more than loading the whole journal into memory costs", iris


@pytest.mark.parametrize("damage", [journal_cut, other_journal, torn, far_behind])
def test_a_copy_that_does_not_match_the_journal_is_not_used_and_the_log_says_why(
        tmp_path: Path, damage: Damage, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s"
    why, journal = damage(path)
    caplog.set_level(logging.INFO, logger="porter_mesh.shard")
    with Shard(path) as shard:
        assert not shard.reading_from_copy
        assert live(shard) == journal  # the old path: queries waited for the load
        # The copy is checked on its own thread: the line may come after the load.
        logged(caplog, "the copy of the index on disk is not used")
        assert why in caplog.text, caplog.text
    # Close wrote a new copy, which the next start uses.
    caplog.clear()
    with Shard(path) as shard:
        logged(caplog, "queries are answered from the copy of the index on disk")
        assert live(shard) == journal


def test_the_disk_index_removes_a_copy(tmp_path: Path) -> None:
    iris = build(tmp_path / "s")
    with Shard(tmp_path / "s", index=Index.DISK) as shard:
        assert not (tmp_path / "s" / "index-copy").exists()
        assert live(shard) == iris


def test_a_copy_that_cannot_be_written_at_close_costs_nothing_but_the_log_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    mount = tmp_path / "tiny"
    mount.mkdir()
    with mounted_tiny(mount):  # 2 MiB: the journal fits, its copy does not
        caplog.set_level(logging.INFO, logger="porter_mesh.shard")
        iris = build(mount / "s")
        assert "the copy of the index was not written on disk" in caplog.text, caplog.text
        assert not (mount / "s" / "index-copy").exists()
        assert not (mount / "s" / "index-copy.tmp").exists()
        with Shard(mount / "s") as shard:
            assert not shard.reading_from_copy
            assert live(shard) == iris
