"""Receiving direct messages: whether a message is new, a duplicate, or must wait.

Theory of operation
-------------------
A direct message arrives at least once and often more: its sender resends it until it
is acknowledged. The receiver decides, for each arrival of a message from a peer on the
roster, one :class:`Verdict`:

::

    arrival --(no room, no consumer, too much held)--> refuse: no ack, sender retries
       |
       v
    sequence tracker (sender, incarnation, seq) --new--> key seen? --yes--> DUPLICATE_KEY
       |                                                   |no
       | seen before                                       v
       +-- refused for a full disk? --yes----------------> NEW: journal, deliver, ack
       +-- declined by a handler, held in memory? -------> HELD: no ack until taken
       +-- otherwise ------------------------------------> DUPLICATE: ack again

Admission comes first: a message refused for room is not recorded as seen, so its
retry is judged afresh. A NEW message must be journaled (when the node keeps a journal)
before it is delivered, and delivered before it is acknowledged; when the journal
cannot write it, :meth:`DirectReceiver.refused` makes its retry NEW again. A message a
handler declines on a node without a journal stays unacknowledged
(:meth:`DirectReceiver.hold`) until it is taken (:meth:`DirectReceiver.taken`), so its
retries are not acknowledged meanwhile either.

Broadcasts are best effort: a broadcast from a peer on the roster is delivered as it
comes; a jump in its channel's numbering is counted as loss and never waited for, and a
repeat is counted. A heartbeat's positions (the last number sent on each channel) move
the top of each stream so that loss at the tail shows too.

:class:`Receiving` puts these rules together and says, for each arrival, what to do in
order as a :class:`Receipt` (the steps journal, deliver, acknowledge, and a counter to
add to). The node (:meth:`porter_mesh.node.arrivals.Arrivals._on_direct`, ``_on_broadcast``)
and the pure :class:`~porter_mesh.core.session.endpoint.Endpoint` both carry out its
receipts, so each receiving rule is written here once.

Pure: the caller passes the wall time (for idempotency keys) and carries the receipts
out.
"""

from __future__ import annotations

import enum
from typing import Final, NamedTuple

from porter_mesh.core.constants import MAX_BATCH
from porter_mesh.core.sequence import SeqResult, SequenceTracker, SeqVerdict
from porter_mesh.core.session.keys import KEY_PREFIX, IdempotencyKeys, key_of

__all__ = [
    "DECLINED", "DIRECT_STREAM", "LOST_BROADCAST", "MISADDRESSED", "TAKEN", "UNKNOWN_SENDER",
    "DirectReceiver", "Receipt", "Receiving", "Step", "Verdict",
]

#: The tracker's stream name for direct messages (one stream per sender).
DIRECT_STREAM: Final = "direct"
#: Sequence numbers a receiver remembers per sender (retries that overtake each other
#: within this window are still told apart).
SEQUENCE_WINDOW: Final = 1 << 16
_KEY_PREFIX_LEN: Final = len(KEY_PREFIX)
#: Most messages remembered as refused for a full disk.
MAX_UNJOURNALED: Final = 100_000


class Verdict(enum.Enum):
    """What to do with one arrival; the value is the counter it adds to (empty: none)."""

    #: New: journal it, deliver it, then acknowledge it.
    NEW = ""
    #: Seen before: acknowledge it again, deliver nothing.
    DUPLICATE = "duplicate.direct"
    #: A new sequence whose idempotency key was seen within the window: acknowledge it,
    #: deliver nothing.
    DUPLICATE_KEY = "duplicate.key"
    #: A retry of a message a handler declined, held in memory: no acknowledgement yet.
    HELD = "duplicate.held"
    #: The inbox has no room: no acknowledgement, the sender retries.
    NO_ROOM = "backpressure.inbox"
    #: No inbox and no handler (or owed messages go first): the sender retries.
    NO_CONSUMER = "backpressure.no-consumer"
    #: Handlers declined this much already: the sender retries.
    HELD_FULL = "backpressure.held"

    @property
    def acknowledged(self) -> bool:
        """Whether the arrival is acknowledged now (NEW: once journaled and taken)."""
        return self in (Verdict.DUPLICATE, Verdict.DUPLICATE_KEY)


