"""What the application is owed: handlers, the inbox, declined messages and the journal.

Theory of operation
-------------------
Every activity the node receives becomes a :class:`Message` and is offered, in order,
to the handlers (one call per activity), then the batch handlers (one call per ZeroMQ
message), then the inbox that :meth:`Inbox.receive` and :meth:`Inbox.drain` read (when
the node has one, ``inbox_size`` > 0).

A handler that cannot act yet raises :class:`~porter_mesh.errors.NotHandled`: the offer
stops there and the message is *held*, per sender, and offered again on a capped backoff
(``redeliver_initial`` .. ``redeliver_max``), at once when a handler is added or
:meth:`Inbox.redeliver` is called. Nothing of that sender overtakes it.

With a data directory, every new direct message is written to the delivery journal
(:class:`~porter_mesh.adapters.journal.DeliveryJournal`) before it is offered, and the
sender's acknowledgement goes only after that write; the journal's *taken* mark says
what the application has taken. A restart delivers again what was journaled and not
taken (:meth:`Inbox.open_journal`), before anything new. The mark never passes a held
message (the *floor*): a take asked for beyond it (the *goal*) waits until the held
message is taken. Without a data directory a direct message is acknowledged once it is
taken, so one a handler declines stays its sender's to resend.

When the journal cannot be written (a full disk) new direct messages are refused: not
delivered, not acknowledged, so their senders retry until there is space again.

The inbox owns no socket: it is told what arrived (:meth:`Inbox.accept` for the new
direct messages of one read, :meth:`Inbox.deliver` for the rest) and asks the node,
through the functions it was given, to acknowledge, to wake it by a time and to flush
after a batch.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import pathlib
import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, TypeVar, cast

from porter_mesh.adapters.journal import DeliveryJournal, JournalRecord
from porter_mesh.core import speedups as _speedups
from porter_mesh.core.as2 import Activity
from porter_mesh.core.envelope import Envelope, decode_direct, decode_payload
from porter_mesh.core.session.keys import KEY_PREFIX
from porter_mesh.core.session.receiving import Receiving
from porter_mesh.core.tracecontext import TraceContext
from porter_mesh.errors import NodeClosedError, NotHandled, ProtocolError, StorageError
from porter_mesh.node.config import NodeConfig

__all__ = ["Accepted", "Inbox", "Message", "wall_ms"]

log = logging.getLogger("porter_mesh.node")

_T = TypeVar("_T")


def _expire(waiter: asyncio.Future[None]) -> None:
    """A reader's deadline passed (see :meth:`Inbox._wait`)."""
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def wall_ms() -> int:
    """The wall clock in milliseconds (hybrid clocks, idempotency keys' times)."""
    return time.time_ns() // 1_000_000


class Message(NamedTuple):
    """One activity delivered to the application.

    Attributes:
        channel: where it travelled (``task:<me>`` for direct messages).
        sender: the sending agent (authenticated name on a secured mesh).
        activity: the AS2 activity.
        envelope: the envelope of the ZeroMQ message that carried it.
        seq: this activity's sequence number in the sender's stream.
        direct: True for ROUTER/DEALER delivery, False for broadcast.
        offset: its position in the node's delivery journal (direct messages on a node
            with a data directory), -1 otherwise; :meth:`Node.ack` takes it.
        redelivered: True when a restarted node delivers it again because the
            application had not taken it before the previous process ended.
    """

    channel: str
    sender: str
    activity: Activity
    envelope: Envelope
    seq: int
    direct: bool
    offset: int = -1
    redelivered: bool = False

    @property
    def trace(self) -> TraceContext | None:
        """The W3C trace context the message carried (its sender's span), if any."""
        traceparent = self.envelope.traceparent
        if traceparent is None:
            return None
        return TraceContext(traceparent, self.envelope.tracestate)


#: A new direct message read from the ROUTER: its envelope, the envelope's bytes, the
#: payload, the decoded activities and the sender's ROUTER identity.
Accepted = tuple[Envelope, bytes, bytes, list[Activity], bytes]

_tuple_new = cast(Callable[[type[Message], tuple[Any, ...]], Message], tuple.__new__)

Handler = Callable[[Message], None]
BatchHandler = Callable[[list[Message]], None]


