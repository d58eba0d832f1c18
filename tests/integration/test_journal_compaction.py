"""Compaction while the journal is open is crash-safe: a real process that appends,
takes and compacts all the time is killed with SIGKILL at arbitrary points, over and
over, and every time the journal opens whole: the owed messages are the last ones
written, in order, and de-duplication still knows every sequence number used."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from porter_mesh.adapters.journal import DeliveryJournal

pytestmark = [pytest.mark.timeout(120)]

WRITER = Path(__file__).with_name("journal_writer.py")
KILLS = 12


def test_kill_9_at_any_point_of_compaction_leaves_a_whole_journal(tmp_path: Path) -> None:
    path = tmp_path / "inbox.journal"
    rng = random.Random(7)
    next_seq = 1
    for _ in range(KILLS):
        proc = subprocess.Popen([sys.executable, str(WRITER), str(path), str(next_seq)],
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"  # it compacts by now
            deadline = time.monotonic() + rng.uniform(0.0, 0.3)
            while time.monotonic() < deadline:  # compacting all the while
                assert proc.poll() is None
            proc.kill()
        finally:
            proc.kill()
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
        journal = DeliveryJournal(path, compact_bytes=4096)
        try:
            owed = [r.first_seq for _, r in journal.pending]
            known = sorted(r.first_seq + i for r in journal.known for i in range(r.count))
        finally:
            journal.close()
        assert owed, "the last messages written are owed"
        assert owed == list(range(owed[0], owed[-1] + 1)), owed
        assert len(owed) <= 6
        assert known == list(range(1, owed[-1] + 1)), "de-duplication lost sequences"
        assert not path.with_suffix(".tmp").exists()
        next_seq = owed[-1] + 1
