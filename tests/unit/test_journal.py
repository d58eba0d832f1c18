"""The delivery journal: torn writes, the taken mark, what is owed after a restart, and
compaction that keeps what de-duplication needs."""

from __future__ import annotations

import os
from pathlib import Path

import msgpack
import pytest

from porter_mesh.adapters.journal import (
    DeliveryJournal,
    JournalRecord,
    read_journal,
    read_taken,
)


def rec(sender: str, inc: int, seq: int, count: int = 1) -> JournalRecord:
    return JournalRecord(sender, inc, seq, count, "task:me", b'{"type":"Note","content":"x"}',
                         b"env")


def reopen(path: Path, **kw: int) -> DeliveryJournal:
    return DeliveryJournal(path, **kw)


def test_append_returns_positions_and_reopen_owes_everything(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j = DeliveryJournal(path)
    assert j.append([rec("a", 1, 1), rec("a", 1, 2, count=3)]) == 0
    assert j.append([rec("b", 7, 1)]) == 4
    j.close()
    again = reopen(path)
    assert again.taken == 0 and again.end == 5
    assert again.pending == [(0, rec("a", 1, 1)), (1, rec("a", 1, 2, 3)), (4, rec("b", 7, 1))]
    assert again.known == [rec("a", 1, 1), rec("a", 1, 2, 3), rec("b", 7, 1)]
    again.close()


def test_taken_prefix_is_not_owed_again(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j = DeliveryJournal(path)
    j.append([rec("a", 1, 1, count=4), rec("a", 1, 5, count=2)])
    j.take(2)  # half of the first record
    j.close()
    assert read_taken(path) == 2
    again = reopen(path)
    assert again.taken == 2
    # The partly taken record is still owed (its activities from position 2 on).
    assert [p for p, _ in again.pending] == [0, 4]
    again.take(6)
    again.close()
    third = reopen(path)
    assert third.pending == [] and third.taken == 6
    # De-duplication still knows every record of the newest incarnation.
    assert [r.first_seq for r in third.known] == [1, 5]
    third.close()


def test_take_never_moves_back_or_past_the_end(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j = DeliveryJournal(path)
    j.append([rec("a", 1, 1, count=3)])
    j.take(2)
    j.take(1)
    assert j.taken == 2
    j.take(99)
    assert j.taken == 3
    j.close()
    assert read_taken(path) == 3


def test_the_mark_survives_without_close(tmp_path: Path) -> None:
    """The mark is a store into a shared mapping: it is in the file without a close or
    a flush, as after kill -9 (the page cache holds it)."""
    path = tmp_path / "j"
    j = DeliveryJournal(path)
    j.append([rec("a", 1, 1, count=10)])
    for upto in range(1, 8):
        j.take(upto)
    assert read_taken(path) == 7
    j.close()


def test_a_torn_mark_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j = DeliveryJournal(path)
    j.append([rec("a", 1, 1, count=10)])
    j.take(4)
    j.take(5)  # written to the other slot
    j.close()
    data = bytearray(path.read_bytes())
    # Damage whichever slot holds 5: the other one (4) is what a reader then believes.
    for offset in (8, 24):
        taken = int.from_bytes(data[offset:offset + 8], "little")
        if taken == 5:
            data[offset + 8] ^= 0xFF
    path.write_bytes(bytes(data))
    assert read_taken(path) == 4


def test_torn_tail_is_cut(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j = DeliveryJournal(path)
    j.append([rec("a", 1, 1)])
    j.take(1)
    j.close()
    with open(path, "ab") as fh:
        fh.write(b"\x00\x00\x01\x00partial")
    again = reopen(path)
    assert again.pending == [] and again.taken == 1
    again.append([rec("a", 1, 2)])
    again.close()
    assert [r.first_seq for r in read_journal(path)] == [1, 2]
    assert read_taken(path) == 1


def test_compaction_keeps_owed_records_whole_and_strips_taken_ones(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j = DeliveryJournal(path, compact_bytes=1)
    # a's incarnation 1 is superseded by 2; the old record is taken, so nothing needs it.
    j.append([rec("a", 1, 1), rec("a", 2, 1), rec("b", 5, 1), rec("b", 5, 2, count=2)])
    j.take(3)  # a/1, a/2, b/5 seq 1
    j.close()
    again = reopen(path, compact_bytes=1)
    assert [(r.sender, r.incarnation, r.first_seq) for r in again.known] == [
        ("a", 2, 1), ("b", 5, 1), ("b", 5, 2)]
    # Rebased: the owed record is at position 2 now, and nothing before it is owed.
    assert again.taken == 2
    assert again.pending == [(2, rec("b", 5, 2, count=2))]
    again.close()
    on_disk = read_journal(path)
    assert [r.payload for r in on_disk] == [b"", b"", rec("b", 5, 2).payload]


def test_an_owed_record_of_an_old_incarnation_is_kept(tmp_path: Path) -> None:
    """A sender that restarted since does not make its earlier, acknowledged but not yet
    handled message any less owed."""
    path = tmp_path / "j"
    j = DeliveryJournal(path, compact_bytes=1)
    j.append([rec("a", 1, 1), rec("a", 2, 1)])
    j.close()
    again = reopen(path, compact_bytes=1)
    assert [r.incarnation for _, r in again.pending] == [1, 2]
    again.close()


def test_a_journal_of_the_earlier_layout_is_read_as_taken(tmp_path: Path) -> None:
    path = tmp_path / "j"
    body = msgpack.packb(["a", 3, 1, 2, "task:me", b"{}"], use_bin_type=True)
    path.write_bytes(len(body).to_bytes(4, "big") + body)
    j = reopen(path)
    assert j.pending == [] and j.taken == 2 and j.end == 2
    assert [(r.sender, r.first_seq, r.count) for r in j.known] == [("a", 1, 2)]
    j.append([rec("a", 3, 3)])
    j.close()
    assert [r.first_seq for r in read_journal(path)] == [1, 3]


def test_keys_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j = DeliveryJournal(path, compact_bytes=1)
    keyed = JournalRecord("a", 1, 1, 1, "task:me", b"{}", b"env", "order-17", 1234)
    j.append([keyed])
    j.take(1)
    j.close()
    again = reopen(path, compact_bytes=1)
    (kept,) = again.known
    assert (kept.key, kept.wall_ms, kept.payload) == ("order-17", 1234, b"")
    again.close()


@pytest.mark.parametrize("size", [0, 3, 40])
def test_a_file_cut_inside_the_header_is_started_afresh(tmp_path: Path, size: int) -> None:
    path = tmp_path / "j"
    j = DeliveryJournal(path)
    j.close()
    with open(path, "r+b") as fh:
        fh.truncate(size)
    again = reopen(path)
    assert again.pending == [] and again.end == 0
    assert again.append([rec("a", 1, 1)]) == 0
    again.close()
    assert os.path.getsize(path) > 64


def test_a_failed_append_on_a_full_disk_leaves_the_journal_as_it_was(tmp_path: Path) -> None:
    """A real full filesystem: the append raises StorageError, keeps nothing (no torn
    record in the middle of the file), and appends work again once there is space."""
    from porter_mesh.errors import StorageError
    from tests.tinyfs import fill, tiny_filesystem

    with tiny_filesystem(tmp_path / "fs") as fs:
        path = fs / "inbox.journal"
        j = DeliveryJournal(path)
        assert j.append([rec("a", 1, 1)]) == 0
        size = path.stat().st_size
        filler = fill(fs, leave=100)  # room for part of a record, not all of it
        big = JournalRecord("a", 1, 2, 1, "task:me", b"x" * 8192, b"env")
        with pytest.raises(StorageError) as caught:
            j.append([big])
        assert caught.value.path == str(path)
        assert caught.value.free_bytes is not None and caught.value.free_bytes < 8192
        assert "free space" in str(caught.value)
        assert path.stat().st_size == size  # cut back: nothing of it is left
        assert j.end == 1
        filler.unlink()
        assert j.append([big, rec("a", 1, 3)]) == 1
        j.close()
        again = reopen(path)
        assert [r.first_seq for _, r in again.pending] == [1, 2, 3]
        assert again.pending[1][1].payload == b"x" * 8192
        again.close()
