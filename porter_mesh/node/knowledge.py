"""The knowledge replica of a node: a :class:`~porter_mesh.adapters.shard.Shard` kept in
step with the other nodes' replicas.

Theory of operation
-------------------
Replication rides on the node's extension kind ``sync`` (msgpack messages of
:mod:`porter_mesh.core.knowledge`). Every shard call runs on the node's loop thread
(queries excepted, see :meth:`Knowledge.query`).

* **Broadcast.** ``remember`` and ``retract`` make the record durable in the local
  shard, then broadcast it (``Records``) on ``control``; the AS2 ``Remember`` activity
  also goes out on ``log`` for people and observers. A ``Records`` message is accepted
  only by broadcast and only with records written by its sender: nobody pushes another
  origin's records unasked. Records that arrive in one loop iteration are merged as one
  batch (one journal write, one fsync); a batch that is refused is merged again message
  by message, so one bad sender cannot make a good one's records wait.
* **Gaps.** Records carry per-origin sequence numbers. After every merge the shard's
  version vector shows the missing ranges; each is pulled (``PullRequest``) from the
  origin when it is connected, else from a peer, over ROUTER/DEALER. A request not
  answered in ``request_timeout`` is forgotten and asked again on a later tick.
* **Catch-up.** When a peer joins (or comes back with a new incarnation), a node asks
  it for everything past its own version vector (``CatchupRequest``), chunk by chunk,
  one peer at a time; progress is logged and reported to listeners. A late joiner or a
  restarted node (which first reloads its shard from disk) converges this way in a few
  large messages. A chunk not answered within ``catchup_timeout``, or refused, fails the
  attempt, which starts over from the current version vector; after a few failed
  attempts that peer is skipped until it joins again (a peer that answers with garbage
  cannot hold the catch-up, nor the gap pulls waiting behind it, for long). While a
  catch-up runs, gap pulls and digests wait: the catch-up brings the same records in
  order, and cheaper.
* **Anti-entropy.** Every ``anti_entropy_interval`` seconds a node sends its bucketed
  digest to one connected peer, round robin. The peer lists its records in the buckets
  that differ and also sends its own digest back (at most once per interval), so one
  exchange repairs both sides: each pulls what the other's listing shows it lacks. A
  listing that shows much missing turns into a catch-up from that peer. This repairs
  what sequence numbers cannot reveal, such as a lost last record.
* **Signatures.** On a secured mesh the shard signs this agent's records with the node's
  signing key and checks every record it is given against the trusted directory before
  it is stored, on every path (broadcast, pull reply, catch-up chunk). A record whose
  signature is missing or wrong is left out, the rest of its message is merged; each is
  counted (``refused.<reason>``, and per claimed author in ``refused_by_origin``), and
  audited as ``forged-record`` (a warning the first time per author). So a trusted node
  that plants a record in another agent's name in its own replica can keep it there,
  but can neither spread it nor take that agent's sequence number anywhere else.
* **A full disk.** A record that cannot be written is not held: a local write raises
  :class:`~porter_mesh.errors.StorageError` to its caller (nothing is broadcast); a
  received one is dropped and counted (``storage.write-failed``), and pulls, digests
  or a catch-up bring it again once the shard can write.
* **Refusals.** A reply nobody asked for (pull reply, catch-up chunk, bucket listing), a
  record outside the asked range, a forged or conflicting record, a malformed message:
  all are refused before anything is stored, counted in the node's counters as
  ``dropped.sync.<reason>``, and logged once per peer and reason.

Sequence numbers are never reused: the shard assigns one past the highest it holds from
its own agent, and that survives a restart in the journal. Timestamps are data only
(``generatedAtTime``), so clock skew cannot reorder or lose anything.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import pathlib
import time
from collections.abc import Callable
from typing import Any, Final

from porter_mesh.adapters.security import RecordSigner, RecordVerifier
from porter_mesh.adapters.shard import MergeReport, Shard
from porter_mesh.core import constants as C
from porter_mesh.core.advert import key_name
from porter_mesh.core.as2 import Activity
from porter_mesh.core.envelope import KIND_SYNC, Envelope
from porter_mesh.core.knowledge import (
    BucketEntries,
    CatchupChunk,
    CatchupRequest,
    Digest,
    PullReply,
    PullRequest,
    Record,
    Records,
    SyncMessage,
    decode_sync,
    encode_sync,
)
from porter_mesh.core.peers import PeerEvent, PeerEventKind
from porter_mesh.errors import (
    ActivityError,
    KnowledgeError,
    PorterError,
    SecurityError,
    StorageError,
    SyncError,
)
from porter_mesh.node.node import Node, Reply
from porter_mesh.tools.port import QueryResult

__all__ = ["Knowledge", "SyncKnowledge", "attach_knowledge"]

log = logging.getLogger("porter_mesh.knowledge")

#: A bucket listing that asks for more pull requests than this starts a catch-up instead.
CATCHUP_AFTER_PULLS: Final = 32
#: Failed catch-up attempts from one peer before it is skipped until it joins again.
CATCHUP_ATTEMPTS: Final = 3
#: Records asked for per catch-up chunk. Merging a chunk runs on the loop thread (about
#: 25 us per record to decode, check and journal); 4096 keeps each step near 0.1 s, so
#: heartbeats and other traffic never wait long, and a chunk stays well under a megabyte.
CATCHUP_CHUNK: Final = 4096
#: Seconds a peer that answered "no replica here" is left out of catch-ups and digests.
NO_SYNC_BACKOFF = 5.0
#: Claimed authors of refused records counted one by one (then as ``(others)``).
MAX_REFUSED_ORIGINS: Final = 1000
#: Seconds an agent's first write waits for a first catch-up (see SyncKnowledge.remember).
FIRST_WRITE_WAIT: Final = 10.0
_TICK: Final = 0.1
#: Seconds a synchronous Remember may take (a write and one shared fdatasync).
REMEMBER_TIMEOUT: Final = 60.0


def _remembered(activity: Activity) -> tuple[str, str, str | None]:
    """``(about, finding, severity)`` of a ``Remember`` activity's Note.

    Raises:
        KnowledgeError: the activity is not a Remember of a Note with both fields.
    """
    obj = activity.object
    if activity.type != "Remember" or obj is None or isinstance(obj, str):
        raise KnowledgeError("remember needs a Remember activity whose object is a Note "
                             "with 'about' and 'content'")
    about, finding = obj.about, obj.content
    if not about or not finding:
        raise KnowledgeError("the Remember's object needs both 'about' and 'content'")
    severity = obj.extra.get("severity")
    return about, finding, severity if isinstance(severity, str) else None


def _retrieved(future: asyncio.Future[None]) -> None:
    """Mark a shared sync's outcome as seen (its failure is counted where it happens)."""
    if not future.cancelled():
        future.exception()


