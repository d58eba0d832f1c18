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
             (taken: u64, check: u64), little-endian, check = taken ^ _CHECK, then
             (base: u64, check: u64), the position of the first record (a file
             without a valid base, as earlier versions wrote, starts at 0)
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

Compaction keeps the file's size bounded. Records not yet taken are kept whole; taken
records keep only what de-duplication needs: nothing of a sender's older incarnations,
and of its newest one the sequence numbers it used, merged into one payload-less record
per unbroken run (a record whose idempotency key is still in its window stays apart,
with its key). On open the file is compacted when it has grown past ``compact_bytes``
(or had a torn tail), and the positions are numbered from 0 again. While it is open it
is compacted when it has grown past ``compact_bytes`` (and past twice its size after
the last compaction) and the taken records make up over half of it; then the owed
records keep their positions (the header's base says where the first record sits), so
the positions the application holds stay valid. Either way the rewrite goes to a
temporary file, synced, that replaces the journal with one rename (the directory synced
after it): a crash at any point leaves the old file or the new one, and a temporary
file left behind is removed on open. A rewrite that fails (a full disk) leaves the
journal as it was.

An append is all or nothing: a write that fails or stops short is cut back to the last
whole record and raises :class:`~porter_mesh.errors.StorageError`, so that no torn
record sits in the middle of the file for later appends to hide behind.

Durability policy: ``fsync=False`` (default) hands each batch to the OS with one ``write``
before the ack, and the mark lives in the page cache: this survives the death of the
process but not of the machine. ``fsync=True`` adds an ``fsync`` per appended batch (the
mark is flushed with it).

A journal written by an earlier version (no header) is read as fully taken, which is what
that version promised, and rewritten in this layout.
"""

from __future__ import annotations

import collections
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

__all__ = ["DeliveryJournal", "JournalRecord", "free_bytes", "read_journal"]

_LEN = struct.Struct(">I")
_SLOT = struct.Struct("<QQ")
_MAGIC = b"PMJ2"
_HEADER = 64
_SLOT_OFFSETS = (8, 8 + _SLOT.size)
#: Where the header keeps the position of the first record (and its check word).
_BASE_OFFSET = 8 + 2 * _SLOT.size
_CHECK = 0x9E3779B97F4A7C15
_MAX_RECORD = 64 * 1024 * 1024
log = logging.getLogger("porter_mesh.journal")


def free_bytes(directory: pathlib.Path) -> int | None:
    """Bytes this user may still write on the filesystem holding ``directory`` (what a
    full-disk message reports), or ``None`` when it cannot be read."""
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


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


def _read_base(data: bytes | memoryview) -> int:
    base, check = _SLOT.unpack_from(data, _BASE_OFFSET)
    return int(base) if check == base ^ _CHECK else 0


def _header(taken: int, base: int = 0) -> bytes:
    head = bytearray(_HEADER)
    head[:4] = _MAGIC
    for offset in _SLOT_OFFSETS:
        _SLOT.pack_into(head, offset, taken, taken ^ _CHECK)
    _SLOT.pack_into(head, _BASE_OFFSET, base, base ^ _CHECK)
    return bytes(head)


def _parse(data: bytes) -> tuple[list[JournalRecord], int, int, bool, int]:
    """``(records, taken, end of the intact part, legacy, base)`` of a journal file's
    bytes (``base``: the position of the first record)."""
    legacy = bool(data) and not data.startswith(_MAGIC)
    start = 0 if legacy or not data else _HEADER
    records: list[JournalRecord] = []
    end = start
    for offset, record in _records(data, start):
        records.append(record)
        end = offset
    base = 0
    if legacy:
        taken = sum(r.count for r in records)
    elif len(data) >= _HEADER:
        taken = _read_mark(data)
        base = _read_base(data)
    else:
        taken = 0
    return records, max(taken, base), end, legacy, base


def _positions(records: list[JournalRecord], base: int) -> list[int]:
    """The position of each record's first activity, the first record at ``base``."""
    positions = []
    for record in records:
        positions.append(base)
        base += record.count
    return positions


def _stripped(record: JournalRecord, count: int | None = None,
              key: bool = True) -> JournalRecord:
    """``record`` without its payload (taken: only de-duplication needs it now)."""
    return JournalRecord(record.sender, record.incarnation, record.first_seq,
                         record.count if count is None else count, record.channel, b"", b"",
                         record.key if key else None, record.wall_ms if key else 0)


def _compacted(records: list[JournalRecord], positions: list[int], taken: int,
               keep_keys_after: int) -> tuple[list[JournalRecord], list[int], int]:
    """What a compacted journal keeps: ``(records, positions, base)``.

    Records not yet wholly taken are kept whole, at the positions they had. Before
    them, taken records keep only what de-duplication needs: nothing of a sender's
    older incarnations, and of its newest one the sequence ranges it used, merged into
    one record per unbroken run (so a sender that runs for weeks costs one record),
    each without its payload; a record whose idempotency key is still within the
    window is kept apart, with its key. ``base`` puts the first kept record where the
    owed records still land on their positions.
    """
    latest: dict[str, int] = {}
    for record in records:
        latest[record.sender] = record.incarnation
    prefix: list[JournalRecord] = []
    runs: dict[tuple[str, int, str], int] = {}
    owed_from = len(records)
    for index, (start, record) in enumerate(zip(positions, records, strict=True)):
        if start + record.count > taken:
            owed_from = index
            break
        if record.key is not None and record.wall_ms > keep_keys_after:
            prefix.append(_stripped(record))  # its key is still recognised
            continue
        if latest[record.sender] != record.incarnation:
            continue  # taken, and its sender restarted since: nothing needs it
        run = (record.sender, record.incarnation, record.channel)
        at = runs.get(run)
        if at is not None and prefix[at].first_seq + prefix[at].count == record.first_seq:
            prefix[at] = _stripped(prefix[at], prefix[at].count + record.count)
        else:
            runs[run] = len(prefix)
            prefix.append(_stripped(record, key=False))
    if owed_from < len(records):
        first_owed = positions[owed_from]
    else:
        first_owed = positions[-1] + records[-1].count if records else taken
    kept = prefix + records[owed_from:]
    base = first_owed - sum(r.count for r in prefix)
    return kept, _positions(kept, base), base


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
        compact_bytes: rewrite on open when the file is larger than this, and while
            open when it has grown past this (and past twice its size after the last
            rewrite) with taken records making up over half of it.
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
        self._compact_bytes = compact_bytes
        self._key_window = key_window
        path.parent.mkdir(parents=True, exist_ok=True)
        # A rewrite that a crash interrupted: the journal itself is still whole.
        self._tmp_path().unlink(missing_ok=True)
        data = path.read_bytes() if path.exists() else b""
        records, taken, end, legacy, base = _parse(data)
        torn = end != len(data)
        if torn:
            log.warning("journal %s: cut %d bytes of a torn last record", path, len(data) - end)
        positions = _positions(records, base)
        taken = min(taken, positions[-1] + records[-1].count if records else base)
        latest: dict[str, int] = {}
        for record in records:
            latest[record.sender] = record.incarnation
        compact = not data or legacy or torn or len(data) > compact_bytes
        if compact:
            kept, kept_positions, base = _compacted(records, positions, taken,
                                                    self._keys_after())
            try:
                self._rewrite(kept, taken - base, 0)
            except OSError as exc:
                if not data or legacy:
                    raise self._storage_error(exc) from exc
                # A full disk: go on with the file as it is, its torn tail cut off.
                log.warning("journal %s: cannot compact it (%s); using it as it is",
                            path, exc)
                if torn:
                    os.truncate(path, end)
            else:
                # Nothing refers to a position yet: number from 0 again.
                records, taken = kept, taken - base
                positions = [p - base for p in kept_positions]
        self.taken = taken
        self.end = positions[-1] + records[-1].count if records else taken
        self.pending = [(p, r) for p, r in zip(positions, records, strict=True)
                        if p + r.count > taken]
        self.known = [r for p, r in zip(positions, records, strict=True)
                      if latest.get(r.sender) == r.incarnation or p + r.count > taken
                      or r.key is not None]
        self._open()
        # Where taken records end in the file (bytes), and (position, byte) after each
        # later append: a cheap measure of how much of the file compaction would drop.
        self._taken_bytes = 0
        self._marks: collections.deque[tuple[int, int]] = collections.deque()
        self._compact_at = max(compact_bytes, 2 * self._size)

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        self._map = mmap.mmap(self._fd, _HEADER)
        self._slot = 0
        # Bytes of whole records (and the header): where a failed append is cut back to.
        self._size = os.fstat(self._fd).st_size
        self._torn = False

    def _tmp_path(self) -> pathlib.Path:
        return self.path.with_suffix(".tmp")

    def _keys_after(self) -> int:
        """Keys of records that arrived after this (ms since the epoch) are still live."""
        return int((time.time() - self._key_window) * 1000)

    def _rewrite(self, records: list[JournalRecord], taken: int, base: int) -> list[int]:
        """Replace the file with ``records`` (the first at ``base``) and mark ``taken``,
        atomically: a temporary file, written and synced, renamed over the journal, the
        directory synced. A crash at any point leaves the old file or the new one.

        Returns:
            The byte offset after each record in the new file.

        Raises:
            OSError: the temporary file could not be written (it is removed).
        """
        tmp = self._tmp_path()
        ends = []
        size = _HEADER
        try:
            with open(tmp, "wb") as fh:
                chunks = [_header(taken, base)]
                for record in records:
                    chunks.append(self._encode(record))
                    size += len(chunks[-1])
                    ends.append(size)
                fh.write(b"".join(chunks))
                fh.flush()
                os.fsync(fh.fileno())
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return ends

    def compact(self) -> bool:
        """Rewrite the journal while it is open, keeping what is owed at the same
        positions and of the rest only what de-duplication needs (see the module
        docstring). The application's positions (``Message.offset``) stay valid.

        Returns:
            True when the file was rewritten; False when it could not be (a full disk:
            the journal stays as it was, and is tried again after more growth).
        """
        data = self.path.read_bytes()
        records, _, _, _, base = _parse(data)
        positions = _positions(records, base)
        records, positions, base = _compacted(records, positions, self.taken,
                                              self._keys_after())
        try:
            ends = self._rewrite(records, self.taken, base)
        except OSError as exc:
            log.warning("journal %s: cannot compact it (%s); it keeps growing until there "
                        "is space", self.path, exc)
            self._compact_at = self._size + self._compact_bytes
            return False
        self._map.close()
        os.close(self._fd)
        self._open()
        self._slot = 0
        owed = [(p + r.count, e) for p, r, e in zip(positions, records, ends, strict=True)
                if p + r.count > self.taken]
        self._marks = collections.deque(owed)
        prefix = len(records) - len(owed)
        self._taken_bytes = ends[prefix - 1] if prefix else _HEADER
        self._compact_at = max(self._compact_bytes, 2 * self._size)
        log.debug("journal %s: compacted from %d to %d bytes", self.path, len(data),
                  self._size)
        return True

    def _worth_compacting(self) -> bool:
        """Whether taken records make up more than half of the file."""
        marks, taken = self._marks, self.taken
        while marks and marks[0][0] <= taken:
            self._taken_bytes = max(self._taken_bytes, marks.popleft()[1])
        if 2 * self._taken_bytes > self._size:
            return True
        self._compact_at = self._size + self._compact_bytes // 4
        return False

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
        self._marks.append((self.end, self._size))
        if self._size > self._compact_at and self._worth_compacting():
            self.compact()
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
        if error is not None:
            raise self._storage_error(error) from error

    def _storage_error(self, error: OSError) -> StorageError:
        free = free_bytes(self.path.parent)
        return StorageError(
            f"cannot write the delivery journal {self.path}: {error.strerror or error} "
            f"({'unknown' if free is None else free} bytes free); nothing was kept; free "
            "space on that filesystem (or move the data directory)",
            path=str(self.path), free_bytes=free, errno_=error.errno)

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
