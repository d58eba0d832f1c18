"""The direct-delivery journal: what a node has received, and how much of it was taken.

Theory of operation
-------------------
A node with a data directory appends every direct message it accepts to
``inbox.journal`` *before* acknowledging it, and moves a *taken* mark once the application
has taken the message (a handler returned, or the application took it from the inbox:
see :mod:`porter_mesh.node.node`). The file is therefore the truth about two things:

* what was acknowledged: every record, so that a sender's retry of a message the node
  already accepted is recognised after a restart and acknowledged without being
  delivered again (de-duplication state);
* what the application still owes: the records past the taken mark. A restarted node
  delivers them again, in order, before anything new, so a message the sender saw
  acknowledged is handled even when the receiver died with it in a handler, in a batch
  or in a backlog in the inbox.

Messages are taken in the order they were journaled (handlers run in order, the inbox is
first in, first out), so the taken part is a prefix and one number says where it ends:
the count of activities taken, counted in journal order (activity ``i`` of a record that
starts at position ``p`` is at ``p + i``). Each message carries its position
(``Message.offset``) so the application can say which one it finished.

File layout::

    header   64 bytes: b"PMJ2", 4 bytes of padding, then two slots of
             (taken: u64, check: u64), little-endian, check = taken ^ _CHECK
    records  each a 4-byte big-endian length and a msgpack array
             [sender, incarnation, first_seq, count, channel, payload, envelope,
              key, wall_ms]

The header is memory-mapped: moving the mark is a 16-byte store into the page cache, with
no system call, so it costs well under a microsecond per message and survives the death
of the process (not of the machine: see the durability policy). The two slots are written
alternately; a reader takes the highest slot whose check matches, so a store torn by
``kill -9`` loses at most the last mark (that message is delivered again, flagged
``redelivered``), never a record. A torn last record (the process died mid-write) is cut
off on open; that message was never acknowledged, so its sender sends it again.

``key`` and ``wall_ms`` are set only for messages sent with an idempotency key (``None``
and 0 otherwise): the node keeps the keys of the last ``key_window`` seconds so that a
retry with the same key is acknowledged and not handled again, across restarts too.

On open the file is compacted when it has grown past ``compact_bytes`` (or had a torn
tail): taken records keep only what de-duplication needs (their payload is dropped, and
records of a sender's older incarnations are dropped), records not yet taken are kept
whole, and the mark is rebased. The rewrite goes to a temporary file that replaces the
journal atomically, so a crash during compaction leaves the old file intact.

Durability policy: ``fsync=False`` (default) hands each batch to the OS with one ``write``
before the ack, and the mark lives in the page cache: this survives the death of the
process but not of the machine. ``fsync=True`` adds an ``fsync`` per appended batch (the
mark is flushed with it).

A journal written by an earlier version (no header) is read as fully taken, which is what
that version promised, and rewritten in this layout.
"""

from __future__ import annotations

import logging
import mmap
import os
import pathlib
import shutil
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass

import msgpack

from porter_mesh.errors import StorageError

__all__ = ["DeliveryJournal", "JournalRecord", "read_journal"]

_LEN = struct.Struct(">I")
_SLOT = struct.Struct("<QQ")
_MAGIC = b"PMJ2"
_HEADER = 64
_SLOT_OFFSETS = (8, 8 + _SLOT.size)
_CHECK = 0x9E3779B97F4A7C15
_MAX_RECORD = 64 * 1024 * 1024
log = logging.getLogger("porter_mesh.journal")


@dataclass(frozen=True, slots=True)
class JournalRecord:
    """One accepted direct message (a ZeroMQ message of ``count`` activities).

    Attributes:
        sender / incarnation / first_seq / count / channel: from its envelope.
        payload: the activities as received (empty once taken and compacted).
        envelope: the envelope frame as received (empty once taken and compacted).
        key: the sender's idempotency key, if it gave one.
        wall_ms: when it was accepted (milliseconds since the epoch), for keyed messages.
    """

    sender: str
    incarnation: int
    first_seq: int
    count: int
    channel: str
    payload: bytes
    envelope: bytes = b""
    key: str | None = None
    wall_ms: int = 0