def _asked_key(message: SyncMessage) -> tuple[Any, ...] | None:
    """The key matching a request with its reply."""
    if isinstance(message, PullRequest | PullReply):
        return ("pull", message.origin, message.first, message.last)
    if isinstance(message, CatchupRequest | CatchupChunk):
        return ("catchup",)
    if isinstance(message, Digest | BucketEntries):
        return ("digest",)
    return None


class _Refused(SyncError):
    """A sync message refused for ``reason`` (counted and logged once; never escapes)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Knowledge:
    """Keeps one node's shard converged with the mesh.

    Create it, call :meth:`start` on the loop (before or after the node starts), and
    :meth:`aclose` when done. Methods prefixed ``async_`` must run on the loop thread.

    Args:
        node: the node.
        shard: the local replica (owned from now on: :meth:`aclose` closes it).
        anti_entropy_interval: seconds between digest comparisons.
        request_timeout: seconds before an unanswered pull is asked again.
        catchup_timeout: seconds before an unanswered catch-up chunk counts as a failed
            attempt (the catch-up then starts over from the current state). Replies
            travel over TCP, so this guards against a stuck or silent peer, not loss;
            it must exceed the time a peer takes to read a chunk.
        drop_every: fault injection for tests: do not broadcast every k-th record (the
            receivers must repair it). 0 disables.

    Raises:
        KnowledgeError: a setting is out of range.
    """

    def __init__(self, node: Node, shard: Shard, *, anti_entropy_interval: float = 2.0,
                 request_timeout: float = 2.0, catchup_timeout: float = 30.0,
                 drop_every: int = 0) -> None:
        if min(anti_entropy_interval, request_timeout, catchup_timeout) <= 0 or drop_every < 0:
            raise KnowledgeError("anti_entropy_interval, request_timeout and catchup_timeout "
                                 "must be positive, and drop_every >= 0")
        self.node = node
        self.shard = shard
        self.anti_entropy_interval = anti_entropy_interval
        self.request_timeout = request_timeout
        self.catchup_timeout = catchup_timeout
        self.drop_every = drop_every
        self.counters: collections.Counter[str] = collections.Counter()
        #: ``(done, total)`` of the catch-up running or last finished.
        self.progress: tuple[int, int] | None = None
        self._asked: dict[tuple[str, tuple[Any, ...]], tuple[SyncMessage, float]] = {}
        self._catchup_peer: str | None = None
        self._catchup_queue: collections.deque[str] = collections.deque()
        self._catchup_failures: collections.Counter[str] = collections.Counter()
        # Peers that said they run no replica, until when to leave them alone. Not for
        # ever: a node may attach its replica a moment after it starts.
        self._no_sync: dict[str, float] = {}
        self._caught_up: set[str] = set()
        # Peers that sent any sync message or said they run none (since they joined).
        self._answered: set[str] = set()
        self._digest_sent: dict[str, float] = {}
        self._rr = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._broadcasts = 0
        self._inbound: list[tuple[str, Records]] = []
        self._merge_scheduled = False
        self._listeners: list[Callable[[str, Any], None]] = []
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []
        self._probes: dict[tuple[str, tuple[Any, ...]], asyncio.Future[bool]] = {}
        self._refusals_logged: set[tuple[str, str]] = set()
        self._remove_listener: Callable[[], None] | None = None
        self._closed = False
        #: Records refused for their signatures, per claimed author.
        self.refused_by_origin: collections.Counter[str] = collections.Counter()
        self._keys_in_use = False
        self._signer_error: SecurityError | None = None
        self._next_sync: asyncio.Future[None] | None = None
        self._syncing: asyncio.Future[None] | None = None

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Hook into the node and start the timers (on the loop thread).

        Called before the node starts, no peer and no sync message is missed.
        """
        self.node.register_kind(KIND_SYNC, self._on_sync)
        self.node.register_unsupported(KIND_SYNC, self._on_unsupported)
        self._remove_listener = self.node.add_peer_listener(self._on_peer)
        self.node.view_sections["knowledge"] = self.summary
        for peer in self.node.peers():
            self._queue_catchup(peer.name)
        self._task = asyncio.ensure_future(self._tick_loop())

    async def aclose(self) -> None:
        """Stop replicating and close the shard (records merged so far are durable)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None
        if self._remove_listener is not None:
            with contextlib.suppress(ValueError):
                self._remove_listener()
            self._remove_listener = None
        self._merge_inbound()
        while self._syncing is not None:  # what was merged is durable before the shard closes
            with contextlib.suppress(BaseException):
                await self._syncing
        self.node.view_sections.pop("knowledge", None)
        self._closed = True
        for _, fut in self._waiters:
            if not fut.done():
                fut.cancel()
        for probe in self._probes.values():
            if not probe.done():
                probe.cancel()
        self.shard.close()

    # -- local writes --------------------------------------------------------------------

    def async_remember(self, activity: Activity) -> Record:
        """Store the observation of a ``Remember`` activity and replicate it.

        Args:
            activity: a ``Remember`` whose object is a Note with ``about`` and
                ``content`` (optional ``severity``; the activity's ``context`` is the task).

        Returns:
            The stored record (durable when this returns).

        Raises:
            KnowledgeError: the activity is not such a Remember, or the shard refused it.
        """
        about, finding, severity = _remembered(activity)
        record = self.async_observe(about, finding, context=activity.context,
                                    severity=severity)
        with contextlib.suppress(KnowledgeError, ActivityError):
            self.node.async_publish(C.CHANNEL_LOG, activity)
        return record

    async def aremember(self, activity: Activity) -> Record:
        """Like :meth:`async_remember`, but concurrent calls share their ``fdatasync``.

        The record is written on the loop thread; the sync runs on a worker thread, where
        every Remember written before it started is covered by the same one (group
        commit). The record is broadcast, and this returns, only once it is durable.

        Args:
            activity: a ``Remember`` (see :meth:`async_remember`).

        Returns:
            The stored record.

        Raises:
            KnowledgeError: the activity is not such a Remember.
            StorageError: the shard could not write or sync it; nothing was broadcast.
        """
        about, finding, severity = _remembered(activity)
        self._ready_to_write()
        try:
            record = self.shard.remember(about, finding, context=activity.context,
                                         severity=severity, durable=False)
            # Shielded: a caller that gives up must not cancel the sync others share.
            await asyncio.shield(self._sync_journal())
        except StorageError:
            self.counters["storage.write-failed"] += 1
            raise
        self.async_broadcast(record)
        with contextlib.suppress(KnowledgeError, ActivityError):
            self.node.async_publish(C.CHANNEL_LOG, activity)
        return record

    def async_observe(self, about: str, finding: str, *, context: str | None = None,
                      severity: str | None = None, generated_at: str | None = None) -> Record:
        """Store a new observation by this node's agent and replicate it.

        Args:
            about: what it is about.
            finding: the fact.
            context: the task, if any.
            severity: a short token, if any.
            generated_at: canonical UTC timestamp (default now); data only, so a wrong
                clock changes the text, never the order or the replication.

        Returns:
            The stored record (durable when this returns).

        Raises:
            KnowledgeError: a field is invalid.
            StorageError: the shard could not write it (a full disk); nothing was kept
                or broadcast.
            SecurityError: on a secured mesh, this node's key has no signing key.
        """
        self._ready_to_write()
        try:
            record = self.shard.remember(about, finding, context=context, severity=severity,
                                         generated_at=generated_at)
        except StorageError:
            self.counters["storage.write-failed"] += 1
            raise
        self.async_broadcast(record)
        return record

    def _use_keys(self) -> None:
        """On a secured node, have the shard sign and check records (once started)."""
        if self._keys_in_use:
            return
        security = self.node.security
        if security is None:
            return  # unsecured, or not started yet (nothing arrives before the start)
        try:
            signer: RecordSigner | None = RecordSigner(security.identity)
        except SecurityError as exc:
            # Others' records are still checked and merged; this node's own writes are
            # refused with the way out (peers would refuse them unsigned).
            log.error("%s", exc)
            self._signer_error, signer = exc, None
        self.shard.use_signatures(sign=signer, verify=RecordVerifier(security.store))
        self._keys_in_use = True

    def _ready_to_write(self) -> None:
        self._use_keys()
        if self._signer_error is not None:
            raise self._signer_error
        if self.node.config.secured and not self._keys_in_use:
            raise KnowledgeError("on a secured mesh records are signed with the node's key, "
                                 "which is loaded when the node starts: start the node first")

    def async_retract(self, observation: str | bytes) -> Record:
        """Retract an observation everywhere, permanently.

        Args:
            observation: its IRI, hex id or 32-byte id.

        Returns:
            The retraction record (durable when this returns).

        Raises:
            KnowledgeError: no such observation here, or it is already retracted.
            StorageError: the shard could not write it (a full disk).
        """
        self._ready_to_write()
        try:
            record = self.shard.retract(observation)
        except StorageError:
            self.counters["storage.write-failed"] += 1
            raise
        self.async_broadcast(record)
        return record

    def async_broadcast(self, record: Record) -> None:
        """Broadcast a record this node wrote (again, if need be: duplicates are harmless)."""
        self._broadcasts += 1
        if self.drop_every and self._broadcasts % self.drop_every == 0:
            self.counters["fault.dropped-broadcast"] += 1
            return
        self.node.async_publish_kind(KIND_SYNC, encode_sync(Records((record,))))
        self.counters["sent.Records"] += 1

    def query(self, sparql: str, *, row_limit: int | None = None) -> QueryResult:
        """Run a read-only query on the local shard, as the agent tools want it.

        Safe to call from any one thread besides the loop (Oxigraph reads run beside the
        loop's writes), which keeps a slow query from stalling the node's heartbeats.

        Raises:
            QueryError: refused, invalid, or past its deadline.
        """
        result = (self.shard.query(sparql) if row_limit is None
                  else self.shard.query(sparql, row_limit=row_limit))
        if result.boolean is not None:
            return QueryResult(("answer",), ({"answer": str(result.boolean).lower()},), False)
        return QueryResult(result.variables, tuple(result.items()), result.truncated)

    # -- waiting (for command-line tools and tests) ------------------------------------------

    def caught_up_from(self) -> frozenset[str]:
        """Peers this replica has finished a catch-up from (since they joined)."""
        return frozenset(self._caught_up)

    def answered_by(self) -> frozenset[str]:
        """Peers that have answered on the sync path (since they joined), including those
        that said they run no replica."""
        return frozenset(self._answered)

    def without_replica(self) -> frozenset[str]:
        """Peers that said they run no knowledge replica (recently: see NO_SYNC_BACKOFF)."""
        return frozenset(self._no_sync)

    async def wait_caught_up(self, count: int, timeout: float) -> None:
        """Wait until catch-ups from ``count`` peers have finished.

        Raises:
            TimeoutError: not within ``timeout`` seconds (the message says how far it got).
        """
        try:
            await self._wait(lambda: len(self._caught_up) >= count, timeout)
        except TimeoutError:
            done, total = self.progress or (0, 0)
            raise TimeoutError(
                f"catch-up from {count} peer(s) not finished within {timeout}s "
                f"({len(self._caught_up)} done; {done}/{total} records of the current one)"
            ) from None

    async def _wait(self, cond: Callable[[], bool], timeout: float) -> None:
        if cond():
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (cond, fut)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(fut, timeout)
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(entry)

    def _wake(self) -> None:
        for cond, fut in list(self._waiters):
            if not fut.done() and cond():
                fut.set_result(None)

    async def peer_holds(self, peer: str, origin: str, seq: int, timeout: float) -> bool:
        """Ask ``peer`` whether it holds record ``(origin, seq)`` (a one-record pull).

        Returns:
            ``True`` if its answer carries the record, ``False`` if it answered without it.

        Raises:
            TimeoutError: no answer within ``timeout`` seconds.
            UnknownPeerError: ``peer`` is not connected.
        """
        request = PullRequest(origin, seq, seq)
        key = (peer, _asked_key(request) or ())
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._probes[key] = fut
        try:
            self._asked[key] = (request, time.monotonic())
            self.node.async_send_kind(peer, KIND_SYNC, encode_sync(request))
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._probes.pop(key, None)

    # -- sync protocol -------------------------------------------------------------------

    def _send(self, peer: str, message: SyncMessage, reply: Reply | None = None) -> None:
        key = _asked_key(message)
        if key is not None and isinstance(message, PullRequest | CatchupRequest | Digest):
            self._asked[(peer, key)] = (message, time.monotonic())
        try:
            payload = encode_sync(message)
            if reply is not None:
                reply(KIND_SYNC, payload)
            else:
                self.node.async_send_kind(peer, KIND_SYNC, payload)
        except PorterError as exc:  # the peer left meanwhile, or the message is too big
            if key is not None:
                self._asked.pop((peer, key), None)
            log.debug("sync %s to %s not sent: %s", type(message).__name__, peer, exc)
            return
        self.counters["sent." + type(message).__name__] += 1

    def _refuse(self, peer: str, reason: str, error: Exception) -> None:
        self.node.count_drop("sync." + reason, peer)
        if (reason, peer) in self._refusals_logged or len(self._refusals_logged) > 10_000:
            log.debug("refused sync from %s (%s): %s", peer, reason, error)
            return
        self._refusals_logged.add((reason, peer))
        log.warning("refused a sync message from %s (%s): %s (further refusals of this kind "
                    "from %s are only counted)", peer, reason, error, peer)

    def _on_sync(self, env: Envelope, payload: bytes, reply: Reply) -> None:
        peer = env.sender
        self._answered.add(peer)
        self._use_keys()
        try:
            message = decode_sync(payload)
        except SyncError as exc:
            self._refuse(peer, "malformed", exc)
            return
        self.counters["received." + type(message).__name__] += 1
        try:
            if isinstance(message, Records):
                self._accept_records(env, message)
            else:
                self._handle(peer, message, reply)
        except _Refused as exc:
            self._refuse(peer, exc.reason, exc)
        except SyncError as exc:
            self._refuse(peer, "refused", exc)
        except StorageError:
            # Not the peer's fault; the shard logged it. What was not written is not held,
            # so pulls and catch-ups ask for it again.
            self.counters["storage.write-failed"] += 1

    def _accept_records(self, env: Envelope, message: Records) -> None:
        if env.recipient is not None:
            raise _Refused("not-broadcast", "records are accepted unasked only by broadcast; "
                           "replies to pulls and catch-ups carry them otherwise")
        for record in message.records:
            if key_name(record.origin) != key_name(env.sender):
                raise _Refused("wrong-origin", f"{env.sender} broadcast a record written by "
                               f"{record.origin}: a node broadcasts only its own records")
        self._inbound.append((env.sender, message))
        if not self._merge_scheduled:
            self._merge_scheduled = True
            asyncio.get_running_loop().call_soon(self._merge_inbound)

    def _merge_inbound(self) -> None:
        """Merge the broadcast records of this loop iteration as one batch."""
        self._merge_scheduled = False
        inbound, self._inbound = self._inbound, []
        if not inbound or self._closed:
            return
        try:
            # Synced behind, off the loop (see _flush_behind): broadcast records are
            # acknowledged to no one, and the shard serves none before its sync.
            report = self.shard.merge([r for _, m in inbound for r in m.records],
                                      durable=False)
            self._flush_soon()
        except StorageError:
            # Nothing of the batch is held: gap pulls and digests bring it again later.
            self.counters["storage.write-failed"] += 1
            return
        except SyncError:
            # Someone sent a record that cannot go in; find out who, keep the others.
            report = None
            for peer, message in inbound:
                try:
                    self._merged(self.shard.merge(message.records), peer)
                except SyncError as exc:
                    self._refuse(peer, "refused", exc)
                except StorageError:
                    self.counters["storage.write-failed"] += 1
        if report is not None:
            self._merged(report, inbound[-1][0], broadcast=True)

    def _sync_journal(self) -> asyncio.Future[None]:
        """A future done once a journal sync that starts after this call has ended.

        Group commit on the loop: one sync runs at a time on a worker thread; whoever
        asks while it runs waits for the next one, which covers them all, so a burst of
        Remembers costs one thread hop and one ``fdatasync`` per group, not per record.
        """
        waiting = self._next_sync
        if waiting is None:
            waiting = self._next_sync = asyncio.get_running_loop().create_future()
            if self._syncing is None:
                self._start_sync()
        return waiting

    def _start_sync(self) -> None:
        waiting, self._next_sync = self._next_sync, None
        assert waiting is not None
        self._syncing = asyncio.ensure_future(self._run_sync(waiting))

    async def _run_sync(self, done: asyncio.Future[None]) -> None:
        try:
            await asyncio.to_thread(self.shard.flush)
        except (StorageError, KnowledgeError) as exc:  # a failed sync, or a closed shard
            if isinstance(exc, StorageError):
                self.counters["storage.sync-failed"] += 1
            if not done.done():
                done.set_exception(exc)
        else:
            if not done.done():
                done.set_result(None)
        finally:
            self._syncing = None
            if self._next_sync is not None:
                self._start_sync()

    def _flush_soon(self) -> None:
        """Have merged records synced behind, without waiting (nobody is answered)."""
        self._sync_journal().add_done_callback(_retrieved)

    def _merged(self, report: MergeReport, peer: str, *, broadcast: bool = False) -> None:
        if report.refused:
            self._forged(report, peer, broadcast=broadcast)
        self.counters["merged.records"] += report.accepted
        self.counters["merged.duplicates"] += report.duplicates
        if report.accepted:
            self._pull_gaps(prefer=peer)
            self._notify("merged", report)
            self._wake()

    def _forged(self, report: MergeReport, peer: str, *, broadcast: bool) -> None:
        """Count and audit records refused for their signatures.

        Args:
            report: the merge that left them out.
            peer: the peer whose message carried them.
            broadcast: the records came in a batch of broadcasts, where each sender
                carries only its own records: each was sent by its claimed author.
        """
        security = self.node.security
        for refused in report.refused:
            if broadcast:
                peer = refused.origin
            self.counters["refused." + refused.reason] += 1
            origin = refused.origin
            if (origin not in self.refused_by_origin
                    and len(self.refused_by_origin) >= MAX_REFUSED_ORIGINS):
                origin = "(others)"
            self.refused_by_origin[origin] += 1
            self.node.count_drop("sync.forged", peer)
            if security is not None:
                # Audited under the claimed author: one warning per author, however many
                # peers relay its forgeries.
                security.audit.record(
                    "forged-record",
                    f"refused record ({refused.origin}, {refused.seq}) relayed by {peer}: "
                    f"{refused.reason} (it does not carry {refused.origin}'s signature)",
                    peer=refused.origin)

    def _handle(self, peer: str, message: SyncMessage, reply: Reply) -> None:
        asked: SyncMessage | None = None
        key = _asked_key(message)
        is_reply = isinstance(message, PullReply | CatchupChunk | BucketEntries)
        if is_reply:
            entry = self._asked.get((peer, key or ()))
            if entry is None:
                raise _Refused("unasked", f"{type(message).__name__} that was not asked for "
                               "(or came too late)")
            asked = entry[0]
        if (isinstance(message, CatchupChunk) and isinstance(asked, CatchupRequest)
                and message.done != asked.done + len(message.records)):
            # The answer to an earlier request of this catch-up that timed out: the one
            # now asked for is still on its way.
            raise _Refused("stale", f"catch-up chunk ending at {message.done} does not follow "
                           f"{asked.done}: a late answer to an earlier request")
        if isinstance(message, BucketEntries):
            message = self._without_conflicts(peer, message)
        prefetched = False
        if (isinstance(message, CatchupChunk) and isinstance(asked, CatchupRequest)
                and message.cursor is not None):
            # Ask for the next chunk before merging this one, so that the peer reads it
            # from its journal meanwhile (the request the shard would make next).
            self._send(peer, CatchupRequest(asked.vv, message.cursor, message.done,
                                            asked.limit))
            prefetched = True
        try:
            outcome = self.shard.handle(message, asked=asked)
        except SyncError as exc:
            if isinstance(message, CatchupChunk):
                self._catchup_failed(peer, str(exc))
            raise _Refused("refused", str(exc)) from None
        except StorageError as exc:
            if isinstance(message, CatchupChunk):
                self._catchup_failed(peer, str(exc))
            raise
        if is_reply and not prefetched:
            self._asked.pop((peer, key or ()), None)
        if isinstance(message, PullReply):
            probe = self._probes.get((peer, key or ()))
            if probe is not None and not probe.done():
                probe.set_result(bool(message.records))
        if outcome.merged is not None:
            self._merged(outcome.merged, peer)
        if outcome.progress is not None:
            self.progress = outcome.progress
            done, total = outcome.progress
            log.info("catch-up from %s: %d/%d records", peer, done, total)
            self._notify("progress", outcome.progress)
        replies = outcome.replies
        if isinstance(message, BucketEntries) and len(replies) > CATCHUP_AFTER_PULLS:
            # Much is missing: one catch-up brings it in order, in a few large chunks.
            self._caught_up.discard(peer)
            self._queue_catchup(peer)
            replies = ()
        for out in replies:
            if prefetched and isinstance(out, CatchupRequest):
                continue  # asked for already
            asking = isinstance(out, PullRequest | CatchupRequest)
            self._send(peer, out, None if asking else reply)
        if isinstance(message, Digest) and outcome.replies:
            # The digests differ: let the peer list what it has for us too.
            self._send_digest(peer, reply_only_if_due=True)
        if isinstance(message, CatchupChunk) and outcome.finished:
            self._catchup_done(peer)

    def _without_conflicts(self, peer: str, listing: BucketEntries) -> BucketEntries:
        """The listing without the entries that conflict with records held here.

        Two honest replicas can hold different records at one ``(origin, seq)`` when a
        forging node fed them different versions. Those slots can never agree, but they
        must not stop the rest of the listing from repairing both sides.
        """
        mine = {(o, s): k for o, s, k in self.shard.state.bucket_entries(
            listing.buckets).entries}
        keep = tuple(e for e in listing.entries if mine.get((e[0], e[1]), e[2]) == e[2])
        if len(keep) == len(listing.entries):
            return listing
        clash = next(e for e in listing.entries if mine.get((e[0], e[1]), e[2]) != e[2])
        self._refuse(peer, "conflict", SyncError(
            f"{len(listing.entries) - len(keep)} listed record(s) differ from those held "
            f"here, e.g. ({clash[0]}, {clash[1]}): a node fed them forged records"))
        return BucketEntries(listing.buckets, keep, listing.more)

    def _pull_gaps(self, *, prefer: str | None = None) -> None:
        if self._catchup_peer is not None:
            return  # the catch-up brings them
        connected = self._sync_peers()
        if not connected:
            return
        for request in self.shard.missing_ranges():
            key = _asked_key(request)
            if any((p, key) in self._asked for p in connected):
                continue
            if request.origin in connected:
                target = request.origin
            elif prefer in connected and prefer is not None:
                target = prefer
            else:
                target = connected[next(self._rr) % len(connected)]
            self._send(target, request)

    # -- catch-up and anti-entropy ---------------------------------------------------------

    def _on_peer(self, event: PeerEvent) -> None:
        name = event.peer.name
        if event.kind is PeerEventKind.JOINED:
            self._catchup_failures.pop(name, None)
            self._queue_catchup(name)
        elif event.kind is PeerEventKind.LEFT:
            for key in [k for k in self._asked if k[0] == name]:
                del self._asked[key]
            self._caught_up.discard(name)
            self._answered.discard(name)
            self._no_sync.pop(name, None)  # a restarted peer may run a replica now
            self._digest_sent.pop(name, None)
            with contextlib.suppress(ValueError):
                self._catchup_queue.remove(name)
            if self._catchup_peer == name:
                self._catchup_peer = None
                self._next_catchup()

    def _is_seat(self, name: str) -> bool:
        """A short-lived command-line seat: its replica is a throw-away copy of ours."""
        info = self.node.peer(name)
        return info is not None and info.advert.role == C.ROLE_SEAT

    def _queue_catchup(self, name: str) -> None:
        if (name in self._caught_up or name in self._catchup_queue
                or name == self._catchup_peer or name in self._no_sync
                or self._is_seat(name)):
            return
        self._catchup_queue.append(name)
        self._next_catchup()

    def _next_catchup(self) -> None:
        while self._catchup_peer is None and self._catchup_queue:
            name = self._catchup_queue.popleft()
            if self.node.peer(name) is None:
                continue
            self._catchup_peer = name
            self.progress = (0, 0)
            self._send(name, self.shard.catchup_request(limit=CATCHUP_CHUNK))
            if (name, ("catchup",)) not in self._asked:  # could not be sent
                self._catchup_peer = None

    def _catchup_done(self, peer: str) -> None:
        self._caught_up.add(peer)
        self._catchup_peer = None
        self._catchup_failures.pop(peer, None)
        self.counters["catchups"] += 1
        self._notify("caught-up", peer)
        self._wake()
        self._next_catchup()
        self._pull_gaps()

    def _on_unsupported(self, env: Envelope, payload: bytes, reply: Reply) -> None:
        """A peer runs no knowledge replica (the human's seat, a tool): never ask it."""
        peer = env.sender
        self._answered.add(peer)
        self._no_sync[peer] = time.monotonic() + NO_SYNC_BACKOFF
        for key in [k for k in self._asked if k[0] == peer]:
            del self._asked[key]
        if self._catchup_peer == peer:
            self._catchup_peer = None
            self._next_catchup()

    def _sync_peers(self) -> list[str]:
        """Connected peers that run a knowledge replica (as far as we know), seats aside."""
        return sorted(p.name for p in self.node.peers()
                      if p.name not in self._no_sync and p.advert.role != C.ROLE_SEAT)

    def _catchup_failed(self, peer: str, why: str) -> None:
        """A chunk was refused or never came: start that peer's catch-up over, or skip it."""
        self._asked.pop((peer, ("catchup",)), None)
        if self._catchup_peer != peer:
            return
        self._catchup_peer = None
        self._catchup_failures[peer] += 1
        if self._catchup_failures[peer] >= CATCHUP_ATTEMPTS:
            log.warning("giving up catch-up from %s after %d attempts (%s); anti-entropy "
                        "goes on", peer, CATCHUP_ATTEMPTS, why)
            self.counters["catchup.abandoned"] += 1
        else:
            self._catchup_queue.appendleft(peer)
        self._next_catchup()

    def _send_digest(self, peer: str, *, reply_only_if_due: bool = False) -> None:
        now = time.monotonic()
        if reply_only_if_due and now - self._digest_sent.get(peer, 0.0) < (
                self.anti_entropy_interval / 2):
            return
        self._digest_sent[peer] = now
        self._send(peer, self.shard.digest())

    async def _tick_loop(self) -> None:
        last_digest = time.monotonic()
        while True:
            await asyncio.sleep(min(_TICK, self.anti_entropy_interval))
            try:
                self._tick(time.monotonic(), last_digest)
                if time.monotonic() - last_digest >= self.anti_entropy_interval:
                    last_digest = time.monotonic()
            except Exception:
                log.exception("knowledge tick failed")

    def _tick(self, now: float, last_digest: float) -> None:
        for key, (message, sent) in list(self._asked.items()):
            limit = (self.catchup_timeout if isinstance(message, CatchupRequest)
                     else self.request_timeout)
            if now - sent <= limit:
                continue
            del self._asked[key]
            if isinstance(message, Digest):
                continue  # equal digests get no answer: nothing to time out
            self.counters["timeout." + type(message).__name__] += 1
            if isinstance(message, CatchupRequest):
                self._catchup_failed(key[0], "no answer")
        for peer, until in list(self._no_sync.items()):
            if now >= until:
                del self._no_sync[peer]
                self._queue_catchup(peer)
        self._pull_gaps()
        if self._catchup_peer is None and now - last_digest >= self.anti_entropy_interval:
            peers = self._sync_peers()
            if peers:
                self._send_digest(peers[next(self._rr) % len(peers)])

    def add_listener(self, listener: Callable[[str, Any], None]) -> Callable[[], None]:
        """Call ``listener(event, detail)`` on the loop thread: ``merged`` (a
        :class:`~porter_mesh.adapters.shard.MergeReport`), ``progress`` (``(done,
        total)``), ``caught-up`` (the peer's name).

        Returns:
            A function that removes the listener.
        """
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def _notify(self, event: str, detail: Any) -> None:
        for listener in list(self._listeners):
            try:
                listener(event, detail)
            except Exception:
                log.exception("knowledge listener failed")

    def summary(self) -> dict[str, Any]:
        """The replica's size and digest, cheaply (the node's view shows it):
        ``observations`` and ``retractions`` recorded, ``origins``, ``digest`` (hex),
        ``data_dir``, the peer a catch-up runs from (or ``None``), ``write_failures``
        (journal writes that failed: a full disk) and ``forged`` (records refused for
        their signatures)."""
        state = self.shard.state
        return {"observations": state.observation_records,
                "retractions": state.retraction_records,
                "origins": len(state.version_vector()), "digest": state.digest().top.hex(),
                "data_dir": str(self.shard.data_dir), "catching_up_from": self._catchup_peer,
                "write_failures": self.shard.write_failures,
                "forged": sum(self.refused_by_origin.values())}

    def stats(self) -> dict[str, Any]:
        """Shard summary plus replication counters.

        Returns:
            ``observations``, ``observation_records``, ``retractions``,
            ``version_vector``, ``digest`` (hex), ``records``, ``write_failures`` (journal
            writes that failed), ``checks_signatures``, ``refused_by_origin`` (records
            refused for their signatures, per claimed author), ``store_error`` (only while
            the store is being recovered; ``observations`` is then ``None``), and the counters
            (``sent.*``, ``received.*``, ``merged.*``, ``timeout.*``, ``catchups``,
            ``refused.*``, ``storage.write-failed``...).
        """
        try:
            st = self.shard.stats()
        except KnowledgeError as exc:  # the store is being recovered: what the state says
            state = self.shard.state
            return {"observations": None, "observation_records": state.observation_records,
                    "retractions": state.retraction_records,
                    "records": state.record_count, "version_vector": state.version_vector(),
                    "digest": state.digest().top.hex(),
                    "write_failures": self.shard.write_failures, "store_error": str(exc),
                    "checks_signatures": self.shard.checks_signatures,
                    "refused_by_origin": dict(self.refused_by_origin), **dict(self.counters)}
        return {"observations": st.observations, "observation_records": st.observation_records,
                "retractions": st.retractions, "records": st.observation_records
                + st.retractions, "version_vector": st.version_vector, "digest": st.digest,
                "write_failures": st.write_failures,
                "checks_signatures": self.shard.checks_signatures,
                "refused_by_origin": dict(self.refused_by_origin), **dict(self.counters)}


class SyncKnowledge:
    """The knowledge replica for synchronous callers (the agent tools' port).

    Args:
        sync_node: the :class:`~porter_mesh.node.sync.SyncNode` the replica rides on.
        knowledge: the replica, started on that node's loop.
    """

    def __init__(self, sync_node: Any, knowledge: Knowledge) -> None:
        self._node = sync_node
        self.knowledge = knowledge
        self._first_write_done = False

    def remember(self, activity: Activity) -> None:
        """Store durably and replicate (returns once stored). Threads that call it at
        once share their ``fdatasync`` (see :meth:`Knowledge.aremember`).

        The first write waits (up to :data:`FIRST_WRITE_WAIT` seconds) for a first
        catch-up when peers are known: a node whose data directory was lost learns its
        own earlier records, and so its next sequence number, from its peers.

        Raises:
            KnowledgeError: the activity is not a valid Remember.
            OperationTimeout: the node did not answer in time.
        """
        if not self._first_write_done:
            self._first_write_done = True
            if self._node.peers() and not self.knowledge.caught_up_from():
                with contextlib.suppress(TimeoutError):
                    self._node.run_coroutine(self.knowledge.wait_caught_up(1, FIRST_WRITE_WAIT),
                                             FIRST_WRITE_WAIT + 5.0)
        self._node.run_coroutine(self.knowledge.aremember(activity), REMEMBER_TIMEOUT)

    def recall(self, sparql: str) -> QueryResult:
        """Run a read-only query on the local shard (on the caller's thread, so the node
        keeps its heartbeats while a slow query runs).

        Raises:
            QueryError: refused, invalid, or past its deadline.
        """
        return self.knowledge.query(sparql)

    def stats(self) -> dict[str, Any]:
        """Shard summary plus replication counters."""
        result: dict[str, Any] = self._node.call_in_loop(self.knowledge.stats)
        return result

    def close(self) -> None:
        """Stop replicating and close the shard."""
        self._node.run_coroutine(self.knowledge.aclose(), 30.0)


def attach_knowledge(sync_node: Any, data_dir: pathlib.Path, **options: Any) -> SyncKnowledge:
    """Open the shard in ``data_dir`` and keep it replicated through ``sync_node``.

    Args:
        sync_node: a started :class:`~porter_mesh.node.sync.SyncNode`.
        data_dir: the shard's directory (created if missing).
        options: passed to :class:`Knowledge`.

    Returns:
        The replica's synchronous facade.

    Raises:
        KnowledgeError: the shard cannot be opened (in use, damaged).
    """
    node: Node = sync_node.node

    def make() -> Knowledge:
        shard = Shard(data_dir, agent=node.name)
        knowledge = Knowledge(node, shard, **options)
        knowledge.start()
        return knowledge

    knowledge: Knowledge = sync_node.call_in_loop(make, 60.0)
    return SyncKnowledge(sync_node, knowledge)
