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

File layout: a :mod:`~porter_mesh.adapters.framedlog` log (the framing, the cut-back
append, the rewrite by rename and the torn-tail cut live there)::

    header   64 bytes: b"PMJ3", 4 bytes of padding, then two slots of
             (taken: u64, check: u64), little-endian, check = taken ^ _CHECK, then
             (base: u64, check: u64), the position of the first record
    frames   each (length, CRC-32, payload), the payload a msgpack array
             [sender, incarnation, first_seq, count, channel, payload, envelope,
              key, wall_ms]

The header is memory-mapped: moving the mark is a 16-byte store into the page cache, with
no system call, so it costs well under a microsecond per message and survives the death
of the process (not of the machine: see the durability policy). The two slots are written
alternately; a reader takes the highest slot whose check matches, so a store torn by
``kill -9`` loses at most the last mark (that message is delivered again, flagged
``redelivered``), never a record. A torn last record (the process died mid-write) is cut
off on open; that message was never acknowledged, so its sender sends it again. A record
whose checksum fails with more of the file after it (a damaged file, not a torn write)
ends the readable part just the same, with a warning that says so and how many bytes
are lost.

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
process but not of the machine. ``fsync=True`` adds an ``fdatasync`` per appended batch
(the mark is flushed with it).

Earlier layouts are read by their own reader and rewritten in this one when the journal
opens: ``PMJ2`` (the same header, each record a 4-byte big-endian length and the msgpack
array, no checksum) keeps its mark and positions; a journal with no header at all is
read as fully taken, which is what that version promised. A journal of an earlier
layout that cannot be rewritten (a full disk) is not opened: :class:`StorageError`.
"""

from __future__ import annotations

import collections
import logging
import mmap
import pathlib
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import msgpack

from porter_mesh.adapters.framedlog import (
    Damage,
    FramedLog,
    Frames,
    Fsync,
    discard_unfinished_rewrite,
    free_bytes,
    storage_error,
    warn_damage,
    write_log,
)

__all__ = ["DeliveryJournal", "JournalRecord", "free_bytes", "read_journal"]

_LEN = struct.Struct(">I")
_SLOT = struct.Struct("<QQ")
_MAGIC = b"PMJ3"
#: The layout before this one: the same header, records without a checksum.
_MAGIC_PMJ2 = b"PMJ2"
_HEADER = 64
_SLOT_OFFSETS = (8, 8 + _SLOT.size)
#: Where the header keeps the position of the first record (and its check word).
_BASE_OFFSET = 8 + 2 * _SLOT.size
_CHECK = 0x9E3779B97F4A7C15
_MAX_RECORD = 64 * 1024 * 1024
#: What the journal is called in messages, and what a user does when it cannot be written.
_WHAT = "delivery journal"
_ADVICE = "free space on that filesystem (or move the data directory)"
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


def _decode(body: bytes) -> JournalRecord:
    """A record from its msgpack array (raises on anything else)."""
    item = msgpack.unpackb(body, raw=False)
    sender, inc, first, count, channel, payload = item[:6]
    env = bytes(item[6]) if len(item) > 6 else b""
    key = None if len(item) <= 7 or item[7] is None else str(item[7])
    wall = int(item[8]) if len(item) > 8 else 0
    return JournalRecord(str(sender), int(inc), int(first), int(count), str(channel),
                         bytes(payload), env, key, wall)


def _encode(record: JournalRecord) -> bytes:
    item: list[object] = [record.sender, record.incarnation, record.first_seq,
                          record.count, record.channel, record.payload, record.envelope]
    if record.key is not None:
        item += [record.key, record.wall_ms]
    return msgpack.packb(item, use_bin_type=True)


def _framed_records(data: bytes) -> tuple[list[JournalRecord], Damage | None]:
    """The records of a journal in this layout, and what ended them early."""
    frames = Frames(data, _HEADER, max_frame=_MAX_RECORD)
    records = []
    for offset, body in frames:
        try:
            records.append(_decode(body))
        except Exception:  # a sound frame that is no record: the file was damaged
            return records, Damage(offset, len(data), corrupt=True)
    return records, frames.damage


def _unframed_records(data: bytes, start: int) -> Iterator[tuple[int, JournalRecord]]:
    """Yield ``(end_offset, record)`` of a journal of an earlier layout (each record a
    4-byte length and its msgpack array) from ``start``; stops at a torn or corrupt
    record."""
    pos = start
    size = len(data)
    while pos + 4 <= size:
        (length,) = _LEN.unpack_from(data, pos)
        if length > _MAX_RECORD or pos + 4 + length > size:
            return
        try:
            record = _decode(data[pos + 4 : pos + 4 + length])
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


class _Parsed(NamedTuple):
    """What a journal file's bytes hold."""

    records: list[JournalRecord]
    #: Activities taken (a position).
    taken: int
    #: The end of the intact part (bytes).
    end: int
    #: Not in this layout (empty, cut inside its header, or an earlier layout): rewrite it.
    stale: bool
    #: The position of the first record.
    base: int
    #: What ended the intact part before the end of the file.
    damage: Damage | None