class _Held:
    """A ZeroMQ message's activities that a handler declined (raised NotHandled), with
    where the offer stopped: activity ``index`` for the single handlers (``done``: those
    that already returned for it), or, once every activity passed them, the batch
    handlers (``done_batch``: those that already returned; ``None`` until then). The
    next offer goes to the current handlers that have not returned yet, a handler
    added since included.

    ``offset``/``end``: journal positions of the message's first activity and past its
    last (-1: not journaled); ``floor``: the first position not taken yet, which the
    journal's taken mark must not pass while this is held; ``ident``: the ROUTER
    identity to acknowledge once it is taken, for a direct message the node holds only
    in memory (no data directory), whose acknowledgement waits until then."""

    __slots__ = ("direct", "done", "done_batch", "end", "env", "floor", "ident", "index",
                 "msgs", "offset")

    def __init__(self, env: Envelope, msgs: list[Message], offset: int, end: int,
                 direct: bool, ident: bytes | None) -> None:
        self.env = env
        self.msgs = msgs
        self.offset = offset
        self.end = end
        self.direct = direct
        self.ident = ident
        self.index = 0
        self.done: tuple[Handler, ...] = ()
        self.done_batch: tuple[BatchHandler, ...] | None = None
        self.floor = offset


class _HeldQueue(collections.deque[_Held]):
    """The declined messages of one sender (direct or broadcast), oldest first, with the
    capped backoff of the next offer: nothing of that sender overtakes them."""

    __slots__ = ("delay", "due")

    def __init__(self) -> None:
        super().__init__()
        self.delay = 0.0
        self.due = 0.0


def _index_of(items: tuple[_T, ...], item: _T) -> int:
    """The position of ``item`` in ``items`` by identity (handlers may compare equal)."""
    return next(i for i, x in enumerate(items) if x is item)


