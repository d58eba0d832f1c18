"""Knowledge sync as a pure session: every rule of replicating one node's shard, with no
socket, no event loop, no clock and no disk of its own.

Theory of operation
-------------------
A :class:`SyncSession` keeps one node's replica converged with its peers'. It reads the
replica's in-memory :class:`~porter_mesh.core.knowledge.ReplicaState` (version vector,
gaps, digest, bucket listings: pure computations) and asks its driver, through frozen
actions, for everything else: putting a message on the wire, merging records into the
shard (the journal), reading records back to answer a peer. Every input takes ``now``
(monotonic seconds); :meth:`SyncSession.next_deadline` says when the session must next be
woken, and nothing else wakes it::

    peer_joined  --> queue a catch-up ------------------> [Send(CatchupRequest)]
    receive(rec, broadcast, sender's own) --------------> [Count, Merge]
    receive(pull | cu) ---------------------------------> [Count, Answer]
    receive(dg)  --> buckets differ? -------------------> [Count, Send(be, reply), Send(dg)?]
    receive(pulled | cc | be) --> asked? in range? -----> [Count, Send(next cu)?, Merge] or
                                                          [Count, Send(pull)...]  or [Refuse]
    merged(...)  --> gaps? chunk progress? last chunk? -> [Send(pull)..., Progress, CaughtUp]
    timer(now)   --> requests timed out, peers without a replica back, gaps,
                     the digest's turn --------------> [Count(timeout.*), Send(...)...]

The rules (they were spread over the node's driver and the shard before):

* **Broadcast.** A ``Records`` message is accepted only by broadcast and only with
  records written by its sender (the seats of the human user speak with one key, so
  they count as one sender): nobody pushes another origin's records unasked.
* **Asked ranges.** Every request this session sends (pull, catch-up chunk, digest) is
  remembered with the peer it went to, until answered, timed out, or the peer leaves. A
  reply nobody asked for (pull reply, catch-up chunk, bucket listing) is refused
  (``unasked``); a pull reply is matched to its request by its range, so records outside
  the asked range are refused too (by the decoder, which checks that each record lies
  in the reply's range, and here by the range itself). A catch-up chunk must follow the
  chunk asked for (``stale`` otherwise: a late answer to an earlier request), and its
  records must lie past the version vector the catch-up started from (the storage's
  merge plan checks that, :meth:`~porter_mesh.core.knowledge.ReplicaState.plan`).
* **Gaps.** After every merge, the version vector's holes are pulled: from their origin
  when it is connected, else from the peer that brought the records, else round robin;
  a range already asked of a connected peer is not asked twice. A request not answered
  within ``request_timeout`` is forgotten (counted ``timeout.PullRequest``) and its gap
  is asked again.
* **Catch-up queue.** When a peer joins (or comes back with a new incarnation), a
  catch-up from it is queued: one peer at a time, chunk by chunk (``catchup_chunk``
  records), starting from the replica's version vector. The next chunk is asked before
  the current one is merged (prefetch), so the peer reads it from its journal meanwhile.
  A chunk not answered within ``catchup_timeout``, refused, or that could not be stored
  fails the attempt, which starts over at the head of the queue; after
  ``catchup_attempts`` failed attempts the peer is skipped until it joins again. While a
  catch-up runs, gap pulls and digests wait: the catch-up brings the same records in
  order, and cheaper. Seats (short-lived command lines) are never caught up from.
* **Anti-entropy.** Every ``anti_entropy_interval`` a digest goes to one peer, round
  robin (not while a catch-up runs), with the version vector it was taken at. When the
  digests differ and so do the version vectors, records still travelling (a burst of
  writes, a pull under way) or missing ranges explain it: the ranges the peer's vector
  shows and this replica lacks are pulled, and this session's own digest goes back (at
  most once per half interval) so that the peer pulls what it lacks; nothing is listed.
  When the vectors are equal (or the peer sent none) only a listing can find the
  difference: the peer gets the listing of the differing buckets back, and this
  session's own digest, so one exchange repairs both sides. A listing that shows more than
  ``catchup_after_pulls`` ranges missing turns into a catch-up from that peer (into
  pulls, when its catch-up was given up); a range already asked of a peer is not asked
  again; entries that clash with records held here (a forger fed one side) are left out
  and refused (``conflict``) so that the rest still repairs.
* **Peers without a replica.** A peer that answers ``unsupported`` is left out of
  catch-ups, gap pulls and digests for ``no_sync_backoff`` seconds, then queued again (a
  node may attach its replica a moment after it starts).

The driver carries the actions out in order. :class:`Merge` needs an answer:
:meth:`SyncSession.merged` once the records are stored, :meth:`SyncSession.merge_refused`
when the shard refused the batch (nothing stored), :meth:`SyncSession.merge_failed`
when it could not write it (a full disk). A :class:`Send` that cannot go out (the peer
left meanwhile) is reported with :meth:`SyncSession.not_sent`. What each merge stored,
signatures refused and storage failures are the driver's to count: they are the
storage's answers, not the protocol's.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from porter_mesh.core.advert import key_name
from porter_mesh.core.constants import MAX_MESSAGE_BYTES
from porter_mesh.core.knowledge import (
    MAX_CATCHUP_RECORDS,
    MAX_RECORDS_PER_MESSAGE,
    BucketEntries,
    CatchupChunk,
    CatchupRequest,
    Digest,
    Observation,
    PullReply,
    PullRequest,
    Record,
    Records,
    ReplicaState,
    SyncMessage,
    decode_sync,
)
from porter_mesh.errors import SyncError

__all__ = [
    "BROADCAST_BUDGET", "CATCHUP_AFTER_PULLS", "CATCHUP_ATTEMPTS", "CATCHUP_CHUNK",
    "NO_SYNC_BACKOFF", "Abandoned", "Answer", "Broadcast", "CaughtUp", "Count", "Merge",
    "Progress", "PullAnswered", "Refuse", "Send", "SyncAction", "SyncSession", "reply_refusal",
]

#: A bucket listing that asks for more pull requests than this starts a catch-up instead.
CATCHUP_AFTER_PULLS: Final = 32
#: Failed catch-up attempts from one peer before it is skipped until it joins again.
CATCHUP_ATTEMPTS: Final = 3
#: Records asked for per catch-up chunk. Merging a chunk runs on the node's loop thread
#: (about 25 us per record to decode, check and journal); 4096 keeps each step near
#: 0.1 s, so heartbeats and other traffic never wait long, and a chunk stays well under
#: a megabyte.
CATCHUP_CHUNK: Final = 4096
#: Seconds a peer that answered "no replica here" is left out of catch-ups and digests.
NO_SYNC_BACKOFF: Final = 5.0
#: Bytes of records one broadcast of this node's own records carries at most, by the
#: upper bound :func:`_broadcast_cost` puts on each (room is left for the envelope).
BROADCAST_BUDGET: Final = MAX_MESSAGE_BYTES - 64 * 1024

_CATCHUP_KEY: Final = ("catchup",)
_DIGEST_KEY: Final = ("digest",)
_NEVER: Final = float("inf")


# -- actions --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``message`` to ``peer``. ``reply``: answer on the connection the message
    being handled came by (the asker may be a command line that is on no roster)."""

    peer: str
    message: SyncMessage
    reply: bool = False