def _parse(data: bytes) -> _Parsed:
    """Read a journal file's bytes, of this layout or an earlier one."""
    if len(data) < _HEADER and (data.startswith(_MAGIC) or _MAGIC.startswith(data)):
        return _Parsed([], 0, len(data), True, 0, None)  # cut inside its header: empty
    if data.startswith(_MAGIC):
        records, damage = _framed_records(data)
        base = _read_base(data)
        return _Parsed(records, max(_read_mark(data), base),
                       len(data) if damage is None else damage.offset, False, base, damage)
    pmj2 = data.startswith(_MAGIC_PMJ2)
    start = _HEADER if pmj2 else 0
    records = []
    end = start
    for offset, record in _unframed_records(data, start):
        records.append(record)
        end = offset
    damage = Damage(end, len(data), corrupt=False) if end < len(data) else None
    if not pmj2:  # no header at all: its version promised every record taken
        return _Parsed(records, sum(r.count for r in records), end, True, 0, damage)
    base = _read_base(data) if len(data) >= _HEADER else 0
    taken = _read_mark(data) if len(data) >= _HEADER else 0
    return _Parsed(records, max(taken, base), end, True, base, damage)


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
    return _parse(data).records


def read_taken(path: pathlib.Path) -> int:
    """How many activities of a journal file the application has taken."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    return _parse(data).taken


class DeliveryJournal:
    """Append-only journal of accepted direct messages, with the taken mark.

    Args:
        path: the journal file (created with its parent directory).
        fsync: ``fdatasync`` after every append batch.
        compact_bytes: rewrite on open when the file is larger than this, and while
            open when it has grown past this (and past twice its size after the last
            rewrite) with taken records making up over half of it.
        key_window: seconds a keyed record is kept by compaction after it arrived,
            whatever else happened since, so that its key is still recognised.

    Raises:
        StorageError: a new journal, or one of an earlier layout, cannot be written (a
            full disk).

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
        discard_unfinished_rewrite(path)
        data = path.read_bytes() if path.exists() else b""
        records, taken, end, stale, base, damage = _parse(data)
        if damage is not None:
            warn_damage(_WHAT, path, damage)
        positions = _positions(records, base)
        taken = min(taken, positions[-1] + records[-1].count if records else base)
        latest: dict[str, int] = {}
        for record in records:
            latest[record.sender] = record.incarnation
        whole: int | None = end  # where the file's whole records end, unless rewritten
        if stale or damage is not None or len(data) > compact_bytes:
            kept, kept_positions, base = _compacted(records, positions, taken,
                                                    self._keys_after())
            try:
                write_log(path, _header(taken - base, 0), [_encode(r) for r in kept])
            except OSError as exc:
                if stale:
                    raise storage_error(path, exc, what=_WHAT, advice=_ADVICE) from exc
                # A full disk: go on with the file as it is, its torn tail cut off.
                log.warning("journal %s: cannot compact it (%s); using it as it is",
                            path, exc)
            else:
                # Nothing refers to a position yet: number from 0 again.
                records, taken, whole = kept, taken - base, None
                positions = [p - base for p in kept_positions]
        self.taken = taken
        self.end = positions[-1] + records[-1].count if records else taken
        self.pending = [(p, r) for p, r in zip(positions, records, strict=True)
                        if p + r.count > taken]
        self.known = [r for p, r in zip(positions, records, strict=True)
                      if latest.get(r.sender) == r.incarnation or p + r.count > taken
                      or r.key is not None]
        self._log = FramedLog(path, header=_header(0), max_frame=_MAX_RECORD,
                              fsync=Fsync.EVERY if fsync else Fsync.NONE, what=_WHAT,
                              advice=_ADVICE, end=whole)
        self._map_header()
        # Where taken records end in the file (bytes), and (position, byte) after each
        # later append: a cheap measure of how much of the file compaction would drop.
        self._taken_bytes = 0
        self._marks: collections.deque[tuple[int, int]] = collections.deque()
        self._compact_at = max(compact_bytes, 2 * self._log.end)

    def _map_header(self) -> None:
        self._map = mmap.mmap(self._log.fd, _HEADER)
        self._slot = 0

    def _keys_after(self) -> int:
        """Keys of records that arrived after this (ms since the epoch) are still live."""
        return int((time.time() - self._key_window) * 1000)

    def compact(self) -> bool:
        """Rewrite the journal while it is open, keeping what is owed at the same
        positions and of the rest only what de-duplication needs (see the module
        docstring). The application's positions (``Message.offset``) stay valid.

        Returns:
            True when the file was rewritten; False when it could not be (a full disk:
            the journal stays as it was, and is tried again after more growth).
        """
        data = self.path.read_bytes()
        parsed = _parse(data)
        records, positions, base = _compacted(parsed.records,
                                              _positions(parsed.records, parsed.base),
                                              self.taken, self._keys_after())
        try:
            ends = self._log.rewrite(_header(self.taken, base), [_encode(r) for r in records])
        except OSError as exc:
            log.warning("journal %s: cannot compact it (%s); it keeps growing until there "
                        "is space", self.path, exc)
            self._compact_at = self._log.end + self._compact_bytes
            return False
        self._map.close()
        self._map_header()
        owed = [(p + r.count, e) for p, r, e in zip(positions, records, ends, strict=True)
                if p + r.count > self.taken]
        self._marks = collections.deque(owed)
        prefix = len(records) - len(owed)
        self._taken_bytes = ends[prefix - 1] if prefix else _HEADER
        self._compact_at = max(self._compact_bytes, 2 * self._log.end)
        log.debug("journal %s: compacted from %d to %d bytes", self.path, len(data),
                  self._log.end)
        return True

    def _worth_compacting(self) -> bool:
        """Whether taken records make up more than half of the file."""
        marks, taken = self._marks, self.taken
        while marks and marks[0][0] <= taken:
            self._taken_bytes = max(self._taken_bytes, marks.popleft()[1])
        if 2 * self._taken_bytes > self._log.end:
            return True
        self._compact_at = self._log.end + self._compact_bytes // 4
        return False

    def append(self, records: list[JournalRecord]) -> int:
        """Write ``records`` with one system call (and ``fdatasync`` if configured).

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
        if self.fsync:
            self._map.flush()  # the mark goes to disk with the records
        self._log.append([_encode(r) for r in records])
        self.end = first + sum(r.count for r in records)
        self._marks.append((self.end, self._log.end))
        if self._log.end > self._compact_at and self._worth_compacting():
            self.compact()
        return first

    @property
    def size(self) -> int:
        """The file's size in bytes (header and whole records)."""
        return self._log.end

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
        if not self._map.closed:
            if self.fsync:
                self._map.flush()
            self._map.close()
        self._log.close()
