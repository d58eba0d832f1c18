"""One node's end of the mesh protocol as a pure state machine: direct sending with
acknowledgement, direct receiving with de-duplication, broadcasts with gap counting, and
the roster of peers, all driven by frames, timer expiries and an explicit ``now``.

Theory of operation
-------------------
An :class:`Endpoint` composes the core's pure pieces the way the node glues them,
and says what to do as an ordered list of :data:`Action` values instead of doing it.
Its sending side and roster are the node's own :class:`~.sending.Sender` and
:class:`~.roster.Roster`:

::

    send()  --> Sender.send_run     --> [SendFrame(direct)]        (or [Fail] when full)
    timer() --> Sender.timer        --> [SendFrame(resend)...,  Fail(deadline)...]
            --> Roster.tick         --> [PeerChanged(evasive | left expired)...]
    receive(direct) --> Receiving.direct_message (roster? recipient? DirectReceiver.admit)
                          unknown    --> [Count(dropped.unknown-peer)]        (no ack)
                          NEW        --> [Journal, Deliver, SendFrame(ack)]
                          DUPLICATE* --> [Count, SendFrame(ack)]
                          HELD       --> [Count]                              (no ack)
                          no room... --> [Count]                              (no ack)
    receive(ack)    --> Sender.acked --> [Settle(tokens)...]
    receive(hello)  --> Roster.found --> [SendFrame(hello), SendFrame(resend)...,
                                          PeerChanged(joined), SendFrame(welcome)]
    receive(broadcast) --> Receiving.broadcast --> [Count(lost.broadcast)?, Deliver]
    receive(bye)    --> Roster.left  --> [Fail(left)... for a seat, PeerChanged(left)]

"Journal before deliver before acknowledge" is the order of the list the receiving side
returns. The driver carries the actions out in order; when a :class:`Journal` cannot be
written (a full disk) it stops there and calls :meth:`Endpoint.journal_failed`, so the
message is neither delivered nor acknowledged and its retry is judged new again.

The sending, roster and receiving rules are written once, in :mod:`.sending`,
:mod:`.roster` and :mod:`.receiving`, which the node drives too: this endpoint turns the
receiving side's :class:`~.receiving.Receipt` steps into actions that carry the frame
(:meth:`_receipt`), as the node carries them out on its sockets. Frames are typed
values (:mod:`.frames`; the node encodes them as envelopes and control bodies); a
completion token is opaque (the node keeps futures in it).

Pure: no sockets, no event loop, no clock; ``now`` is monotonic seconds and ``wall`` is
seconds since the epoch (for idempotency keys only).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from porter_mesh.core.advert import PeerAdvert
from porter_mesh.core.outbox import Outbox
from porter_mesh.core.peers import PeerTable
from porter_mesh.core.session.frames import (
    AckFrame,
    BroadcastFrame,
    ByeFrame,
    Count,
    DirectFrame,
    Fail,
    Frame,
    HeartbeatFrame,
    HelloFrame,
    SendFrame,
    Settle,
    WelcomeFrame,
)
from porter_mesh.core.session.keys import KEY_PREFIX
from porter_mesh.core.session.receiving import DirectReceiver, Receipt, Receiving, Step
from porter_mesh.core.session.roster import (
    Connect,
    Disconnect,
    Drop,
    Forget,
    PeerChanged,
    Reconnect,
    Refuse,
    Roster,
    RosterAction,
)
from porter_mesh.core.session.sending import Run, Sender

__all__ = [
    "AckFrame", "Action", "BroadcastFrame", "ByeFrame", "Count", "Deliver", "DirectFrame",
    "Endpoint", "Fail", "Frame", "HeartbeatFrame", "HelloFrame", "Journal", "PeerChanged",
    "SendFrame",
    "Settle", "WelcomeFrame",
]

T = TypeVar("T")


# -- actions --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Journal:
    """Write ``frame`` to the delivery journal before anything else is done with it."""

    frame: DirectFrame


@dataclass(frozen=True, slots=True)
class Deliver:
    """Hand ``frame``'s activities to the application (inbox or handlers)."""

    frame: DirectFrame | BroadcastFrame


Action = SendFrame | Journal | Deliver | Settle[T] | Fail[T] | Count | PeerChanged


