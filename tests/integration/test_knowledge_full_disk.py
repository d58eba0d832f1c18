"""Knowledge on a full disk: a real 2 MiB tmpfs, filled on purpose.

A Remember that cannot be written is not acknowledged (StorageError, the journal as it
was, the sequence number still free); a replica that cannot write a received record
does not count it as held and gets it again, by itself, once space returns. Mounting
needs root; without it the tests are skipped with the reason printed.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import pathlib
import subprocess
from collections.abc import Iterator

import pytest

from porter_mesh.adapters.shard import Index, Shard
from porter_mesh.core.knowledge import Observation, Record, format_timestamp
from porter_mesh.errors import KnowledgeError, StorageError
from tests.integration.harness import peers_seen
from tests.integration.kg_proc import TIMINGS, KgProcess, poll

_ids = itertools.count()
#: A finding larger than a page, so that its frame cannot hide in the journal's last one.
BIG = "x" * 10_000


def need_root() -> None:
    if os.geteuid() != 0:
        reason = "mounting a tmpfs needs root; the full-disk tests did not run"
        print(reason)
        pytest.skip(reason)


@contextlib.contextmanager
def mounted_tiny(path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A 2 MiB tmpfs of this test's own, mounted on ``path`` (an empty directory)."""
    need_root()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.fixture
def tiny_fs(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    mount = tmp_path / "tiny"
    mount.mkdir()
    with mounted_tiny(mount):
        yield mount


def fill(fs: pathlib.Path) -> pathlib.Path:
    """Take every free byte of ``fs``; returns the file to delete to give them back."""
    filler = fs / "filler"
    with open(filler, "wb", buffering=0) as fh, contextlib.suppress(OSError):
        for _ in range(4096):  # 2 MiB in 4 KiB pieces, at most
            fh.write(b"\0" * 4096)
    st = os.statvfs(fs)
    assert st.f_bavail * st.f_frsize < 8192, "the tmpfs is not full"
    return filler


def test_a_remember_on_a_full_disk_is_not_acknowledged_and_the_shard_recovers(
        tiny_fs: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="porter_mesh.shard")
    shard = Shard(tiny_fs / "shard", agent="worker-1")
    try:
        shard.remember("urn:porter:file:a", "small one")
        shard.remember("urn:porter:file:a", "small two")
        shard.sync()
        journal = tiny_fs / "shard" / "knowledge.journal"
        before = journal.read_bytes()
        filler = fill(tiny_fs)

        with pytest.raises(StorageError) as failed:
            shard.remember("urn:porter:file:a", BIG)
        error = failed.value
        assert error.path == str(journal) and error.free_bytes is not None
        assert error.free_bytes < 8192 and "free some space" in str(error)
        assert journal.read_bytes() == before  # cut back to the last good record
        assert shard.state.version_vector() == {"worker-1": 2}
        with pytest.raises(StorageError):
            shard.remember("urn:porter:file:a", BIG + "again")
        peer = Record("peer-1", 1, Observation("urn:porter:file:b", BIG, "peer-1",
                                               format_timestamp(0)))
        with pytest.raises(StorageError):
            shard.merge([peer])
        assert not shard.state.holds("peer-1", 1)  # not written, so not held
        assert journal.read_bytes() == before
        assert shard.write_failures == 3 and shard.stats().write_failures == 3
        logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR
                  and "knowledge journal" in r.getMessage()]
        assert len(logged) == 1, logged  # once per episode, not per attempt
        assert str(journal) in logged[0] and "bytes free" in logged[0]

        filler.unlink()  # space returns: the next writes go through by themselves
        third = shard.remember("urn:porter:file:a", BIG)
        assert third.seq == 3  # the failed attempts took no sequence number
        assert shard.merge([peer]).accepted == 1
        shard.wait_store(30.0)  # the store, if it failed too, is reopened meanwhile
        findings = {r["f"] for r in shard.query(
            "SELECT ?f WHERE { ?o porter:finding ?f }").items()}
        assert findings == {"small one", "small two", BIG}
        assert shard.stats().observations == 4
    finally:
        shard.close()
    # After failed writes the journal may hold what the replica state does not: no state
    # is saved at close, and the next start reads the whole journal.
    assert not (tiny_fs / "shard" / "replica-state").exists()
    with Shard(tiny_fs / "shard") as reopened:  # and all of it is on disk
        assert reopened.state.version_vector() == {"peer-1": 1, "worker-1": 3}