class Inbox:
    """The application's side of a node (see the module docstring).

    Args:
        config: the node's configuration (inbox size, redelivery backoff, journal).
        counters: the node's counters, added to here.
        receiving: the node's receiving rules, told what was taken, declined or could
            not be journaled.
        drop: counts and logs (once) a dropped message: ``drop(reason, origin, fmt,
            *args)``.
        refuse: counts and audits something a secured node must not accept:
            ``refuse(event, peer, detail)``.
        queue_ack: acknowledges a direct message with the next flush:
            ``queue_ack(router_identity, seq)``.
        wake_by: makes the node's timer fire no later than a monotonic time.
        after_batch: flushes what handlers queued, after a batch of deliveries.
        closed: whether the node has closed.
        handlers, batch_handlers: installed before anything can arrive.
    """

    def __init__(self, config: NodeConfig, counters: collections.Counter[str], *,
                 receiving: Receiving, drop: Callable[..., None],
                 refuse: Callable[[str, str, str], None],
                 queue_ack: Callable[[bytes, int], None], wake_by: Callable[[float], None],
                 after_batch: Callable[[], None], closed: Callable[[], bool],
                 handlers: Iterable[Handler] = (),
                 batch_handlers: Iterable[BatchHandler] = ()) -> None:
        self._config = config
        self._name = config.name
        self._counters = counters
        self._receiving = receiving
        self._drop = drop
        self._refuse = refuse
        self._queue_ack = queue_ack
        self._wake_by = wake_by
        self._after_batch = after_batch
        self._closed = closed
        self._size = config.inbox_size
        self._messages: collections.deque[Message] = collections.deque()
        # The readers waiting for a message (receive(), wait_readable()), woken together.
        self._waiters: list[asyncio.Future[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.handlers: list[Handler] = list(handlers)
        self.batch_handlers: list[BatchHandler] = list(batch_handlers)
        #: Whether each activity's ``actor`` must be its (authenticated) sender.
        self.bind_actors = False
        # Messages a handler declined (NotHandled), per (sender, direct), offered again on
        # a capped backoff, and how many activities they hold.
        self._held: dict[tuple[str, bool], _HeldQueue] = {}
        self.held_count = 0
        self.held_limit = config.inbox_size or 100_000
        # Journal positions: the first one a held message still owes (the taken mark
        # stays below it; None: nothing journaled is held), and the highest take asked
        # for meanwhile (the mark moves there once nothing below it is held).
        self._floor: int | None = None
        self._goal = 0
        self.journal: DeliveryJournal | None = None
        # Journal records owed to the application, delivered before anything new.
        self._replay: list[tuple[int, JournalRecord]] = []
        # The journal position after the last message handed out by receive()/drain().
        self._handed = 0
        #: A failed journal write: the error while the data directory cannot be written
        #: (None once a write succeeds again).
        self.storage_error: StorageError | None = None
        # When the application last read the inbox (or the node started), and whether
        # the node said that owed messages wait unread (see NodeConfig.unread_warning).
        self._read_at = time.monotonic()
        self.unread_warned = False

    def __len__(self) -> int:
        return len(self._messages)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind to the node's running loop."""
        self._loop = loop
        self._read_at = time.monotonic()

    def close(self) -> None:
        """The node closed: take what was handed out, close the journal, wake readers."""
        if self.journal is not None:
            # Closing the node means the application is done with what it took.
            self._take(self._handed)
            self.journal.close()
        self._wake()

    # -------------------------------------------------------------- the journal

    def open_journal(self, path: pathlib.Path) -> None:
        """Restore de-duplication from the journal and deliver what is still owed.

        The inbox takes the owed messages now, ahead of anything from the network; an
        application that consumes through handlers only (no inbox) gets them as soon as
        its first handler is added. Until then no new direct message is accepted.

        Raises:
            StorageError: the journal cannot be created or read.
        """
        window = self._config.idempotency_window
        self.journal = journal = DeliveryJournal(
            path, key_window=window, compact_bytes=self._config.journal_compact_bytes)
        self._handed = journal.taken
        self._receiving.journal = True
        for record in journal.known:
            self._receiving.direct.restore(record.sender, record.incarnation,
                                           record.first_seq, record.count, record.key,
                                           record.wall_ms / 1000)
        self._replay = journal.pending
        if self._replay:
            log.info("node %s: %d direct message(s) received before a restart were not "
                     "taken by the application; delivering them again", self._name,
                     journal.end - journal.taken)
        if self._size or self.handlers or self.batch_handlers:
            self._redeliver()

    def _redeliver(self) -> None:
        """Deliver the journal's owed records (see :meth:`open_journal`)."""
        pending, self._replay = self._replay, []
        journal = self.journal
        assert journal is not None
        for position, record in pending:
            skip = max(0, journal.taken - position)
            try:
                env, payload = decode_direct([record.envelope, record.payload])
                activities = decode_payload(payload, env.count)
            except ProtocolError as exc:
                # Checked when it arrived: only a damaged file gets here.
                log.error("node %s: journal record from %s cannot be decoded (%s); "
                          "skipped", self._name, record.sender, exc)
                self._take(position + record.count)
                continue
            self._counters["redelivered.direct"] += record.count - skip
            self.deliver(env, activities[skip:], direct=True, offset=position + skip,
                         first=skip, redelivered=True)
        self._after_batch()

    def admission(self, pending: list[Accepted]) -> tuple[int | None, bool, bool]:
        """What the receiving rules need to admit a new direct message, ``pending``
        being the new messages of the current read not offered yet: the room left in
        the inbox (None: no inbox), whether a consumer takes it (without an inbox: a
        handler, and no owed message that must go first) and whether the held
        messages are at their limit."""
        limit = self._size
        if not limit:
            room = None
        elif pending:
            room = limit - len(self._messages) - sum([a[0].count for a in pending[-64:]])
        else:
            room = limit - len(self._messages)
        consumer = bool(self.handlers or self.batch_handlers) and not self._replay
        return room, consumer, self.held_count >= self.held_limit

    def accept(self, accepted: list[Accepted]) -> bool:
        """Keep and deliver the new direct messages of one read.

        Journal first, then acknowledge (queued: the flush after the read sends them),
        then hand to the application: whatever was acknowledged is on record, and stays
        owed to the application until it is taken (see :meth:`open_journal`). A message
        that cannot be journaled (a full disk) is neither delivered nor acknowledged:
        its sender retries until space returns or its deadline passes. Without a journal
        a message is acknowledged once taken, so that one a handler declines stays the
        sender's. Returns False when the journal refused them.
        """
        offset = -1
        journal = self.journal
        if journal is not None:
            try:
                offset = journal.append([
                    JournalRecord(env.sender, env.incarnation, env.seq, env.count,
                                  env.channel, payload, env_bytes)
                    if not env.msg_id.startswith(KEY_PREFIX) else
                    JournalRecord(env.sender, env.incarnation, env.seq, env.count,
                                  env.channel, payload, env_bytes,
                                  env.msg_id[len(KEY_PREFIX):], wall_ms())
                    for env, env_bytes, payload, _, _ in accepted
                ])
            except StorageError as exc:
                self._storage_failed(exc, accepted)
                return False
            if self.storage_error is not None:
                self._storage_recovered()
            for env, _, _, _, ident in accepted:
                self._queue_ack(ident, env.seq)
        for env, _, _, activities, ident in accepted:
            self.deliver(env, activities, direct=True, offset=offset,
                         ident=ident if offset < 0 else None)
            if offset >= 0:
                offset += env.count
        return True

    def _storage_failed(self, error: StorageError, accepted: list[Accepted]) -> None:
        """The journal could not keep ``accepted``: refuse them (no acknowledgement)."""
        for env, _, _, _, _ in accepted:
            # Not kept, so not seen: its retry (with its key, if any) must land.
            receipt = self._receiving.journal_failed(env.sender, env.incarnation, env.seq,
                                                     env.msg_id, env.count)
            self._counters[receipt.counter] += receipt.n
        first = self.storage_error is None
        self.storage_error = error
        log.log(logging.WARNING if first else logging.DEBUG,
                "node %s: %s; direct messages are refused (not acknowledged, so their "
                "senders retry) until there is space again%s", self._name, error,
                "" if first else " (again)")

    def _storage_recovered(self) -> None:
        error, self.storage_error = self.storage_error, None
        assert error is not None
        log.warning("node %s: the delivery journal %s can be written again; direct "
                    "messages are accepted (%d refused so far, retries included)",
                    self._name, error.path, self._counters["refused.disk"])

    def storage(self) -> dict[str, Any] | None:
        """The delivery journal's state (see :meth:`Node.storage`)."""
        journal = self.journal
        if journal is None:
            return None
        error = self.storage_error
        return {"state": "ok" if error is None else "full", "path": str(journal.path),
                "free_bytes": None if error is None else error.free_bytes,
                "refused": self._counters["refused.disk"], "size": journal.size}

    # -------------------------------------------------------------- offering

    def deliver(self, env: Envelope, activities: list[Activity], *, direct: bool,
                offset: int = -1, first: int = 0, redelivered: bool = False,
                ident: bytes | None = None) -> None:
        """Hand activities to the handlers and the inbox.

        ``offset`` is the journal position of ``activities[0]`` (-1: not journaled),
        which is activity number ``first`` of the ZeroMQ message. ``ident``: the ROUTER
        identity to acknowledge once the message is taken (a direct message that is not
        journaled; None: acknowledged by the caller). Messages of a sender with declined
        messages wait behind them (see :meth:`_dispatch`).
        """
        channel, sender, seq = env.channel, env.sender, env.seq + first
        # Message's own constructor is a Python function; building the tuples directly
        # skips a frame per activity. The compiled path builds them in C, untracked by
        # the garbage collector (porter_mesh.core.speedups says why).
        made = _speedups.messages
        if made is not None and activities.__class__ is list:
            msgs = made(Message, channel, sender, activities, env, seq, direct, offset,
                        offset >= 0 and redelivered)
        elif offset < 0:
            msgs = [_tuple_new(Message, (channel, sender, activity, env, seq + i, direct,
                                         -1, False))
                    for i, activity in enumerate(activities)]
        else:
            msgs = [_tuple_new(Message, (channel, sender, activity, env, seq + i, direct,
                                         offset + i, redelivered))
                    for i, activity in enumerate(activities)]
        if self.bind_actors:
            msgs = self._bound_messages(env, msgs)
        self._counters["received.direct" if direct else "received.broadcast"] += len(msgs)
        end = offset + len(activities) if offset >= 0 else -1
        if self._held:
            queue = self._held.get((sender, direct))
            if queue is not None:
                # Order within a sender: nothing overtakes a declined message.
                if not direct and self.held_count >= self.held_limit:
                    self._drop("held-full", sender, "dropped %d broadcast(s) from %s: %d "
                               "declined messages are held already", len(msgs), sender,
                               self.held_count)
                    return
                held = _Held(env, msgs, offset, end, direct, ident)
                queue.append(held)
                self.held_count += len(msgs)
                self._track_unacked(held)
                return
        rest = self._dispatch(env, msgs, offset, end, direct, ident, None)
        if rest is not None:
            queue = self._held[(sender, direct)] = _HeldQueue()
            queue.append(rest)
            self.held_count += len(msgs)
            self._track_unacked(rest)
            self._held_changed()
            self._schedule_offer(queue)

    def _dispatch(self, env: Envelope, msgs: list[Message], offset: int, end: int,
                  direct: bool, ident: bytes | None, held: _Held | None) -> _Held | None:
        """Offer one ZeroMQ message's activities to the handlers, then the inbox.

        Without an inbox the handlers are the consumers: each journaled message is
        taken as soon as every handler has returned for it (an exception counts as
        returning; a crash does not), and the whole message once the batch handlers
        have returned too. A handler that raises :class:`NotHandled` stops the offer
        there: nothing from that point on is taken, and the returned :class:`_Held`
        says where to go on (``held``: where an earlier offer stopped). Returns None
        once everything was taken.
        """
        limit = self._size
        journal = self.journal if offset >= 0 and not limit else None
        index = 0
        done: tuple[Handler, ...] = ()
        done_batch = None
        if held is not None:
            index, done, done_batch = held.index, held.done, held.done_batch
        handlers = self.handlers
        batch_handlers = self.batch_handlers
        if handlers and done_batch is None:
            current = tuple(handlers)  # a handler may remove itself
            take_each = None
            if journal is not None and not batch_handlers:
                take_each = journal.take if self._floor is None else self._take
            for i in range(index, len(msgs)):
                msg = msgs[i]
                run = current
                if done:
                    run = tuple(h for h in current if h not in done)
                for handler in run:
                    try:
                        handler(msg)
                    except NotHandled:
                        return self._stopped(env, msgs, offset, end, direct, ident, held, i,
                                             done + run[:_index_of(run, handler)], None)
                    except Exception:
                        log.exception("message handler failed on %s", env.msg_id)
                done = ()
                if take_each is not None:
                    take_each(msg.offset + 1)
        if batch_handlers:
            run_batch = tuple(batch_handlers)
            if done_batch:
                run_batch = tuple(h for h in run_batch if h not in done_batch)
            for batch_handler in run_batch:
                try:
                    batch_handler(msgs.copy())  # each its own list, to keep or change
                except NotHandled:
                    return self._stopped(
                        env, msgs, offset, end, direct, ident, held, len(msgs), (),
                        (done_batch or ()) + run_batch[:_index_of(run_batch, batch_handler)])
                except Exception:
                    log.exception("batch handler failed on %s", env.msg_id)
        if journal is not None:
            if self._floor is None:
                journal.take(end)
            else:
                self._take(end)
        if ident is not None:
            # Not journaled: acknowledged now that it is taken.
            self._receiving.taken(env.sender, env.incarnation, env.seq)
            self._queue_ack(ident, env.seq)
        if not limit or not msgs:
            return None
        inbox = self._messages
        room = limit - len(inbox)
        if room < len(msgs):
            self._counters["dropped.inbox-full"] += len(msgs) - max(room, 0)
            if room <= 0:
                return None
            msgs = msgs[:room]
        inbox.extend(msgs)
        if self._waiters:
            self._wake()
        return None

    def _stopped(self, env: Envelope, msgs: list[Message], offset: int, end: int,
                 direct: bool, ident: bytes | None, held: _Held | None, index: int,
                 done: tuple[Handler, ...],
                 done_batch: tuple[BatchHandler, ...] | None) -> _Held:
        """A handler declined: where the offer of this message goes on next time."""
        if held is None:
            held = _Held(env, msgs, offset, end, direct, ident)
        held.index, held.done, held.done_batch = index, done, done_batch
        if offset >= 0:
            # Only handlers alone take a message at a time: with batch handlers nothing
            # of it is taken before they return, and the inbox gets all of it at once.
            single = (done_batch is None and not self.batch_handlers and index < len(msgs)
                      and not self._size)
            held.floor = msgs[index].offset if single else offset
        self._counters["declined." + ("direct" if direct else "broadcast")] += 1
        if log.isEnabledFor(logging.DEBUG):
            log.debug("node %s: a handler declined %s from %s; offered again later",
                      self._name, env.msg_id, env.sender)
        return held

    def _track_unacked(self, held: _Held) -> None:
        if held.ident is not None:
            self._receiving.declined(held.env.sender, held.env.incarnation, held.env.seq)

    def _take(self, upto: int) -> None:
        """Take journal positions below ``upto``, but none a declined message holds."""
        journal = self.journal
        assert journal is not None
        floor = self._floor
        if floor is None:
            journal.take(upto)
            return
        if upto > self._goal:
            self._goal = upto
        journal.take(min(upto, floor))

    def _held_changed(self) -> None:
        """Held messages came or went: move the journal's floor (and the mark up to it)."""
        floors = [q[0].floor for q in self._held.values() if q and q[0].floor >= 0]
        floor = min(floors) if floors else None
        journal = self.journal
        if journal is None or floor == self._floor:
            return
        if self._floor is None:
            self._goal = max(self._goal, journal.taken)
        self._floor = floor
        journal.take(self._goal if floor is None else min(self._goal, floor))

    def _schedule_offer(self, queue: _HeldQueue) -> None:
        """Back ``queue`` off (capped, doubling) and arm the timer of the next offer."""
        cfg = self._config
        queue.delay = min(cfg.redeliver_max, max(cfg.redeliver_initial, queue.delay * 2))
        queue.due = time.monotonic() + queue.delay
        self._wake_by(queue.due)

    @property
    def next_due(self) -> float:
        """When the next declined message is offered again (monotonic; inf: none)."""
        if not self._held:
            return float("inf")
        return min(q.due for q in self._held.values())

    def offer_due(self, now: float) -> None:
        """Offer the declined messages whose backoff has passed (the timer's call)."""
        if self._held and self.next_due <= now:
            self._offer_held(False)

    def _offer_held(self, now_all: bool) -> None:
        """Offer declined messages again: every sender's (``now_all``) or those due."""
        if self._closed():
            return
        now = time.monotonic()
        for key, queue in list(self._held.items()):
            if now_all:
                queue.delay = 0.0  # a fresh start: the backoff begins again
            elif queue.due > now:
                continue
            while queue:
                item = queue[0]
                if self._dispatch(item.env, item.msgs, item.offset, item.end, item.direct,
                                  item.ident, item) is not None:
                    self._schedule_offer(queue)
                    break
                self.held_count -= len(item.msgs)
                queue.popleft()
                queue.delay = 0.0
            if not queue:
                del self._held[key]
        self._held_changed()
        self._after_batch()

    def redeliver(self) -> None:
        """Offer the declined messages to the handlers again now (see
        :meth:`Node.redeliver`)."""
        if self._held:
            self._offer_held(True)

    def _bound_messages(self, env: Envelope, msgs: list[Message]) -> list[Message]:
        """The messages whose ``actor`` is the (authenticated) sender; the rest are
        refused. The profile's plain-text fallback has no actor and speaks for its
        sender."""
        sender = env.sender
        if all(m.activity.actor == sender or m.activity.is_fallback for m in msgs):
            return msgs
        kept = []
        for msg in msgs:
            activity = msg.activity
            if activity.actor == sender or activity.is_fallback:
                kept.append(msg)
            else:
                self._refuse("spoofed-actor", sender, f"{sender!r} sent a {activity.type} "
                             f"with actor {activity.actor[:64]!r} on {env.channel}")
        return kept

    # -------------------------------------------------------------- the application

    def add_handler(self, handler: Handler) -> Callable[[], None]:
        """Add a handler (see :meth:`Node.add_handler`); returns its remover."""
        self.handlers.append(handler)
        self._consumer_added()
        return lambda: self.handlers.remove(handler)

    def add_batch_handler(self, handler: BatchHandler) -> Callable[[], None]:
        """Add a batch handler (see :meth:`Node.add_batch_handler`); returns its remover."""
        self.batch_handlers.append(handler)
        self._consumer_added()
        return lambda: self.batch_handlers.remove(handler)

    def _consumer_added(self) -> None:
        # Without an inbox, messages owed from before a restart wait for a handler; it
        # gets them on the next loop turn, ahead of anything new (see open_journal).
        # Declined messages are offered again at once: the new handler may take them.
        if self._loop is None:
            return
        if self._replay and not self._size:
            self._loop.call_soon(self._redeliver)
        if self._held:
            self._loop.call_soon(self.redeliver)

    def drain(self, *, limit: int | None = None, ack: bool = True) -> list[Message]:
        """Take up to ``limit`` messages without waiting (see :meth:`Node.drain`)."""
        if ack:
            self.ack()
        self._read_at = time.monotonic()
        inbox = self._messages
        if limit is None or limit >= len(inbox):
            out = list(inbox)
            inbox.clear()
        else:
            out = [inbox.popleft() for _ in range(limit)]
        for msg in reversed(out):
            if msg.offset >= 0:
                self._handed = msg.offset + 1
                break
        return out

    async def receive(self, timeout: float | None = None, *, ack: bool = True) -> Message:
        """The next message, waiting up to ``timeout`` (see :meth:`Node.receive`).

        Raises:
            TimeoutError: nothing arrived in time.
            NodeClosedError: the node closed while waiting.
        """
        loop = self._loop
        assert loop is not None, "node not started"
        if ack:
            self.ack()
        messages = self._messages
        if not messages:
            # A future and a timer of our own rather than asyncio.timeout() around an
            # Event: a request/reply client waits here once per reply, and this costs
            # half the calls.
            deadline = None if timeout is None else loop.time() + timeout
            while not messages:
                if self._closed():
                    raise NodeClosedError(f"node {self._name} closed")
                await self._wait(loop, deadline)
        msg = messages.popleft()
        self._read_at = time.monotonic()
        if msg.offset >= 0:
            self._handed = msg.offset + 1
        return msg

    def ack(self, message: Message | None = None) -> None:
        """Take what was handed out (see :meth:`Node.ack`)."""
        if self.journal is None:
            return
        self._read_at = time.monotonic()
        if message is None:
            self._take(self._handed)
        elif message.offset >= 0:
            self._take(min(message.offset + 1, self._handed))

    async def wait_readable(self) -> None:
        """Wait until the inbox holds at least one message (or the node closes)."""
        loop = self._loop
        assert loop is not None, "node not started"
        while not self._messages and not self._closed():
            await self._wait(loop, None)

    async def _wait(self, loop: asyncio.AbstractEventLoop, deadline: float | None) -> None:
        """Wait until a message arrives or the node closes (``deadline``: loop time after
        which :class:`TimeoutError` is raised)."""
        waiter = loop.create_future()
        self._waiters.append(waiter)
        timer = None if deadline is None else loop.call_at(deadline, _expire, waiter)
        try:
            await waiter
        except BaseException:
            # Timed out or cancelled: nothing will wake it (a wake-up clears the list).
            if waiter in self._waiters:
                self._waiters.remove(waiter)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _wake(self) -> None:
        """Wake every reader waiting in :meth:`_wait`."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def check_unread(self, now: float) -> None:
        """Say once when owed messages wait for an application that does not read them:
        an inbox nobody reads, or (without an inbox) no handler for what a restart
        owes. Said again only after the application read in between."""
        waiting = len(self._messages) if self._size else sum(
            r.count for _, r in self._replay)
        if not waiting:
            self.unread_warned = False
            self._read_at = now
            return
        idle = now - self._read_at
        if idle < self._config.unread_warning:
            self.unread_warned = False
            return
        if self.unread_warned:
            return
        self.unread_warned = True
        self._counters["warned.unread"] += 1
        if self._size:
            log.warning("node %s: %d message(s) have waited %.0fs in the inbox and nothing "
                        "reads it (receive(), drain()); pass handlers to the constructor "
                        "(handlers=[...]) to see them, or read the inbox", self._name,
                        waiting, idle)
        else:
            log.warning("node %s: %d message(s) owed from before a restart have waited "
                        "%.0fs for a handler; add one (or pass handlers=[...] to the "
                        "constructor)", self._name, waiting, idle)