class Endpoint(Generic[T]):
    """One node's protocol state.

    Args:
        advert: what this node announces (its name and incarnation are its identity).
        retry_initial, retry_max, max_pending: the :class:`~porter_mesh.core.outbox.Outbox`
            settings.
        key_window: seconds (wall clock) an idempotency key is remembered.
        evasive_after, expire_after: peer silence bounds (:class:`PeerTable`).
        heartbeat_interval: seconds between heartbeats, which also check peer silence.
        journal: whether received direct messages are journaled before delivery (else
            acknowledged once the application takes them, :meth:`taken`).
    """

    def __init__(self, advert: PeerAdvert, *, retry_initial: float, retry_max: float,
                 max_pending: int, key_window: float, evasive_after: float,
                 expire_after: float, heartbeat_interval: float, journal: bool = True,
                 now: float = 0.0) -> None:
        self.advert = advert
        self.name = advert.name
        self.incarnation = advert.incarnation
        self.journal = journal
        self.heartbeat_interval = heartbeat_interval
        self.sending: Sender[T] = Sender(self.name, self.incarnation,
                                         retry_initial=retry_initial, retry_max=retry_max,
                                         max_pending=max_pending)
        self.receiving = Receiving(key_window=key_window, journal=journal)
        self.roster: Roster[T] = Roster(self.name, advert.mesh, self.sending,
                                        evasive_after=evasive_after, expire_after=expire_after)
        self._beat_due = now + heartbeat_interval

    @property
    def peers(self) -> PeerTable:
        """The roster's peers."""
        return self.roster.peers

    @property
    def receiver(self) -> DirectReceiver:
        """The direct messages seen (the receiving side's)."""
        return self.receiving.direct

    @property
    def outbox(self) -> Outbox[Run[T]]:
        """The direct messages in flight (the sender's)."""
        return self.sending.outbox

    # -- sending --------------------------------------------------------------------

    def hello(self, recipient: str) -> list[Action[T]]:
        """Introduce this node to ``recipient`` (a seed, or a peer found by discovery)."""
        return [SendFrame(HelloFrame(self.advert, recipient))]

    def send(self, recipient: str, payload: bytes, *, now: float, deadline: float,
             token: T, count: int = 1, key: str | None = None) -> list[Action[T]]:
        """Send one direct message (:meth:`Sender.send_run`, which the node's flush
        uses too).

        Args:
            recipient: the agent it is for.
            payload: the encoded activities.
            now: monotonic time now.
            deadline: monotonic time after which the send fails.
            token: the caller's completion handle, settled or failed exactly once.
            count: activities in the payload.
            key: an idempotency key; it travels as the message id (``k:`` and the key).

        Returns:
            ``[SendFrame]`` when the recipient is on the roster (else the message waits
            in the outbox for it to join), or ``[Fail(overflow)]`` when ``max_pending``
            messages to it already wait for acknowledgement.
        """
        action = self.sending.send_run(recipient, payload, count, (token,), now=now,
                                       deadline=deadline, reachable=self.peers, key=key)
        return [] if action is None else [action]

    def broadcast(self, channel: str, payload: bytes) -> list[Action[T]]:
        """Publish on ``channel``: best effort, numbered per channel so loss shows."""
        return [self.sending.broadcast(channel, payload)]

    # -- receiving ------------------------------------------------------------------

    def receive(self, frame: Frame, *, now: float, wall: float, room: int | None = None,
                consumer: bool = True, held_full: bool = False) -> list[Action[T]]:
        """One frame arrived.

        Args:
            frame: the decoded frame.
            now: monotonic time now.
            wall: wall time now (idempotency keys).
            room, consumer, held_full: the application's state, as
                :meth:`DirectReceiver.admit` takes them.

        Returns:
            What to do, in order.
        """
        if isinstance(frame, DirectFrame):
            return self._on_direct(frame, now, wall, room, consumer, held_full)
        if isinstance(frame, AckFrame):
            return self._on_ack(frame, now)
        if isinstance(frame, HelloFrame | WelcomeFrame):
            actions = self._roster_actions(self.roster.found(frame.advert, now))
            if isinstance(frame, HelloFrame):
                actions.append(SendFrame(WelcomeFrame(self.advert, frame.advert.name)))
            return actions
        if isinstance(frame, ByeFrame):
            # The rule of Arrivals._on_control for ``bye``.
            return self._roster_actions(self.roster.left(frame.sender, frame.incarnation, now))
        return self._on_broadcast(frame, now)

    def _heard(self, sender: str, incarnation: int,
               now: float) -> tuple[bool, list[Action[T]]]:
        """Mark ``sender`` heard (``Arrivals._heard``): whether it is on the roster."""
        known, actions = self.roster.heard(sender, incarnation, now)
        return known, self._roster_actions(actions)

    def _on_direct(self, frame: DirectFrame, now: float, wall: float, room: int | None,
                   consumer: bool, held_full: bool) -> list[Action[T]]:
        """Judged by :meth:`Receiving.direct_message`, as the node's ``_on_direct``."""
        known, actions = self._heard(frame.sender, frame.incarnation, now)
        receipt = self.receiving.direct_message(
            frame.sender, frame.incarnation, frame.recipient, frame.seq, frame.count,
            frame.msg_id, known=known, me=self.name, room=room, consumer=consumer,
            held_full=held_full, wall=wall)
        return self._receipt(receipt, frame, actions)

    def _receipt(self, receipt: Receipt, frame: DirectFrame | BroadcastFrame,
                 actions: list[Action[T]]) -> list[Action[T]]:
        """``receipt`` as actions about ``frame``, appended to ``actions``: the count
        first, then its steps in order."""
        if receipt.counter:
            actions.append(Count(receipt.counter, receipt.n))
        for step in receipt.steps:
            if step is Step.JOURNAL:
                assert isinstance(frame, DirectFrame)
                actions.append(Journal(frame))
            elif step is Step.DELIVER:
                actions.append(Deliver(frame))
            else:
                actions.append(SendFrame(AckFrame(self.name, self.incarnation, frame.sender,
                                                  (frame.seq,))))
        return actions

    def journal_failed(self, frame: DirectFrame) -> list[Action[T]]:
        """The :class:`Journal` of ``frame`` could not be written (``Inbox._storage_failed``):
        nothing after it is carried out, and its retry is judged new again."""
        return self._receipt(self.receiving.journal_failed(
            frame.sender, frame.incarnation, frame.seq, frame.msg_id, frame.count), frame, [])

    def taken(self, frame: DirectFrame) -> list[Action[T]]:
        """Without a journal: the application took ``frame``, acknowledge it now."""
        return self._receipt(self.receiving.taken(frame.sender, frame.incarnation, frame.seq),
                             frame, [])

    def declined(self, frame: DirectFrame) -> list[Action[T]]:
        """Without a journal: a handler declined ``frame``; it stays unacknowledged."""
        return self._receipt(
            self.receiving.declined(frame.sender, frame.incarnation, frame.seq), frame, [])

    def _on_ack(self, frame: AckFrame, now: float) -> list[Action[T]]:
        """The rule of ``Arrivals._on_ack``: each named message settles once."""
        _, actions = self._heard(frame.sender, frame.incarnation, now)
        actions += self.sending.acked(frame.sender, frame.firsts, now)
        return actions

    def _on_broadcast(self, frame: BroadcastFrame | HeartbeatFrame,
                      now: float) -> list[Action[T]]:
        """Judged by :meth:`Receiving.broadcast`, as the node's ``_on_broadcast``: a
        heartbeat only marks its sender heard."""
        known, actions = self._heard(frame.sender, frame.incarnation, now)
        if isinstance(frame, HeartbeatFrame):
            if not known:
                actions.append(Count("dropped.unknown-peer"))
            return actions
        receipt = self.receiving.broadcast(frame.sender, frame.channel, frame.incarnation,
                                           frame.seq, frame.count, known=known)
        return self._receipt(receipt, frame, actions)

    # -- the roster -----------------------------------------------------------------

    def _roster_actions(self, actions: Iterable[RosterAction | Action[T]]) -> list[Action[T]]:
        """The roster's actions (:class:`~.roster.Roster`, the node's own rules) as this
        endpoint carries them: a link is a hello on the in-memory wire; a restarted
        peer's streams start over here."""
        out: list[Action[T]] = []
        for action in actions:
            if isinstance(action, Connect | Reconnect):
                out.append(SendFrame(HelloFrame(self.advert, action.advert.name)))
            elif isinstance(action, Forget):
                self.receiving.forget(action.name)
            elif isinstance(action, Drop | Refuse):
                out.append(Count("dropped." + (action.reason if isinstance(action, Drop)
                                               else action.event)))
            elif not isinstance(action, Disconnect):
                out.append(action)
        return out

    # -- a life's start and end ----------------------------------------------------

    def restore(self, journal: list[tuple[DirectFrame, float]]) -> None:
        """Remember what an earlier run of this node journaled (``Inbox.open_journal``):
        each message with the wall time it arrived, oldest first, so that its retries
        are duplicates and its key stays in the window."""
        for frame, wall in journal:
            key = frame.msg_id[len(KEY_PREFIX):] if frame.msg_id.startswith(KEY_PREFIX) else None
            self.receiving.direct.restore(frame.sender, frame.incarnation, frame.seq, frame.count,
                                  key, wall)

    def close(self) -> list[Action[T]]:
        """The node is closing (``Node.aclose``): the peers are told goodbye, and every
        send in flight fails."""
        actions: list[Action[T]] = [SendFrame(ByeFrame(self.name, self.incarnation))]
        actions += self.sending.close()
        return actions

    # -- time -----------------------------------------------------------------------

    def next_deadline(self) -> float:
        """When :meth:`timer` next has something to do (``Node._next_deadline``).

        Returns:
            Monotonic seconds: the next heartbeat, resend or send deadline. May be
            early, never late (a settled send's old time is found, then passed over).
        """
        return min(self._beat_due, self.sending.next_due)

    def timer(self, now: float) -> list[Action[T]]:
        """Time passed to ``now`` (``Node._tick``): resends, failed sends, and on the
        heartbeat's cadence a heartbeat and the peers' silence check.

        Args:
            now: monotonic time now (at or after :meth:`next_deadline` to do anything).

        Returns:
            Resends (only to peers on the roster: the others get theirs when they join),
            ``Fail(deadline)`` for each send past its deadline, then the heartbeat and
            the roster's changes.
        """
        actions: list[Action[T]] = list(self.sending.timer(now, self.peers))
        if now >= self._beat_due:
            self._beat_due = now + self.heartbeat_interval
            actions.append(SendFrame(HeartbeatFrame(self.name, self.incarnation)))
            actions += self._roster_actions(self.roster.tick(now))
        return actions
