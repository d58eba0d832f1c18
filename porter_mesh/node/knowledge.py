"""The knowledge replica of a node: a :class:`~porter_mesh.adapters.shard.Shard` kept in
step with the other nodes' replicas.

Theory of operation
-------------------
Replication rides on the node's extension kind ``sync`` (msgpack messages of
:mod:`porter_mesh.core.knowledge`). Every rule of the protocol (which ranges are asked
and from whom, the catch-up queue with its prefetch, retries and skipped peers, gap pulls
waiting behind a catch-up, the digests' round robin, the refusals of unasked, stale,
out-of-range and misdirected messages, the request and catch-up timeouts) lives in the
pure :class:`~porter_mesh.core.session.sync.SyncSession`, whose theory of operation says
what each one is. :class:`Knowledge` is its driver: it feeds the session the peers'
comings and goings, the sync messages, this node's own records, the storage's answers
and the timer, and carries out the actions it returns in order (send, broadcast, merge
into the shard, read from it to answer, count, log). It arms one timer
(``loop.call_at``) at the session's ``next_deadline()``: an idle node wakes only for the
session's own deadlines (the next digest while a peer runs a replica, a request's
timeout), never on a polling tick. Every shard call runs on the node's loop thread
(queries excepted, see :meth:`Knowledge.query`).

* **Broadcast.** ``remember`` and ``retract`` make the record durable in the local
  shard, then broadcast it (``Records``) on ``control``; the AS2 ``Remember`` activity
  also goes out on ``log`` for people and observers. Records that the session lets in
  during one loop iteration are merged as one batch (one journal write, one fsync, run
  behind); a batch that is refused is merged again message by message, so one bad
  sender cannot make a good one's records wait.
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
  all are refused before anything is stored (the session judges the messages, the
  shard's merge plan the records), counted in the node's counters as
  ``dropped.sync.<reason>``, and logged once per peer and reason.

Sequence numbers are never reused: the shard assigns one past the highest it holds from
its own agent, and that survives a restart in the journal. Timestamps are data only
(``generatedAtTime``), so clock skew cannot reorder or lose anything.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

from porter_mesh.adapters.security import RecordSigner, RecordVerifier
from porter_mesh.adapters.shard import MergeReport, Shard
from porter_mesh.core import constants as C
from porter_mesh.core.as2 import Activity
from porter_mesh.core.envelope import KIND_SYNC, Envelope
from porter_mesh.core.knowledge import (
    Observation,
    PullRequest,
    Record,
    encode_sync,
    format_timestamp,
)
from porter_mesh.core.peers import PeerEvent, PeerEventKind
from porter_mesh.core.session.sync import (
    Abandoned,
    Answer,
    Broadcast,
    CaughtUp,
    Count,
    Merge,
    Progress,
    PullAnswered,
    Refuse,
    Send,
    SyncAction,
    SyncSession,
)
from porter_mesh.errors import (
    ActivityError,
    KnowledgeError,
    PorterError,
    SecurityError,
    StorageError,
    SyncError,
    UnknownPeerError,
)
from porter_mesh.node.node import Node, Reply
from porter_mesh.node.timer import DeadlineTimer
from porter_mesh.tools.port import QueryResult

__all__ = ["Knowledge", "SyncKnowledge", "attach_knowledge"]

log = logging.getLogger("porter_mesh.knowledge")

#: Claimed authors of refused records counted one by one (then as ``(others)``).
MAX_REFUSED_ORIGINS: Final = 1000
#: Seconds an agent's first write waits for a first catch-up (see SyncKnowledge.remember).
FIRST_WRITE_WAIT: Final = 10.0
#: Turns of the event loop a group commit waits, after answering its Remembers, for
#: their callers to come back with the next ones (see Knowledge._run_syncs).
REFILL_TURNS: Final = 8
#: Remembers written, signed and indexed by one group commit at most: the group's work
#: runs on the loop thread, so a burst larger than this goes in several groups and the
#: loop (heartbeats, reads) runs between them.
MAX_GROUP: Final = 256
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


def _sync_cancelled() -> KnowledgeError:
    return KnowledgeError("the journal's sync was cancelled (the replica is closing), so "
                          "this Remember is not known to be durable; remember it again "
                          "once the node runs")


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark a shared sync's outcome as seen (its failure is counted where it happens)."""
    if not future.cancelled():
        future.exception()


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
        if drop_every < 0:
            raise KnowledgeError("drop_every must be >= 0 (0 disables the fault injection)")
        self.node = node
        self.shard = shard
        self.anti_entropy_interval = anti_entropy_interval
        self.request_timeout = request_timeout
        self.catchup_timeout = catchup_timeout
        self.drop_every = drop_every
        self.counters: collections.Counter[str] = collections.Counter()
        #: The protocol's rules; this object carries out what it says.
        self.session = SyncSession(shard.state, anti_entropy_interval=anti_entropy_interval,
                                   request_timeout=request_timeout,
                                   catchup_timeout=catchup_timeout, now=time.monotonic())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: DeadlineTimer | None = None
        self._broadcasts = 0
        self._inbound: list[Merge] = []
        self._merge_scheduled = False
        self._listeners: list[Callable[[str, Any], None]] = []
        self._waiters: list[tuple[Callable[[], bool], asyncio.Future[None]]] = []
        self._probes: dict[tuple[str, PullRequest], asyncio.Future[bool]] = {}
        self._refusals_logged: set[tuple[str, str]] = set()
        self._remove_listener: Callable[[], None] | None = None
        self._closed = False
        #: Records refused for their signatures, per claimed author.
        self.refused_by_origin: collections.Counter[str] = collections.Counter()
        self._keys_in_use = False
        self._signer_error: SecurityError | None = None
        #: Done with the records it wrote once the next sync has ended.
        self._next_sync: asyncio.Future[list[Record]] | None = None
        #: Remembers waiting for the next sync, which writes them first as one batch.
        self._next_writes: list[Observation] = []
        self._syncing: asyncio.Future[None] | None = None

    @property
    def progress(self) -> tuple[int, int] | None:
        """``(done, total)`` of the catch-up running or last finished."""
        return self.session.progress

    # -- lifecycle ----------------------------------------------------------------------

    @staticmethod
    def expect(node: Node) -> None:
        """Before ``node`` starts, when its replica starts after it (the shard opened
        while the node already beats): what peers send for the replica meanwhile waits
        for it, instead of being answered ``unsupported``, which would tell them (and a
        command line looking for a replica) that this node keeps none."""
        node.expect_kind(KIND_SYNC)

    def start(self) -> None:
        """Hook into the node and the loop's clock (on the loop thread).

        Called before the node starts, no peer and no sync message is missed.
        """
        self._loop = asyncio.get_running_loop()
        self._timer = DeadlineTimer(self._loop, self._on_timer)
        self.node.register_kind(KIND_SYNC, self._on_sync)
        self.node.register_unsupported(KIND_SYNC, self._on_unsupported)
        self._remove_listener = self.node.add_peer_listener(self._on_peer)
        self.node.view_sections["knowledge"] = self.summary
        now = time.monotonic()
        for peer in self.node.peers():
            self._carry(self.session.peer_joined(
                peer.name, seat=peer.advert.role == C.ROLE_SEAT, now=now))
        self._rearm()

    async def aclose(self) -> None:
        """Stop replicating and close the shard (records merged so far are durable)."""
        self._loop = None
        # The node runs on: peers asking for sync are told this node has no replica.
        self.node.unregister_kind(KIND_SYNC)
        if self._timer is not None:
            self._timer.close()  # nothing is armed from now on
        if self._remove_listener is not None:
            with contextlib.suppress(ValueError):
                self._remove_listener()
            self._remove_listener = None
        self._merge_inbound()
        while self._syncing is not None:  # what was merged is durable before the shard closes
            with contextlib.suppress(BaseException):
                # Shielded: a close that is given up on must not cancel a sync others wait on.
                await asyncio.shield(self._syncing)
        self.node.view_sections.pop("knowledge", None)
        self._closed = True
        for _, fut in self._waiters:
            if not fut.done():
                fut.cancel()
        for probe in self._probes.values():
            if not probe.done():
                probe.cancel()
        # Off the loop: closing a large shard writes the copy of its index on disk (some
        # seconds for 100k observations the first time), and the node still runs.
        await asyncio.to_thread(self.shard.close)

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

        Group commit: one sync runs at a time, on a worker thread. The Remembers that
        arrive meanwhile wait for the next one, which first writes them all on the loop
        thread (one journal write, one batch for the index), then syncs them with one
        ``fdatasync``. Their records are broadcast once durable, together, in one
        message as far as the size limits allow (the peers merge them as one batch),
        and only then does this return.

        Args:
            activity: a ``Remember`` (see :meth:`async_remember`).

        Returns:
            The stored record.

        Raises:
            KnowledgeError: the activity is not such a Remember; or the replica closed
                before its sync ended (it is not known to be durable).
            StorageError: the shard could not write or sync it; nothing was broadcast.
        """
        about, finding, severity = _remembered(activity)
        self._ready_to_write()
        agent = self.shard.agent
        if agent is None:
            raise KnowledgeError("this node's shard was opened without an agent name, so "
                                 "it cannot write records")
        # Checked now: a bad field fails this Remember alone, never its group.
        obs = Observation(about, finding, agent, format_timestamp(time.time()),
                          activity.context, severity)
        while len(self._next_writes) >= MAX_GROUP:
            # The next group is full: wait for it to be synced, then join the one after.
            with contextlib.suppress(Exception):
                await asyncio.shield(self._sync_journal())
        place = len(self._next_writes)
        self._next_writes.append(obs)
        # Shielded: a caller that gives up must not cancel the sync others share.
        record = (await asyncio.shield(self._sync_journal()))[place]
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
        self._carry(self.session.local_record(record))

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
        return self.session.caught_up

    def answered_by(self) -> frozenset[str]:
        """Peers that have answered on the sync path (since they joined), including those
        that said they run no replica."""
        return self.session.answered

    def without_replica(self) -> frozenset[str]:
        """Peers that said they run no knowledge replica (within the last
        :data:`~porter_mesh.core.session.sync.NO_SYNC_BACKOFF` seconds)."""
        return self.session.without_replica

    async def wait_caught_up(self, count: int, timeout: float) -> None:
        """Wait until catch-ups from ``count`` peers have finished.

        Raises:
            TimeoutError: not within ``timeout`` seconds (the message says how far it got).
        """
        try:
            await self._wait(lambda: len(self.session.caught_up) >= count, timeout)
        except TimeoutError:
            done, total = self.progress or (0, 0)
            raise TimeoutError(
                f"catch-up from {count} peer(s) not finished within {timeout}s "
                f"({len(self.session.caught_up)} done; {done}/{total} records of the current one)"
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
        if self.node.peer(peer) is None:
            raise UnknownPeerError(f"no connected peer {peer!r}", recipient=peer)
        key = (peer, PullRequest(origin, seq, seq))
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._probes[key] = fut
        try:
            self._carry(self.session.probe(peer, origin, seq, now=time.monotonic()))
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._probes.pop(key, None)

    # -- carrying out the session's actions ------------------------------------------------

    def _carry(self, actions: Sequence[SyncAction], reply: Reply | None = None) -> None:
        """Carry out the session's actions in order, then arm the timer for its next
        deadline. ``reply`` answers the message being handled, if any."""
        for action in actions:
            if isinstance(action, Send):
                self._send(action, reply)
            elif isinstance(action, Merge):
                if action.broadcast:
                    self._merge_later(action)
                else:
                    self._merge_now(action)
            elif isinstance(action, Answer):
                self._answer(action, reply)
            elif isinstance(action, Count):
                self.counters[action.name] += action.n
            elif isinstance(action, Refuse):
                self._refuse(action.peer, action.reason, action.detail)
            elif isinstance(action, Broadcast):
                self._broadcast(action)
            elif isinstance(action, Progress):
                log.info("catch-up from %s: %d/%d records", action.peer, action.done,
                         action.total)
                self._notify("progress", (action.done, action.total))
            elif isinstance(action, CaughtUp):
                self._notify("caught-up", action.peer)
                self._wake()
            elif isinstance(action, PullAnswered):
                probe = self._probes.get((action.peer, action.request))
                if probe is not None and not probe.done():
                    probe.set_result(action.records > 0)
            elif isinstance(action, Abandoned):
                log.warning("giving up catch-up from %s after %d attempts (%s); anti-entropy "
                            "goes on", action.peer, action.attempts, action.why)
        self._rearm()

    def _send(self, action: Send, reply: Reply | None) -> None:
        message = action.message
        try:
            payload = encode_sync(message)
            if action.reply and reply is not None:
                reply(KIND_SYNC, payload)
            else:
                self.node.async_send_kind(action.peer, KIND_SYNC, payload)
        except PorterError as exc:  # the peer left meanwhile, or the message is too big
            log.debug("sync %s to %s not sent: %s", type(message).__name__, action.peer, exc)
            self._carry(self.session.not_sent(action, now=time.monotonic()))
            return
        self.counters["sent." + type(message).__name__] += 1

    def _broadcast(self, action: Broadcast) -> None:
        self._broadcasts += 1
        if self.drop_every and self._broadcasts % self.drop_every == 0:
            self.counters["fault.dropped-broadcast"] += 1
            return
        self.node.async_publish_kind(KIND_SYNC, encode_sync(action.message))
        self.counters["sent." + type(action.message).__name__] += 1

    def _answer(self, action: Answer, reply: Reply | None) -> None:
        """Read what a peer asked for from the shard and send it back."""
        request = action.request
        try:
            answer = (self.shard.answer_pull(request) if isinstance(request, PullRequest)
                      else self.shard.answer_catchup(request))
        except PorterError as exc:  # a closed shard, a journal that cannot be read
            log.warning("could not answer %s from %s: %s", type(request).__name__,
                        action.peer, exc)
            return
        self._send(Send(action.peer, answer, reply=True), reply)

    def _merge_now(self, action: Merge) -> None:
        """Merge a reply's records (durable before the session hears of them)."""
        now = time.monotonic()
        try:
            report = self.shard.merge(action.records, after=action.after)
        except SyncError as exc:
            self._carry(self.session.merge_refused(action, str(exc), now=now))
            return
        except StorageError as exc:
            # Not the peer's fault; the shard logged it. What was not written is not held,
            # so pulls and catch-ups ask for it again.
            self.counters["storage.write-failed"] += 1
            self._carry(self.session.merge_failed(action, str(exc), now=now))
            return
        self._merged(report, action.peer)
        self._carry(self.session.merged(action, report.accepted, now=now))

    def _merge_later(self, action: Merge) -> None:
        """Queue broadcast records for this loop iteration's batch."""
        self._inbound.append(action)
        if not self._merge_scheduled and self._loop is not None:
            self._merge_scheduled = True
            self._loop.call_soon(self._merge_inbound)

    def _rearm(self) -> None:
        """Have the one timer fire no later than the session's next deadline."""
        if self._timer is not None:
            self._timer.wake_by(self.session.next_deadline())

    def _on_timer(self, now: float) -> None:
        try:
            self._carry(self.session.timer(now))
        except Exception:
            log.exception("knowledge timer failed")
            self._rearm()

    def _refuse(self, peer: str, reason: str, detail: str) -> None:
        self.node.count_drop("sync." + reason, peer)
        if (reason, peer) in self._refusals_logged or len(self._refusals_logged) > 10_000:
            log.debug("refused sync from %s (%s): %s", peer, reason, detail)
            return
        self._refusals_logged.add((reason, peer))
        log.warning("refused a sync message from %s (%s): %s (further refusals of this kind "
                    "from %s are only counted)", peer, reason, detail, peer)

    # -- what the node hands over ----------------------------------------------------------

    def _on_sync(self, env: Envelope, payload: bytes, reply: Reply) -> None:
        # Never called once closed: aclose unregisters the kind first.
        self._use_keys()
        self._carry(self.session.receive(env.sender, payload,
                                         broadcast=env.recipient is None,
                                         now=time.monotonic()), reply)

    def _on_unsupported(self, env: Envelope, payload: bytes, reply: Reply) -> None:
        """A peer runs no knowledge replica (the human's seat, a tool): never ask it."""
        self._carry(self.session.peer_without_replica(env.sender, now=time.monotonic()))

    def _on_peer(self, event: PeerEvent) -> None:
        now = time.monotonic()
        if event.kind is PeerEventKind.JOINED:
            self._carry(self.session.peer_joined(
                event.peer.name, seat=event.peer.advert.role == C.ROLE_SEAT, now=now))
        elif event.kind is PeerEventKind.LEFT:
            self._carry(self.session.peer_left(event.peer.name, now=now))

    def _merge_inbound(self) -> None:
        """Merge the broadcast records of this loop iteration as one batch."""
        self._merge_scheduled = False
        inbound, self._inbound = self._inbound, []
        if not inbound or self._closed:
            return
        now = time.monotonic()
        try:
            # Synced behind, off the loop (see _flush_soon): broadcast records are
            # acknowledged to no one, and the shard serves none before its sync.
            report = self.shard.merge([r for m in inbound for r in m.records], durable=False)
            self._flush_soon()
        except StorageError:
            # Nothing of the batch is held: gap pulls and digests bring it again later.
            self.counters["storage.write-failed"] += 1
            return
        except SyncError:
            # Someone sent a record that cannot go in; find out who, keep the others.
            for merge in inbound:
                try:
                    one = self.shard.merge(merge.records)
                except SyncError as exc:
                    self._carry(self.session.merge_refused(merge, str(exc), now=now))
                except StorageError:
                    self.counters["storage.write-failed"] += 1
                else:
                    self._merged(one, merge.peer)
                    self._carry(self.session.merged(merge, one.accepted, now=now))
            return
        self._merged(report, inbound[-1].peer, broadcast=True)
        self._carry(self.session.merged(inbound[-1], report.accepted, now=now))

    def _sync_journal(self) -> asyncio.Future[list[Record]]:
        """A future done once a journal sync that starts after this call has ended.

        Group commit on the loop: one sync runs at a time on a worker thread; whoever
        asks while it runs waits for the next one, which covers them all, so a burst of
        Remembers costs one journal write, one thread hop, one ``fdatasync`` and one
        broadcast per group, not per record. The future's result is the records that
        sync wrote (the Remembers queued in ``_next_writes`` when it started, in order);
        it fails with the write's or the sync's error, and then none of them is
        broadcast or counts as stored.
        """
        waiting = self._next_sync
        if waiting is None:
            waiting = self._next_sync = asyncio.get_running_loop().create_future()
        if self._syncing is None:
            self._syncing = asyncio.ensure_future(self._run_syncs())
        return waiting

    async def _run_syncs(self) -> None:
        """Run the syncs asked for, one at a time, until none is."""
        try:
            while self._next_sync is not None:
                done, self._next_sync = self._next_sync, None
                writes, self._next_writes = self._next_writes, []
                try:
                    await self._run_sync(done, writes)
                except Exception:  # settled already; the syncs asked for go on
                    log.exception("a group of Remembers was stored but not broadcast "
                                  "(anti-entropy brings it to the peers)")
                # The callers just answered often remember again at once (a worker with
                # several findings). A few turns of the loop let them join the next
                # group instead of the one after it: without them, a steady stream of
                # N Remembers in flight settles into two groups of N/2 taking turns, one
                # syncing while the other waits, and each waits for two syncs.
                for _ in range(REFILL_TURNS if writes else 0):
                    if len(self._next_writes) >= len(writes):
                        break
                    await asyncio.sleep(0)
        finally:
            self._syncing = None
            waiting = self._next_sync
            if waiting is not None and not waiting.done():
                # Cancelled (the loop is closing): the Remembers queued for the next
                # group were never written; their callers are told so, never left waiting.
                self._next_sync, self._next_writes = None, []
                waiting.set_exception(_sync_cancelled())

    async def _run_sync(self, done: asyncio.Future[list[Record]],
                        writes: list[Observation]) -> None:
        """Write ``writes``, sync the journal, broadcast what it made durable, settle
        ``done``: whatever happens, cancellation included, ``done`` is settled (its
        callers never hang)."""
        try:
            await self._write_and_sync(done, writes)
        finally:
            if not done.done():  # cancelled before the sync ended: not known durable
                done.set_exception(_sync_cancelled())

    async def _write_and_sync(self, done: asyncio.Future[list[Record]],
                              writes: list[Observation]) -> None:
        records: list[Record] = []
        error: BaseException | None = None
        try:
            # On the loop thread, as every other write: the journal keeps the order of
            # the loop's events.
            records = self.shard.write_observations(writes)
        except Exception as exc:  # a full disk, a closed shard: the whole group fails
            if isinstance(exc, StorageError):
                self.counters["storage.write-failed"] += 1
            error = exc
        try:  # also what was merged from peers since the last sync
            await asyncio.to_thread(self.shard.flush)
        except Exception as exc:  # a failed sync, a closed shard
            if isinstance(exc, StorageError):
                self.counters["storage.sync-failed"] += 1
            error = exc
        try:
            if error is None and records:
                self.counters["remember.groups"] += 1
                self.counters["remember.grouped"] += len(records)
                if self._loop is not None:  # not once replication has stopped
                    self._carry(self.session.local_records(records))
        finally:
            if not done.done():
                if error is not None:
                    done.set_exception(error)
                else:
                    done.set_result(records)

    def _flush_soon(self) -> None:
        """Have merged records synced behind, without waiting (nobody is answered)."""
        self._sync_journal().add_done_callback(_retrieved)

    def _merged(self, report: MergeReport, peer: str, *, broadcast: bool = False) -> None:
        if report.refused:
            self._forged(report, peer, broadcast=broadcast)
        self.counters["merged.records"] += report.accepted
        self.counters["merged.duplicates"] += report.duplicates
        if report.accepted:
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
                "data_dir": str(self.shard.data_dir), "catching_up_from": self.session.catchup_peer,
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
                "write_failures": st.write_failures, "index": st.index,
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
    # Opened on the caller's thread, not the loop's: a new shard's files are created with
    # fsyncs, and a restart rebuilds its index from the journal, while the node's loop
    # must go on beating (its peers would see a silent node).
    shard = Shard(data_dir, agent=node.name)

    def make() -> Knowledge:
        try:
            knowledge = Knowledge(node, shard, **options)
            knowledge.start()
        except BaseException:
            shard.close()
            node.unregister_kind(KIND_SYNC)  # expected (Knowledge.expect) but not coming
            raise
        return knowledge

    knowledge: Knowledge = sync_node.call_in_loop(make, 60.0)
    return SyncKnowledge(sync_node, knowledge)
