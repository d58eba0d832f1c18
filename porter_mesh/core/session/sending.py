"""Sending, as one pure unit: what waits to go out, how it is cut into messages and
numbered, and what becomes of each direct message until it is acknowledged or fails.

Theory of operation
-------------------
The application queues activities; at the next flush the queues become messages. A
:class:`Sender` returns what to do as frozen actions and never touches a socket:

::

    queue(recipient, activity, token, deadline, key?, trace?)   waits per recipient
    publish(channel, activity)                                   waits per channel
    flush(now, reachable)
        broadcasts: runs of <= batch_max activities and <= broadcast_bytes bytes,
                    numbered per channel                   --> [SendFrame(broadcast)...]
        direct:     runs per recipient (a keyed or traced activity travels alone)
                    --> send_run --> Outbox.allocate --full--> [Fail(overflow)]
                                 --> Outbox.add --> [SendFrame(direct)] if reachable
                                                  (else it waits for the recipient to join)
    acked(sender, firsts, now)   --> [Settle...]                   each message once
    timer(now, reachable)        --> [SendFrame(resend)... to reachable recipients,
                                      Fail(deadline)...]
    joined(name, now)            --> [SendFrame(resend)...]  everything in flight to a new
                                                             connection, backoff restarts
    left(name, role, reason)     --> [Fail(left)...]   a seat that said goodbye
    refused(name)                --> [Fail(refused)...] the recipient refused our keys
    close()                      --> [Fail(closed)...]  in flight and still queued

A direct message carries one or more activities, each with its own completion token;
its :class:`~.frames.Settle` or :class:`~.frames.Fail` names them all. A run is cut where
one message would pass the size limit of a frame (:func:`runs`), so a single activity is
sent whatever its size and the envelope codec says if it is too large.

The sender keeps each message as a typed :class:`~.frames.DirectFrame` (the payload is
encoded once); the driver encodes the envelope each time it sends it. Backpressure has
two bounds: ``max_pending`` messages in flight per recipient (more fail at once with
``overflow``: a stopped receiver cannot grow the sender's memory), and a socket that
refuses a frame, after which the driver holds that recipient's later frames of the same
list for the resend timer (see :class:`~.frames.SendFrame`).

Pure: no sockets, no event loop, no clock; ``now`` is monotonic seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterator
from typing import Final, Generic, NamedTuple, TypeVar, cast

from porter_mesh.core.as2 import Activity
from porter_mesh.core.constants import CHANNEL_CONTROL, DIRECT_PREFIX, MAX_BATCH, ROLE_SEAT
from porter_mesh.core.envelope import encode_payload, make_msg_id
from porter_mesh.core.outbox import Outbox, Pending
from porter_mesh.core.session.frames import (
    BroadcastFrame,
    Count,
    DirectFrame,
    Fail,
    FailReason,
    SendFrame,
    Settle,
)
from porter_mesh.core.session.keys import KEY_PREFIX
from porter_mesh.core.tracecontext import TraceContext
from porter_mesh.errors import FrameError

__all__ = ["Run", "SendAction", "Sender", "runs"]

T = TypeVar("T")
_I = TypeVar("_I")

#: What a sender asks of its driver.
SendAction = SendFrame | Settle[T] | Fail[T] | Count

# One queued direct activity: (activity, token, deadline, key, trace). A plain tuple:
# this is the hot path of every send.
_Queued = tuple[Activity, T, float, str | None, TraceContext | None]

#: The count of one direct activity sent (a frozen value, shared).
_SENT_ONE: Final = Count("sent.direct", 1)


class Run(NamedTuple, Generic[T]):
    """One direct message in flight: its frame and the tokens of its activities (what
    the outbox keeps for each entry)."""

    frame: DirectFrame
    tokens: tuple[T, ...]


def runs(items: list[_I], activity: Callable[[_I], Activity] | None, *, batch_max: int,
         max_bytes: int | None = None) -> Iterator[tuple[list[_I], bytes]]:
    """``items`` cut into runs of at most ``batch_max``, each with its encoded payload.

    A run whose activities together pass one frame's size limit (or ``max_bytes``) is
    split into parts that fit; a single activity is yielded whatever its size.

    Args:
        items: what to send, in order.
        activity: picks an item's activity (``None``: the items are activities).
        batch_max: most activities in one message.
        max_bytes: most payload bytes in one message (besides the frame's own limit).

    Yields:
        ``(run, payload)`` in order; together the runs are ``items``.

    Raises:
        FrameError: one activity alone is too large for a frame, or is not valid.
    """
    step = batch_max
    pending = [items[start:start + step] for start in range(0, len(items), step)][::-1]
    while pending:
        chunk = pending.pop()
        try:
            payload = encode_payload(
                cast(list[Activity], chunk) if activity is None
                else [activity(item) for item in chunk])
        except FrameError as exc:
            if exc.reason != "too-large" or len(chunk) == 1:
                raise
            parts = 2
        else:
            if max_bytes is None or len(payload) <= max_bytes or len(chunk) == 1:
                yield chunk, payload
                continue
            parts = -(-len(payload) // max_bytes)
        size = -(-len(chunk) // min(parts, len(chunk)))
        pending += [chunk[i:i + size] for i in range(0, len(chunk), size)][::-1]


def _activity(item: _Queued[T]) -> Activity:
    return item[0]


class Sender(Generic[T]):
    """One node's sending side.

    Args:
        name: this node's agent name (the frames' sender).
        incarnation: this node's incarnation.
        retry_initial, retry_max, max_pending: the :class:`~porter_mesh.core.outbox.Outbox`
            settings.
        batch_max: most activities in one message.
        broadcast_batch_max: most activities in one broadcast message (None: ``batch_max``).
        broadcast_bytes: most payload bytes in one broadcast message (None: no bound
            besides the frame's).
    """

    def __init__(self, name: str, incarnation: int, *, retry_initial: float,
                 retry_max: float, max_pending: int, batch_max: int = MAX_BATCH,
                 broadcast_batch_max: int | None = None,
                 broadcast_bytes: int | None = None) -> None:
        self.name = name
        self.incarnation = incarnation
        self.batch_max = batch_max
        self.broadcast_batch_max = batch_max if broadcast_batch_max is None else broadcast_batch_max
        self.broadcast_bytes = broadcast_bytes
        self.outbox: Outbox[Run[T]] = Outbox(retry_initial=retry_initial,
                                              retry_max=retry_max, max_pending=max_pending)
        #: Direct activities waiting for a flush, by recipient; broadcasts, by channel.
        #: The queues themselves, public so that the driver can ask whether any wait
        #: (after every read and flush) without a call: read them, never change them.
        self.direct_queued: dict[str, list[_Queued[T]]] = {}
        self.broadcasts_queued: dict[str, list[Activity]] = {}
        # Recipients whose queue holds an activity that travels alone (keyed or traced).
        self._alone: set[str] = set()
        self._bseq: dict[str, int] = {}

    # -- queues ---------------------------------------------------------------------

    def queue(self, recipient: str, activity: Activity, token: T, deadline: float, *,
              key: str | None = None, trace: TraceContext | None = None) -> None:
        """Queue one direct activity for the next :meth:`flush`.

        Args:
            recipient: the agent it is for.
            activity: what to send.
            token: the caller's completion handle, settled or failed exactly once.
            deadline: monotonic time after which the send fails.
            key: an idempotency key; a keyed activity travels alone, its message id
                ``k:`` and the key, so that the receiver recognises a retry.
            trace: W3C trace context; a traced activity travels alone with it.
        """
        queue = self.direct_queued.get(recipient)
        if queue is None:
            queue = self.direct_queued[recipient] = []
        queue.append((activity, token, deadline, key, trace))
        if key is not None or trace is not None:
            self._alone.add(recipient)

    def publish_more(self, channel: str, activity: Activity) -> bool:
        """Queue one broadcast behind others waiting on ``channel``.

        Returns:
            Whether any waited (else nothing was queued: see :meth:`publish`).
        """
        queue = self.broadcasts_queued.get(channel)
        if queue is None:
            return False
        queue.append(activity)
        return True

    def publish(self, channel: str, activity: Activity) -> None:
        """Queue one broadcast for the next :meth:`flush` (the driver asks for one)."""
        queue = self.broadcasts_queued.get(channel)
        if queue is None:
            self.broadcasts_queued[channel] = [activity]
        else:
            queue.append(activity)

    def flush(self, now: float, reachable: Container[str]) -> list[SendAction[T]]:
        """Everything queued becomes messages: broadcasts first, then direct ones.

        Args:
            now: monotonic time now.
            reachable: the recipients this node has a connection to; a message to any
                other waits in the outbox until :meth:`joined`.

        Returns:
            The frames to send, failures (``overflow``) and counts, in order.
        """
        actions: list[SendAction[T]] = []
        if self.broadcasts_queued:
            pending, self.broadcasts_queued = self.broadcasts_queued, {}
            for channel, activities in pending.items():
                actions += self._broadcast(channel, activities, None)
        if self.direct_queued:
            pending_d, self.direct_queued = self.direct_queued, {}
            alone, self._alone = self._alone, set()
            for recipient, items in pending_d.items():
                if recipient in alone:
                    self._flush_alone(recipient, items, now, reachable, actions)
                else:
                    self._count_sent(self._runs(recipient, items, None, None, now,
                                                reachable, actions), actions)
        return actions

    def publish_now(self, channel: str, activity: Activity,
                    trace: TraceContext) -> list[SendAction[T]]:
        """A traced broadcast, in its own message, after what is queued before it on
        ``channel`` (so that the channel's order holds)."""
        actions: list[SendAction[T]] = []
        queued = self.broadcasts_queued.pop(channel, None)
        if queued:
            actions += self._broadcast(channel, queued, None)
        actions += self._broadcast(channel, [activity], trace)
        return actions

    # -- broadcasts -----------------------------------------------------------------

    def _broadcast(self, channel: str, activities: list[Activity],
                   trace: TraceContext | None) -> list[SendAction[T]]:
        actions: list[SendAction[T]] = []
        last = self._bseq.get(channel, 0)
        for chunk, payload in runs(activities, None, batch_max=self.broadcast_batch_max,
                                   max_bytes=self.broadcast_bytes):
            actions.append(SendFrame(BroadcastFrame(self.name, self.incarnation, channel,
                                                    last + 1, payload, len(chunk), None,
                                                    trace)))
            last += len(chunk)
        self._bseq[channel] = last
        actions.append(Count("sent.broadcast", len(activities)))
        return actions

    def broadcast(self, channel: str, payload: bytes, *, count: int = 1,
                  kind: str | None = None) -> SendFrame:
        """One encoded broadcast (a control message names its ``kind``), next in the
        channel's sequence: best effort, numbered so that loss shows."""
        seq = self._bseq.get(channel, 0) + 1
        self._bseq[channel] = seq + count - 1
        return SendFrame(BroadcastFrame(self.name, self.incarnation, channel, seq, payload,
                                        count, kind))

    def broadcast_positions(self) -> dict[str, int]:
        """The last sequence number sent on each channel but ``control`` (a heartbeat
        carries them, so that a subscriber sees a lost tail)."""
        return {ch: seq for ch, seq in self._bseq.items() if ch != CHANNEL_CONTROL}

    # -- direct ---------------------------------------------------------------------

    def _flush_alone(self, recipient: str, items: list[_Queued[T]], now: float,
                     reachable: Container[str], actions: list[SendAction[T]]) -> None:
        """A recipient's queue that holds activities travelling alone (keyed or traced):
        each of those in its own message, the runs between them as usual."""
        sent = 0
        start = 0
        for index, item in enumerate(items):
            if item[3] is None and item[4] is None:
                continue
            if index > start:
                sent += self._runs(recipient, items[start:index], None, None, now,
                                   reachable, actions)
            sent += self._runs(recipient, items[index:index + 1], item[3], item[4], now,
                               reachable, actions)
            start = index + 1
        if start < len(items):
            sent += self._runs(recipient, items[start:], None, None, now, reachable,
                               actions)
        self._count_sent(sent, actions)

    @staticmethod
    def _count_sent(sent: int, actions: list[SendAction[T]]) -> None:
        if sent == 1:
            actions.append(_SENT_ONE)  # the usual request or reply: no Count built
        elif sent:
            actions.append(Count("sent.direct", sent))

    def _runs(self, recipient: str, items: list[_Queued[T]], key: str | None,
              trace: TraceContext | None, now: float, reachable: Container[str],
              actions: list[SendAction[T]]) -> int:
        """Cut ``items`` into messages and send each; returns the activities sent."""
        if len(items) == 1:
            # The common case of a request or a reply: one activity, one message.
            activity, token, deadline, _, _ = items[0]
            action = self.send_run(recipient, encode_payload([activity]), 1, (token,),
                                   now=now, deadline=deadline, reachable=reachable, key=key,
                                   trace=trace)
            if action is not None:
                actions.append(action)
            return 0 if type(action) is Fail else 1
        sent = 0
        for chunk, payload in runs(items, _activity, batch_max=self.batch_max):
            tokens = tuple([item[1] for item in chunk])
            deadline = min([item[2] for item in chunk])
            action = self.send_run(recipient, payload, len(chunk), tokens, now=now,
                                   deadline=deadline, reachable=reachable, key=key,
                                   trace=trace)
            if action is not None:
                actions.append(action)
            if type(action) is not Fail:
                sent += len(chunk)
        return sent

    def send_run(self, recipient: str, payload: bytes, count: int, tokens: tuple[T, ...], *,
                 now: float, deadline: float, reachable: Container[str],
                 key: str | None = None,
                 trace: TraceContext | None = None) -> SendFrame | Fail[T] | None:
        """Send one direct message of ``count`` encoded activities now.

        Args:
            recipient: the agent it is for.
            payload: the encoded activities.
            count: how many.
            tokens: the activities' completion handles.
            now: monotonic time now.
            deadline: monotonic time after which the send fails.
            reachable: the recipients this node has a connection to.
            key: an idempotency key; it travels as the message id (``k:`` and the key).
            trace: the W3C trace context the message carries.

        Returns:
            ``SendFrame`` when the recipient is reachable, ``None`` when the message
            waits in the outbox for it to join, or ``Fail(overflow)`` when
            ``max_pending`` messages to it already wait for acknowledgement.
        """
        try:
            first = self.outbox.allocate(recipient, count)
        except OverflowError:
            return Fail(tokens, recipient, "overflow", 0, count)
        msg_id = (KEY_PREFIX + key if key is not None
                  else make_msg_id(self.incarnation, DIRECT_PREFIX + recipient, first))
        frame = DirectFrame(self.name, self.incarnation, recipient, first, count, msg_id,
                            payload, trace)
        self.outbox.add(recipient, first, count, [], deadline=deadline, now=now,
                        token=Run(frame, tokens))
        return SendFrame(frame) if recipient in reachable else None

    def acked(self, sender: str, firsts: tuple[int, ...] | list[int],
              now: float) -> list[SendAction[T]]:
        """``sender`` acknowledged the messages starting at ``firsts``: each settles
        once (a repeated or unknown acknowledgement is ignored)."""
        actions: list[SendAction[T]] = []
        for first in firsts:
            entry = self.outbox.acked(sender, first, now)
            if entry is not None:
                actions.append(Settle(entry.token.tokens))
        return actions

    @staticmethod
    def _fail(entry: Pending[Run[T]], reason: FailReason) -> Fail[T]:
        return Fail(entry.token.tokens, entry.recipient, reason, entry.attempts, entry.count)

    # -- time and peers -------------------------------------------------------------

    @property
    def next_due(self) -> float:
        """When :meth:`timer` next has something to do (monotonic; ``inf``: nothing in
        flight). May be early, never late."""
        return self.outbox.next_due

    def timer(self, now: float, reachable: Container[str]) -> list[SendAction[T]]:
        """Time passed to ``now``.

        Returns:
            Resends (only to reachable recipients: the others get theirs when they
            join), then ``Fail(deadline)`` for each message past its deadline.
        """
        resend, failed = self.outbox.poll(now)
        actions: list[SendAction[T]] = [SendFrame(entry.token.frame) for entry in resend
                                        if entry.recipient in reachable]
        actions += [self._fail(entry, "deadline") for entry in failed]
        return actions

    def joined(self, name: str, now: float) -> list[SendAction[T]]:
        """A new connection to ``name``: everything in flight to it goes at once, and
        its backoff starts over."""
        return [SendFrame(entry.token.frame) for entry in self.outbox.retry_now(name, now)]

    def left(self, name: str, role: str, reason: str) -> list[SendAction[T]]:
        """``name`` (of ``role``) left the roster for ``reason``.

        A command line's seat that said goodbye is not coming back for its replies:
        they fail now rather than at their deadline. Any other peer may come back
        before the deadline, so its messages keep waiting.
        """
        if role == ROLE_SEAT and reason == "goodbye":
            return [self._fail(entry, "left") for entry in self.outbox.fail_for(name)]
        return []

    def refused(self, name: str) -> list[SendAction[T]]:
        """``name`` refused this node's connection: what waits for it fails now."""
        return [self._fail(entry, "refused") for entry in self.outbox.fail_for(name)]

    def close(self) -> list[SendAction[T]]:
        """This node is closing: every message in flight fails, then every activity
        still queued."""
        actions: list[SendAction[T]] = [self._fail(entry, "closed")
                                        for entry in self.outbox.fail_all()]
        for recipient, items in self.direct_queued.items():
            actions += [Fail((item[1],), recipient, "closed") for item in items]
        self.direct_queued.clear()
        self._alone.clear()
        self.broadcasts_queued.clear()
        return actions
