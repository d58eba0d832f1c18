"""The direct-delivery journal: the durable record of what a node has received.

A node with a data directory appends every direct message it accepts (sender,
sender incarnation, first sequence, count, channel, payload) to ``inbox.journal`` *before*
acknowledging it. After a crash or ``kill -9`` the restarted node replays the journal
into its de-duplication state, so a sender's retry of a message the old process had
already accepted is recognised and acknowledged without being delivered again: each
message is recorded exactly once across restarts.

Format: a sequence of records, each a 4-byte big-endian length followed by a msgpack
array. A torn last record (the process died mid-write) is cut off on open; that message
was never acknowledged, so its sender sends it again.

Durability policy: ``fsync=False`` (default) hands each batch to the OS with one
``write`` before the ack, which survives the death of the process but not of the
machine; ``fsync=True`` adds an ``fsync`` per batch and survives power loss too.

On open, records of older sender incarnations are dropped and the file is rewritten
when it has grown past ``compact_bytes``, keeping only what de-duplication needs.
"""

from __future__ import annotations

import logging
import os
import pathlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import msgpack

__all__ = ["DeliveryJournal", "JournalRecord", "read_journal"]

_LEN = struct.Struct(">I")
_MAX_RECORD = 64 * 1024 * 1024
log = logging.getLogger("porter_mesh.journal")


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One accepted direct message."""

    sender: str
    incarnation: int
    first_seq: int
    count: int
    channel: str
    payload: bytes


def _records(data: bytes) -> Iterator[tuple[int, JournalRecord]]:
    """Yield ``(end_offset, record)``; stops at the first torn or corrupt record."""
    pos = 0
    size = len(data)
    while pos + 4 <= size:
        (length,) = _LEN.unpack_from(data, pos)
        if length > _MAX_RECORD or pos + 4 + length > size:
            return
        try:
            item = msgpack.unpackb(data[pos + 4 : pos + 4 + length], raw=False)
            sender, inc, first, count, channel, payload = item
            record = JournalRecord(str(sender), int(inc), int(first), int(count), str(channel),
                                   bytes(payload))
        except Exception:  # a corrupt tail ends the readable part
            return
        pos += 4 + length
        yield pos, record


def read_journal(path: pathlib.Path) -> list[JournalRecord]:
    """Every intact record of a journal file (for tools and tests)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return [record for _, record in _records(data)]


class DeliveryJournal:
    """Append-only journal of accepted direct messages.

    Args:
        path: the journal file (created with its parent directory).
        fsync: ``fsync`` after every append batch.
        compact_bytes: rewrite on open when the file is larger than this.
    """

    def __init__(
        self, path: pathlib.Path, *, fsync: bool = False, compact_bytes: int = 8 * 1024 * 1024
    ) -> None:
        self.path = path
        self.fsync = fsync
        path.parent.mkdir(parents=True, exist_ok=True)
        data = path.read_bytes() if path.exists() else b""
        end = 0
        records: list[JournalRecord] = []
        for offset, record in _records(data):
            records.append(record)
            end = offset
        if end < len(data):
            log.warning("journal %s: cut %d bytes of a torn last record", path, len(data) - end)
        latest: dict[str, int] = {}
        for record in records:
            latest[record.sender] = record.incarnation
        self.replayed = [r for r in records if latest[r.sender] == r.incarnation]
        if end < len(data) or (len(data) > compact_bytes and len(self.replayed) < len(records)):
            self._rewrite(self.replayed)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def _rewrite(self, records: list[JournalRecord]) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            fh.write(b"".join(self._encode(r) for r in records))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    @staticmethod
    def _encode(record: JournalRecord) -> bytes:
        body = msgpack.packb(
            [record.sender, record.incarnation, record.first_seq, record.count,
             record.channel, record.payload],
            use_bin_type=True,
        )
        return _LEN.pack(len(body)) + body

    def append(self, records: list[JournalRecord]) -> None:
        """Write ``records`` with one system call (and ``fsync`` if configured)."""
        if not records:
            return
        data = b"".join(self._encode(r) for r in records)
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        if self.fsync:
            os.fsync(self._fd)

    def close(self) -> None:
        """Close the file; idempotent."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