def test_a_store_that_could_not_write_is_reopened_by_itself_when_space_returns(
        tmp_path: pathlib.Path) -> None:
    # Only the on-disk Oxigraph store is on the tiny file system: the journal (the truth)
    # can write, RocksDB cannot, and refuses every write after the first failure until the
    # store is opened again.
    store_dir = tmp_path / "shard" / "oxigraph"
    store_dir.mkdir(parents=True)
    with mounted_tiny(store_dir):
        shard = Shard(tmp_path / "shard", agent="worker-1", index=Index.DISK)
        try:
            shard.remember("urn:porter:file:a", "small one")
            shard.sync()
            filler = fill(store_dir)
            held = shard.remember("urn:porter:file:a", BIG)  # durable in the journal
            assert held.seq == 2 and shard.state.holds("worker-1", 2)
            with pytest.raises(KnowledgeError, match=r"safe in the journal.*reopens the store"):
                shard.sync()
            with pytest.raises(KnowledgeError, match="reopens the store"):
                shard.query("SELECT ?f WHERE { ?o porter:finding ?f }")
            assert shard.remember("urn:porter:file:a", BIG + " too").seq == 3
            filler.unlink()
            shard.wait_store(30.0)
            findings = {r["f"] for r in shard.query(
                "SELECT ?f WHERE { ?o porter:finding ?f }").items()}
            assert findings == {"small one", BIG, BIG + " too"}
            assert shard.remember("urn:porter:file:a", "small four").seq == 4
            shard.sync()
            assert shard.stats().observations == 4
        finally:
            shard.close()


@pytest.mark.network
@pytest.mark.timeout(180)
def test_a_replica_on_a_full_disk_holds_nothing_it_could_not_write_and_catches_up(
        tiny_fs: pathlib.Path, tmp_path: pathlib.Path) -> None:
    mesh = f"kgfull{os.getpid()}-{next(_ids)}"
    alice_name, bob_name = f"alice-{mesh}", f"bob-{mesh}"
    procs: list[KgProcess] = []
    try:
        alice = KgProcess(alice_name, tmp_path / "alice", *TIMINGS, mesh=mesh)
        procs.append(alice)
        bob = KgProcess(bob_name, tiny_fs / "bob", *TIMINGS, mesh=mesh)
        procs.append(bob)
        for node, other in ((alice, bob_name), (bob, alice_name)):
            node.wait_until(lambda ev, o=other: o in peers_seen(ev), 30, f"{node.name} "
                            f"finds {other}")
        alice.ask("remember", "stored-batch", n=1, prefix="before ")
        poll(lambda: bob.ask("vv", "vv")["vv"].get(alice_name) == 1, 30,
             "bob holds alice's first record")

        filler = fill(tiny_fs)
        bob.command(op="remember", n=1, prefix=BIG, tag="on-full-disk")
        refused = bob.wait_for(lambda e: e.get("tag") == "on-full-disk", 30, "bob's answer")
        assert refused["ev"] == "error" and refused["type"] == "StorageError"
        assert "free some space" in refused["error"]
        alice.ask("remember", "stored-batch", n=3, prefix=BIG)
        kg = poll(lambda: (lambda s: s if s["storage.write-failed"] >= 2 else None)(
            bob.stats()["kg"]), 30, "bob fails to write what alice sends")
        assert kg["write_failures"] >= 2
        assert bob.ask("vv", "vv")["vv"] == {alice_name: 1}  # nothing unwritten is held

        filler.unlink()
        poll(lambda: bob.ask("vv", "vv")["vv"].get(alice_name) == 4, 60,
             "bob gets alice's records again once it can write")
        stored = bob.ask("remember", "stored-batch", n=1, prefix="bob after")
        assert stored["top"] == 1  # bob's refused Remember took no sequence number
        def all_rows() -> list[dict[str, str]] | None:
            try:  # refused while the store is being reopened
                rows = bob.ask("query", "rows", limit=100,
                               sparql="SELECT ?f WHERE { ?o porter:finding ?f }")["items"]
            except AssertionError:
                return None
            return list(rows) if len(rows) == 5 else None

        rows = poll(all_rows, 60, "bob's store answers with every record")
        assert sum(1 for r in rows if r["f"].startswith(BIG)) == 3
    finally:
        for p in procs:
            p.stop()


@pytest.mark.network
def test_a_group_of_remembers_on_a_full_disk_fails_whole_and_the_next_one_is_kept(
        tiny_fs: pathlib.Path, tmp_path: pathlib.Path) -> None:
    import asyncio

    from tests.integration.test_knowledge_closed import remember_activity as remember
    from tests.integration.test_knowledge_closed import replica_pair

    async def run() -> None:
        async with replica_pair(tmp_path, tiny_fs / "kg") as (_, theirs, mine):
            try:
                first = await mine.aremember(remember("small one"))
                assert first.seq == 1
                filler = fill(tiny_fs)
                # Sixteen at once make groups; every one of them fails, none is
                # acknowledged, kept or broadcast, and the node goes on.
                outcomes = await asyncio.gather(
                    *(mine.aremember(remember(f"{BIG} {i}")) for i in range(16)),
                    return_exceptions=True)
                assert all(isinstance(o, StorageError) for o in outcomes), outcomes
                assert mine.counters["storage.write-failed"] >= 1
                assert mine.shard.state.top_seq("second") == 1
                filler.unlink()
                kept = await asyncio.gather(
                    *(mine.aremember(remember(f"{BIG} again {i}")) for i in range(8)))
                # The failed groups left no hole: the sequence numbers go on from 2.
                assert sorted(r.seq for r in kept) == list(range(2, 10))
                assert mine.counters["remember.groups"] >= 2
                # Broadcast once durable: the peer gets them all.
                await theirs._wait(lambda: theirs.shard.state.top_seq("second") == 9, 20)
            finally:
                await theirs.aclose()

    asyncio.run(run())