@dataclass(frozen=True, slots=True)
class Broadcast:
    """Publish ``message`` (this node's own records) to every peer."""

    message: Records


@dataclass(frozen=True, slots=True)
class Merge:
    """Merge ``message``'s records into the shard as one batch, then call
    :meth:`SyncSession.merged` (or ``merge_refused`` / ``merge_failed``) with this action.

    Attributes:
        peer: who sent them.
        message: the ``Records`` broadcast, pull reply or catch-up chunk.
        after: for a catch-up chunk, the version vector the catch-up started from: every
            record must lie past it.
        broadcast: the records came by broadcast (acknowledged to nobody: the driver may
            batch them with others and sync them behind).
    """

    peer: str
    message: Records | PullReply | CatchupChunk
    after: Mapping[str, int] | None = None
    broadcast: bool = False

    @property
    def records(self) -> tuple[Record, ...]:
        """The records to merge."""
        return self.message.records


@dataclass(frozen=True, slots=True)
class Answer:
    """Read what ``request`` asks for from the shard and send it back to ``peer`` as a
    reply (a :class:`PullReply` or a :class:`CatchupChunk`)."""

    peer: str
    request: PullRequest | CatchupRequest


@dataclass(frozen=True, slots=True)
class Count:
    """Add ``n`` to the replication counter ``name`` (``porter-mesh stats``)."""

    name: str
    n: int = 1