def _records(data: bytes | memoryview, start: int) -> Iterator[tuple[int, JournalRecord]]:
    """Yield ``(end_offset, record)`` from ``start``; stops at a torn or corrupt record."""
    pos = start
    size = len(data)
    while pos + 4 <= size:
        (length,) = _LEN.unpack_from(data, pos)
        if length > _MAX_RECORD or pos + 4 + length > size:
            return
        try:
            item = msgpack.unpackb(data[pos + 4 : pos + 4 + length], raw=False)
            sender, inc, first, count, channel, payload = item[:6]
            env = bytes(item[6]) if len(item) > 6 else b""
            key = None if len(item) <= 7 or item[7] is None else str(item[7])
            wall = int(item[8]) if len(item) > 8 else 0
            record = JournalRecord(str(sender), int(inc), int(first), int(count),
                                   str(channel), bytes(payload), env, key, wall)
        except Exception:  # a corrupt tail ends the readable part
            return
        pos += 4 + length
        yield pos, record


def _read_mark(data: bytes | memoryview | mmap.mmap) -> int:
    best = 0
    for offset in _SLOT_OFFSETS:
        taken, check = _SLOT.unpack_from(data, offset)
        if check == taken ^ _CHECK:
            best = max(best, taken)
    return best


def _header(taken: int) -> bytes:
    head = bytearray(_HEADER)
    head[:4] = _MAGIC
    for offset in _SLOT_OFFSETS:
        _SLOT.pack_into(head, offset, taken, taken ^ _CHECK)
    return bytes(head)


def _parse(data: bytes) -> tuple[list[JournalRecord], int, int, bool]:
    """``(records, taken, end of the intact part, legacy)`` of a journal file's bytes."""
    legacy = bool(data) and not data.startswith(_MAGIC)
    start = 0 if legacy or not data else _HEADER
    records: list[JournalRecord] = []
    end = start
    for offset, record in _records(data, start):
        records.append(record)
        end = offset
    if legacy:
        taken = sum(r.count for r in records)
    elif len(data) >= _HEADER:
        taken = _read_mark(data)
    else:
        taken = 0
    return records, taken, end, legacy


def read_journal(path: pathlib.Path) -> list[JournalRecord]:
    """Every intact record of a journal file (for tools and tests)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return _parse(data)[0]


def read_taken(path: pathlib.Path) -> int:
    """How many activities of a journal file the application has taken."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    return _parse(data)[1]


