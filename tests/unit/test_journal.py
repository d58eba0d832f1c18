"""The delivery journal: torn writes, the taken mark, what is owed after a restart, and
compaction that keeps what de-duplication needs."""

from __future__ import annotations

import os
import time
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
    """A key within the window is kept with its record; an expired one (1970) is not,
    since the node no longer recognises it: its record joins the sender's run."""
    path = tmp_path / "j"
    j = DeliveryJournal(path, compact_bytes=1)
    now = int(time.time() * 1000)
    keyed = JournalRecord("a", 1, 1, 1, "task:me", b"{}", b"env", "order-17", now)
    expired = JournalRecord("a", 1, 2, 1, "task:me", b"{}", b"env", "order-1", 1234)
    j.append([keyed, expired])
    j.take(2)
    j.close()
    again = reopen(path, compact_bytes=1)
    kept, run = again.known
    assert (kept.key, kept.wall_ms, kept.payload) == ("order-17", now, b"")
    assert (run.key, run.first_seq, run.count) == (None, 2, 1)
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


def test_compaction_while_open_keeps_what_is_owed_at_its_positions(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j = DeliveryJournal(path)
    for seq in range(1, 101):
        assert j.append([rec("a", 1, seq)]) == seq - 1
    j.take(90)
    before = path.stat().st_size
    assert j.compact()
    assert path.stat().st_size < before / 4
    # Positions the application holds still mean the same messages.
    assert j.taken == 90 and j.end == 100
    assert j.append([rec("b", 3, 1)]) == 100
    j.take(95)
    j.close()
    again = reopen(path)
    assert [(r.sender, r.first_seq) for _, r in again.pending] == [
        ("a", s) for s in range(96, 101)] + [("b", 1)]
    # The taken ones live on as one run of sequence numbers, for de-duplication.
    run = again.known[0]
    assert (run.sender, run.first_seq, run.count, run.payload) == ("a", 1, 90, b"")
    again.close()


def test_the_journal_stays_bounded_under_sustained_traffic(tmp_path: Path) -> None:
    """Many messages from a long-lived sender and from restarting ones, each taken soon
    after it arrived: the file never grows far past the compaction threshold."""
    path = tmp_path / "j"
    limit = 64 * 1024
    j = DeliveryJournal(path, compact_bytes=limit)
    biggest = 0
    payload = b"p" * 200
    seqs: dict[tuple[str, int], int] = {}
    for i in range(1, 20_001):
        stream = ("long", 1) if i % 3 else ("short", i // 300)  # restarts now and then
        seq = seqs[stream] = seqs.get(stream, 0) + 1
        position = j.append([JournalRecord(*stream, seq, 1, "task:me", payload, b"env")])
        j.take(position + 1 - 10)  # a few stay owed
        biggest = max(biggest, path.stat().st_size)
    assert biggest <= 2 * limit + 4096, biggest
    assert j.compact()
    j.close()
    again = reopen(path, compact_bytes=limit)
    assert len(again.pending) >= 10
    # Runs, not one record per message: the long-lived sender's taken messages are one
    # record, the restarted senders' older incarnations are gone.
    assert len(again.known) <= 10 + 2, again.known
    again.close()


def test_every_crash_point_of_a_compaction_leaves_a_whole_journal(tmp_path: Path) -> None:
    """The states a crash can leave, made on a real disk: a torn temporary file; a
    complete one not yet renamed; the renamed one. Each opens with the same owed
    messages and the same de-duplication knowledge."""
    path = tmp_path / "j"
    j = DeliveryJournal(path)
    j.append([rec("a", 1, seq) for seq in range(1, 51)])
    j.take(40)
    j.close()
    old = path.read_bytes()
    j = DeliveryJournal(path)
    assert j.compact()
    j.close()
    new = path.read_bytes()
    tmp = path.with_suffix(".tmp")

    def owed_and_known() -> tuple[list[int], set[int]]:
        again = reopen(path)
        try:
            owed = [r.first_seq for _, r in again.pending]
            known = {r.first_seq + i for r in again.known for i in range(r.count)}
            return owed, known
        finally:
            again.close()

    expected = (list(range(41, 51)), set(range(1, 51)))
    for journal, temporary in [(old, new[: len(new) // 2]), (old, new), (new, None)]:
        path.write_bytes(journal)
        if temporary is not None:
            tmp.write_bytes(temporary)
        assert owed_and_known() == expected
        assert not tmp.exists()  # the interrupted rewrite is cleared away


def test_opening_on_a_full_disk(tmp_path: Path) -> None:
    """A journal with a torn tail opens on a full filesystem (cut in place, no
    rewrite); a new one that cannot be created says so with a StorageError."""
    from porter_mesh.errors import StorageError
    from tests.tinyfs import fill, tiny_filesystem

    with tiny_filesystem(tmp_path / "fs") as fs:
        path = fs / "inbox.journal"
        j = DeliveryJournal(path)
        j.append([rec("a", 1, 1), rec("a", 1, 2)])
        j.take(1)
        j.close()
        with open(path, "ab") as fh:
            fh.write(b"\x00\x00\x01\x00partial")
        filler = fill(fs)
        again = reopen(path)
        assert [r.first_seq for _, r in again.pending] == [2] and again.taken == 1
        again.close()
        assert read_journal(path)[-1].first_seq == 2
        with pytest.raises(StorageError, match="free space"):
            DeliveryJournal(fs / "other" / "inbox.journal")
        filler.unlink()
