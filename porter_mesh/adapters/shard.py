"""The shard: one node's durable replica of the knowledge graph.

Theory of operation
-------------------
A shard lives in a data directory::

    shard.json           format version and the agent that owns it
    shard.lock           held (flock) while a process has the shard open
    knowledge.journal    every record ever accepted, append-only: the truth
    oxigraph/            the on-disk index (RocksDB), once the index is on disk
    oxigraph.tmp/        an on-disk index being built (the index moving to disk)
    index-copy/          while the index is in memory: a copy of it (RocksDB), written at
                         close, which answers queries after a restart while it loads
    replica-state        the replica state as it was at the last close, with the
                         journal offset it reflects (a cache: see Restart)
    checkpoints/         on-disk copies of the store for isolated queries

**The store is an index.** The Oxigraph store answers queries; it holds nothing the
journal does not, so it can be chosen for speed. ``Index.MEMORY`` keeps it in memory and
rebuilds it from the journal at every start: no RocksDB write path, about 2.3 KB of
memory per observation (the replica state included), a profile query several times
faster than on disk, a rebuild of the index after each start (see docs/knowledge.md);
meanwhile queries are answered from the copy of it that the last close left on disk, when
that copy matches the journal (:class:`_IndexCopy`).
``Index.DISK`` keeps it in RocksDB under ``oxigraph/`` with a watermark, for a shard
larger than memory; at start it applies only what the journal holds past the watermark.
It is compacted after large loads (:class:`_Compactor`).
``Index.AUTO`` (the default) is the first up to :data:`DISK_AFTER` observations and the
second past them: the index moves to disk while the shard serves
(:meth:`Shard._move_to_disk`), and stays there.

**The journal is the source of truth.** Each accepted record is appended as a frame
(4-byte length, 4-byte CRC-32, the record's msgpack encoding) of the framed log the
delivery journal uses too (:mod:`~porter_mesh.adapters.framedlog`). The pure
:class:`~porter_mesh.core.knowledge.ReplicaState` (version vector, per-origin logs,
digest, tombstones) is rebuilt from it at start-up, using journal offsets as locators, so
a pull or a catch-up is served by reading frames back.

**Write path** (``remember``, ``retract``, ``merge``, and the sync handlers): the batch is
validated by ``ReplicaState.plan`` (a refused batch changes nothing), appended to the
journal with a single ``write``, made durable (see below), and committed to the replica
state; the call returns there. The Oxigraph store is written behind it, in order, by one
background thread (:class:`_Applier`), which joins batches that pile up; each write ends
by moving a *watermark* (the journal offset it reflects, kept in a private named graph
that queries cannot see). Reads (queries, export, stats, the rdflib view) first wait for
the store to catch up, so they see every record committed before them. Small writes go
through a transactional ``load``; large ones through ``bulk_load``, which writes sorted
files directly and keeps memory flat.

**Restart.** The replica state saved at the last close is read back when it matches the
journal (the offset it reflects lies within the journal, and the journal's bytes just
before that offset hash as they did), and the journal is scanned from that offset only;
otherwise (a first start, a crash, a damaged or foreign file) the whole journal is
scanned. Either way a torn last frame, from a crash mid-write, is cut off: it was never
acknowledged. Then every record past the store's watermark (on disk)
or the copy's mark (in memory, see :class:`_IndexCopy`) is applied again. Applying is
idempotent (adding a quad twice or deleting an absent one changes nothing), so a crash
at any point between the journal write and the watermark only means some work is redone.

**Durability policy.** ``Durability.FSYNC`` (the default): ``fdatasync`` the journal
before the call returns -- one per merged batch however large -- so a record the node
reported as stored survives ``kill -9`` and power loss. A ``remember`` writes its frame
under the shard's lock and syncs outside it, so concurrent Remembers share one
``fdatasync`` (group commit: whoever syncs first covers every frame written before it
started); ``remember(durable=False)`` and ``merge(durable=False)`` leave the sync to a
later :meth:`Shard.flush`. A frame written but not yet synced is served to no one
(pulls and catch-ups stop before it). ``Durability.OS``: the ``write`` alone, which
survives the death of the process (the data is in the kernel) but not of the machine.
The benchmark measures both. The store itself is never synced: it is rebuilt from the
journal.

**Signatures.** On a secured mesh the node gives its shard a signer and a verifier
(:meth:`Shard.use_signatures`). The shard signs each record its agent writes, chained to
the agent's previous record (its link is computed from the record held at ``seq - 1``,
which the journal keeps, so a restarted author continues its chain), and proves the
author of every record it is given by anyone before planning the merge, whatever path
brought it (broadcast, pull, catch-up, a relayed listing), with one signature check per
run of one author's consecutive records (:func:`~porter_mesh.core.knowledge.
authenticate`). A record that is not already held (same slot, same content) and whose
signature is missing, made with another key, or by an author without a trusted signing
key, and that no proved successor vouches for, is left out of the batch and reported in
:attr:`MergeReport.refused`; the rest of the batch is merged. A forged record thus never
takes a slot of its claimed author's log, and never makes an honest batch that carries
it conflict. Without a verifier (an unsecured mesh, offline tools) records are taken as
they come, signed or not.

**A full disk.** A journal write that fails or falls short (``ENOSPC``, ``EIO``) is cut
back to the last good frame and raised as :class:`~porter_mesh.errors.StorageError`
(path and free space); the replica state is left as it was, so nothing is reported as
held and a received record is simply missing until a pull or a catch-up brings it again.
The failure is logged once per episode and counted (:attr:`Shard.write_failures`); the
next write tries again, so the shard recovers by itself when space returns.

**Sequence numbers** are assigned from the replica state (one past the highest held for
this agent, which the journal restores), and the record is durable before ``remember``
returns, so no number the mesh has seen is reused after a restart.

**Queries** run on the store directly through :class:`~porter_mesh.adapters.sparql.
QueryEngine`. :attr:`Shard.graph` is an ``rdflib.Graph`` over the same store (oxrdflib),
read-only, whose ``query`` goes through the same guard.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import enum
import functools
import gc
import hashlib
import json
import logging
import os
import pathlib
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

import msgpack
import orjson
import pyoxigraph as ox

from porter_mesh.adapters.dirlock import DirLock
from porter_mesh.adapters.framedlog import (
    DamagedLogError,
    FramedLog,
    Fsync,
    free_bytes,
    fsync_directory,
)
from porter_mesh.adapters.sparql import (
    DEFAULT_DEADLINE,
    DEFAULT_ROW_LIMIT,
    PREFIXES,
    QueryEngine,
    QueryResult,
)
from porter_mesh.core.advert import check_agent_name
from porter_mesh.core.constants import MAX_MESSAGE_BYTES
from porter_mesh.core.knowledge import (
    MAX_RECORDS_PER_MESSAGE,
    OBSERVATION_CLASS,
    P_ABOUT,
    P_CONTEXT,
    P_DISCOVERED_BY,
    P_FINDING,
    P_GENERATED_AT,
    P_SEVERITY,
    RDF_TYPE,
    XSD_DATETIME,
    Body,
    BucketEntries,
    CatchupChunk,
    CatchupRequest,
    Digest,
    MergePlan,
    Observation,
    PullReply,
    PullRequest,
    Record,
    RecordKind,
    ReplicaState,
    Retraction,
    SyncMessage,
    authenticate,
    bulk_allocation,
    encode_record,
    format_timestamp,
    observation_id_from_iri,
    observation_iri,
    record_from_journal,
    record_link,
    record_signing_bytes,
    sign_record,
)
from porter_mesh.core.session.sync import reply_refusal
from porter_mesh.errors import ConfigError, KnowledgeError, StorageError, SyncError

if TYPE_CHECKING:
    import rdflib

__all__ = ["Durability", "Index", "MergeReport", "RefusedRecord", "Shard", "ShardStats",
           "SyncOutcome"]

#: Signs the bytes of a record (``record_signing_bytes``): returns 64 bytes.
SignRecord = Callable[[bytes], bytes]
#: Checks a record's signature: ``(origin, signed bytes, signature or None)`` -> ``None``
#: when good, else the reason it is refused.
VerifyRecord = Callable[[str, bytes, "bytes | None"], "str | None"]

log = logging.getLogger("porter_mesh.shard")

_FORMAT: Final = 1
#: The lock file of a shard's directory (see the layout above), held while it is open.
SHARD_LOCK: Final = "shard.lock"
_MAGIC: Final = b"porter-mesh knowledge journal 1\n"
_MAX_FRAME: Final = 1 << 20
#: Batches with at least this many observations are written with ``bulk_load`` (sorted
#: files written directly: about 35 us of CPU per observation at 4096 per call, but some
#: 25 ms per call); smaller ones with a transactional ``load`` (about 80 us each).
BULK_THRESHOLD: Final = 768
#: Replies stay this far below the message limit (room for the envelope).
_REPLY_BUDGET: Final = MAX_MESSAGE_BYTES - 64 * 1024
_META_GRAPH: Final = ox.NamedNode("urn:porter:shard:meta")
_META_SUBJECT: Final = ox.NamedNode("urn:porter:shard")
_META_WATERMARK: Final = ox.NamedNode("urn:porter:shard:journal-end")
_XSD_INTEGER: Final = ox.NamedNode("http://www.w3.org/2001/XMLSchema#integer")
_XSD_STRING: Final = "http://www.w3.org/2001/XMLSchema#string"
_EXPORT_FORMATS: Final = {
    "turtle": ox.RdfFormat.TURTLE,
    "nt": ox.RdfFormat.N_TRIPLES,
    "jsonld": ox.RdfFormat.JSON_LD,
}


class Durability(enum.Enum):
    """When a write counts as stored (see the module docstring)."""

    FSYNC = "fsync"
    OS = "os"


class Index(enum.Enum):
    """Where the shard keeps its Oxigraph store, the index over the journal."""

    #: In memory, rebuilt from the journal at start (fast; about 2.3 KB per observation).
    MEMORY = "memory"
    #: RocksDB under ``oxigraph/`` (for shards larger than memory; slower to write and
    #: to query).
    DISK = "disk"
    #: In memory while the shard is small; moved to disk, while the shard serves, once
    #: it holds more than ``disk_after`` observations, and on disk from then on (the
    #: default; see :meth:`Shard._move_to_disk`).
    AUTO = "auto"


def _disk_after_default() -> int:
    """``PORTER_MESH_INDEX_DISK_AFTER`` (observations), else :data:`DISK_AFTER`."""
    raw = os.environ.get("PORTER_MESH_INDEX_DISK_AFTER", "")
    if not raw:
        return DISK_AFTER
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"PORTER_MESH_INDEX_DISK_AFTER={raw!r} is not a whole number of "
                          "observations; set it to one (or unset it for "
                          f"{DISK_AFTER})") from None
    if value < 1:
        raise ConfigError(f"PORTER_MESH_INDEX_DISK_AFTER={value} must be at least 1")
    return value


#: Observations (held, not retracted) past which an ``Index.AUTO`` shard moves its index
#: from memory to disk. Up to here the in-memory index costs some 2.2 KB per observation
#: (about 550 MB at this size) and answers the profile query 4 to 6 times faster; past
#: it memory would grow without bound, while the on-disk index costs under 100 B per
#: observation at 1M (docs/knowledge.md, "Memory at 1M").
DISK_AFTER: Final = 250_000
#: The on-disk index is compacted (``Store.optimize``) once this many observations were
#: written to it since the last compaction and writes have paused for
#: :data:`_COMPACT_QUIET` seconds, or once twice as many were written as it held then:
#: RocksDB's files as bulk loads leave them make the profile query 3 to 4 times slower
#: at 1M.
COMPACT_AFTER: Final = 50_000
_COMPACT_QUIET: Final = 1.0


#: Observations per store write while the in-memory index is rebuilt at start: bounds
#: the N-Triples text held at once, however large the journal.
_REPLAY_CHUNK: Final = 16384
#: Observations per bulk load into the copy of the index (see _IndexCopy): 16,384 leave
#: RocksDB files of some 860 B per observation, 32,768 or more some 530 B, in as long.
_COPY_CHUNK: Final = 32768
#: Where the on-disk copy of the in-memory index lives, and where a new one is written
#: before it is renamed into place (see :class:`_IndexCopy`).
_COPY_DIR: Final = "index-copy"
_COPY_TMP: Final = "index-copy.tmp"
#: Where the on-disk index lives, and where an index moving to disk is built first.
_DISK_DIR: Final = "oxigraph"
_DISK_TMP: Final = "oxigraph.tmp"
#: An index moving to disk catches up with what the shard wrote while it was built,
#: without the shard's lock, in at most this many rounds of at most this many bytes of
#: journal each (about a second of on-disk writes): writes keep going to the in-memory
#: index meanwhile, so rounds that did not shrink would only let it grow. What is left
#: then is applied by the store thread once the on-disk index answers, reads waiting
#: for it and writers held to its pace (the store thread's bound), as with any batch.
_MOVE_ROUNDS: Final = 3
_MOVE_ROUND_BYTES: Final = 4 << 20
#: The copy's mark: ``"<journal offset> <hash of the journal's bytes before it>"``.
_META_COPY_OF: Final = ox.NamedNode("urn:porter:shard:copy-of-journal")
#: Journal bytes hashed into the mark: enough to take in the length and CRC-32 of some
#: frames (records of one shape end alike; their checksums and ids differ).
_TAIL_BYTES: Final = 4096
#: The replica state saved at close (see Restart): the magic, a BLAKE2b-256 of the body,
#: and the body, msgpack ``[journal offset, hash of the journal's bytes before it,
#: ReplicaState.snapshot()]``.
_STATE_FILE: Final = "replica-state"
_STATE_MAGIC: Final = b"porter-mesh replica state 1\n"
#: A copy is written at close only for a journal at least this large: below it the
#: index loads from the journal in some 0.1 s, about what opening a copy costs.
COPY_MIN_JOURNAL_BYTES: Final = 1 << 20
#: A copy further behind its journal than this share of the journal is not used: the
#: records past it would take longer to apply to it (on disk) than loading the whole
#: journal into memory.
_COPY_MAX_BEHIND: Final = 0.25


@dataclass(frozen=True, slots=True)
class RefusedRecord:
    """A record left out of a merge because its signature did not prove its author.

    Attributes:
        origin: the author it claims.
        seq: the place it claims in that author's log.
        reason: ``unsigned``, ``unknown-signer`` or ``bad-signature``.
    """

    origin: str
    seq: int
    reason: str


@dataclass(frozen=True, slots=True)
class MergeReport:
    """What one merge did.

    Attributes:
        accepted: new records stored.
        duplicates: records already held (ignored).
        added: observations added to the graph.
        removed: observations retracted from the graph.
        refused: records left out for a missing or bad signature (only when the shard
            checks signatures).
    """

    accepted: int
    duplicates: int
    added: int
    removed: int
    refused: tuple[RefusedRecord, ...] = ()


@dataclass(frozen=True, slots=True)
class SyncOutcome:
    """The result of handling one sync message.

    Attributes:
        replies: messages to send back to the peer that sent it (pull requests, a pull
            reply, the next catch-up request, a bucket listing...).
        merged: what merging its records did, when it carried records.
        progress: ``(done, total)`` of a catch-up, when the message was a chunk.
        finished: ``True`` when a catch-up chunk was the last one.
    """

    replies: tuple[SyncMessage, ...] = ()
    merged: MergeReport | None = None
    progress: tuple[int, int] | None = None
    finished: bool = False


@dataclass(frozen=True, slots=True)
class ShardStats:
    """A summary of a shard (``porter-mesh kg stats``).

    Attributes:
        observations: observations in the graph now (held and not retracted).
        observation_records: observation records held (including retracted ones).
        retractions: retraction records held.
        version_vector: per origin, the highest seq held with no gap before it.
        digest: the anti-entropy digest's top hash, hex.
        journal_bytes: size of the journal file.
        data_dir: where the shard lives.
        write_failures: journal writes that failed (a full disk...) since it was opened.
        index: where the index is: ``"memory"`` or ``"disk"``.
        compactions: compactions of the on-disk index since the shard was opened.
    """

    observations: int
    observation_records: int
    retractions: int
    version_vector: dict[str, int]
    digest: str
    journal_bytes: int
    data_dir: str
    write_failures: int = 0
    index: str = "memory"
    compactions: int = 0


# --- journal ----------------------------------------------------------------------------


class _Journal:
    """The shard's record log: a :class:`~porter_mesh.adapters.framedlog.FramedLog` under
    the knowledge journal's magic, with the shard's errors and its group commit.

    ``append`` writes (under the shard's lock); ``sync_to`` makes the file durable up to
    an offset and may run on any thread, outside that lock. Callers that wait for the
    same ``fdatasync`` share it (see :meth:`FramedLog.sync_to`).
    """

    def __init__(self, path: pathlib.Path, *, fsync: bool) -> None:
        self.path = path
        if path.exists():
            with open(path, "rb") as fh:
                head = fh.read(len(_MAGIC))
            if head != _MAGIC:
                raise KnowledgeError(
                    f"{path} is not a porter-mesh knowledge journal; move it aside or "
                    "point --data-dir elsewhere"
                )
        self._log = FramedLog(
            path, header=_MAGIC, fsync=Fsync.GROUP if fsync else Fsync.NONE,
            max_frame=_MAX_FRAME, what="knowledge journal",
            advice="free some space on that file system and write it again (the node "
                   "retries by itself for records from its peers)")
        # Whether the last append failed: its failure is logged once per episode.
        self._failing = False

    @property
    def end(self) -> int:
        """The offset after the last whole frame."""
        return self._log.end

    @property
    def synced(self) -> int:
        """The journal is durable up to here (== ``end`` when nothing waits for a sync)."""
        return self._log.synced

    @property
    def syncs(self) -> int:
        """fdatasync calls made (the benchmark and tests count group commits with it)."""
        return self._log.syncs

    @property
    def failures(self) -> int:
        """Failed appends and syncs since the journal was opened."""
        return self._log.failures

    def scan(self, until: int | None = None, *,
             start: int | None = None) -> Iterator[tuple[int, bytes]]:
        """Yield ``(offset, payload)`` of every intact frame; cut a torn tail.

        Args:
            until: read only the frames before this offset (one this journal reached),
                and change nothing: safe while other threads append.
            start: the offset of a frame to begin at (the first frame by default).

        Raises:
            KnowledgeError: a frame before the end is damaged.
        """
        try:
            yield from self._log.replay(start, until=until)
        except DamagedLogError as exc:
            raise KnowledgeError(
                f"{self.path} is damaged at byte {exc.damage.offset} (checksum mismatch "
                "before the end); move the data directory aside and let the node catch up "
                "from its peers"
            ) from None

    def append(self, payloads: Sequence[bytes], *, sync: bool = True) -> list[int]:
        """Append frames with one write; their offsets.

        Args:
            payloads: the records' encodings.
            sync: under FSYNC, also make them durable before returning (else the caller
                calls :meth:`sync_to` later, outside the shard's lock).

        Raises:
            StorageError: the write failed; the file is cut back to its last good frame.
        """
        for payload in payloads:
            if len(payload) > _MAX_FRAME:
                raise KnowledgeError(f"a record of {len(payload)} bytes is too large to store")
        try:
            offsets = self._log.append(payloads, sync=False)
        except StorageError as exc:
            if not self._failing:
                self._failing = True
                log.error("knowledge journal %s: write failed (%s); %s bytes free on its file "
                          "system; nothing was stored, and the shard retries with its next "
                          "write", self.path,
                          os.strerror(exc.errno) if exc.errno is not None else exc,
                          exc.free_bytes)
            raise
        if self._failing:
            self._failing = False
            log.warning("knowledge journal %s: writing again (%s bytes free)", self.path,
                        free_bytes(self.path.parent))
        if sync:
            self._log.sync_to(self._log.end)
        return offsets

    def sync_to(self, end: int) -> None:
        """Return once the journal is durable up to ``end`` (one shared fdatasync).

        Raises:
            StorageError: the fdatasync failed: what it covers is not known to be on disk.
        """
        self._log.sync_to(end)

    def tail_hash(self, end: int) -> str:
        """A hash of the bytes just before ``end``: it tells whether a copy of the index
        made from this journal up to ``end`` was made from this journal (see
        :class:`_IndexCopy`)."""
        start = max(len(_MAGIC), end - _TAIL_BYTES)
        return hashlib.blake2b(os.pread(self._log.fd, end - start, start),
                               digest_size=16).hexdigest()

    def read(self, offset: int) -> bytes:
        """The payload of the frame at ``offset``."""
        try:
            return self._log.read(offset)
        except DamagedLogError:
            raise KnowledgeError(f"{self.path}: frame at {offset} is damaged") from None

    def close(self) -> None:
        self._log.close()


# --- RDF text -----------------------------------------------------------------------------


_T_TYPE: Final = f"> <{RDF_TYPE}> <{OBSERVATION_CLASS}> .\n".encode()
_T_ABOUT: Final = f"> <{P_ABOUT}> ".encode()
_T_FINDING: Final = f"> <{P_FINDING}> ".encode()
_T_BY: Final = f"> <{P_DISCOVERED_BY}> ".encode()
_T_AT: Final = f"> <{P_GENERATED_AT}> \"".encode()
_T_AT_END: Final = f"\"^^<{XSD_DATETIME}> .\n".encode()
_T_CONTEXT: Final = f"> <{P_CONTEXT}> ".encode()
_T_SEVERITY: Final = f"> <{P_SEVERITY}> ".encode()
_T_END: Final = b" .\n"


def _ntriples(observations: Iterable[Observation]) -> bytes:
    """N-Triples for observations, the text Oxigraph loads fastest.

    String literals are written with orjson: JSON string escapes (quote, backslash,
    control characters as ``\\uXXXX`` or ``\\n``...) are valid N-Triples escapes, and
    orjson writes them twenty times faster than ``str.translate``.
    """
    out: list[bytes] = []
    add = out.append
    for obs in observations:
        _render(add, obs.iri, obs.about, obs.finding, obs.discovered_by, obs.generated_at,
                obs.context, obs.severity)
    return b"".join(out)


def _render(
    add: Callable[[bytes], None], iri: str, about: str, finding: str, by: str, at: str,
    context: str | None, severity: str | None,
) -> None:
    """Pass the N-Triples lines of one observation to ``add`` (see :func:`_ntriples`).

    One ``join`` per observation: the store thread runs this for every observation,
    holding the GIL, and joining each line by concatenation made three short-lived
    bytes objects per line.
    """
    s = b"<" + iri.encode()
    dumps = orjson.dumps
    parts = [s, _T_TYPE, s, _T_ABOUT, dumps(about), _T_END, s, _T_FINDING, dumps(finding),
             _T_END, s, _T_BY, dumps(by), _T_END, s, _T_AT, at.encode(), _T_AT_END]
    if context is not None:
        parts += (s, _T_CONTEXT, dumps(context), _T_END)
    if severity is not None:
        parts += (s, _T_SEVERITY, dumps(severity), _T_END)
    add(b"".join(parts))


def _find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or ``None`` where there is no such thing."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim: Callable[[int], int] | None = getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None
    return trim


# Oxigraph's bulk loader sorts a batch in buffers spread over its worker threads'
# allocator arenas; once the batch is written those pages are free but stay resident
# unless handed back. After each bulk write the shard hands them back, so a node's
# memory after a catch-up reflects what it holds, not the high-water mark of loading it.
# The in-memory index's loads leave the same kind of free pages behind (the text and
# its parse); they are handed back after each large load too (a call costs some 60 us
# with 100k observations held).
_MALLOC_TRIM: Final = _find_malloc_trim()


def _watermark_quad(end: int) -> ox.Quad:
    return ox.Quad(_META_SUBJECT, _META_WATERMARK, ox.Literal(str(end), datatype=_XSD_INTEGER),
                   _META_GRAPH)


# --- the store applier ------------------------------------------------------------------------


class _Applier:
    """Applies committed batches to the store, in order, on one background thread.

    The journal write (the durable part) stays on the caller's thread; handing the store
    write to this thread lets the next batch be decoded and validated while Oxigraph
    (which releases the GIL) indexes the previous one, and lets batches that pile up be
    written together. Readers call :meth:`drain` first, so a query always sees every
    record committed before it (and waits for no batch committed after it began: under
    a steady stream of writes the queue is never empty, and a read must not wait for
    the stream to stop). At most ``max_pending`` observations wait (beyond one
    batch, which is always accepted): that bounds memory -- a deeper queue measurably
    raises what the process keeps resident afterwards -- and makes a fast sender wait
    for the store.
    """

    def __init__(
        self, write: Callable[[_StoreTask], None], *, max_pending: int = 16384,
        max_join: int = 32768, recover: Callable[[], None] | None = None,
        on_stop: Callable[[], None] | None = None,
    ) -> None:
        self._write = write
        self._recover = recover
        self._on_stop = on_stop
        # The thread has ended: a task submitted now is dropped (nobody would apply it,
        # and a drain would wait for it forever; see _IndexCopy).
        self._done = False
        self._max_pending = max_pending
        self._max_join = max_join
        self._pending = 0
        self._queue: collections.deque[_StoreTask] = collections.deque()
        self._cond = threading.Condition()
        # Batches submitted, and those settled: written, or dropped after a failure
        # (the journal holds them, and recovery applies them from there).
        self._submitted = 0
        self._settled = 0
        self._stopping = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="porter-shard-store",
                                        daemon=True)
        self._thread.start()

    def submit(self, task: _StoreTask) -> None:
        with self._cond:
            if self._done:
                return
            if self._error is not None:
                if self._recover is not None:
                    return  # the store is rebuilt from the journal, which holds this batch
                self._raise_error()
            while self._queue and self._pending + task.weight > self._max_pending:
                self._cond.wait()
            self._queue.append(task)
            self._submitted += 1
            self._pending += task.weight
            self._cond.notify_all()

    def drain(self, recovery_timeout: float = 0.0) -> None:
        """Wait until every batch submitted before this call is in the store.

        Args:
            recovery_timeout: how long to wait for a failed store to be recovered (never
                wait for that while holding the shard's lock: recovery needs it).

        Raises:
            KnowledgeError: the store failed (and, if it can, is being recovered).
        """
        deadline = time.monotonic() + recovery_timeout
        with self._cond:
            target = self._submitted
            while self._settled < target and (
                    self._error is None or time.monotonic() < deadline):
                self._cond.wait(None if self._error is None
                                else max(0.0, deadline - time.monotonic()))
            self._raise_error()

    def _raise_error(self) -> None:
        if self._error is not None:
            then = ("the shard reopens the store and applies them again by itself once it "
                    "can write (a full disk: free some space)" if self._recover is not None
                    else "they are applied again when the shard is reopened")
            raise KnowledgeError(f"{self._error}; the records are safe in the journal, and "
                                 f"{then}")

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    self._done = True
                    break
                task = self._queue.popleft()
                joined = 1
                self._pending -= task.weight
                # Join what else is waiting: Oxigraph's bulk load costs about 25 ms per
                # call on top of its per-triple cost, so fewer, larger writes keep up
                # better when batches arrive faster than the store takes them.
                while (self._queue and task.joinable and self._queue[0].joinable
                       and task.weight + self._queue[0].weight <= self._max_join):
                    more = self._queue.popleft()
                    joined += 1
                    self._pending -= more.weight
                    task = _StoreTask([*task.add, *more.add], [*task.remove, *more.remove],
                                      more.new_mark, task.old_marks, task.text + more.text,
                                      task.rendered + more.rendered)
                self._cond.notify_all()  # room for the writers that wait in submit
            failed = False
            try:
                if self._error is None:
                    self._write(task)
            except Exception as exc:  # kept (as text) and raised to the next caller
                # Only the words, here and in the log: the exception's frames would keep
                # the failed store object alive (a log handler may keep its records), and
                # with it RocksDB's lock on the directory, so it could not be reopened.
                text = str(exc)
                log.error("shard store write failed: %s", text)
                failed = True
                with self._cond:
                    self._error = KnowledgeError(text)
                    # What waits is in the journal: recovery applies it from there.
                    self._settled += len(self._queue)
                    self._queue.clear()
                    self._pending = 0
                    self._cond.notify_all()
            del task
            if failed:
                self._heal()
            with self._cond:
                self._settled += joined
                self._cond.notify_all()
        if self._on_stop is not None:
            self._on_stop()

    def _heal(self) -> None:
        """Retry ``recover`` with a growing pause until it works or the shard closes.

        RocksDB refuses every write after one failed (a full disk, say) until the store
        is opened again, so waiting for space alone does not help.
        """
        if self._recover is None:
            return
        delay = 0.25
        while True:
            with self._cond:
                if not self._stopping:
                    self._cond.wait(delay)  # close() wakes it at once
                if self._stopping:
                    return
            try:
                self._recover()
            except Exception as exc:
                log.debug("shard store not recovered yet: %s", str(exc))
                delay = min(delay * 2, 5.0)
                continue
            with self._cond:
                self._error = None
                self._cond.notify_all()
            log.warning("shard store recovered: the records kept in the journal meanwhile "
                        "are in the store again")
            return

    def retire(self) -> None:
        """Apply what is queued, then end the thread (without waiting for it)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()

    def close(self) -> None:
        self.retire()
        self._thread.join()


@dataclass(frozen=True, slots=True)
class _StoreTask:
    add: Sequence[Observation]
    remove: Sequence[bytes]
    new_mark: int
    old_marks: Sequence[int]
    #: N-Triples of more observations, already written (the rebuild at start).
    text: bytes = b""
    #: How many observations ``text`` holds.
    rendered: int = 0
    #: Rebuild the in-memory index from the journal's frames before this offset.
    rebuild_until: int = 0
    #: ... starting at this frame (a copy of the index brought up to date; 0: the first).
    rebuild_from: int = 0
    #: On disk: apply the journal's frames from this offset up to ``new_mark`` (what the
    #: index moved to disk still lacks when it starts to answer; see _move_to_disk).
    catch_up_from: int = 0

    @property
    def joinable(self) -> bool:
        """Whether the applier may join it with the batches around it."""
        return not (self.rebuild_until or self.catch_up_from)

    @property
    def weight(self) -> int:
        """Observations this task adds (what the applier's queue bound counts)."""
        return len(self.add) + self.rendered


def _write_rdf(store: ox.Store, task: _StoreTask) -> None:
    """Write a task's observations and removals to an on-disk store (no watermark).

    Raises:
        OSError: the store failed (a full disk...).
        SyntaxError: Oxigraph refused the text.
    """
    text = task.text + _ntriples(task.add) if task.add else task.text
    if text:
        if task.weight >= BULK_THRESHOLD:
            store.bulk_load(text, format=ox.RdfFormat.N_TRIPLES, lenient=True)
            if _MALLOC_TRIM is not None:
                _MALLOC_TRIM(0)
        else:
            store.load(text, format=ox.RdfFormat.N_TRIPLES, lenient=True)
    _remove_observations(store, task.remove)


def _remove_observations(store: ox.Store, targets: Sequence[bytes]) -> None:
    for start in range(0, len(targets), 256):
        store.update(";\n".join(
            f"DELETE WHERE {{ <{observation_iri(t)}> ?p ?o }}"
            for t in targets[start:start + 256]
        ))


def _copy_marks(store: ox.Store) -> list[tuple[int, str, ox.Quad]]:
    """The marks of a copy of the index: ``(journal offset, tail hash, quad)``."""
    out = []
    for quad in store.quads_for_pattern(_META_SUBJECT, _META_COPY_OF, None, _META_GRAPH):
        if not isinstance(quad.object, ox.Literal):
            continue
        end, _, tail = quad.object.value.partition(" ")
        if end.isdigit() and tail:
            out.append((int(end), tail, quad))
    return out


def _mark_copy(store: ox.Store, end: int, tail: str) -> None:
    """Record that the copy reflects the journal up to ``end``: the new mark first, then
    the old ones removed (a crash in between leaves both; the higher one is true)."""
    old = _copy_marks(store)
    store.add(ox.Quad(_META_SUBJECT, _META_COPY_OF, ox.Literal(f"{end} {tail}"), _META_GRAPH))
    for old_end, old_tail, quad in old:
        if (old_end, old_tail) != (end, tail):
            store.remove(quad)


class _Compactor:
    """Compacts the on-disk index after large loads, on a thread of its own.

    Bulk loads leave RocksDB with many overlapping files, which every lookup has to
    visit: at 1M observations the profile query's p50 is 2.3 to 3.7 ms as merged and
    0.8 ms once compacted. A compaction runs once :data:`COMPACT_AFTER` observations
    were written since the last one and writes have paused for :data:`_COMPACT_QUIET`
    seconds (the end of a catch-up, a bulk merge), or at once when twice as many were
    written as it held then (so a store written without pause is still compacted). The
    store takes writes and answers queries meanwhile (RocksDB compacts in the
    background of its own writes; pyoxigraph lets go of the GIL).
    """

    def __init__(self, store: Callable[[], ox.Store], held: int, label: str,
                 written: int = 0) -> None:
        self._store = store
        self._label = label
        self._cond = threading.Condition()
        self._held = held  # observations in the store at the last compaction
        self._written = written  # ... written since
        self._last_write = time.monotonic()
        self._running = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        #: Compactions finished.
        self.compactions = 0
        with self._cond:
            self._kick()

    def wrote(self, n: int) -> None:
        """Count observations just written to the store (on the store's thread)."""
        with self._cond:
            self._written += n
            self._last_write = time.monotonic()
            self._kick()

    def _kick(self) -> None:
        """Wake the thread (started the first time) when a compaction may be due."""
        if self._written >= COMPACT_AFTER:
            if self._thread is None and not self._stopping:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="porter-shard-compact")
                self._thread.start()
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping:
                    if self._written >= COMPACT_AFTER:
                        quiet = self._last_write + _COMPACT_QUIET - time.monotonic()
                        if quiet <= 0 or self._written >= max(2 * self._held,
                                                              4 * COMPACT_AFTER):
                            break
                        self._cond.wait(quiet)
                    else:
                        self._cond.wait()
                if self._stopping:
                    return
                written, self._written = self._written, 0
                self._running = True
            started = time.monotonic()
            try:
                self._store().optimize()
            except (OSError, RuntimeError) as exc:
                log.warning("shard %s: compacting the index on disk failed (%s); queries "
                            "stay slower until the next compaction", self._label, str(exc))
            else:
                log.info("shard %s: compacted the index on disk after %d observations "
                         "were written to it (%.1f s)", self._label, written,
                         time.monotonic() - started)
            with self._cond:
                self._running = False
                self._held += written
                self.compactions += 1
                self._cond.notify_all()

    def wait_idle(self, timeout: float | None) -> bool:
        """Wait until no compaction is due or running; whether that happened in time."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._stopping or not (self._running
                                               or self._written >= COMPACT_AFTER), timeout)

    def close(self) -> None:
        """Stop: a compaction under way is finished first (RocksDB cannot cut one short)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()


#: Most seconds the in-memory index's load waits for the copy of the index to open.
_COPY_OPEN_WAIT = 5.0


class _Opening:
    """A RocksDB store opening on a thread of its own while the shard reads its journal
    (pyoxigraph lets go of the interpreter's lock while RocksDB opens its files)."""

    def __init__(self, path: pathlib.Path) -> None:
        self.store: ox.Store | None = None
        self.error: Exception | None = None
        self._thread = threading.Thread(target=self._open, args=(path,), daemon=True,
                                        name="shard-copy-open")
        self._thread.start()

    def _open(self, path: pathlib.Path) -> None:
        try:
            self.store = ox.Store(str(path))
        except (OSError, ValueError, RuntimeError) as exc:  # RocksDB: "Corruption: ..."
            self.error = exc

    def result(self) -> ox.Store:
        """The store once open (hand it on: this object lets go of it).

        Raises:
            OSError, ValueError, RuntimeError: it could not be opened.
        """
        self._thread.join()
        store, self.store = self.store, None
        if self.error is not None:
            raise self.error
        assert store is not None
        return store

    def drop(self) -> None:
        """Let the store go unused (its RocksDB lock goes with the last reference)."""
        self._thread.join()
        self.store = None
        gc.collect()


class _IndexCopy:
    """The on-disk copy of the in-memory index, which answers queries after a restart.

    Loading 100k observations into an in-memory store takes 1.5 to 2 s whatever they are
    loaded from, while a RocksDB store opens in a few tens of milliseconds. So a shard
    with ``Index.MEMORY`` keeps a RocksDB copy of its index in ``index-copy/``, with a
    *mark*: the journal offset it reflects and a hash of the journal's bytes just before
    it. Life cycle:

    * **close** brings the copy up to date with the journal (the records past its mark,
      applied in place: idempotent, and the mark moves last, so a crash midway only
      means the work is redone), or, when there is none, writes a new one under
      ``index-copy.tmp/`` and renames it into place (a crash midway leaves the
      temporary directory, removed at the next start). It is never written per merge.
    * **open** checks the mark against the journal: at or before the journal's end,
      the same bytes before it, and not too far behind. That runs on the copy's own
      thread (this object's applier), so the shard serves the mesh without waiting for
      it, and reads wait for it. Then the copy answers queries; its thread first
      applies the records past the mark, then every batch committed meanwhile, in
      order, while the shard's store thread loads the in-memory index from the
      journal. A copy that does not match, cannot be opened or is missing means the old
      path (queries wait for the load), said in the log, and a matching copy too far
      behind is not used either.
    * **switch**: once the in-memory index has loaded, it answers queries (with every
      batch committed meanwhile queued behind the load), the copy's thread applies what
      it still holds queued and ends, and the copy is closed.

    A query reads whichever index answers when it starts, after that index's thread has
    applied every batch committed before: so it sees every acknowledged record.
    """

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        #: Set by its thread once it is opened and its mark checked, and ``None`` again
        #: once its thread has ended (the RocksDB files are let go).
        self.store: ox.Store | None = None
        #: Its thread has tried to open it (``failed`` says whether that worked).
        self.opened = threading.Event()
        #: A write to it failed: it answers nothing more, and close writes a new one.
        self.failed = False
        #: Writes applied (the isolated queries' checkpoint of it is reused until then).
        self.generation = 0
        self.applier: _Applier | None = None
        #: Its store, opening since before the journal was read (None: opened by its
        #: thread).
        self.early: _Opening | None = None

    def release(self) -> None:
        self.store = None


# --- the shard ------------------------------------------------------------------------------


class Shard:
    """A durable replica of the knowledge graph in a data directory.

    Thread-safe: writes are serialised by an internal lock, queries may run concurrently.
    One process at a time may open a data directory (a file lock enforces it).

    Args:
        data_dir: the directory (created if missing).
        agent: the agent that owns this replica and writes its records; may be ``None``
            for tools that only read and merge (``remember``/``retract`` then refuse).
        durability: when a write counts as stored (see the module docstring).
        create: create the shard if the directory holds none (else raise).
        index: where the Oxigraph store lives (see the module docstring).
        disk_after: with ``Index.AUTO``, the observations held past which the index
            moves to disk (default: ``PORTER_MESH_INDEX_DISK_AFTER``, else
            :data:`DISK_AFTER`).

    Raises:
        ConfigError: the agent name is invalid, or the directory belongs to another agent.
        KnowledgeError: the directory is in use by another process, or damaged.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        agent: str | None = None,
        durability: Durability = Durability.FSYNC,
        create: bool = True,
        index: Index = Index.AUTO,
        disk_after: int | None = None,
    ) -> None:
        self.data_dir = pathlib.Path(data_dir)
        #: Where the index is now: ``Index.MEMORY`` or ``Index.DISK`` (an ``Index.AUTO``
        #: shard starts with one of them and may move from memory to disk).
        self.index: Index = Index.MEMORY if index is Index.AUTO else index
        self.auto_index = index is Index.AUTO
        self._disk_after = _disk_after_default() if disk_after is None else disk_after
        #: The index moves to disk once this many observations are held (raised after a
        #: move that failed, so that it is tried again later rather than at every write).
        self._move_at = self._disk_after
        self._mover: threading.Thread | None = None
        self._mover_lock = threading.Lock()
        self._compactor: _Compactor | None = None
        if agent is not None:
            check_agent_name(agent)
        self._lock = threading.RLock()
        self._closed = True
        meta_path = self.data_dir / "shard.json"
        if not meta_path.exists():
            if not create:
                raise KnowledgeError(
                    f"no knowledge shard in {self.data_dir}; check --data-dir (a node creates "
                    "its shard when it first starts)"
                )
            self.data_dir.mkdir(parents=True, exist_ok=True)
        self._dir_lock = DirLock(self.data_dir, filename=SHARD_LOCK,
                                 what="the knowledge shard in", error=KnowledgeError)
        journal: _Journal | None = None
        try:
            self.agent = self._check_meta(meta_path, agent)
            self._journal = journal = _Journal(self.data_dir / "knowledge.journal",
                                               fsync=durability is Durability.FSYNC)
            self._state = ReplicaState()
            self._store = ox.Store()  # the index's store, opened once the journal is read
            self._generation = 0
            self._checkpoint_gen: tuple[bool, int] = (False, -1)
            self._checkpoint_dir: pathlib.Path | None = None
            self._sign: SignRecord | None = None
            self._verify: VerifyRecord | None = None
            self._last_link: tuple[int, bytes] | None = None  # (seq, link) of our last
            # The copy of the in-memory index kept on disk (see _IndexCopy): the one
            # opened at start, and while it answers queries (until the index has loaded).
            self._copy: _IndexCopy | None = None
            self._reading_copy: _IndexCopy | None = None
            self._loaded = threading.Event()  # the in-memory index holds the journal
            self._closing = False  # close() stops a load still running
            self._opened_at = time.monotonic()
            self._applier = _Applier(self._write_store, recover=self._reopen_store)
            # The copy of an in-memory index opens while the journal is read: both take
            # tens of milliseconds at 100k observations, and queries wait for both.
            copy_path = self.data_dir / _COPY_DIR
            self._early_copy = (_Opening(copy_path) if index is not Index.DISK
                                and copy_path.exists() else None)
            try:
                start = self._restore_state()
                for _ in self._load_journal(rebuild=False, start=start):
                    pass  # the replica state only: the shard can serve the mesh now
                if self.auto_index:
                    self.index = self._choose_index()
                self._store = self._open_store()
                if self.index is Index.DISK:
                    self._discard_copy("the shard uses the on-disk index")
                    self._compactor = _Compactor(lambda: self._store, self._held(),
                                                 str(self.data_dir))
                    self._replay()
                elif self._journal.end > len(_MAGIC):
                    # The index is rebuilt by the store thread, reading the journal up
                    # to here again; meanwhile queries are answered from the copy on
                    # disk, or wait for it (they drain the store thread).
                    self._copy = self._reading_copy = self._open_copy()
                    self._applier.submit(_StoreTask((), (), 0, (),
                                                    rebuild_until=self._journal.end))
                else:
                    self._discard_copy("the journal is empty")
                if self.index is Index.DISK or self._journal.end == len(_MAGIC):
                    self._loaded.set()
            except BaseException:
                self._closing = True
                self._drop_early_copy()
                self._applier.close()
                if self._compactor is not None:
                    self._compactor.close()
                if self._copy is not None:
                    assert self._copy.applier is not None
                    self._copy.applier.close()
                raise
            self._engine = QueryEngine(self._store, checkpoint=self._checkpoint)
            self._graph: rdflib.Graph | None = None
        except BaseException:
            if journal is not None:
                journal.close()
            self._dir_lock.release()
            raise
        self._closed = False

    # -- opening --

    def _check_meta(self, meta_path: pathlib.Path, agent: str | None) -> str | None:
        if meta_path.exists():
            try:
                meta = json.loads(meta_path.read_text())
                stored = meta.get("agent")
                version = meta["format"]
            except (ValueError, KeyError, AttributeError):
                raise KnowledgeError(f"{meta_path} is damaged; restore it or move the "
                                     "directory aside") from None
            if version != _FORMAT:
                raise KnowledgeError(f"{meta_path}: shard format {version} is not supported "
                                     f"(this version reads {_FORMAT})")
            if agent is not None and stored is not None and stored != agent:
                raise ConfigError(
                    f"the shard in {self.data_dir} belongs to agent {stored!r}, not {agent!r}: "
                    "each agent needs its own data directory"
                )
            if stored is None and agent is not None:
                self._write_meta(meta_path, agent)
            return agent if agent is not None else stored
        self._write_meta(meta_path, agent)
        return agent

    def _write_meta(self, meta_path: pathlib.Path, agent: str | None) -> None:
        tmp = meta_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"format": _FORMAT, "agent": agent}) + "\n")
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, meta_path)
        fsync_directory(self.data_dir)

    def _load_journal(self, *, rebuild: bool, load_state: bool = True,
                      until: int | None = None, start: int | None = None,
                      chunk: int = _REPLAY_CHUNK) -> Iterator[_StoreTask]:
        """Read the journal: rebuild the replica state, and with ``rebuild`` the store.

        The in-memory store is rebuilt in the same pass: each observation's N-Triples are
        written from the decoded frame and yielded in chunks, which the caller hands to
        the store thread, so the store indexes one chunk (Oxigraph releases the GIL)
        while the next is read. Retracted observations are loaded and removed at the end
        (a retraction may come long after its observation).

        Args:
            rebuild: yield store tasks that write every observation of the journal.
            load_state: rebuild the replica state too (only at opening).
            until: read only the frames before this offset (see ``_Journal.scan``).
            start: begin at this frame (a copy of the index brought up to date): an
                observation retracted earlier is then left out (its retraction, outside
                the range, is not there to remove it).
            chunk: observations per store task.
        """
        load, unpack = self._state.load, msgpack.unpackb
        retracted = self._state.is_retracted
        obs_kind, ret_kind = RecordKind.OBSERVATION, RecordKind.RETRACTION
        parts: list[bytes] = []
        rendered = 0
        targets: list[bytes] = []
        for offset, payload in self._journal.scan(until, start=start):
            item = unpack(payload, raw=False)
            if item[0] == obs_kind:
                if load_state:
                    load(item[1], item[2], item[3][:16], obs_kind, None, offset)
                if rebuild and (start is None or not retracted(item[3])):
                    # [0, origin, seq, id, about, finding, generatedAt, context, severity]
                    _render(parts.append, observation_iri(item[3]), item[4], item[5],
                            item[1], item[6], item[7], item[8])
                    rendered += 1
                    if rendered == chunk:
                        yield _StoreTask((), (), 0, (), b"".join(parts), rendered)
                        parts, rendered = [], 0
            else:
                if load_state:
                    load(item[1], item[2], item[3][:16], ret_kind, item[4], offset)
                targets.append(item[4])
        if rebuild and (parts or targets):
            yield _StoreTask((), targets, 0, (), b"".join(parts), rendered)

    def _restore_state(self) -> int | None:
        """Read back the replica state saved at the last close, if it matches the
        journal: the journal offset it reflects (scan from there), else ``None`` (scan
        the whole journal; the log says why)."""
        try:
            data = (self.data_dir / _STATE_FILE).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            found: tuple[int, ReplicaState] | str = f"it cannot be read ({exc.strerror})"
        else:
            found = self._saved_state(data)
        if isinstance(found, str):
            log.warning("shard %s: the replica state saved at the last close is not used: "
                        "%s; the whole journal is read instead", self.data_dir, found)
            return None
        mark, self._state = found
        log.info("shard %s: the replica state saved at the last close is read back; the %d "
                 "bytes of journal past it are read", self.data_dir, self._journal.end - mark)
        return mark

    def _saved_state(self, data: bytes) -> tuple[int, ReplicaState] | str:
        """The journal offset and the replica state of a saved state file, or why it
        cannot stand for this journal."""
        head, digest = len(_STATE_MAGIC), len(_STATE_MAGIC) + 32
        body = data[digest:]
        if (data[:head] != _STATE_MAGIC
                or hashlib.blake2b(body, digest_size=32).digest() != data[head:digest]):
            return "it is damaged (its checksum does not match)"
        try:
            mark, tail, snapshot = msgpack.unpackb(body, raw=False)
            end = self._journal.end
            if not isinstance(mark, int) or not len(_MAGIC) <= mark <= end:
                return f"it reflects {mark} bytes of journal, and the journal holds {end}"
            if self._journal.tail_hash(mark) != tail:
                return "it was saved from another journal"
            return mark, ReplicaState.restore(snapshot)
        except (ValueError, TypeError, KnowledgeError) as exc:
            return f"it cannot be read ({exc})"

    def _save_state(self) -> None:
        """Save the replica state beside the journal (at close), so that the next start
        reads only the journal written after it. Skipped after a failed journal write or
        sync (the journal may then hold frames the state does not), and a failure here
        only means the next start reads the whole journal."""
        path = self.data_dir / _STATE_FILE
        tmp = path.with_name(_STATE_FILE + ".tmp")
        try:
            end = self._journal.end
            if self._journal.failures or end <= len(_MAGIC):
                path.unlink(missing_ok=True)
                return
            self._journal.sync_to(end)
            body = msgpack.packb([end, self._journal.tail_hash(end), self._state.snapshot()],
                                 use_bin_type=True)
            tmp.write_bytes(_STATE_MAGIC + hashlib.blake2b(body, digest_size=32).digest() + body)
            os.replace(tmp, path)
        except (OSError, StorageError) as exc:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            log.warning("shard %s: the replica state was not saved (%s); the next start "
                        "reads the whole journal", self.data_dir, exc)

    def _open_store(self) -> ox.Store:
        """A store for the index kind: empty in memory, or the RocksDB one on disk."""
        if self.index is Index.MEMORY:
            return ox.Store()
        try:
            return ox.Store(str(self.data_dir / _DISK_DIR))
        except OSError as exc:
            raise KnowledgeError(
                f"cannot open the Oxigraph store in {self.data_dir / _DISK_DIR}: {exc}; "
                "it is rebuilt from the journal if you move it aside"
            ) from None

    # -- the copy of the in-memory index (see _IndexCopy) --

    def _drop_early_copy(self) -> None:
        early, self._early_copy = self._early_copy, None
        if early is not None:
            early.drop()

    def _discard_copy(self, why: str) -> None:
        """Remove a copy of the in-memory index, and an unfinished one, if any."""
        self._drop_early_copy()
        for name in (_COPY_DIR, _COPY_TMP):
            if (self.data_dir / name).exists():
                log.info("shard %s: removing %s (%s)", self.data_dir, name, why)
                shutil.rmtree(self.data_dir / name, ignore_errors=True)

    def _open_copy(self) -> _IndexCopy | None:
        """Open the copy of the index if it matches the journal, to answer queries while
        the in-memory index loads; else ``None``, and the log says why."""
        tmp, path = self.data_dir / _COPY_TMP, self.data_dir / _COPY_DIR
        if tmp.exists():
            log.warning("shard %s: removing an unfinished copy of the index (the process "
                        "stopped while writing it at close)", self.data_dir)
            shutil.rmtree(tmp, ignore_errors=True)
        if not path.exists():
            self._drop_early_copy()
            log.info("shard %s: no copy of the index on disk (one is written at close once "
                     "the journal holds %d bytes): queries wait until the index has loaded "
                     "from the journal", self.data_dir, COPY_MIN_JOURNAL_BYTES)
            return None
        # Opened and checked on its own thread, so that opening it does not delay the
        # shard serving the mesh; reads wait for that thread (see _reading_store).
        copy = _IndexCopy(path)
        copy.early, self._early_copy = self._early_copy, None
        copy.applier = _Applier(functools.partial(self._write_copy, copy),
                                on_stop=copy.release)
        end = self._journal.end
        copy.applier.submit(_StoreTask((), (), end, (), rebuild_until=end))
        return copy

    def _open_copy_store(self, copy: _IndexCopy, end: int) -> int | None:
        """Open the copy and check its mark against the journal's end at opening (on the
        copy's thread): the mark, or ``None`` when it is not used (the log says why)."""
        path = copy.path
        store: ox.Store | None = None
        why: str | None
        early, copy.early = copy.early, None
        try:
            store = early.result() if early is not None else ox.Store(str(path))
            marks = _copy_marks(store)
        except (OSError, ValueError, RuntimeError) as exc:  # RocksDB: "Corruption: ..."
            why = f"it cannot be read ({exc})"
        else:
            why = self._copy_mismatch(marks, end)
        if why is not None:
            store = None
            gc.collect()  # RocksDB's lock goes with the last reference
            log.warning("shard %s: the copy of the index on disk is not used: %s; it is "
                        "removed, queries wait until the index has loaded from the journal, "
                        "and a new copy is written at close", self.data_dir, why)
            shutil.rmtree(path, ignore_errors=True)
            return None
        assert store is not None
        mark = max(m[0] for m in marks)
        copy.store = store
        log.info("shard %s: queries are answered from the copy of the index on disk while "
                 "the index loads into memory (%d bytes of journal past the copy are applied "
                 "to it first)", self.data_dir, end - mark)
        return mark

    def _copy_mismatch(self, marks: Sequence[tuple[int, str, ox.Quad]], end: int
                       ) -> str | None:
        """Why a copy with these marks cannot stand for a journal ending at ``end``."""
        if not marks:
            return "it holds no journal offset (it was not finished)"
        mark, tail, _ = max(marks)
        if mark > end:
            return (f"it reflects {mark} bytes of journal, more than the journal's {end} "
                    "(the journal was cut or replaced)")
        if mark < len(_MAGIC) or self._journal.tail_hash(mark) != tail:
            return "it was made from another journal"
        behind = end - mark
        if behind > (end - len(_MAGIC)) * _COPY_MAX_BEHIND:
            return (f"{behind} bytes of journal lie past it, more than loading the whole "
                    "journal into memory costs")
        return None

    def _write_copy(self, copy: _IndexCopy, task: _StoreTask) -> None:
        """Apply a batch to the copy and move its mark (on the copy's thread).

        The first task opens it (and applies the journal past its mark). A failure leaves
        the copy behind: it answers nothing more (queries wait for the in-memory index,
        which has every batch too), and close writes a new one.
        """
        if not copy.opened.is_set():
            mark: int | None = None
            try:
                mark = self._open_copy_store(copy, task.rebuild_until)
            finally:
                copy.failed = mark is None
                copy.opened.set()
            if mark is None:
                assert copy.applier is not None
                copy.applier.retire()
                return
            if mark == task.rebuild_until:
                return
            task = replace(task, rebuild_from=mark)
        store = copy.store
        if copy.failed or store is None:
            return
        try:
            if task.rebuild_until:
                for part in self._load_journal(rebuild=True, load_state=False,
                                               start=task.rebuild_from,
                                               until=task.rebuild_until, chunk=_COPY_CHUNK):
                    if self._closing:
                        return  # close() brings it up to date from its mark
                    _write_rdf(store, part)
                end = task.rebuild_until
            else:
                _write_rdf(store, task)
                end = task.new_mark
            _mark_copy(store, end, self._journal.tail_hash(end))
        except (OSError, RuntimeError, SyntaxError, KnowledgeError) as exc:
            copy.failed = True
            assert copy.applier is not None
            copy.applier.retire()
            log.warning("shard %s: writing the copy of the index on disk failed (%s); queries "
                        "wait until the index has loaded into memory", self.data_dir, str(exc))
            return
        copy.generation += 1

    def _index_loaded(self) -> None:
        """The in-memory index holds the journal as it was at opening: it answers queries
        from now on, and the copy of it on disk is closed (on the store thread)."""
        copy, self._reading_copy = self._reading_copy, None
        self._loaded.set()
        self._maybe_move()  # what the journal held, or what was written during the load
        if copy is not None:
            assert copy.applier is not None
            copy.applier.retire()  # what it holds queued is applied; then it lets go
        log.info("shard %s: the index has loaded into memory %.2f s after opening%s",
                 self.data_dir, time.monotonic() - self._opened_at,
                 "; it answers queries now, and the copy on disk is closed"
                 if copy is not None else "")

    def _save_copy(self) -> None:
        """Bring the copy of the in-memory index up to date with the journal, or write one
        (at close; see _IndexCopy). A failure is logged: the next start loads the index
        from the journal."""
        if self.index is not Index.MEMORY:
            return
        end = self._journal.end
        if end < COPY_MIN_JOURNAL_BYTES:
            self._discard_copy("the journal is small enough to load at once")
            return
        tmp, path = self.data_dir / _COPY_TMP, self.data_dir / _COPY_DIR
        copy, started = self._copy, time.monotonic()
        store: ox.Store | None = None
        try:
            mark = 0
            if copy is not None and not copy.failed:
                store = ox.Store(str(path))
                mark = max((m[0] for m in _copy_marks(store)), default=0)
            if not mark:
                store = None
                gc.collect()
                shutil.rmtree(path, ignore_errors=True)
                shutil.rmtree(tmp, ignore_errors=True)
                store, mark = ox.Store(str(tmp)), len(_MAGIC)
            assert store is not None
            log.info("shard %s: %s the copy of the index on disk (%d bytes of journal to "
                     "apply)", self.data_dir, "writing" if mark == len(_MAGIC) else "updating",
                     end - mark)
            if mark < end:
                for part in self._load_journal(rebuild=True, load_state=False, start=mark,
                                               until=end, chunk=_COPY_CHUNK):
                    _write_rdf(store, part)
                _mark_copy(store, end, self._journal.tail_hash(end))
            store.flush()
            store = None
            gc.collect()
            if not path.exists():
                os.rename(tmp, path)
                fsync_directory(self.data_dir)
        except (OSError, ValueError, RuntimeError, SyntaxError, KnowledgeError) as exc:
            store = None
            gc.collect()
            shutil.rmtree(tmp, ignore_errors=True)
            log.warning("shard %s: the copy of the index was not written on disk (%s); the "
                        "next start loads the index from the journal, queries waiting for it",
                        self.data_dir, str(exc))
            return
        log.info("shard %s: the copy of the index on disk is up to date (%.2f s)",
                 self.data_dir, time.monotonic() - started)

    def _watermarks(self) -> list[int]:
        return [int(q.object.value) for q in
                self._store.quads_for_pattern(_META_SUBJECT, _META_WATERMARK, None, _META_GRAPH)
                if isinstance(q.object, ox.Literal)]

    def _replay(self) -> None:
        """Apply what the journal holds past the on-disk store's watermark."""
        marks = self._watermarks()
        mark = max(marks, default=len(_MAGIC))
        if mark > self._journal.end:
            # The store is ahead of the journal: the journal was replaced. Rebuild.
            log.warning("shard %s: store is ahead of its journal; rebuilding", self.data_dir)
            self._store.clear()
            mark = len(_MAGIC)
        if mark == self._journal.end:
            return
        log.info("shard %s: applying the %d bytes of journal past the on-disk index's "
                 "watermark", self.data_dir, self._journal.end - mark)
        written = self._apply_journal(self._store, mark, self._journal.end)
        self._generation += 1
        if self._compactor is not None:
            self._compactor.wrote(written)

    def _apply_journal(self, store: ox.Store, start: int, until: int) -> int:
        """Apply the journal's frames from ``start`` up to ``until`` to an on-disk store,
        in bulk, then move its watermark to ``until`` (last: a crash midway only means
        the work is redone). Returns the observations written.

        Raises:
            KnowledgeError: the store failed (a full disk...).
        """
        written = 0
        try:
            if start < until:
                for part in self._load_journal(rebuild=True, load_state=False, start=start,
                                               until=until, chunk=_COPY_CHUNK):
                    if self._closing:
                        raise KnowledgeError("the shard is closing")
                    _write_rdf(store, part)
                    written += part.weight
            old = list(store.quads_for_pattern(_META_SUBJECT, _META_WATERMARK, None,
                                               _META_GRAPH))
            mark = _watermark_quad(until)
            store.add(mark)
            for quad in old:
                if quad != mark:
                    store.remove(quad)
        except (OSError, RuntimeError, SyntaxError) as exc:
            raise KnowledgeError(f"the Oxigraph store failed ({exc})") from None
        return written

    def _held(self) -> int:
        """Observations held and not retracted (from the replica state: no query)."""
        return self._state.observation_records - self._state.retraction_records

    # -- moving the index to disk (Index.AUTO) --

    def _choose_index(self) -> Index:
        """Where an ``Index.AUTO`` shard's index is at opening: on disk once it moved
        there (or when the journal already holds more than ``disk_after``
        observations: it is then built on disk from the journal before the shard
        serves), else in memory."""
        tmp = self.data_dir / _DISK_TMP
        if tmp.exists():
            log.warning("shard %s: removing an unfinished on-disk index (the process "
                        "stopped while moving the index to disk)", self.data_dir)
            shutil.rmtree(tmp, ignore_errors=True)
        if (self.data_dir / _DISK_DIR).is_dir():
            return Index.DISK
        held = self._held()
        if held > self._disk_after:
            log.info("shard %s: %d observations held, more than %d: the index is built on "
                     "disk from the journal before the shard serves", self.data_dir, held,
                     self._disk_after)
            return Index.DISK
        return Index.MEMORY

    def _maybe_move(self) -> None:
        """Start moving the index to disk if it has grown past ``disk_after`` (after a
        commit, and once the in-memory index has loaded)."""
        if not (self.auto_index and self.index is Index.MEMORY and self._mover is None
                and self._held() > self._move_at):
            return  # the common case, without a lock
        with self._mover_lock:
            if self._mover is None and not self._closing and self._loaded.is_set():
                self._mover = threading.Thread(target=self._move_to_disk, daemon=True,
                                               name="porter-shard-to-disk")
                self._mover.start()

    def _move_to_disk(self) -> None:
        """Move the in-memory index to disk, while the shard serves (its own thread).

        1. Build the on-disk index from the journal in ``oxigraph.tmp/`` (bulk loads;
           compacted later, once writes pause: see _Compactor), give it its
           watermark, and rename it to ``oxigraph/``: from
           then on the next start opens it (and applies what lies past its watermark).
           A crash before the rename leaves the temporary directory, removed at the
           next start, and the index in memory.
        2. Apply what the shard wrote meanwhile, without its lock, a few rounds.
        3. Under the lock: let the in-memory index's thread finish, make the on-disk
           index the one that answers (what was written since the last round goes to
           the store thread first, and reads wait for it), and let the in-memory index
           go, with its memory.

        A failure (a full disk) leaves the index in memory, said in the log; the move
        is tried again once the shard holds a quarter more.
        """
        tmp, path = self.data_dir / _DISK_TMP, self.data_dir / _DISK_DIR
        started, held = time.monotonic(), self._held()
        log.info("shard %s: moving the index to disk (%d observations held, more than %d): "
                 "building it from the journal while the index in memory answers",
                 self.data_dir, held, self._disk_after)
        store: ox.Store | None = None
        old: ox.Store | None = None
        renamed, left = False, 0
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            store = ox.Store(str(tmp))
            mark = self._journal.end
            self._apply_journal(store, len(_MAGIC), mark)
            store.flush()
            store = None
            gc.collect()  # RocksDB's lock goes with the last reference
            os.rename(tmp, path)
            fsync_directory(self.data_dir)
            renamed = True
            log.info("shard %s: the on-disk index is built (%.1f s); catching up with "
                     "the journal", self.data_dir, time.monotonic() - started)
            store = ox.Store(str(path))
            for _ in range(_MOVE_ROUNDS):
                end = self._journal.end
                if end == mark or end - mark > _MOVE_ROUND_BYTES:
                    break
                self._apply_journal(store, mark, end)
                mark = end
            with self._lock:
                if self._closing:
                    raise KnowledgeError("the shard is closing")
                self._applier.drain()
                old, self._store = self._store, store
                self.index = Index.DISK
                self._generation += 1
                self._engine.use_store(store)
                # Compacted once writes pause (bulk loads left it as the build did).
                self._compactor = _Compactor(lambda: self._store, held,
                                             str(self.data_dir), written=held)
                end = self._journal.end
                left = end - mark
                if left:
                    self._applier.submit(_StoreTask((), (), end, (), catch_up_from=mark))
            store = None
        except (OSError, RuntimeError, SyntaxError, KnowledgeError) as exc:
            store = None
            gc.collect()
            shutil.rmtree(tmp, ignore_errors=True)
            if self._closing:
                log.info("shard %s: moving the index to disk stopped: the shard closes%s",
                         self.data_dir, " (the next start opens it and applies the rest)"
                         if renamed else "")
                return
            if renamed:
                shutil.rmtree(path, ignore_errors=True)
            with self._mover_lock:
                self._move_at = max(self._move_at, self._held() * 5 // 4)
                self._mover = None
            log.warning("shard %s: moving the index to disk failed (%s); it stays in memory "
                        "and the move is tried again at %d observations (a full disk: free "
                        "some space)", self.data_dir, str(exc), self._move_at)
            return
        del old
        gc.collect()
        if _MALLOC_TRIM is not None:
            _MALLOC_TRIM(0)
        self._discard_copy("the index is on disk now")
        log.info("shard %s: the index is on disk now and answers queries (%d bytes of journal "
                 "written meanwhile are applied to it first); the in-memory index is let go "
                 "(%.1f s in all)", self.data_dir, left, time.monotonic() - started)

    @property
    def index_moving(self) -> bool:
        """Whether the index is being moved to disk now (the in-memory one answers)."""
        mover = self._mover
        return mover is not None and mover.is_alive() and self.index is Index.MEMORY

    def wait_settled(self, timeout: float | None = None) -> bool:
        """Wait until no move of the index to disk and no compaction of it is under way
        or due (benchmarks and tests: queries are answered meanwhile).

        Returns:
            Whether that happened within ``timeout`` seconds (``None``: no limit).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        mover = self._mover
        if mover is not None:
            mover.join(timeout)
            if mover.is_alive():
                return False
        self._applier.drain()
        compactor = self._compactor
        if compactor is None:
            return True
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return compactor.wait_idle(left)

    def _reopen_store(self) -> None:
        """Open the store again and apply what the journal holds past its watermark.

        Runs on the applier's thread after a failed store write. Queries that still hold
        the old store keep its directory locked; then this fails and is retried.

        Raises:
            OSError: the store cannot be opened or written yet.
        """
        # Not a blocking acquire: close() holds the lock while it waits for this thread.
        if not self._lock.acquire(timeout=1.0):
            raise OSError("the shard is busy; trying again")
        try:
            if self._closed:
                return
            self._release_store()
            try:
                self._store = self._open_store()
            except KnowledgeError as exc:
                self._store = ox.Store()  # empty, in memory, until the next attempt
                raise OSError(str(exc)) from None
            finally:
                self._engine = QueryEngine(self._store, checkpoint=self._checkpoint)
            if self.index is Index.DISK:
                self._replay()
            else:  # on this (the store's) thread: write the whole journal again
                for task in self._load_journal(rebuild=True, load_state=False,
                                               until=self._journal.end):
                    self._write_store(task)
                if not self._loaded.is_set():
                    self._index_loaded()
        finally:
            self._lock.release()

    # -- writing --

    def use_signatures(self, *, sign: SignRecord | None, verify: VerifyRecord | None) -> None:
        """Sign this agent's records with ``sign`` and check everyone's with ``verify``.

        A secured node calls it before it merges anything (see the module docstring).

        Args:
            sign: signs ``record_signing_bytes(record)``; ``None`` writes unsigned records.
            verify: checks a record's signature (``None`` when good, else the reason);
                ``None`` accepts records as they come.
        """
        with self._lock:
            self._sign = sign
            self._verify = verify

    @property
    def checks_signatures(self) -> bool:
        """Whether every record merged must carry its author's good signature."""
        return self._verify is not None

    @property
    def write_failures(self) -> int:
        """Journal writes that failed since the shard was opened (a full disk...)."""
        return self._journal.failures

    def _write_own(self, agent: str, bodies: Sequence[Body]) -> list[Record]:
        """Place this agent's new bodies at its next sequence numbers, sign them (when
        there is a signer, each chained to the one before) and write them with one
        journal write (not synced: the caller syncs outside the lock, see :meth:`flush`).
        Called under the shard's lock."""
        first = self._state.next_seq(agent)
        records = [Record(agent, first + i, body) for i, body in enumerate(bodies)]
        if self._sign is not None:
            link = self._link_below(agent, first)
            for i, record in enumerate(records):
                records[i] = record = sign_record(record, link, self._sign)
                link = record_link(record)
        self._commit(records, sync=False)
        # Only once they are stored.
        self._last_link = (records[-1].seq, record_link(records[-1]))
        return records

    def _link_below(self, origin: str, seq: int) -> bytes | None:
        """The link of ``origin``'s record ``seq - 1``, which record ``seq`` chains to.

        Kept from the last record this agent wrote; after a restart (or when the record
        below came back from a peer) it is computed once from the journal. ``None`` when
        nothing is held below (the author's first record).
        """
        if self._last_link is not None and self._last_link[0] == seq - 1:
            return self._last_link[1]
        loc = self._state.locator(origin, seq - 1) if seq > 1 else None
        if loc is None:
            return None
        return record_link(record_from_journal(self._journal.read(loc)))

    def _verified(self, records: Sequence[Record]
                  ) -> tuple[Sequence[Record], tuple[RefusedRecord, ...]]:
        """The records whose authors are proved, and those refused.

        A record already held at its slot with the same content was proved when it was
        stored (or written here), so it is not checked again: a catch-up that repeats
        what is held costs no signature checks. The others cost one signature check per
        run of one author's consecutive records (see ``authenticate``).
        """
        verify, state = self._verify, self._state
        if verify is None:
            return records, ()
        refused = authenticate(
            records,
            lambda r: verify(r.origin, record_signing_bytes(r), r.sig),
            held=lambda r: state.holds_record(r.origin, r.seq, r.key),
        )
        if not refused:
            return records, ()
        kept = [r for i, r in enumerate(records) if i not in refused]
        return kept, tuple(RefusedRecord(records[i].origin, records[i].seq, reason)
                           for i, reason in sorted(refused.items()))

    def _write_store(self, task: _StoreTask) -> None:
        """Apply graph changes, then move the watermark to ``task.new_mark``.

        Additions go first and removals second: a task may be several batches joined
        together, and a later batch may retract what an earlier one added (a batch never
        adds what is already retracted). The watermark moves last, so a crash anywhere
        in between only means the work is redone at the next start.
        """
        store, add, remove = self._store, task.add, task.remove
        try:
            if task.rebuild_until:
                copy = self._reading_copy
                if copy is not None:
                    # The copy answers queries until this load ends: it opens first, on
                    # its own thread, without this load's Python taking turns at the
                    # interpreter's lock with it (the load takes seconds; the copy's
                    # opening, tens of milliseconds, which it would stretch).
                    copy.opened.wait(_COPY_OPEN_WAIT)
                for part in self._load_journal(rebuild=True, load_state=False,
                                               until=task.rebuild_until):
                    if self._closing:
                        return  # nobody will read it
                    self._write_store(part)
                self._index_loaded()
                return
            if self.index is Index.MEMORY:
                # A transactional load is the fast path in memory (the bulk loader's
                # sorting pays off only for RocksDB's files), and nothing is watermarked:
                # the index is rebuilt from the whole journal at every start.
                text = task.text + _ntriples(add) if add else task.text
                if text:
                    store.load(text, format=ox.RdfFormat.N_TRIPLES, lenient=True)
                    del text
                    if task.weight >= BULK_THRESHOLD and _MALLOC_TRIM is not None:
                        _MALLOC_TRIM(0)  # the parse buffers' pages: some 100 B/observation
                _remove_observations(store, remove)
                self._generation += 1
                return
            if task.catch_up_from:
                written = self._apply_journal(store, task.catch_up_from, task.new_mark)
            else:
                _write_rdf(store, task)
                store.add(_watermark_quad(task.new_mark))
                for old in task.old_marks:
                    if old != task.new_mark:
                        store.remove(_watermark_quad(old))
                written = task.weight
        except (OSError, SyntaxError) as exc:
            raise KnowledgeError(f"the Oxigraph store failed ({exc})") from None
        self._generation += 1
        if self._compactor is not None:
            self._compactor.wrote(written)

    def _commit(
        self, records: Sequence[Record], *, after: Mapping[str, int] | None = None,
        sync: bool = True,
    ) -> MergeReport:
        self._check_open()
        records, refused = self._verified(records)
        plan: MergePlan = self._state.plan(records, after=after)
        if not plan.accepted:
            return MergeReport(0, plan.duplicates, 0, 0, refused)
        old_mark = self._journal.end
        # A failed write raises StorageError here, before the state changes: nothing of
        # the batch counts as held, and pulls or a catch-up bring it again later.
        offsets = self._journal.append([encode_record(r) for r in plan.accepted], sync=sync)
        self._state.apply(plan, offsets)
        task = _StoreTask(plan.add, plan.remove, self._journal.end, (old_mark,))
        # While the copy of the index answers queries, it gets every batch too. (Read
        # once: a batch submitted to it after it ended is dropped, and no query reads
        # it then; see _IndexCopy.)
        copy = self._reading_copy
        if copy is not None and not copy.failed:
            assert copy.applier is not None
            copy.applier.submit(task)
        self._applier.submit(task)
        self._maybe_move()
        return MergeReport(len(plan.accepted), plan.duplicates, len(plan.add), len(plan.remove),
                           refused)

    def _own(self) -> str:
        if self.agent is None:
            raise KnowledgeError("this shard was opened without an agent name, so it cannot "
                                 "write records; open it with agent=<name>")
        return self.agent

    def remember(
        self,
        about: str,
        finding: str,
        *,
        severity: str | None = None,
        context: str | None = None,
        generated_at: str | None = None,
        durable: bool = True,
    ) -> Record:
        """Store a new observation by this shard's agent; durable when this returns.

        Concurrent callers (threads) share their ``fdatasync``: it runs outside the
        shard's lock, and one covers every record written before it started.

        Args:
            about: what it is about (e.g. ``urn:porter:file:server.ts``).
            finding: the fact.
            severity: optional short token (``info``, ``high``...).
            context: optional task id (``urn:porter:task:<id>``).
            generated_at: canonical UTC timestamp; default now.
            durable: ``False`` returns once the record is written but not yet synced:
                the caller must call :meth:`flush` before it reports the record as
                stored or sends it anywhere (pulls and catch-ups serve it only then).

        Returns:
            The record (to broadcast as ``Records((record,))``), signed when the shard
            has a signer.

        Raises:
            KnowledgeError: a field is invalid, or the shard has no agent.
            StorageError: the journal could not be written (a full disk): the record was
                not kept and its sequence number stays free.
        """
        agent = self._own()
        obs = Observation(about, finding, agent, generated_at or format_timestamp(time.time()),
                          context, severity)
        record, = self.write_observations((obs,))
        if durable:
            # Covers this record, and whatever other threads wrote meanwhile.
            self._journal.sync_to(self._journal.end)
        return record

    def write_observations(self, observations: Sequence[Observation]) -> list[Record]:
        """Write new observations by this shard's agent as one batch, not yet synced.

        One journal write, one merge plan and one batch for the index however many
        there are: what a group of concurrent Remembers costs once their sync is shared.
        Nothing written here may be reported as stored or sent anywhere before a
        :meth:`flush` that started after this returned has returned (pulls and catch-ups
        serve none of it before that).

        Args:
            observations: each discovered by this shard's agent, in the order their
                sequence numbers are to follow.

        Returns:
            Their records, in order (signed when the shard has a signer).

        Raises:
            KnowledgeError: an observation names another agent, or the shard has no agent.
            StorageError: the journal could not be written (a full disk): none of them
                was kept and their sequence numbers stay free.
        """
        agent = self._own()
        for obs in observations:
            if obs.discovered_by != agent:
                raise KnowledgeError(f"this shard writes observations by {agent} only, not "
                                     f"by {obs.discovered_by}")
        if not observations:
            return []
        with self._lock:
            self._check_open()
            return self._write_own(agent, observations)

    def flush(self) -> None:
        """Make every record written so far durable (under ``Durability.FSYNC``).

        Safe to call from any thread and outside the shard's lock: callers that wait at
        the same time share one ``fdatasync`` (group commit).

        Raises:
            StorageError: the ``fdatasync`` failed.
        """
        self._check_open()
        self._journal.sync_to(self._journal.end)

    @property
    def journal_syncs(self) -> int:
        """``fdatasync`` calls made on the journal since the shard was opened."""
        return self._journal.syncs

    def retract(self, observation: str | bytes) -> Record:
        """Withdraw an observation everywhere, permanently.

        Args:
            observation: its IRI (``urn:porter:obs:<hex>``), hex id, or 32-byte id.

        Returns:
            The retraction record (to broadcast).

        Raises:
            KnowledgeError: no such observation here, or it is already retracted.
            StorageError: the journal could not be written (a full disk).
        """
        agent = self._own()
        target = (observation if isinstance(observation, bytes)
                  else observation_id_from_iri(observation))
        with self._lock:
            self._check_open()
            if self._state.is_retracted(target):
                raise KnowledgeError(f"{observation_iri(target)} is already retracted")
            present = next(iter(self._reading_store().quads_for_pattern(
                ox.NamedNode(observation_iri(target)), ox.NamedNode(RDF_TYPE), None,
                ox.DefaultGraph())), None)
            if present is None:
                raise KnowledgeError(
                    f"no observation {observation_iri(target)} in this shard; find its id "
                    "with a query such as SELECT ?obs WHERE {{ ?obs porter:about ?a }}"
                )
            record, = self._write_own(
                agent, (Retraction(target, agent, format_timestamp(time.time())),))
            end = self._journal.end
        self._journal.sync_to(end)
        return record

    def merge(
        self, records: Sequence[Record], *, after: Mapping[str, int] | None = None,
        durable: bool = True,
    ) -> MergeReport:
        """Merge records from peers as one batch (one journal write, one fsync).

        Args:
            records: decoded records (their content hashes were checked by decoding).
            after: for a catch-up chunk, the version vector sent in the request.
            durable: ``False`` returns before the fsync; the caller calls :meth:`flush`
                (the records are served to no one before it).

        Returns:
            What changed, and which records were left out for their signatures.

        Raises:
            SyncError: the batch is refused as a whole (forged or conflicting records,
                records outside what was asked); the shard is unchanged.
            StorageError: the journal could not be written; the shard is unchanged.
        """
        if len(records) > MAX_RECORDS_PER_MESSAGE * 16:
            raise SyncError(f"a merge batch of {len(records)} records is too large; split it")
        with self._lock, bulk_allocation():
            return self._commit(records, after=after, sync=durable)

    # -- sync --

    def handle(self, message: SyncMessage, *, asked: SyncMessage | None = None) -> SyncOutcome:
        """Exchange one sync message with another shard in process (tests, benchmarks,
        offline tools): the storage calls a :class:`~porter_mesh.core.session.sync.
        SyncSession`'s actions name, with its rule for matching a reply to its request.

        The node does not come here: its session decides what is asked, from whom, and
        what is refused (see :mod:`porter_mesh.node.knowledge`).

        Args:
            message: the decoded message.
            asked: the request this message answers, for replies (a :class:`PullRequest`
                for a :class:`PullReply`, a :class:`CatchupRequest` for a
                :class:`CatchupChunk`): the reply must match it.

        Returns:
            Replies for the same peer, and what merging did.

        Raises:
            SyncError: the message is refused; the shard is unchanged.
            StorageError: its records could not be written; the shard is unchanged.
        """
        self._check_open()
        refusal = reply_refusal(message, asked)
        if refusal is not None:
            raise SyncError(refusal[1])
        if isinstance(message, PullRequest):
            return SyncOutcome(replies=(self.answer_pull(message),))
        if isinstance(message, CatchupRequest):
            return SyncOutcome(replies=(self.answer_catchup(message),))
        if isinstance(message, Digest | BucketEntries):
            with self._lock:
                if isinstance(message, BucketEntries):
                    return SyncOutcome(replies=tuple(self._state.lacking(message)))
                differ = self._state.differing_buckets(message)
                return SyncOutcome(replies=(self._state.bucket_entries(differ),) if differ
                                   else ())
        if isinstance(message, CatchupChunk):
            assert isinstance(asked, CatchupRequest)  # reply_refusal saw to it
            report = self.merge(message.records, after=asked.vv)
            finished = message.cursor is None
            replies: tuple[SyncMessage, ...] = () if finished else (CatchupRequest(
                asked.vv, message.cursor, message.done, asked.limit),)
            return SyncOutcome(replies, report, (message.done, message.total), finished)
        return SyncOutcome(merged=self.merge(message.records))

    def answer_pull(self, request: PullRequest) -> PullReply:
        """The records held in a requested range (cut to fit one message).

        Args:
            request: the peer's request.

        Returns:
            The reply; records that would overflow the message limit are left out (the
            peer sees them still missing and asks again).
        """
        with self._lock:
            locators = self._state.locators_in(request.origin, request.first, request.last)
            records = self._read_records(locators)
        return PullReply(request.origin, request.first, request.last, tuple(records))

    def answer_catchup(self, request: CatchupRequest) -> CatchupChunk:
        """The next chunk of a catch-up (a snapshot when ``request.vv`` is empty)."""
        with self._lock:
            items, remaining, exhausted = self._state.catchup_slice(request)
            records = self._read_records([loc for _, _, loc in items])
            if len(records) < len(items):
                exhausted = False
            cursor = None
            if not exhausted:
                origin, seq, _ = items[len(records)] if len(records) < len(items) else (
                    items[-1][0], items[-1][1] + 1, 0)
                cursor = (origin, seq)
        done = request.done + len(records)
        return CatchupChunk(tuple(records), done, request.done + remaining, cursor)

    def _read_records(self, locators: Sequence[int]) -> list[Record]:
        out: list[Record] = []
        size = 0
        synced = self._journal.synced
        for loc in locators:
            if loc >= synced:
                break  # written but not yet durable: not sent anywhere before it is
            payload = self._journal.read(loc)
            size += len(payload)
            if size > _REPLY_BUDGET or len(out) == MAX_RECORDS_PER_MESSAGE:
                break
            out.append(record_from_journal(payload))  # checked when it was stored
        return out

    def catchup_request(self, *, limit: int = MAX_RECORDS_PER_MESSAGE) -> CatchupRequest:
        """The first request of a catch-up from a peer, starting at this replica's state."""
        return CatchupRequest(self.version_vector(), None, 0, limit)

    # -- reading --

    def version_vector(self) -> dict[str, int]:
        """Per origin, the highest seq held with nothing missing below it."""
        return self._state.version_vector()

    def digest(self) -> Digest:
        """The anti-entropy digest to send to a peer."""
        return self._state.digest()

    def missing_ranges(self) -> list[PullRequest]:
        """Pull requests for the gaps this replica knows of."""
        return self._state.missing_ranges()

    @property
    def state(self) -> ReplicaState:
        """The replica state (read it; change it only through this shard)."""
        return self._state

    def query(
        self,
        text: str,
        *,
        row_limit: int = DEFAULT_ROW_LIMIT,
        deadline: float = DEFAULT_DEADLINE,
        isolate: bool | None = None,
        prefixes: Mapping[str, str] | None = None,
    ) -> QueryResult:
        """Run a read-only SPARQL query (see :mod:`porter_mesh.adapters.sparql`).

        Raises:
            QueryError: refused or invalid; QueryTimeout past the deadline.
        """
        return self._engine.query(text, row_limit=row_limit, deadline=deadline,
                                  isolate=isolate, prefixes=prefixes,
                                  store=self._reading_store())

    def stop_query_worker(self) -> None:
        """Stop the process that runs isolated queries (it restarts when next needed)."""
        self._engine.stop_worker()

    @property
    def graph(self) -> rdflib.Graph:
        """A read-only ``rdflib.Graph`` over this shard's store (oxrdflib).

        Iteration, ``triples()``, ``serialize()`` read the live store; ``query()`` goes
        through the SPARQL guard; ``add``/``remove``/``update`` raise KnowledgeError (use
        :meth:`remember` and :meth:`retract`, which replicate).
        """
        self._check_open()
        if self._graph is None:
            self._graph = _rdflib_view(self)
        return self._graph

    def export(self, fmt: str = "turtle") -> bytes:
        """Serialise the graph: ``turtle``, ``nt`` or ``jsonld``.

        Raises:
            KnowledgeError: unknown format.
        """
        store = self._reading_store()
        try:
            rdf_format = _EXPORT_FORMATS[fmt]
        except KeyError:
            raise KnowledgeError(f"unknown export format {fmt!r}; use one of "
                                 f"{', '.join(_EXPORT_FORMATS)}") from None
        prefixes = dict(PREFIXES) if rdf_format is ox.RdfFormat.TURTLE else None
        data = store.dump(format=rdf_format, from_graph=ox.DefaultGraph(),
                                prefixes=prefixes)
        assert data is not None  # dump() returns the bytes when no output is given
        return data

    def stats(self) -> ShardStats:
        """Counts, version vector and digest."""
        count = self._reading_store().query(
            f"SELECT (COUNT(?s) AS ?n) WHERE {{ ?s <{RDF_TYPE}> <{OBSERVATION_CLASS}> }}")
        assert isinstance(count, ox.QuerySolutions)
        live = next(count)[0]
        return ShardStats(
            observations=int(live.value) if isinstance(live, ox.Literal) else 0,
            observation_records=self._state.observation_records,
            retractions=self._state.retraction_records,
            version_vector=self._state.version_vector(),
            digest=self._state.digest().top.hex(),
            journal_bytes=self._journal.end,
            data_dir=str(self.data_dir),
            write_failures=self._journal.failures,
            index=self.index.value,
            compactions=self._compactor.compactions if self._compactor is not None else 0,
        )

    def optimize(self) -> None:
        """Compact the store (worth it after a large catch-up made of bulk loads)."""
        self._reading_store().optimize()

    # -- checkpoints for isolated queries --

    def _checkpoint(self) -> str:
        with self._lock:
            store = self._reading_store()
            from_copy = store is not self._store  # the copy on disk, while the index loads
            generation = (self._copy.generation if from_copy and self._copy is not None
                          else self._generation)
            if self._checkpoint_dir is not None and \
                    self._checkpoint_gen == (from_copy, generation):
                return str(self._checkpoint_dir)
            root = self.data_dir / "checkpoints"
            if root.exists():
                for old in root.iterdir():
                    shutil.rmtree(old, ignore_errors=True)
            root.mkdir(exist_ok=True)
            target = root / f"{os.getpid()}-{int(from_copy)}-{generation}"
            copy: ox.Store | None = None
            try:
                if self.index is Index.DISK or from_copy:
                    store.backup(str(target))  # hard links: cheap
                else:
                    # An in-memory store has no files to link: write a copy (a bulk load,
                    # some seconds per 100k observations; kept until the next write).
                    copy = ox.Store(str(target))
                    copy.bulk_load(store.dump(format=ox.RdfFormat.N_QUADS),
                                   format=ox.RdfFormat.N_QUADS)
                    copy.flush()
            except OSError as exc:
                if copy is not None:
                    copy = None
                    gc.collect()
                shutil.rmtree(target, ignore_errors=True)
                raise KnowledgeError(
                    f"this query runs in a worker process on a copy of the index on disk, "
                    f"which could not be written in {root} ({exc}); free some space, or ask "
                    "a query the guard bounds in process (no aggregate, no ORDER BY)"
                ) from None
            if copy is not None:
                copy = None
                gc.collect()  # RocksDB's lock goes with the last reference
            self._checkpoint_dir, self._checkpoint_gen = target, (from_copy, generation)
            return str(target)

    # -- closing --

    def _check_open(self) -> None:
        if self._closed:
            raise KnowledgeError("the shard is closed; open it again")

    def sync(self) -> None:
        """Wait until every record committed so far is in the index that answers queries
        (queries do this): the in-memory index, or while it loads after a restart the
        copy of it on disk (see :attr:`reading_from_copy`).

        Raises:
            KnowledgeError: the shard is closed, or the store failed to apply a batch.
        """
        self._reading_store()

    def _reading_store(self) -> ox.Store:
        """The store that answers reads now, once it holds every record committed so far.

        Raises:
            KnowledgeError: the shard is closed, or the store failed to apply a batch.
        """
        self._check_open()
        copy = self._reading_copy
        if copy is not None and not copy.failed:
            assert copy.applier is not None
            copy.applier.drain()
            store = copy.store
            if store is not None and not copy.failed:
                return store
            # Refused when opened, failed on a batch this read must see, or closed once
            # the index loaded: the in-memory index has every batch.
        # The store is read before the drain: when the index moves to disk between the
        # two, the in-memory store read here holds every batch committed before this
        # read began, while the on-disk one may still lack some (the rest of the move is
        # queued to the store thread, and this drain may have started before it).
        store = self._store
        self._applier.drain()
        return store

    @property
    def index_loading(self) -> bool:
        """Whether the in-memory index is still loading from the journal after opening."""
        return not self._loaded.is_set()

    @property
    def reading_from_copy(self) -> bool:
        """Whether queries are answered from the copy of the in-memory index on disk (while
        the index loads after a restart, when a copy matching the journal was there)."""
        copy = self._reading_copy
        if copy is None:
            return False
        copy.opened.wait()
        return not copy.failed and copy.store is not None

    def wait_index(self, timeout: float | None = None) -> bool:
        """Wait until the in-memory index has loaded (after opening).

        Args:
            timeout: seconds to wait at most (``None``: no limit).

        Returns:
            Whether it has loaded.
        """
        return self._loaded.wait(timeout)

    def wait_store(self, timeout: float) -> None:
        """Like :meth:`sync`, but give a failed store up to ``timeout`` seconds to be
        recovered (after a full disk was given space again).

        Raises:
            KnowledgeError: the shard is closed, or the store is still failing.
        """
        self._check_open()
        self._applier.drain(timeout)

    def _release_store(self) -> None:
        """Let go of the store: the query engine's, the rdflib view's and our reference."""
        self._engine.close()
        if self._graph is not None:
            # A caller may still hold the graph: point it at an empty store so that the
            # RocksDB files are released, and make it refuse to answer.
            view_store: Any = self._graph.store
            view_store._store = ox.Store()
            self._graph = None
        del self._store
        gc.collect()  # the RocksDB lock goes with the last reference to the store

    def close(self) -> None:
        """Stop the query worker, release the store and the directory lock."""
        self._closing = True  # a load, or a move of the index to disk, still running stops
        mover = self._mover
        if mover is not None:
            mover.join()  # outside the lock: the move takes it to finish
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._applier.close()
            if self._compactor is not None:
                self._compactor.close()
            if self._copy is not None:
                assert self._copy.applier is not None
                self._copy.applier.close()
            self._release_store()
            self._save_copy()
            self._save_state()
            self._journal.close()
            shutil.rmtree(self.data_dir / "checkpoints", ignore_errors=True)
            self._dir_lock.release()

    def __enter__(self) -> Shard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- the rdflib view ------------------------------------------------------------------------


def _rdflib_view(shard: Shard) -> rdflib.Graph:
    """An ``rdflib.Graph`` over the shard's store (imports rdflib only when asked)."""
    import rdflib
    from oxrdflib import OxigraphStore
    from rdflib.graph import DATASET_DEFAULT_GRAPH_ID
    from rdflib.query import Result

    def refuse(*_: Any, **__: Any) -> None:
        raise KnowledgeError("the shard's graph is read-only: use Shard.remember() to add and "
                             "Shard.retract() to withdraw observations (both replicate)")

    def to_rdflib(term: Any) -> Any:
        if term is None:
            return None
        if isinstance(term, ox.NamedNode):
            return rdflib.URIRef(term.value)
        if isinstance(term, ox.BlankNode):
            return rdflib.BNode(term.value)
        if isinstance(term, ox.Literal):
            if term.language:
                return rdflib.Literal(term.value, lang=term.language)
            datatype = term.datatype.value
            return rdflib.Literal(term.value, datatype=None if datatype.endswith(
                "#string") else rdflib.URIRef(datatype))
        raise KnowledgeError(f"cannot express {term} in rdflib")

    def open_shard(view: OxigraphStore) -> None:
        if shard._closed:
            raise KnowledgeError("the shard behind this graph is closed; open it again")
        view._store = shard._reading_store()  # the copy on disk, while the index loads

    def plain(term: Any) -> Any:
        if isinstance(term, rdflib.Literal) and str(term.datatype) == _XSD_STRING:
            return rdflib.Literal(str(term))
        return term

    class _ShardStore(OxigraphStore):
        add = addN = remove = update = add_graph = remove_graph = refuse

        def triples(self, triple_pattern: Any, context: Any = None) -> Any:
            open_shard(self)
            for (s, p, o), ctx in super().triples(triple_pattern, context):
                yield (s, p, plain(o)), ctx

        def __len__(self, context: Any = None) -> int:
            open_shard(self)
            return int(super().__len__(context))

        def query(self, query: Any, initNs: Mapping[str, Any], initBindings: Mapping[str, Any],
                  queryGraph: Any, **kwargs: Any) -> Result:
            open_shard(self)
            if not isinstance(query, str) or initBindings or kwargs:
                raise KnowledgeError("the shard's graph answers SPARQL text only (no prepared "
                                     "queries, no initBindings)")
            result = shard.query(query, prefixes={k: str(v) for k, v in initNs.items()})
            if result.truncated:
                log.warning("query result cut at %d rows (the row limit)", result.row_limit)
            if result.boolean is not None:
                out = Result("ASK")
                out.askAnswer = result.boolean
            elif result.variables == ("subject", "predicate", "object") and \
                    result.form.value in ("CONSTRUCT", "DESCRIBE"):
                out = Result("CONSTRUCT")
                out.graph = rdflib.Graph()
                for row in result.rows:
                    out.graph.add(tuple(to_rdflib(t) for t in row))
            else:
                out = Result("SELECT")
                out.vars = [rdflib.Variable(v) for v in result.variables]
                out.bindings = [
                    {var: to_rdflib(val) for var, val in zip(out.vars, row, strict=True)
                     if val is not None}
                    for row in result.rows
                ]
            # The row limit cut it: said, not silent (rdflib's Result has no such field).
            setattr(out, "truncated", result.truncated)  # noqa: B010
            return out

    graph = rdflib.Graph(store=_ShardStore(store=shard._store),
                         identifier=DATASET_DEFAULT_GRAPH_ID)
    for prefix, iri in PREFIXES.items():
        graph.bind(prefix, iri, override=True)
    return graph