class DirectReceiver:
    """The direct-message state of one receiver: sequences seen per sender, the
    idempotency keys, messages refused for a full disk, messages held unacknowledged.

    Args:
        key_window: seconds (wall clock) an idempotency key is remembered.
    """

    def __init__(self, *, key_window: float) -> None:
        self.tracker = SequenceTracker(window=SEQUENCE_WINDOW)
        self.keys = IdempotencyKeys(window=key_window)
        self._unjournaled: dict[tuple[str, int, int], None] = {}
        self._unacked: set[tuple[str, int, int]] = set()

    def admit(self, sender: str, incarnation: int, seq: int, count: int, msg_id: str, *,
              room: int | None, consumer: bool, held_full: bool, wall: float) -> Verdict:
        """Judge one arrival of a direct message from a peer on the roster.

        Args:
            sender, incarnation, seq, count, msg_id: from its envelope.
            room: activities the inbox can still take; None without an inbox.
            consumer: without an inbox, whether a handler is there to take it now.
            held_full: whether handlers have declined as much as the node holds.
            wall: the wall time now (seconds since the epoch), for its key.

        Returns:
            The verdict; a NEW message is recorded as seen (and its key remembered).
        """
        if room is not None:
            if count > room:
                return Verdict.NO_ROOM
        elif not consumer:
            return Verdict.NO_CONSUMER
        if held_full:
            return Verdict.HELD_FULL
        ident = (sender, incarnation, seq)
        is_new = self.tracker.observe_range(sender, DIRECT_STREAM, incarnation, seq,
                                            count).is_new
        if not is_new and self._unjournaled and ident in self._unjournaled:
            # Seen, but its journal write failed (a full disk): this retry may land.
            del self._unjournaled[ident]
            is_new = True
        if is_new:
            # A slice comparison first: no call for the usual message, which has no key.
            if msg_id[:_KEY_PREFIX_LEN] == KEY_PREFIX:
                key = key_of(msg_id)
                if key is not None and self.keys.seen(sender, key, wall):
                    return Verdict.DUPLICATE_KEY
            return Verdict.NEW
        if self._unacked and ident in self._unacked:
            return Verdict.HELD
        return Verdict.DUPLICATE

    def restore(self, sender: str, incarnation: int, first_seq: int, count: int,
                key: str | None, wall: float) -> None:
        """Remember a message journaled by an earlier run of this node (oldest first):
        its sequences, and its key from the wall time it arrived."""
        # Compaction merges a sender's taken messages into runs of any length; only the
        # tracker's window of a run's end matters (older is a duplicate anyway).
        last = first_seq + count - 1
        first = max(first_seq, last - self.tracker.window + 1)
        while first <= last:
            step = min(MAX_BATCH, last - first + 1)
            self.tracker.observe_range(sender, DIRECT_STREAM, incarnation, first, step)
            first += step
        if key is not None:
            self.keys.restore(sender, key, wall)

    def refused(self, sender: str, incarnation: int, seq: int, msg_id: str) -> None:
        """A NEW message could not be journaled: neither kept nor acknowledged, so its
        retry must be NEW again (key included)."""
        if len(self._unjournaled) >= MAX_UNJOURNALED:
            del self._unjournaled[next(iter(self._unjournaled))]
        self._unjournaled[(sender, incarnation, seq)] = None
        key = key_of(msg_id)
        if key is not None:
            self.keys.forget(sender, key)

    def hold(self, sender: str, incarnation: int, seq: int) -> None:
        """A handler declined the message, which is kept in memory only: its retries
        are not acknowledged until :meth:`taken`."""
        self._unacked.add((sender, incarnation, seq))

    def taken(self, sender: str, incarnation: int, seq: int) -> None:
        """A held message was taken: it is acknowledged now, its retries as duplicates."""
        if self._unacked:  # (every message taken without a journal passes here)
            self._unacked.discard((sender, incarnation, seq))

    def forget(self, sender: str) -> None:
        """``sender`` restarted: its new incarnation starts a new stream."""
        self.tracker.forget(sender)


# -- one arrival's receipt ------------------------------------------------------------


class Step(enum.Enum):
    """One thing to do with an arriving message; a receipt lists them in order."""

    #: Write it to the delivery journal (nothing after this if the write fails).
    JOURNAL = "journal"
    #: Hand its activities to the application (inbox or handlers).
    DELIVER = "deliver"
    #: Acknowledge it to its sender.
    ACK = "ack"


class Receipt(NamedTuple):
    """What to do with one arrival: ``steps`` in order, and ``n`` added to the counter
    ``counter`` (empty: none).

    A ``NamedTuple``: the common receipts are shared constants, so the hot path builds
    nothing.
    """

    steps: tuple[Step, ...]
    counter: str = ""
    n: int = 0


#: A direct message from a sender that is not on the roster: counted, not acknowledged
#: (the sender retries, by which time its hello has introduced it).
UNKNOWN_SENDER: Final = Receipt((), "dropped.unknown-peer", 1)
#: A direct message for another agent: counted, not acknowledged.
MISADDRESSED: Final = Receipt((), "dropped.misaddressed", 1)
#: A new direct message on a node with a journal: kept, then handed over, then
#: acknowledged, so that whatever is acknowledged is on record.
_NEW_JOURNALED: Final = Receipt((Step.JOURNAL, Step.DELIVER, Step.ACK))
#: A new direct message without a journal: acknowledged once the application takes it.
_NEW_UNJOURNALED: Final = Receipt((Step.DELIVER,))
#: A taken message is acknowledged now.
TAKEN: Final = Receipt((Step.ACK,))
#: A declined message (no journal) stays the sender's: no acknowledgement.
DECLINED: Final = Receipt((), "declined.direct", 1)
#: A broadcast in order.
_BROADCAST: Final = Receipt((Step.DELIVER,))
#: A heartbeat position that shows nothing lost.
_NOTHING: Final = Receipt(())
#: Counted as lost broadcasts (the receipts of a gap carry the number).
LOST_BROADCAST: Final = "lost.broadcast"