@dataclass(frozen=True, slots=True)
class Refuse:
    """A message from ``peer`` was refused for ``reason`` before anything was stored:
    count it (``dropped.sync.<reason>``) and log it once per peer and reason."""

    peer: str
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class Progress:
    """A catch-up chunk from ``peer`` was merged: ``done`` of ``total`` records."""

    peer: str
    done: int
    total: int


@dataclass(frozen=True, slots=True)
class CaughtUp:
    """The catch-up from ``peer`` finished."""

    peer: str


@dataclass(frozen=True, slots=True)
class Abandoned:
    """The catch-up from ``peer`` failed ``attempts`` times (the last one because
    ``why``) and is given up until the peer joins again; anti-entropy goes on."""

    peer: str
    attempts: int
    why: str


@dataclass(frozen=True, slots=True)
class PullAnswered:
    """``peer`` answered ``request`` with ``records`` records (a probe waits for this)."""

    peer: str
    request: PullRequest
    records: int


SyncAction: TypeAlias = (Send | Broadcast | Merge | Answer | Count | Refuse | Progress
                         | CaughtUp | Abandoned | PullAnswered)

_Key: TypeAlias = tuple[object, ...]


def _asked_key(message: SyncMessage) -> _Key:
    """The key matching a request with its reply (``Records`` are never asked)."""
    if isinstance(message, PullRequest | PullReply):
        return ("pull", message.origin, message.first, message.last)
    if isinstance(message, CatchupRequest | CatchupChunk):
        return _CATCHUP_KEY
    return _DIGEST_KEY


def reply_refusal(message: SyncMessage, asked: SyncMessage | None) -> tuple[str, str] | None:
    """Why a reply does not answer the request it is matched with, if it does not.

    Args:
        message: a reply (a pull reply or a catch-up chunk; other messages pass).
        asked: the request it answers (``None``: a pull reply is then taken as it
            comes, a catch-up chunk is refused).

    Returns:
        ``(reason, explanation)`` (reasons ``refused``, ``unasked``, ``stale``), or
        ``None`` when the reply matches.
    """
    if isinstance(message, PullReply):
        if asked is not None and (
            not isinstance(asked, PullRequest)
            or (asked.origin, asked.first, asked.last)
            != (message.origin, message.first, message.last)
        ):
            return "refused", "pull reply does not match the range that was asked for"
    elif isinstance(message, CatchupChunk):
        if not isinstance(asked, CatchupRequest):
            return "unasked", "a catch-up chunk arrived that was not asked for"
        if message.done != asked.done + len(message.records):
            return "stale", (
                f"catch-up chunk counts {message.done} done after {asked.done} with "
                f"{len(message.records)} records: not the chunk asked for (a late answer "
                "to an earlier request)")
    return None


