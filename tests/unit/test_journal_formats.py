"""Data directories written by earlier versions still open.

The files under ``tests/data`` were written by the code before the journals shared one
framed log (commit 671f7b7), and are kept byte for byte:

* ``inbox-pmj2.journal``: a delivery journal of layout PMJ2 (records without a checksum):
  alice's seq 1 and seq 2-3, bob's keyed seq 1, alice's seq 4, taken up to position 3;
* ``shard-v1/``: a knowledge shard of worker-1: three Remembers and the retraction of
  the third.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from porter_mesh.adapters.journal import DeliveryJournal, JournalRecord, read_journal, read_taken
from porter_mesh.adapters.shard import Shard

DATA = Path(__file__).resolve().parent.parent / "data"
NOTE = b'{"type":"Note","content":"x"}'


def test_a_pmj2_delivery_journal_is_read_and_rewritten_in_frames(tmp_path: Path) -> None:
    old = DATA / "inbox-pmj2.journal"
    assert old.read_bytes().startswith(b"PMJ2")
    # Read as it is (tools read a journal without opening it for writing).
    assert [(r.sender, r.first_seq, r.count) for r in read_journal(old)] == [
        ("alice", 1, 1), ("alice", 2, 2), ("bob", 1, 1), ("alice", 4, 1)]
    assert read_taken(old) == 3
    path = tmp_path / "inbox.journal"
    shutil.copyfile(old, path)
    journal = DeliveryJournal(path)
    bob = JournalRecord("bob", 7, 1, 1, "task:me", NOTE, b"env-b1", "order-17",
                        1_700_000_000_000)
    alice4 = JournalRecord("alice", 1, 4, 1, "task:me", b'{"type":"Note","content":"owed"}',
                           b"env-a4")
    # What was owed is owed at the same positions; what was taken is remembered.
    assert journal.taken == 3 and journal.end == 5
    assert journal.pending == [(3, bob), (4, alice4)]
    assert [(r.sender, r.first_seq, r.count) for r in journal.known] == [
        ("alice", 1, 3), ("bob", 1, 1), ("alice", 4, 1)]
    assert path.read_bytes().startswith(b"PMJ3")  # rewritten in the framed layout
    assert journal.append([JournalRecord("bob", 7, 2, 1, "task:me", NOTE, b"env-b2")]) == 5
    journal.take(4)
    journal.close()
    again = DeliveryJournal(path)
    assert [(p, r.sender, r.first_seq) for p, r in again.pending] == [
        (4, "alice", 4), (5, "bob", 2)]
    again.close()


def test_a_pmj2_journal_that_cannot_be_rewritten_is_not_opened(tmp_path: Path) -> None:
    """Appends in frames behind records without them would make a file neither reader
    can read whole: on a full disk the old journal is refused, and left as it was."""
    from porter_mesh.errors import StorageError
    from tests.tinyfs import fill, tiny_filesystem

    with tiny_filesystem(tmp_path / "fs") as fs:
        path = fs / "inbox.journal"
        shutil.copyfile(DATA / "inbox-pmj2.journal", path)
        filler = fill(fs)
        with pytest.raises(StorageError, match="free space"):
            DeliveryJournal(path)
        assert path.read_bytes() == (DATA / "inbox-pmj2.journal").read_bytes()
        filler.unlink()
        journal = DeliveryJournal(path)
        assert [p for p, _ in journal.pending] == [3, 4]
        journal.close()


def test_a_damaged_delivery_journal_opens_with_what_precedes_the_damage(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="porter_mesh.framedlog")
    path = tmp_path / "inbox.journal"
    journal = DeliveryJournal(path)
    for seq in range(1, 6):
        journal.append([JournalRecord("a", 1, seq, 1, "task:me", NOTE, b"env")])
    journal.close()
    data = bytearray(path.read_bytes())
    third = 64 + 2 * (len(data) - 64) // 5  # records are the same size
    data[third + 20] ^= 0x01
    path.write_bytes(bytes(data))
    again = DeliveryJournal(path)
    assert [r.first_seq for _, r in again.pending] == [1, 2]
    again.close()
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "corrupt frame" in warning and f"cut {len(data) - third} bytes" in warning


def test_a_shard_of_the_earlier_version_opens_as_it_is(tmp_path: Path) -> None:
    """The shard's frames were already the shared framing: its journal is read without
    conversion, and new records follow the old ones in the same file."""
    data_dir = tmp_path / "shard"
    shutil.copytree(DATA / "shard-v1", data_dir)
    old = (data_dir / "knowledge.journal").read_bytes()
    with Shard(data_dir, agent="worker-1") as shard:
        assert shard.version_vector() == {"worker-1": 4}
        assert shard.stats().observations == 2
        found = {r["f"] for r in shard.query(
            "SELECT ?f WHERE { ?o porter:finding ?f }").items()}
        assert found == {"first finding", "second finding"}
        assert shard.remember("urn:porter:file:c.py", "a new finding").seq == 5
    assert (data_dir / "knowledge.journal").read_bytes().startswith(old)
    with Shard(data_dir, agent="worker-1") as shard:
        assert shard.version_vector() == {"worker-1": 5}
        assert shard.stats().observations == 3
