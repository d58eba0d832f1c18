"""Direct delivery, sender side: sequence allocation, acknowledgement, retry, deadline.

Theory of operation
-------------------
Each direct message (possibly a batch of ``count`` activities) gets the next sequence
numbers of the stream (this sender, this recipient) and waits in the outbox until the
recipient acknowledges that range. Many messages may be in flight at once (pipelining):
acknowledgements name ranges, so one ack can settle a whole burst.

A message not acknowledged in time is sent again with exponential backoff, with the
*same* sequence numbers, so the receiver's de-duplication makes the handler run once.
When the deadline passes the message fails and the caller is told (the node raises
``DeliveryTimeout``).

The first resend waits one retransmission timeout (RTO), which adapts to the measured
acknowledgement time the way TCP's does (RFC 6298: smoothed round trip plus four times
its variation, measured only on messages sent once), bounded below by ``retry_initial``
and above by ``retry_max``. Under a deep pipeline acknowledgements take longer, because
messages queue behind each other; a fixed timer would then resend messages that are
merely waiting, doubling the load exactly when the receiver is busiest.

The outbox is bounded per recipient (``max_pending``): a stopped receiver cannot grow the
sender's memory without limit; ``add`` raises ``OverflowError`` and the node turns that
into a clear ``DeliveryError``. Retries are kept in a heap keyed by their next attempt,
with lazy deletion of settled entries, so a poll costs O(due) rather than O(in flight).

Pure: the caller passes ``now`` (monotonic seconds) and performs the sends.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["Outbox", "Pending"]

T = TypeVar("T")


@dataclass(slots=True)
class Pending(Generic[T]):
    """One in-flight direct message.

    Attributes:
        recipient: agent name.
        first_seq: sequence number of the first activity in the message.
        count: activities carried.
        frames: the encoded ZeroMQ frames, resent as they are.
        deadline: monotonic time after which the send fails.
        next_try: monotonic time of the next resend.
        attempts: sends so far.
        token: the caller's handle (the node keeps a future here).
    """

    recipient: str
    first_seq: int
    count: int
    frames: list[bytes]
    deadline: float
    next_try: float
    attempts: int
    token: T
    sent_at: float = 0.0


class Outbox(Generic[T]):
    """Pending direct messages of one node.

    Args:
        retry_initial: seconds before the first resend.
        retry_max: cap on the backoff between resends.
        max_pending: most in-flight messages per recipient.
    """

    def __init__(self, *, retry_initial: float, retry_max: float, max_pending: int) -> None:
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.max_pending = max_pending
        self._next_seq: dict[str, int] = {}
        self._pending: dict[tuple[str, int], Pending[T]] = {}
        self._per_peer: dict[str, int] = {}
        self._heap: list[tuple[float, int, str, int]] = []
        self._tie = 0
        self.resent = 0
        self.failed = 0
        self._srtt: float | None = None
        self._rttvar = 0.0
        self.rto = retry_initial

    def _sample(self, rtt: float) -> None:
        """Fold one acknowledgement time into the RTO (RFC 6298, section 2)."""
        # Comparisons rather than min/max/abs: this runs for every acknowledgement.
        srtt = self._srtt
        if srtt is None:
            srtt, self._rttvar = rtt, rtt / 2
        else:
            self._rttvar = 0.75 * self._rttvar + 0.25 * (srtt - rtt if srtt > rtt
                                                         else rtt - srtt)
            srtt = 0.875 * srtt + 0.125 * rtt
        self._srtt = srtt
        rto = srtt + 4 * self._rttvar
        if rto < self.retry_initial:
            rto = self.retry_initial
        self.rto = rto if rto < self.retry_max else self.retry_max

    def __len__(self) -> int:
        return len(self._pending)

    def pending_for(self, recipient: str) -> int:
        """How many messages to ``recipient`` are in flight."""
        return self._per_peer.get(recipient, 0)

    def allocate(self, recipient: str, count: int) -> int:
        """Reserve ``count`` sequence numbers towards ``recipient``; returns the first.

        Raises:
            OverflowError: too many messages to this recipient are already in flight.
        """
        if self._per_peer.get(recipient, 0) >= self.max_pending:
            raise OverflowError(recipient)
        first = self._next_seq.get(recipient, 1)
        self._next_seq[recipient] = first + count
        return first

    def add(
        self,
        recipient: str,
        first_seq: int,
        count: int,
        frames: list[bytes],
        *,
        deadline: float,
        now: float,
        token: T,
    ) -> Pending[T]:
        """Record a message that was just sent for the first time."""
        entry = Pending(recipient, first_seq, count, frames, deadline, now + self.rto, 1, token,
                        now)
        key = (recipient, first_seq)
        self._pending[key] = entry
        self._per_peer[recipient] = self._per_peer.get(recipient, 0) + 1
        self._push(entry)
        return entry

    def _push(self, entry: Pending[T]) -> None:
        self._tie += 1
        when = entry.next_try if entry.next_try < entry.deadline else entry.deadline
        heapq.heappush(self._heap, (when, self._tie, entry.recipient, entry.first_seq))

    def _remove(self, key: tuple[str, int]) -> Pending[T] | None:
        entry = self._pending.pop(key, None)
        if entry is not None:
            left = self._per_peer[entry.recipient] - 1
            if left:
                self._per_peer[entry.recipient] = left
            else:
                del self._per_peer[entry.recipient]
        return entry

    def acked(self, recipient: str, first_seq: int, now: float | None = None) -> Pending[T] | None:
        """The recipient acknowledged the message starting at ``first_seq``.

        Args:
            recipient: who acknowledged.
            first_seq: the first sequence of the acknowledged message.
            now: monotonic time of the acknowledgement; when given, and the message was
                sent only once, it updates the retransmission timeout.

        Returns the settled entry, or ``None`` for an unknown or repeated ack.
        """
        entry = self._remove((recipient, first_seq))
        if entry is not None and now is not None and entry.attempts == 1:
            rtt = now - entry.sent_at
            self._sample(rtt if rtt > 0.0 else 0.0)
        return entry

    @property
    def next_due(self) -> float:
        """When :meth:`poll` next has something to do (monotonic seconds; ``inf``:
        nothing in flight). May be early, never late: an entry rescheduled later is
        found at its old time and pushed back by the poll."""
        heap = self._heap
        pending = self._pending
        while heap and (heap[0][2], heap[0][3]) not in pending:
            heapq.heappop(heap)  # settled since it was scheduled
        return heap[0][0] if heap else float("inf")

    def poll(self, now: float) -> tuple[list[Pending[T]], list[Pending[T]]]:
        """Entries to resend now, and entries whose deadline passed (removed)."""
        resend: list[Pending[T]] = []
        failed: list[Pending[T]] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, recipient, first = heapq.heappop(heap)
            entry = self._pending.get((recipient, first))
            if entry is None:
                continue  # settled since it was scheduled
            if now >= entry.deadline:
                self._remove((recipient, first))
                failed.append(entry)
                self.failed += 1
                continue
            if now < entry.next_try:
                self._push(entry)  # rescheduled (e.g. by ``retry_now``)
                continue
            backoff = min(self.rto * (2 ** entry.attempts), self.retry_max)
            entry.attempts += 1
            entry.next_try = now + backoff
            self.resent += 1
            resend.append(entry)
            self._push(entry)
        return resend, failed

    def retry_now(self, recipient: str, now: float) -> list[Pending[T]]:
        """Everything in flight to ``recipient``, to resend at once (the peer restarted
        or reconnected); their backoff starts over."""
        entries = [e for e in self._pending.values() if e.recipient == recipient]
        for entry in entries:
            entry.attempts += 1
            entry.next_try = now + self.rto
            self._push(entry)
        self.resent += len(entries)
        return entries

    def fail_for(self, recipient: str) -> list[Pending[T]]:
        """Remove and return every entry to ``recipient`` (it left for good)."""
        entries = [e for e in self._pending.values() if e.recipient == recipient]
        for entry in entries:
            self._remove((recipient, entry.first_seq))
        self.failed += len(entries)
        return entries

    def fail_all(self) -> list[Pending[T]]:
        """Remove and return every entry (the node is closing)."""
        entries = list(self._pending.values())
        self._pending.clear()
        self._per_peer.clear()
        self._heap.clear()
        return entries