class SyncSession:
    """One node's knowledge sync (see the module docstring).

    Args:
        state: the replica's state, read only (the shard changes it when it merges).
        anti_entropy_interval: seconds between digests (one peer each time).
        request_timeout: seconds before an unanswered pull (or digest) is forgotten.
        catchup_timeout: seconds before an unanswered catch-up chunk fails the attempt.
        now: monotonic time now.
        catchup_chunk: records asked for per catch-up chunk.
        catchup_attempts: failed attempts before a peer's catch-up is given up.
        catchup_after_pulls: pull requests a listing may ask for before it turns into a
            catch-up.
        no_sync_backoff: seconds a peer without a replica is left alone.

    Raises:
        SyncError: a setting is out of range.
    """

    def __init__(self, state: ReplicaState, *, anti_entropy_interval: float,
                 request_timeout: float, catchup_timeout: float, now: float,
                 catchup_chunk: int = CATCHUP_CHUNK, catchup_attempts: int = CATCHUP_ATTEMPTS,
                 catchup_after_pulls: int = CATCHUP_AFTER_PULLS,
                 no_sync_backoff: float = NO_SYNC_BACKOFF) -> None:
        if min(anti_entropy_interval, request_timeout, catchup_timeout, no_sync_backoff) <= 0:
            raise SyncError("anti_entropy_interval, request_timeout, catchup_timeout and "
                            "no_sync_backoff must be positive")
        if not 1 <= catchup_chunk <= MAX_CATCHUP_RECORDS or catchup_attempts < 1:
            raise SyncError(f"catchup_chunk must be 1..{MAX_CATCHUP_RECORDS} and "
                            "catchup_attempts at least 1")
        self.state = state
        self.anti_entropy_interval = anti_entropy_interval
        self.request_timeout = request_timeout
        self.catchup_timeout = catchup_timeout
        self.catchup_chunk = catchup_chunk
        self.catchup_attempts = catchup_attempts
        self.catchup_after_pulls = catchup_after_pulls
        self.no_sync_backoff = no_sync_backoff
        #: ``(done, total)`` of the catch-up running or last finished.
        self.progress: tuple[int, int] | None = None
        # Connected peers, and whether each is a seat (never caught up from).
        self._peers: dict[str, bool] = {}
        # Requests in flight: (peer, key) -> (request, deadline).
        self._asked: dict[tuple[str, _Key], tuple[SyncMessage, float]] = {}
        self._catchup_peer: str | None = None
        self._catchup_queue: collections.deque[str] = collections.deque()
        self._catchup_failures: collections.Counter[str] = collections.Counter()
        # Peers that said they run no replica, until when to leave them alone.
        self._no_sync: dict[str, float] = {}
        self._caught_up: set[str] = set()
        # Peers that sent any sync message or said they run none (since they joined).
        self._answered: set[str] = set()
        self._digest_sent: dict[str, float] = {}
        self._digest_due = now + anti_entropy_interval
        self._rr = itertools.count()

    # -- what the driver shows ------------------------------------------------------

    @property
    def catchup_peer(self) -> str | None:
        """The peer a catch-up runs from, if one does."""
        return self._catchup_peer

    @property
    def caught_up(self) -> frozenset[str]:
        """Peers a catch-up has finished from (since they joined)."""
        return frozenset(self._caught_up)

    @property
    def answered(self) -> frozenset[str]:
        """Peers that sent any sync message or said they run no replica (since they
        joined)."""
        return frozenset(self._answered)

    @property
    def without_replica(self) -> frozenset[str]:
        """Peers that said they run no replica (within the last ``no_sync_backoff``)."""
        return frozenset(self._no_sync)

    def asked(self, peer: str, message: SyncMessage) -> bool:
        """Whether a request that ``message`` answers (or is) is in flight to ``peer``."""
        return not isinstance(message, Records) and (peer, _asked_key(message)) in self._asked

    # -- the roster -----------------------------------------------------------------

    def peer_joined(self, peer: str, *, seat: bool, now: float) -> list[SyncAction]:
        """``peer`` joined (or came back with a new incarnation).

        Args:
            peer: its name.
            seat: it is a short-lived command line's seat (never caught up from).
            now: monotonic time now.

        Returns:
            The first request of a catch-up from it, when it is next in the queue.
        """
        self._peers[peer] = seat
        self._catchup_failures.pop(peer, None)
        return self._queue_catchup(peer, now)

    def peer_left(self, peer: str, *, now: float) -> list[SyncAction]:
        """``peer`` left: its requests are forgotten, and a catch-up from it moves on."""
        self._peers.pop(peer, None)
        for key in [k for k in self._asked if k[0] == peer]:
            del self._asked[key]
        self._caught_up.discard(peer)
        self._answered.discard(peer)
        self._no_sync.pop(peer, None)  # a restarted peer may run a replica now
        self._digest_sent.pop(peer, None)
        if peer in self._catchup_queue:
            self._catchup_queue.remove(peer)
        actions: list[SyncAction] = []
        if self._catchup_peer == peer:
            self._catchup_peer = None
            actions += self._next_catchup(now)
        return actions + self._pull_gaps(now)

    def peer_without_replica(self, peer: str, *, now: float) -> list[SyncAction]:
        """``peer`` answered ``unsupported``: it runs no replica; leave it alone for a
        while (its pending requests are dropped, a catch-up from it moves on)."""
        self._answered.add(peer)
        self._no_sync[peer] = now + self.no_sync_backoff
        for key in [k for k in self._asked if k[0] == peer]:
            del self._asked[key]
        if self._catchup_peer == peer:
            self._catchup_peer = None
            return self._next_catchup(now)
        return []

    # -- this node's own records ----------------------------------------------------

    def local_record(self, record: Record) -> list[SyncAction]:
        """This node stored a record of its own (durably): broadcast it."""
        return self.local_records((record,))

    def local_records(self, records: Sequence[Record]) -> list[SyncAction]:
        """This node stored records of its own (durably, in this order): broadcast them.

        Records made durable by one journal sync (a group commit) travel in as few
        ``Records`` messages as the size limits allow, so the peers decode, check and
        merge them as one batch: a burst of concurrent Remembers costs one broadcast per
        group instead of one per record.

        Args:
            records: this node's records, in the order they were written.

        Returns:
            One :class:`Broadcast` per message, in order (none for no records).
        """
        actions: list[SyncAction] = []
        batch: list[Record] = []
        size = 0
        for record in records:
            cost = _broadcast_cost(record)
            if batch and (size + cost > BROADCAST_BUDGET
                          or len(batch) == MAX_RECORDS_PER_MESSAGE):
                actions.append(Broadcast(Records(tuple(batch))))
                batch, size = [], 0
            batch.append(record)
            size += cost
        if batch:
            actions.append(Broadcast(Records(tuple(batch))))
        return actions

    def probe(self, peer: str, origin: str, seq: int, *, now: float) -> list[SyncAction]:
        """Ask ``peer`` for record ``(origin, seq)`` (a one-record pull whose
        :class:`PullAnswered` says whether it holds it)."""
        return self._send(peer, PullRequest(origin, seq, seq), now)

    # -- messages -------------------------------------------------------------------

    def receive(self, peer: str, data: bytes, *, broadcast: bool,
                now: float) -> list[SyncAction]:
        """A sync message arrived from ``peer``.

        Args:
            peer: the sender the envelope names.
            data: the message as it came (decoded and checked here).
            broadcast: it came by broadcast (else directly).
            now: monotonic time now.

        Returns:
            What to do, in order; a refused message yields only a :class:`Refuse` (and
            perhaps a failed catch-up attempt's next request).
        """
        self._answered.add(peer)
        try:
            message = decode_sync(data)
        except SyncError as exc:
            return [Refuse(peer, "malformed", str(exc))]
        counted = Count("received." + type(message).__name__)
        if isinstance(message, Records):
            return [counted, *self._on_records(peer, message, broadcast)]
        if isinstance(message, PullRequest | CatchupRequest):
            return [counted, Answer(peer, message)]
        if isinstance(message, Digest):
            return [counted, *self._on_digest(peer, message, now)]
        return [counted, *self._on_reply(peer, message, now)]

    def _on_reply(self, peer: str, message: PullReply | CatchupChunk | BucketEntries,
                  now: float) -> list[SyncAction]:
        """A reply: it must answer a request in flight to this peer, and match it."""
        key = _asked_key(message)
        entry = self._asked.get((peer, key))
        if entry is None:
            return [Refuse(peer, "unasked", f"{type(message).__name__} that was not asked "
                           "for (or came too late)")]
        asked = entry[0]
        refusal = reply_refusal(message, asked)
        if refusal is not None:
            return [Refuse(peer, *refusal)]
        if isinstance(message, PullReply):
            del self._asked[(peer, key)]
            assert isinstance(asked, PullRequest)
            return [Merge(peer, message), PullAnswered(peer, asked, len(message.records))]
        if isinstance(message, CatchupChunk):
            assert isinstance(asked, CatchupRequest)
            actions: list[SyncAction] = []
            if message.cursor is not None:
                # Ask for the next chunk before this one is merged, so that the peer
                # reads it from its journal meanwhile.
                actions += self._send(peer, CatchupRequest(asked.vv, message.cursor,
                                                           message.done, asked.limit), now)
            else:
                del self._asked[(peer, key)]
            return [*actions, Merge(peer, message, after=asked.vv)]
        del self._asked[(peer, key)]
        return self._on_listing(peer, message, now)

    def _on_records(self, peer: str, message: Records, broadcast: bool) -> list[SyncAction]:
        if not broadcast:
            return [Refuse(peer, "not-broadcast", "records are accepted unasked only by "
                           "broadcast; replies to pulls and catch-ups carry them otherwise")]
        sender = key_name(peer)
        for record in message.records:
            if key_name(record.origin) != sender:
                return [Refuse(peer, "wrong-origin", f"{peer} broadcast a record written by "
                               f"{record.origin}: a node broadcasts only its own records")]
        return [Merge(peer, message, broadcast=True)]

    def _on_digest(self, peer: str, digest: Digest, now: float) -> list[SyncAction]:
        differ = self.state.differing_buckets(digest)
        if not differ:
            return []
        if digest.vv is not None and _nonzero(digest.vv) != _nonzero(
                self.state.version_vector()):
            # The vectors differ: pull what the peer's shows we lack (it pulls the rest
            # once our digest reaches it). A listing of every differing bucket would
            # only repeat, at far greater cost, what is still on its way.
            return (self._pull_from(peer, self.state.ranges_behind(digest.vv), now)
                    + self._send_digest(peer, now, only_if_due=True))
        # List what we hold where the digests differ, and let the peer list what it
        # holds for us too (at most once per half interval).
        actions: list[SyncAction] = [Send(peer, self.state.bucket_entries(differ), reply=True)]
        return actions + self._send_digest(peer, now, only_if_due=True)

    def _pull_from(self, peer: str, pulls: list[PullRequest], now: float
                   ) -> list[SyncAction]:
        """Ask ``peer`` for ``pulls`` (those not already asked), or for a catch-up when
        they are many."""
        if len(pulls) > self.catchup_after_pulls and not self._given_up(peer):
            # Much is missing: one catch-up brings it in order, in a few large chunks.
            self._caught_up.discard(peer)
            return self._queue_catchup(peer, now)
        actions: list[SyncAction] = []
        for pull in pulls:
            if not self._in_flight(pull):  # else its answer would come twice, one unasked
                actions += self._send(peer, pull, now)
        return actions

    def _on_listing(self, peer: str, listing: BucketEntries, now: float) -> list[SyncAction]:
        actions: list[SyncAction] = []
        # Two honest replicas can hold different records at one (origin, seq) when a
        # forging node fed them different versions. Those slots can never agree, but
        # they must not stop the rest of the listing from repairing both sides.
        mine = {(o, s): k for o, s, k in self.state.bucket_entries(listing.buckets).entries}
        keep = tuple(e for e in listing.entries if mine.get((e[0], e[1]), e[2]) == e[2])
        if len(keep) < len(listing.entries):
            clash = next(e for e in listing.entries if mine.get((e[0], e[1]), e[2]) != e[2])
            actions.append(Refuse(peer, "conflict", (
                f"{len(listing.entries) - len(keep)} listed record(s) differ from those held "
                f"here, e.g. ({clash[0]}, {clash[1]}): a node fed them forged records")))
            listing = BucketEntries(listing.buckets, keep, listing.more)
        return actions + self._pull_from(peer, self.state.lacking(listing), now)

    # -- the storage's answers --------------------------------------------------------

    def merged(self, merge: Merge, accepted: int, *, now: float) -> list[SyncAction]:
        """The shard stored ``merge``'s records (``accepted`` of them were new).

        Returns:
            Pulls for the gaps that showed, the catch-up's progress, and when it was the
            last chunk, the end of that catch-up and the next one.
        """
        actions: list[SyncAction] = []
        if accepted:
            actions += self._pull_gaps(now, prefer=merge.peer)
        message = merge.message
        if isinstance(message, CatchupChunk):
            self.progress = (message.done, message.total)
            actions.append(Progress(merge.peer, message.done, message.total))
            if message.cursor is None:
                actions += self._catchup_done(merge.peer, now)
        return actions

    def merge_refused(self, merge: Merge, why: str, *, now: float) -> list[SyncAction]:
        """The shard refused ``merge`` as a whole (forged or conflicting records, records
        outside what was asked): nothing was stored."""
        actions: list[SyncAction] = [Refuse(merge.peer, "refused", why)]
        if isinstance(merge.message, CatchupChunk):
            actions += self._catchup_failed(merge.peer, why, now)
        return actions

    def merge_failed(self, merge: Merge, why: str, *, now: float) -> list[SyncAction]:
        """The shard could not write ``merge`` (a full disk): nothing was stored. Gaps,
        digests or a catch-up bring the records again once it can."""
        if isinstance(merge.message, CatchupChunk):
            return self._catchup_failed(merge.peer, why, now)
        return []

    def not_sent(self, send: Send, *, now: float) -> list[SyncAction]:
        """``send`` could not go out (the peer left meanwhile, or it was too large)."""
        if send.reply or not isinstance(send.message, PullRequest | CatchupRequest | Digest):
            return []
        self._asked.pop((send.peer, _asked_key(send.message)), None)
        if isinstance(send.message, CatchupRequest) and self._catchup_peer == send.peer:
            # Not the peer's failure: it is left out until it joins again.
            self._catchup_peer = None
            return self._next_catchup(now)
        return []

    # -- time -----------------------------------------------------------------------

    def next_deadline(self) -> float:
        """When :meth:`timer` next has something to do (monotonic seconds; ``inf`` when
        nothing waits: no request in flight, no peer to compare digests with)."""
        due = min((deadline for _, deadline in self._asked.values()), default=_NEVER)
        if self._no_sync:
            due = min(due, min(self._no_sync.values()))
        if self._sync_peers():
            due = min(due, self._digest_due)
        return due

    def timer(self, now: float) -> list[SyncAction]:
        """Time passed to ``now``: requests past their deadline are forgotten (a
        catch-up chunk's fails the attempt), peers without a replica are tried again,
        gaps are pulled, and on the digest's turn one peer gets this replica's digest.
        Harmless when called early."""
        actions: list[SyncAction] = []
        for key, (message, deadline) in list(self._asked.items()):
            if now < deadline or key not in self._asked:
                continue
            del self._asked[key]
            if isinstance(message, Digest):
                continue  # equal digests get no answer: nothing to time out
            actions.append(Count("timeout." + type(message).__name__))
            if isinstance(message, CatchupRequest):
                actions += self._catchup_failed(key[0], "no answer", now)
        for peer, until in list(self._no_sync.items()):
            if now >= until:
                del self._no_sync[peer]
                actions += self._queue_catchup(peer, now)
        actions += self._pull_gaps(now)
        if now >= self._digest_due:
            self._digest_due = now + self.anti_entropy_interval
            peers = self._sync_peers()
            if self._catchup_peer is None and peers:
                actions += self._send_digest(peers[next(self._rr) % len(peers)], now)
        return actions

    # -- the rules' pieces ----------------------------------------------------------

    def _send(self, peer: str, message: SyncMessage, now: float) -> list[SyncAction]:
        """Send a request and remember it until answered or timed out."""
        timeout = (self.catchup_timeout if isinstance(message, CatchupRequest)
                   else self.request_timeout)
        self._asked[(peer, _asked_key(message))] = (message, now + timeout)
        return [Send(peer, message)]

    def _sync_peers(self) -> list[str]:
        """Connected peers that run a replica (as far as we know), seats aside."""
        return sorted(p for p, seat in self._peers.items()
                      if not seat and p not in self._no_sync)

    def _send_digest(self, peer: str, now: float, *, only_if_due: bool = False
                     ) -> list[SyncAction]:
        if only_if_due and now - self._digest_sent.get(peer, -_NEVER) < (
                self.anti_entropy_interval / 2):
            return []
        self._digest_sent[peer] = now
        digest = self.state.digest()
        return self._send(peer, Digest(digest.count, digest.fingerprints,
                                       self.state.version_vector()), now)

    def _pull_gaps(self, now: float, *, prefer: str | None = None) -> list[SyncAction]:
        if self._catchup_peer is not None:
            return []  # the catch-up brings them
        connected = self._sync_peers()
        if not connected:
            return []
        actions: list[SyncAction] = []
        for request in self.state.missing_ranges():
            if self._in_flight(request):
                continue
            if request.origin in connected:
                target = request.origin
            elif prefer is not None and prefer in connected:
                target = prefer
            else:
                target = connected[next(self._rr) % len(connected)]
            actions += self._send(target, request, now)
        return actions

    def _in_flight(self, request: PullRequest) -> bool:
        """Whether ``request``'s range is asked of a peer already (a range is asked of one
        peer at a time; once answered or timed out it may be asked again)."""
        key = _asked_key(request)
        return any((p, key) in self._asked for p in self._peers)

    def _given_up(self, peer: str) -> bool:
        """Whether the catch-up from ``peer`` failed all its attempts (until it joins
        again: anti-entropy with it goes on by pulls)."""
        return self._catchup_failures[peer] >= self.catchup_attempts

    def _queue_catchup(self, peer: str, now: float) -> list[SyncAction]:
        if (peer in self._caught_up or peer in self._catchup_queue or self._given_up(peer)
                or peer == self._catchup_peer or peer in self._no_sync
                or self._peers.get(peer, False)):
            return []
        self._catchup_queue.append(peer)
        return self._next_catchup(now)

    def _next_catchup(self, now: float) -> list[SyncAction]:
        while self._catchup_peer is None and self._catchup_queue:
            peer = self._catchup_queue.popleft()
            if peer not in self._peers:
                continue
            self._catchup_peer = peer
            self.progress = (0, 0)
            return self._send(peer, CatchupRequest(self.state.version_vector(), None, 0,
                                                   self.catchup_chunk), now)
        return []

    def _catchup_done(self, peer: str, now: float) -> list[SyncAction]:
        self._caught_up.add(peer)
        self._catchup_peer = None
        self._catchup_failures.pop(peer, None)
        actions: list[SyncAction] = [Count("catchups"), CaughtUp(peer)]
        return actions + self._next_catchup(now) + self._pull_gaps(now)

    def _catchup_failed(self, peer: str, why: str, now: float) -> list[SyncAction]:
        """A chunk was refused, not stored or never came: start that peer's catch-up
        over (first in the queue), or skip the peer after its attempts."""
        self._asked.pop((peer, _CATCHUP_KEY), None)
        if self._catchup_peer != peer:
            return []
        self._catchup_peer = None
        self._catchup_failures[peer] += 1
        actions: list[SyncAction] = []
        if self._given_up(peer):
            actions += [Count("catchup.abandoned"),
                        Abandoned(peer, self.catchup_attempts, why)]
        else:
            self._catchup_queue.appendleft(peer)
        return actions + self._next_catchup(now)


def _broadcast_cost(record: Record) -> int:
    """An upper bound on the bytes ``record`` takes in a ``Records`` message.

    Its encoding when known; otherwise four bytes per character of its text (UTF-8's
    most) plus room for the fixed fields (ids, timestamps, signature and link).
    """
    if record.wire is not None:
        return len(record.wire) + 16
    body = record.body
    if isinstance(body, Observation):
        chars = (len(body.about) + len(body.finding) + len(body.discovered_by)
                 + len(body.context or "") + len(body.severity or ""))
    else:
        chars = len(body.retracted_by)
    return 4 * chars + 512


def _nonzero(vv: Mapping[str, int]) -> dict[str, int]:
    """A version vector without its zero entries (an origin known only by a hole)."""
    return {origin: seq for origin, seq in vv.items() if seq}
