"""The delivery journal survives torn writes and keeps only what de-duplication needs."""

from __future__ import annotations

from pathlib import Path

from porter_mesh.adapters.journal import DeliveryJournal, JournalRecord, read_journal


def rec(sender: str, inc: int, seq: int) -> JournalRecord:
    return JournalRecord(sender, inc, seq, 1, "task:me", b'{"type":"Note","content":"x"}')


def test_append_and_replay(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j = DeliveryJournal(path)
    j.append([rec("a", 1, 1), rec("a", 1, 2)])
    j.close()
    again = DeliveryJournal(path)
    assert again.replayed == [rec("a", 1, 1), rec("a", 1, 2)]
    again.close()


def test_torn_tail_is_cut(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j = DeliveryJournal(path)
    j.append([rec("a", 1, 1)])
    j.close()
    with open(path, "ab") as fh:
        fh.write(b"\x00\x00\x01\x00partial")
    again = DeliveryJournal(path)
    assert again.replayed == [rec("a", 1, 1)]
    again.append([rec("a", 1, 2)])
    again.close()
    assert read_journal(path) == [rec("a", 1, 1), rec("a", 1, 2)]


def test_old_incarnations_are_not_replayed(tmp_path: Path) -> None:
    path = tmp_path / "j"
    j = DeliveryJournal(path, compact_bytes=1)
    j.append([rec("a", 1, 1), rec("a", 2, 1), rec("b", 5, 1)])
    j.close()
    again = DeliveryJournal(path, compact_bytes=1)
    assert again.replayed == [rec("a", 2, 1), rec("b", 5, 1)]
    again.close()
    assert read_journal(path) == [rec("a", 2, 1), rec("b", 5, 1)]