def _sequence_receipt(result: SeqResult, deliver: Receipt) -> Receipt:
    """A broadcast's (or a heartbeat position's) sequence verdict as a receipt: a gap is
    counted as loss, a repeat counted; ``deliver`` otherwise."""
    if result.verdict is SeqVerdict.GAP and result.missing is not None:
        lo, hi = result.missing
        return Receipt(deliver.steps, LOST_BROADCAST, hi - lo + 1)
    if result.verdict is SeqVerdict.DUPLICATE:
        return Receipt(deliver.steps, "duplicate.broadcast", 1)
    return deliver


class Receiving:
    """The receiving side of one node: direct messages (:class:`DirectReceiver`) and
    broadcast numbering per sender and channel.

    Args:
        key_window: seconds (wall clock) an idempotency key is remembered.
        journal: whether new direct messages are journaled before delivery (else they
            are acknowledged once taken); may be set later, once the journal is open.
    """

    def __init__(self, *, key_window: float, journal: bool = False) -> None:
        self.direct = DirectReceiver(key_window=key_window)
        # Broadcast subscribers may join a running mesh: the first sequence seen is the
        # start. (Direct streams are expected from 1, so that retries which overtake
        # each other are still accepted once.)
        self.broadcasts = SequenceTracker(from_start=False)
        self.journal = journal

    def direct_message(self, sender: str, incarnation: int, recipient: str, seq: int,
                       count: int, msg_id: str, *, known: bool, me: str, room: int | None,
                       consumer: bool, held_full: bool, wall: float) -> Receipt:
        """Judge one arrival of a direct (non-control) message.

        Args:
            sender, incarnation, recipient, seq, count, msg_id: from its envelope.
            known: whether the sender is on the roster (the caller marked it heard).
            me: this node's name.
            room, consumer, held_full, wall: as :meth:`DirectReceiver.admit` takes them.

        Returns:
            The receipt: a new message's steps (journal, deliver, acknowledge; deliver
            only without a journal), a duplicate's acknowledgement and counter, or a
            counter alone when it must not be acknowledged (an unknown sender, another
            recipient, held, no room).
        """
        if not known:
            return UNKNOWN_SENDER
        if recipient != me:
            return MISADDRESSED
        verdict = self.direct.admit(sender, incarnation, seq, count, msg_id, room=room,
                                    consumer=consumer, held_full=held_full, wall=wall)
        if verdict is Verdict.NEW:
            return _NEW_JOURNALED if self.journal else _NEW_UNJOURNALED
        if verdict.acknowledged:
            return Receipt((Step.ACK,), verdict.value, count)
        if verdict is Verdict.HELD:
            return Receipt((), verdict.value, count)
        # Backpressure: one refusal counted per arrival, the sender retries later.
        return Receipt((), verdict.value, 1)

    def journal_failed(self, sender: str, incarnation: int, seq: int, msg_id: str,
                       count: int) -> Receipt:
        """A new message's journal write failed (a full disk): nothing after it is done,
        and its retry is judged new again (:meth:`DirectReceiver.refused`)."""
        self.direct.refused(sender, incarnation, seq, msg_id)
        return Receipt((), "refused.disk", count)

    def taken(self, sender: str, incarnation: int, seq: int) -> Receipt:
        """Without a journal: the application took the message; acknowledge it now."""
        self.direct.taken(sender, incarnation, seq)
        return TAKEN

    def declined(self, sender: str, incarnation: int, seq: int) -> Receipt:
        """Without a journal: a handler declined the message; it stays unacknowledged
        (its retries too) until :meth:`taken`."""
        self.direct.hold(sender, incarnation, seq)
        return DECLINED

    def broadcast(self, sender: str, channel: str, incarnation: int, seq: int, count: int,
                  *, known: bool) -> Receipt:
        """Judge one broadcast (a run of ``count`` activities numbered from ``seq``).

        Args:
            sender, channel, incarnation, seq, count: from its envelope.
            known: whether the sender is on the roster (the caller marked it heard).

        Returns:
            ``UNKNOWN_SENDER`` off the roster; else deliver, with the loss a gap shows
            or the repeat counted (best effort: nothing waits for a gap).

        Raises:
            FrameError: a malformed sequence number.
        """
        if not known:
            return UNKNOWN_SENDER
        return _sequence_receipt(
            self.broadcasts.observe_range(sender, channel, incarnation, seq, count),
            _BROADCAST)

    def position(self, sender: str, channel: str, incarnation: int, last: int) -> Receipt:
        """A heartbeat says ``last`` is the last broadcast ``sender`` sent on ``channel``:
        the broadcasts past what arrived are counted as lost.

        Raises:
            FrameError: ``reason="bad-seq"`` for a malformed position.
        """
        return _sequence_receipt(
            self.broadcasts.observe_last(sender, channel, incarnation, last), _NOTHING)

    def forget(self, sender: str) -> None:
        """``sender`` restarted: its new incarnation starts new streams."""
        self.broadcasts.forget(sender)
        self.direct.forget(sender)
