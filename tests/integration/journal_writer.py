"""Appends to a delivery journal as fast as it can, taking all but the last few, with a
tiny compaction threshold so that it compacts every few appends; killed with SIGKILL by
``test_journal_compaction.py`` at arbitrary points, compactions included.

Arguments: the journal path, the first sequence number to use. Prints ``ready`` once it
has compacted at least once.
"""

from __future__ import annotations

import sys
from pathlib import Path

from porter_mesh.adapters.journal import DeliveryJournal, JournalRecord

OWED = 5


def main() -> None:
    path, seq = Path(sys.argv[1]), int(sys.argv[2])
    journal = DeliveryJournal(path, compact_bytes=4096)
    payload = b"p" * 300
    announced = False
    compacted = journal.size
    while True:
        position = journal.append([JournalRecord("w", 1, seq, 1, "task:me", payload, b"e")])
        journal.take(position + 1 - OWED)
        seq += 1
        if not announced and journal.size < compacted:
            print("ready", flush=True)
            announced = True
        compacted = journal.size


if __name__ == "__main__":
    main()