class DeliveryJournal:
    """Append-only journal of accepted direct messages, with the taken mark.

    Args:
        path: the journal file (created with its parent directory).
        fsync: ``fsync`` after every append batch.
        compact_bytes: rewrite on open when the file is larger than this.
        key_window: seconds a keyed record is kept by compaction after it arrived,
            whatever else happened since, so that its key is still recognised.

    Attributes:
        known: records whose de-duplication state the node must restore: every record
            of each sender's newest incarnation, every record not yet taken, and every
            keyed record (they carry the keys to remember).
        pending: the records not yet (wholly) taken, in order, with the position of
            their first activity: ``(position, record)``. The first may be partly taken:
            its activities below :attr:`taken` were handled already.
        taken: activities taken so far (a position: everything below it was taken).
        end: the position after the last journaled activity.
    """

    def __init__(
        self, path: pathlib.Path, *, fsync: bool = False, compact_bytes: int = 8 * 1024 * 1024,
        key_window: float = 600.0,
    ) -> None:
        self.path = path
        self.fsync = fsync
        path.parent.mkdir(parents=True, exist_ok=True)
        data = path.read_bytes() if path.exists() else b""
        records, taken, end, legacy = _parse(data)
        torn = end != len(data)
        if torn:
            log.warning("journal %s: cut %d bytes of a torn last record", path, len(data) - end)
        position = 0
        positions = []
        for record in records:
            positions.append(position)
            position += record.count
        taken = min(taken, position)
        latest: dict[str, int] = {}
        for record in records:
            latest[record.sender] = record.incarnation
        compact = not data or legacy or torn or len(data) > compact_bytes
        if compact:
            keep_keys_after = int((time.time() - key_window) * 1000)
            records, positions, taken = self._compacted(records, positions, taken, latest,
                                                        keep_keys_after)
            self._rewrite(records, taken)
        self.taken = taken
        self.end = positions[-1] + records[-1].count if records else taken
        self.pending = [(p, r) for p, r in zip(positions, records, strict=True)
                        if p + r.count > taken]
        self.known = [r for p, r in zip(positions, records, strict=True)
                      if latest.get(r.sender) == r.incarnation or p + r.count > taken
                      or r.key is not None]
        self._fd = os.open(path, os.O_RDWR | os.O_APPEND)
        self._map = mmap.mmap(self._fd, _HEADER)
        self._slot = 0
        # Bytes of whole records (and the header): where a failed append is cut back to.
        self._size = os.fstat(self._fd).st_size
        self._torn = False

    @staticmethod
    def _compacted(records: list[JournalRecord], positions: list[int], taken: int,
                   latest: dict[str, int], keep_keys_after: int
                   ) -> tuple[list[JournalRecord], list[int], int]:
        """Keep what is owed whole and what de-duplication needs of the rest."""
        kept: list[JournalRecord] = []
        new_positions: list[int] = []
        position = 0
        new_taken = 0
        for start, record in zip(positions, records, strict=True):
            done = start + record.count <= taken
            if (done and latest[record.sender] != record.incarnation
                    and not (record.key is not None and record.wall_ms > keep_keys_after)):
                continue  # nothing needs it: taken, its sender restarted, no live key
            if done:
                record = JournalRecord(record.sender, record.incarnation, record.first_seq,
                                       record.count, record.channel, b"", b"", record.key,
                                       record.wall_ms)
                new_taken = position + record.count
            elif start < taken:
                new_taken = position + (taken - start)
            kept.append(record)
            new_positions.append(position)
            position += record.count
        if not kept:
            new_taken = 0
        return kept, new_positions, new_taken

    def _rewrite(self, records: list[JournalRecord], taken: int) -> None:
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            fh.write(_header(taken))
            fh.write(b"".join(self._encode(r) for r in records))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)

    @staticmethod
    def _encode(record: JournalRecord) -> bytes:
        item: list[object] = [record.sender, record.incarnation, record.first_seq,
                              record.count, record.channel, record.payload, record.envelope]
        if record.key is not None:
            item += [record.key, record.wall_ms]
        body = msgpack.packb(item, use_bin_type=True)
        return _LEN.pack(len(body)) + body

    def append(self, records: list[JournalRecord]) -> int:
        """Write ``records`` with one system call (and ``fsync`` if configured).

        All or nothing: a write that fails or stops short (a full disk) is cut back to
        the last whole record, so the file is as it was and a later append is never
        hidden behind a torn one.

        Returns:
            The position of the first activity of the first record (the others follow
            in order, each ``count`` further on).

        Raises:
            StorageError: nothing was kept (the message says why and what to do).
        """
        first = self.end
        if not records:
            return first
        if self._torn:
            self._cut(None)  # an earlier failure could not be cut back yet
        data = b"".join([self._encode(r) for r in records])
        view = memoryview(data)
        try:
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            if self.fsync:
                self._map.flush()
                os.fsync(self._fd)
        except OSError as exc:
            self._torn = True
            self._cut(exc)
        self._size += len(data)
        self.end = first + sum(r.count for r in records)
        return first

    def _cut(self, error: OSError | None) -> None:
        """Cut the file back to its last whole record, then raise :class:`StorageError`
        for ``error`` (None: only cut; raise if that fails)."""
        try:
            os.ftruncate(self._fd, self._size)
        except OSError as exc:
            error = error or exc  # still torn: the next append tries again first
        else:
            self._torn = False
        if error is None:
            return
        try:
            free: int | None = shutil.disk_usage(self.path.parent).free
        except OSError:
            free = None
        raise StorageError(
            f"cannot write the delivery journal {self.path}: {error.strerror or error} "
            f"({'unknown' if free is None else free} bytes free); nothing was kept; free "
            "space on that filesystem (or move the data directory)",
            path=str(self.path), free_bytes=free, errno_=error.errno) from error

    @property
    def size(self) -> int:
        """The file's size in bytes (header and whole records)."""
        return self._size

    def take(self, upto: int) -> None:
        """Mark every activity below position ``upto`` as taken (never moves back)."""
        if upto <= self.taken:
            return
        upto = min(upto, self.end)
        self.taken = upto
        self._slot ^= 1
        _SLOT.pack_into(self._map, _SLOT_OFFSETS[self._slot], upto, upto ^ _CHECK)

    def close(self) -> None:
        """Close the file (flushing the mark to it); idempotent."""
        if self._fd >= 0:
            if self.fsync:
                self._map.flush()
            self._map.close()
            os.close(self._fd)
            self._fd = -1
