"""One framed, append-only log file: the delivery journal and the knowledge shard's journal.

Theory of operation
-------------------
A log file is a header its user owns, then frames::

    header   fixed size, written when the file is made (a magic naming the format; the
             delivery journal also keeps its taken mark there, memory-mapped)
    frames   each: payload length (u32, big-endian), CRC-32 of the payload (u32,
             big-endian, ``zlib.crc32``), the payload (1 byte to ``max_frame`` bytes)

The checksum is zlib's CRC-32, not CRC-32C: the knowledge shard has always written
these frames with it, so its files are read as they are, with no second framing to
keep; the standard library has no CRC-32C (it would be a new compiled dependency), and
zlib's costs about 0.4 us for a 300-byte frame here (4 us for 8 KiB), once when a frame
is written and once each time it is read back.

**Reading** (:class:`Frames`) walks the frames from an offset and stops at the first
that is not whole and sound. What stopped it is a :class:`Damage`: a *torn* tail (the
frame runs past the end of the file, its checksum fails and nothing follows it, or the
rest of the file is zero bytes: what a write cut short by a crash leaves) or a *corrupt*
frame (its checksum fails with more of the file after it, or its length is one no
append writes: the file was damaged, not torn). An empty frame is never written, so a
zero length marks the end too.
:meth:`FramedLog.replay` cuts a torn tail off (``ftruncate``, synced) with a warning
naming the bytes lost, and raises :class:`DamagedLogError` at a corrupt frame, cutting
nothing: what follows may still matter, and the log's user decides.

**Appending** is all or nothing: one batch of frames goes out with one ``write``; a write
that fails or stops short (``ENOSPC``, ``EIO``) is cut back to the end of the last whole
frame and raised as :class:`~porter_mesh.errors.StorageError` with the free space named,
so no torn frame sits in the middle of the file for later appends to hide behind. If
even the cut fails, the next append cuts first.

**Durability** (:class:`Fsync`): ``EVERY`` makes each append durable (``fdatasync``)
before it returns; ``GROUP`` leaves it to the caller, who calls :meth:`FramedLog.sync_to`
(outside its own lock): callers waiting at the same time share one ``fdatasync``,
since whoever syncs first covers every frame written before it started; ``NONE`` is the
``write`` alone, which survives the death of the process but not of the machine.
:attr:`FramedLog.synced` says how far the file is known to be durable.

**Creating and rewriting** go through a temporary file beside the log, written and
synced, renamed over it, the directory synced after: a crash at any point leaves the
old file or the new one, never a part of one (:func:`write_log`;
:meth:`FramedLog.rewrite` for compaction while the log is open).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import pathlib
import shutil
import struct
import threading
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from porter_mesh.errors import PorterError, StorageError

__all__ = [
    "FRAME",
    "Damage",
    "DamagedLogError",
    "FramedLog",
    "Frames",
    "Fsync",
    "discard_unfinished_rewrite",
    "encode_frame",
    "free_bytes",
    "fsync_directory",
    "storage_error",
    "warn_damage",
    "write_log",
]

#: A frame's head: payload length, CRC-32 of the payload.
FRAME: Final = struct.Struct(">II")
log = logging.getLogger("porter_mesh.framedlog")


def free_bytes(directory: pathlib.Path) -> int | None:
    """Bytes this user may still write on the filesystem holding ``directory`` (what a
    full-disk message reports), or ``None`` when it cannot be read."""
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def encode_frame(payload: bytes) -> bytes:
    """One frame: length, checksum and ``payload`` (which must not be empty)."""
    return FRAME.pack(len(payload), zlib.crc32(payload)) + payload


@dataclass(frozen=True, slots=True)
class Damage:
    """Where a log's readable part ends before its bytes do.

    Attributes:
        offset: the end of the last whole frame (where the log is cut back to).
        size: the bytes there were (``size - offset`` are lost).
        corrupt: ``True`` when a frame's checksum fails with more of the file after it
            (the file was damaged); ``False`` for a torn tail (a write cut short).
    """

    offset: int
    size: int
    corrupt: bool

    @property
    def lost(self) -> int:
        """Bytes past the last whole frame."""
        return self.size - self.offset


class DamagedLogError(PorterError):
    """A frame inside a log fails its checksum: the file was damaged, not torn.

    The log's user turns it into its own error (the knowledge shard refuses to open and
    says to catch up from the peers).

    Attributes:
        path: the log file.
        damage: where (``damage.offset``) and how much follows it.
    """

    def __init__(self, path: pathlib.Path, damage: Damage) -> None:
        super().__init__(f"{path} is damaged at byte {damage.offset} (a frame fails its "
                         f"checksum with {damage.lost} bytes from there on)")
        self.path = path
        self.damage = damage


class Frames:
    """The frames of a log's bytes from ``start``: iterate for ``(offset, payload)``.

    Once the iteration ends, :attr:`end` is the offset after the last whole frame and
    :attr:`damage` says what stopped it early (``None``: the data ended on a frame).

    Args:
        data: the file's bytes (or the part of them to read).
        start: the offset of the first frame in ``data`` (the header's size).
        max_frame: the largest payload a frame may hold; a longer one is damage.
        base: the file offset at which ``data`` begins (offsets are the file's).
    """

    def __init__(self, data: bytes, start: int, *, max_frame: int, base: int = 0) -> None:
        self._bytes = data
        self._start = start
        self._max = max_frame
        self._base = base
        self.end = base + start
        self.damage: Damage | None = None

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        data, size, crc32 = self._bytes, len(self._bytes), zlib.crc32
        head, unpack, base = FRAME.size, FRAME.unpack_from, self._base
        pos = self._start
        self.end = base + pos
        self.damage = None
        while pos + head <= size:
            length, crc = unpack(data, pos)
            stop = pos + head + length
            if length == 0 or length > self._max or stop > size:
                break
            payload = data[pos + head:stop]
            if crc32(payload) != crc:
                break
            yield base + pos, payload
            pos = stop
            self.end = base + stop
        if pos < size:
            self.damage = Damage(base + pos, base + size, self._corrupt(pos))

    def _corrupt(self, pos: int) -> bool:
        """Whether the bad frame at ``pos`` is damage rather than a torn tail."""
        data = self._bytes
        if pos + FRAME.size > len(data):
            return False  # not even a whole head: a write cut short
        length, _ = FRAME.unpack_from(data, pos)
        if 0 < length <= self._max and pos + FRAME.size + length >= len(data):
            return False  # the frame reaches the end: the last write, torn
        # A length no append writes (past ``max_frame``) is a damaged head, wherever it
        # points: cutting from there would drop the whole frames after it.
        # Zeros to the end: a file whose size grew before its data reached the disk.
        return data.count(0, pos) != len(data) - pos


class Fsync(enum.Enum):
    """When an append is made durable (see the module docstring)."""

    #: ``fdatasync`` before every append returns.
    EVERY = "every"
    #: When the caller asks (:meth:`FramedLog.sync_to`); callers share the call.
    GROUP = "group"
    #: Never: the ``write`` alone (survives the process, not the machine).
    NONE = "none"


def fsync_directory(path: pathlib.Path) -> None:
    """Make the entries of directory ``path`` durable (after a create or a rename)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _inode(path: pathlib.Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _temporary(path: pathlib.Path) -> pathlib.Path:
    return path.with_suffix(".tmp")


def discard_unfinished_rewrite(path: pathlib.Path) -> None:
    """Remove what a rewrite of ``path`` interrupted by a crash left (the log itself is
    whole: the rename never happened)."""
    _temporary(path).unlink(missing_ok=True)


def write_log(path: pathlib.Path, header: bytes, payloads: Iterable[bytes]) -> list[int]:
    """Make ``path`` a log of ``header`` then ``payloads``, atomically: a temporary file,
    written and synced, renamed over ``path``, the directory synced.

    Returns:
        The offset after each frame in the new file.

    Raises:
        OSError: the temporary file could not be written (it is removed; ``path`` is
            as it was).
    """
    tmp = _temporary(path)
    ends = []
    chunks = [header]
    size = len(header)
    for payload in payloads:
        chunks.append(encode_frame(payload))
        size += len(chunks[-1])
        ends.append(size)
    try:
        with open(tmp, "wb") as fh:
            fh.write(b"".join(chunks))
            fh.flush()
            os.fdatasync(fh.fileno())
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)
    fsync_directory(path.parent)
    return ends


def storage_error(path: pathlib.Path, error: OSError, *, what: str,
                  advice: str) -> StorageError:
    """The :class:`StorageError` for a write to log ``path`` that failed with ``error``.

    Args:
        what: what the log is (``"delivery journal"``).
        advice: what the user should do, ending the message.
    """
    free = free_bytes(path.parent)
    return StorageError(
        f"cannot write the {what} {path}: {error.strerror or error} "
        f"({'unknown' if free is None else free} bytes free); nothing was kept; {advice}",
        path=str(path), free_bytes=free, errno_=error.errno)


class FramedLog:
    """An open log file: appends all or nothing, replays, syncs by :class:`Fsync` policy.

    ``append`` and ``rewrite`` are for one writer at a time (the user's lock);
    ``sync_to`` may run on any thread, outside that lock, and ``replay(until=...)`` and
    ``read`` are safe while the writer appends.

    Args:
        path: the log file; made with ``header`` (atomically) when it does not exist.
            An existing file is taken as it is: its user has checked its header.
        header: the bytes a new file starts with; frames follow at ``len(header)``.
        fsync: the durability policy.
        max_frame: the largest payload a frame may hold.
        what: what the log is, for messages (``"knowledge journal"``).
        advice: what to do when a write fails, ending the :class:`StorageError`.
        end: the end of the last whole frame, when the caller has read the file: a tail
            past it is cut off now (see :meth:`cut_tail`).

    Raises:
        StorageError: a new file could not be made (a full disk).

    Attributes:
        end: the offset after the last whole frame (the file's size).
        synced: the file is durable up to here (``end`` under ``Fsync.NONE``, where the
            write is all there is).
        syncs: ``fdatasync`` calls made (group commits are counted with it).
        failures: appends and syncs that failed since the log was opened.
    """

    def __init__(self, path: pathlib.Path, *, header: bytes, fsync: Fsync, max_frame: int,
                 what: str, advice: str, end: int | None = None) -> None:
        self.path = path
        self.header_size = len(header)
        self.fsync = fsync
        self.max_frame = max_frame
        self.what = what
        self.advice = advice
        self.failures = 0
        self.syncs = 0
        self._sync_lock = threading.Lock()
        # Ranges (start, end] that a failed fdatasync covered: a later good fdatasync does
        # not make them durable (the kernel may have dropped those pages), so a sync_to
        # ending inside one fails too. Failures are rare; a few ranges are kept, merged.
        self._unsure: list[tuple[int, int]] = []
        discard_unfinished_rewrite(path)
        if not path.exists():
            try:
                write_log(path, header, ())
                # The directory may be new too (a fresh data directory): its own entry.
                fsync_directory(path.parent.parent)
            except OSError as exc:
                raise storage_error(path, exc, what=what, advice=advice) from exc
        self._fd = -1
        self._open()
        if end is not None and end < self.end:
            self.cut_tail(Damage(end, self.end, corrupt=False), warn=False)

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        self.end = self.synced = os.fstat(self._fd).st_size
        # A failed append whose partial frame could not be cut off yet: the next append
        # cuts it first (the file must end at ``end``: offsets are computed from it).
        self._torn = False

    @property
    def fd(self) -> int:
        """The open file descriptor (for a mapping of the header; changes on rewrite)."""
        return self._fd

    # -- reading --

    def replay(self, start: int | None = None, *,
               until: int | None = None) -> Iterator[tuple[int, bytes]]:
        """Yield ``(offset, payload)`` of every whole frame from ``start`` (the first
        frame by default), in order.

        A torn tail is cut off once the frames before it are read (with a warning naming
        the bytes lost) and :attr:`end` moves to the last whole frame.

        Args:
            start: the offset of a frame to begin at.
            until: read only the frames before this offset (one :attr:`end` reached) and
                change nothing: safe while another thread appends.

        Raises:
            DamagedLogError: a frame fails its checksum with more of the file after it;
                the frames before it were yielded and nothing is cut.
        """
        first = self.header_size if start is None else start
        with open(self.path, "rb") as fh:
            fh.seek(first)
            data = fh.read() if until is None else fh.read(max(0, until - first))
        frames = Frames(data, 0, max_frame=self.max_frame, base=first)
        yield from frames
        if until is not None or frames.damage is None:
            return
        if frames.damage.corrupt:
            raise DamagedLogError(self.path, frames.damage)
        self.cut_tail(frames.damage)

    def read(self, offset: int) -> bytes:
        """The payload of the frame at ``offset``.

        Raises:
            DamagedLogError: no sound frame starts there.
        """
        head = os.pread(self._fd, FRAME.size, offset)
        length, crc = FRAME.unpack(head) if len(head) == FRAME.size else (0, 0)
        payload = os.pread(self._fd, length, offset + FRAME.size) if length else b""
        if not payload or len(payload) != length or zlib.crc32(payload) != crc:
            raise DamagedLogError(self.path, Damage(offset, self.end, corrupt=True))
        return payload

    def cut_tail(self, damage: Damage, *, warn: bool = True) -> None:
        """Cut the file back to ``damage.offset`` (synced) and log it.

        Args:
            damage: what a read found past the last whole frame.
            warn: log the warning (``False`` when the caller has said so already).
        """
        if warn:
            warn_damage(self.what, self.path, damage)
        os.ftruncate(self._fd, damage.offset)
        os.fdatasync(self._fd)
        self.end = self.synced = damage.offset

    # -- writing --

    def append(self, payloads: Sequence[bytes], *, sync: bool = True) -> list[int]:
        """Append one frame per payload with one ``write``; all or nothing.

        Args:
            payloads: the frames' contents (each 1 to ``max_frame`` bytes).
            sync: under ``Fsync.GROUP``, also :meth:`sync_to` the new end before
                returning (else the caller does, outside its lock).

        Returns:
            The offset of each new frame.

        Raises:
            ValueError: a payload is empty or longer than ``max_frame`` (nothing written).
            StorageError: the write (or under ``Fsync.EVERY`` its ``fdatasync``) failed;
                the file is cut back to where it was.
        """
        offsets: list[int] = []
        parts: list[bytes] = []
        pos, largest, head = self.end, self.max_frame, FRAME.size
        pack, crc32, add, mark = FRAME.pack, zlib.crc32, parts.append, offsets.append
        for payload in payloads:
            size = len(payload)
            if not 0 < size <= largest:
                raise ValueError(f"a frame holds 1 to {largest} bytes, not {size}")
            mark(pos)
            add(pack(size, crc32(payload)))
            add(payload)
            pos += head + size
        if not offsets:
            return offsets
        buf = memoryview(b"".join(parts))
        try:
            if self._torn:
                self._cut()
            while buf:
                written = os.write(self._fd, buf)
                buf = buf[written:]
            if self.fsync is Fsync.EVERY:
                os.fdatasync(self._fd)
                self.syncs += 1
        except OSError as exc:
            self.failures += 1
            self._torn = True
            with contextlib.suppress(OSError):  # if even this fails, the next append cuts
                self._cut()
            raise storage_error(self.path, exc, what=self.what, advice=self.advice) from exc
        self.end = pos
        if self.fsync is not Fsync.GROUP:
            self.synced = pos  # synced above, or the write is all there is
        elif sync:
            self.sync_to(pos)
        return offsets

    def _cut(self) -> None:
        """Cut the file back to :attr:`end`, the end of the last whole frame."""
        os.ftruncate(self._fd, self.end)
        self._torn = False

    def sync_to(self, end: int) -> None:
        """Return once the log is durable up to ``end`` (one ``fdatasync`` shared by the
        callers waiting at the same time).

        Raises:
            StorageError: the ``fdatasync`` failed: what it covers is not known to be on
                disk.
        """
        if self._unsure and any(start < end <= stop for start, stop in self._unsure):
            raise self._sync_error("an earlier fdatasync of it failed")
        if self.synced >= end:
            return
        with self._sync_lock:
            if self.synced >= end:
                return  # another caller's fdatasync covered it meanwhile
            # Everything written before the fdatasync starts is covered by it, and
            # ``end`` moves only once a write is complete.
            start, target = self.synced, self.end
            try:
                os.fdatasync(self._fd)
            except OSError as exc:
                self.failures += 1
                self._unsure.append((start, target))
                if len(self._unsure) > 16:
                    self._unsure = [(self._unsure[0][0], self._unsure[-1][1])]
                raise self._sync_error(exc.strerror or str(exc), exc.errno) from None
            self.syncs += 1
            self.synced = max(self.synced, target)

    def _sync_error(self, why: str, errno_: int | None = None) -> StorageError:
        return StorageError(
            f"could not make the {self.what} {self.path} durable: {why}; check the disk "
            "(what was written before the failed sync is not acknowledged)",
            path=str(self.path), free_bytes=free_bytes(self.path.parent), errno_=errno_)

    def rewrite(self, header: bytes, payloads: Iterable[bytes]) -> list[int]:
        """Replace the log with ``header`` and ``payloads`` (compaction), atomically (see
        :func:`write_log`); appends go to the new file after it.

        Returns:
            The offset after each frame in the new file.

        Raises:
            OSError: the new file could not be written; the log is as it was.
        """
        try:
            return write_log(self.path, header, payloads)
        finally:
            # Appends must go to the file the path names: once the rename happened (even
            # if syncing the directory then failed), the open file is the old, unlinked one.
            if os.fstat(self._fd).st_ino != _inode(self.path):
                os.close(self._fd)
                self._open()

    def close(self) -> None:
        """Close the file; idempotent."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def warn_damage(what: str, path: pathlib.Path, damage: Damage) -> None:
    """Log, once, that the bytes past ``damage.offset`` of log ``path`` are cut off."""
    log.warning("%s %s: cut %d bytes of a %s at byte %d", what, path, damage.lost,
                "corrupt frame and what follows it" if damage.corrupt else "torn last frame",
                damage.offset)
