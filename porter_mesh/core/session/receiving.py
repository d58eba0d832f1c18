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

Pure: the caller passes the wall time (for idempotency keys) and carries out the
verdict (the node: :meth:`porter_mesh.node.node.Node._on_direct`).
"""

from __future__ import annotations

import enum
from typing import Final

from porter_mesh.core.constants import MAX_BATCH
from porter_mesh.core.sequence import SequenceTracker
from porter_mesh.core.session.keys import IdempotencyKeys, key_of

__all__ = ["DIRECT_STREAM", "DirectReceiver", "Verdict"]

#: The tracker's stream name for direct messages (one stream per sender).
DIRECT_STREAM: Final = "direct"
#: Sequence numbers a receiver remembers per sender (retries that overtake each other
#: within this window are still told apart).
SEQUENCE_WINDOW: Final = 1 << 16
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
        self._unacked.discard((sender, incarnation, seq))

    def forget(self, sender: str) -> None:
        """``sender`` restarted: its new incarnation starts a new stream."""
        self.tracker.forget(sender)
