"""Per-sender, per-stream sequence tracking: loss detection and de-duplication.

Theory of operation
-------------------
Every sender numbers the messages of each of its streams (a channel, or a direct inbox)
1, 2, 3, ... afresh for every *incarnation* (a random 63-bit number drawn at process
start). A receiver feeds each ``(sender, stream, incarnation, seq)`` it sees to
:meth:`SequenceTracker.observe` and gets a :class:`SeqVerdict`:

========================  ===============================================================
``FIRST``                 first message of a stream this tracker knows nothing about
``IN_ORDER``              the next sequence after the highest seen
``GAP``                   jumps past the highest seen; ``missing`` is the skipped range
``LATE``                  fills an earlier gap (a retry, or reordering)
``DUPLICATE``             seen before (or too old to tell: see *Bounds*)
``NEW_INCARNATION``       the sender restarted; its streams start over
``STALE_INCARNATION``     from an incarnation that a newer one already replaced
========================  ===============================================================

Every verdict except ``DUPLICATE`` and ``STALE_INCARNATION`` means "not seen before":
a direct-delivery receiver runs its handler exactly for those, so retries that arrive
twice or out of order run once. A broadcast receiver counts ``GAP`` ranges as loss and
does not wait for them. A heartbeat that carries the last sequence a sender used on a
stream goes to :meth:`~SequenceTracker.observe_last`, which detects loss at the tail of
a stream (nothing after the lost message would otherwise reveal it).

State per stream is three integers and a bitmap: ``base`` (every sequence ``<= base`` is
settled: received, or given up), ``top`` (the highest sequence known to exist), and a
bitmap of the sequences received in ``(base, top]``. In-order traffic keeps the bitmap
at zero and costs two integer compares.

Incarnations are random, so they carry no order: a sender's replaced incarnations are
remembered (the last :data:`RETIRED_INCARNATIONS`) and a message from one of them is
``STALE_INCARNATION``; any other unfamiliar incarnation is ``NEW_INCARNATION`` and drops
the sender's stream state.

Bounds (memory is bounded whatever peers send)
----------------------------------------------
* Window: at most ``window`` sequences below ``top`` are tracked. When ``top`` moves
  further, the oldest outstanding gaps are given up (they stay counted in ``lost``) and
  any sequence ``<= top - window`` is answered ``DUPLICATE``: an ancient retry is dropped
  rather than risk running a handler twice.
* Streams: at most ``max_streams`` streams are kept, least recently used evicted first,
  and a sender's incarnation memory goes with its last stream. A stream that comes back
  after eviction is ``FIRST`` again, so keep ``max_streams`` far above
  ``peers x streams per peer`` (the default 65536 is).
* ``from_start`` (default ``True``): a first message with ``seq > 1`` reports
  ``1 .. seq-1`` as missing, so that those sequences are still accepted once (as
  ``LATE``) if they arrive later -- right for direct delivery, where retries overtake one
  another. A broadcast subscriber that joins a running mesh passes ``False``: the first
  sequence it sees is its starting point and nothing before it is expected or counted.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from porter_mesh.core.constants import MAX_BATCH
from porter_mesh.errors import ConfigError, FrameError

__all__ = [
    "RETIRED_INCARNATIONS",
    "SeqResult",
    "SeqStats",
    "SeqVerdict",
    "SequenceTracker",
]

#: How many replaced incarnations of one sender are remembered as stale.
RETIRED_INCARNATIONS: Final = 8

#: Largest sequence number (sequences travel as signed 64-bit msgpack integers).
_SEQ_MAX: Final = (1 << 63) - 1


class SeqVerdict(enum.Enum):
    """What one observed sequence number means (see the module docstring)."""

    FIRST = "first"
    IN_ORDER = "in-order"
    GAP = "gap"
    LATE = "late"
    DUPLICATE = "duplicate"
    NEW_INCARNATION = "new-incarnation"
    STALE_INCARNATION = "stale-incarnation"

    @property
    def is_new(self) -> bool:
        """True when the message was not seen before (a handler should run for it)."""
        return self not in _NOT_NEW


# A tuple, not a set: membership by identity needs no call to the members' __hash__.
_NOT_NEW: Final = (SeqVerdict.DUPLICATE, SeqVerdict.STALE_INCARNATION)


@dataclass(frozen=True, slots=True)
class SeqResult:
    """The verdict on one observation.

    Attributes:
        verdict: what the sequence number means.
        missing: inclusive range ``(first, last)`` newly detected as missing by this
            observation, or ``None``.
        duplicates: for :meth:`SequenceTracker.observe_range` only: how many sequences
            of the range were already seen (0 for a fresh batch).
    """

    verdict: SeqVerdict
    missing: tuple[int, int] | None = None
    duplicates: int = 0

    @property
    def is_new(self) -> bool:
        """True when at least one sequence observed was not seen before."""
        return self.verdict not in _NOT_NEW


@dataclass(frozen=True, slots=True)
class SeqStats:
    """Counters of a :class:`SequenceTracker` since it was created.

    Attributes:
        received: sequences accepted as new (every verdict but DUPLICATE/STALE).
        duplicates: sequences answered DUPLICATE.
        stale: sequences answered STALE_INCARNATION.
        gaps: gap detections (each GAP, or FIRST with a missing range).
        lost: sequence numbers declared missing, summed over all gaps.
        late: sequences that filled an earlier gap (LATE).
        restarts: NEW_INCARNATION verdicts.
        evicted: streams dropped to stay within ``max_streams``.
        streams: streams currently tracked.
    """

    received: int
    duplicates: int
    stale: int
    gaps: int
    lost: int
    late: int
    restarts: int
    evicted: int
    streams: int


# Results without a missing range are shared; building a frozen dataclass per message
# would cost more than the tracking itself.
_R_FIRST: Final = SeqResult(SeqVerdict.FIRST)
_R_IN_ORDER: Final = SeqResult(SeqVerdict.IN_ORDER)
_R_LATE: Final = SeqResult(SeqVerdict.LATE)
_R_DUPLICATE: Final = SeqResult(SeqVerdict.DUPLICATE)
_R_NEW_INCARNATION: Final = SeqResult(SeqVerdict.NEW_INCARNATION)
_R_STALE: Final = SeqResult(SeqVerdict.STALE_INCARNATION)


class _Stream:
    """Mutable state of one (sender, stream). ``bits`` bit i <=> seq base+1+i received."""

    __slots__ = ("base", "bits", "inc", "top")

    def __init__(self, inc: int, base: int) -> None:
        self.inc = inc
        self.base = base
        self.top = base
        self.bits = 0


class _Sender:
    """Incarnation memory of one sender and the names of its tracked streams."""

    __slots__ = ("current", "retired", "streams")

    def __init__(self, current: int) -> None:
        self.current = current
        self.retired: list[int] = []
        self.streams: set[str] = set()


def _check_seq(seq: int, low: int, what: str) -> None:
    if type(seq) is not int or not low <= seq <= _SEQ_MAX:
        raise FrameError(
            f"{what} {seq!r} is not an integer in [{low}, 2**63); sequences start at 1 "
            f"per stream and incarnation",
            reason="bad-seq",
        )


class SequenceTracker:
    """Tracks sequence numbers per (sender, stream) with bounded memory.

    Not thread-safe: one tracker belongs to one event loop.

    Args:
        window: how many sequences below the highest one are tracked per stream.
        max_streams: how many streams are kept before the least recently used is evicted.
        from_start: whether streams are expected from sequence 1 (see the module
            docstring); ``True`` for direct delivery, ``False`` for broadcast subscribers
            that may join late.

    Raises:
        ConfigError: when ``window`` or ``max_streams`` is not a positive integer.
    """

    def __init__(
        self, *, window: int = 4096, max_streams: int = 65536, from_start: bool = True
    ) -> None:
        if type(window) is not int or window < 1:
            raise ConfigError(f"window must be a positive integer, got {window!r}")
        if type(max_streams) is not int or max_streams < 1:
            raise ConfigError(f"max_streams must be a positive integer, got {max_streams!r}")
        self._window = window
        self._max_streams = max_streams
        self._from_start = from_start
        self._streams: OrderedDict[tuple[str, str], _Stream] = OrderedDict()
        self._senders: dict[str, _Sender] = {}
        self._received = 0
        self._duplicates = 0
        self._stale = 0
        self._gaps = 0
        self._lost = 0
        self._late = 0
        self._restarts = 0
        self._evicted = 0

    @property
    def window(self) -> int:
        """How many sequences below the highest one are tracked per stream."""
        return self._window

    @property
    def max_streams(self) -> int:
        """How many streams are kept before eviction."""
        return self._max_streams

    def __len__(self) -> int:
        return len(self._streams)

    # -- observation ----------------------------------------------------------------

    def observe(self, sender: str, stream: str, incarnation: int, seq: int) -> SeqResult:
        """Record one received sequence number and say what it means.

        Args:
            sender: the sending agent.
            stream: the sender's stream (channel, or direct inbox).
            incarnation: the sender's incarnation.
            seq: the message's sequence number, ``>= 1``.

        Returns:
            The verdict, with the newly missing range for ``GAP`` (and for ``FIRST`` /
            ``NEW_INCARNATION`` when ``from_start`` and ``seq > 1``).

        Raises:
            FrameError: ``reason="bad-seq"`` when ``seq`` is not an integer in [1, 2**63).
        """
        key = (sender, stream)
        st = self._streams.get(key)
        if st is not None and st.inc == incarnation and type(seq) is int:
            self._streams.move_to_end(key)
            top = st.top
            if seq == top + 1 and st.base == top:
                # The common case: next in order, nothing outstanding.
                st.base = st.top = seq
                self._received += 1
                return _R_IN_ORDER
            if 0 < seq <= _SEQ_MAX:
                return self._observe_known(st, seq)
        _check_seq(seq, 1, "sequence")
        return self._observe_slow(key, incarnation, seq, seq)

    def observe_range(
        self, sender: str, stream: str, incarnation: int, first: int, count: int
    ) -> SeqResult:
        """Record a batch carrying sequences ``first .. first + count - 1``.

        A batch is re-sent whole, so it is normally all new or all duplicate. The result
        is ``DUPLICATE`` (or ``STALE_INCARNATION``) only when no sequence of the range is
        new; otherwise it is the verdict of the first new sequence, with the missing
        range this batch revealed and, in ``duplicates``, how many of the range were
        already seen.

        Args:
            sender: the sending agent.
            stream: the sender's stream.
            incarnation: the sender's incarnation.
            first: sequence of the first message of the batch, ``>= 1``.
            count: number of messages in the batch, 1..MAX_BATCH.

        Returns:
            The merged verdict (see above).

        Raises:
            FrameError: ``reason="bad-seq"`` for a malformed range.
        """
        key = (sender, stream)
        st = self._streams.get(key)
        if (st is not None and st.inc == incarnation and type(first) is int
                and type(count) is int and first == st.top + 1 and st.base == st.top
                and 1 <= count <= MAX_BATCH and count <= self._window
                and first + count - 1 <= _SEQ_MAX):
            # In order with nothing outstanding, checked in one go (top >= 0, so
            # first >= 1): the whole batch at once.
            self._streams.move_to_end(key)
            st.base = st.top = first + count - 1
            self._received += count
            return _R_IN_ORDER
        if type(count) is not int or not 1 <= count <= MAX_BATCH:
            raise FrameError(
                f"batch count {count!r} is not an integer in [1, {MAX_BATCH}]", reason="bad-seq"
            )
        _check_seq(first, 1, "sequence")
        last = first + count - 1
        _check_seq(last, 1, "last sequence of the batch")
        if st is not None and st.inc == incarnation:
            self._streams.move_to_end(key)
        # Rare: reordering, retries, restarts. One sequence at a time, then merge.
        result: SeqResult | None = None
        missing: tuple[int, int] | None = None
        dups = 0
        for seq in range(first, last + 1):
            r = self.observe(sender, stream, incarnation, seq)
            if r.missing is not None:
                missing = r.missing
            if not r.is_new:
                dups += 1
            elif result is None:
                result = r
        if result is None:
            return _R_STALE if self._is_stale(sender, incarnation) else _R_DUPLICATE
        if missing is None and dups == 0:
            return result
        return SeqResult(result.verdict, missing, dups)

    def observe_last(self, sender: str, stream: str, incarnation: int, last_seq: int) -> SeqResult:
        """Record that a sender says ``last_seq`` is the last sequence it sent on a stream.

        Nothing is marked received: this only moves the known top of the stream, so that
        loss at the tail shows up as a ``GAP`` (and the lost sequences are still
        accepted as ``LATE`` if they arrive afterwards).

        Args:
            sender: the sending agent.
            stream: the sender's stream.
            incarnation: the sender's incarnation.
            last_seq: the last sequence sent, ``>= 0`` (0: nothing sent yet).

        Returns:
            ``GAP`` with the missing range when ``last_seq`` is past everything seen;
            ``IN_ORDER`` when it reveals nothing new; ``FIRST`` / ``NEW_INCARNATION`` for
            an unknown stream or incarnation (missing range as for :meth:`observe`);
            ``STALE_INCARNATION`` for a replaced incarnation.

        Raises:
            FrameError: ``reason="bad-seq"`` when ``last_seq`` is malformed.
        """
        _check_seq(last_seq, 0, "last sequence")
        key = (sender, stream)
        st = self._streams.get(key)
        if st is None or st.inc != incarnation:
            return self._observe_slow(key, incarnation, last_seq + 1, last_seq)
        self._streams.move_to_end(key)
        top = st.top
        if last_seq <= top:
            return _R_IN_ORDER
        self._advance_top(st, last_seq)
        return self._gap(top + 1, last_seq)

    # -- queries --------------------------------------------------------------------

    def missing(self, sender: str, stream: str) -> list[tuple[int, int]]:
        """List the gaps of a stream that are still outstanding (within the window).

        Args:
            sender: the sending agent.
            stream: the sender's stream.

        Returns:
            Inclusive ``(first, last)`` ranges in ascending order; empty for an unknown
            stream. At most ``window // 2 + 1`` ranges.
        """
        st = self._streams.get((sender, stream))
        if st is None:
            return []
        ranges: list[tuple[int, int]] = []
        bits, seq, top = st.bits, st.base + 1, st.top
        while seq <= top:
            if bits & 1:
                # Skip the run of received sequences.
                run = (bits ^ (bits + 1)).bit_length() - 1
            else:
                # A run of missing ones: count trailing zeros, capped at the top.
                run = (bits & -bits).bit_length() - 1 if bits else top - seq + 1
                ranges.append((seq, seq + run - 1))
            bits >>= run
            seq += run
        return ranges

    def incarnation(self, sender: str) -> int | None:
        """The current incarnation of a sender, or ``None`` if it is not tracked."""
        rec = self._senders.get(sender)
        return None if rec is None else rec.current

    def forget(self, sender: str) -> None:
        """Drop everything known about a sender (for example when it expires).

        Args:
            sender: the agent to forget; unknown agents are ignored.
        """
        rec = self._senders.pop(sender, None)
        if rec is None:
            return
        for name in rec.streams:
            del self._streams[(sender, name)]

    def stats(self) -> SeqStats:
        """Return the counters (see :class:`SeqStats`)."""
        return SeqStats(
            received=self._received,
            duplicates=self._duplicates,
            stale=self._stale,
            gaps=self._gaps,
            lost=self._lost,
            late=self._late,
            restarts=self._restarts,
            evicted=self._evicted,
            streams=len(self._streams),
        )

    # -- internals ------------------------------------------------------------------

    def _observe_known(self, st: _Stream, seq: int) -> SeqResult:
        """Observe ``seq`` on a stream of the current incarnation (not the fast path)."""
        base = st.base
        if seq <= base:
            self._duplicates += 1
            return _R_DUPLICATE
        top = st.top
        if seq <= top:
            bit = 1 << (seq - base - 1)
            if st.bits & bit:
                self._duplicates += 1
                return _R_DUPLICATE
            st.bits |= bit
            self._settle(st)
            self._received += 1
            self._late += 1
            return _R_LATE
        self._advance_top(st, seq)
        st.bits |= 1 << (seq - st.base - 1)
        self._settle(st)
        self._received += 1
        if seq == top + 1:
            return _R_IN_ORDER
        return self._gap(top + 1, seq - 1)

    def _observe_slow(self, key: tuple[str, str], inc: int, seq: int, top: int) -> SeqResult:
        """Handle an unknown stream or a different incarnation.

        ``seq`` is the received sequence (``top + 1`` when nothing was received, as for a
        heartbeat's ``last_seq``) and ``top`` the highest sequence known to exist.
        """
        if type(inc) is not int:
            raise FrameError(f"incarnation {inc!r} is not an integer", reason="bad-incarnation")
        sender = key[0]
        rec = self._senders.get(sender)
        first = _R_FIRST
        if rec is None:
            rec = self._senders[sender] = _Sender(inc)
        elif rec.current != inc:
            if inc in rec.retired:
                self._stale += 1
                return _R_STALE
            # The sender restarted: its old streams are finished.
            rec.retired.append(rec.current)
            del rec.retired[:-RETIRED_INCARNATIONS]
            rec.current = inc
            for name in rec.streams:
                del self._streams[(sender, name)]
            rec.streams.clear()
            self._restarts += 1
            first = _R_NEW_INCARNATION
        # A known sender and incarnation but an unknown stream falls through to here too.
        received = seq <= top
        if self._from_start:
            st = _Stream(inc, 0)
            self._advance_top(st, top)
            if received:
                st.bits |= 1 << (seq - st.base - 1)
                self._settle(st)
        else:
            st = _Stream(inc, top)
        self._streams[key] = st
        rec.streams.add(key[1])
        if received:
            self._received += 1
        if len(self._streams) > self._max_streams:
            self._evict()
        if self._from_start and seq > 1:
            lost = self._gap(1, seq - 1)
            return SeqResult(first.verdict, lost.missing)
        return first

    def _advance_top(self, st: _Stream, new_top: int) -> None:
        """Raise ``st.top``, sliding the window (giving up old gaps) if needed."""
        floor = new_top - self._window
        if floor > st.base:
            shift = floor - st.base
            st.bits = st.bits >> shift if shift < self._window else 0
            st.base = floor
            self._settle(st)
        st.top = new_top

    @staticmethod
    def _settle(st: _Stream) -> None:
        """Advance ``base`` over the received run just above it."""
        bits = st.bits
        if bits & 1:
            run = (bits ^ (bits + 1)).bit_length() - 1
            st.bits = bits >> run
            st.base += run

    def _gap(self, first: int, last: int) -> SeqResult:
        self._gaps += 1
        self._lost += last - first + 1
        return SeqResult(SeqVerdict.GAP, (first, last))

    def _is_stale(self, sender: str, inc: int) -> bool:
        rec = self._senders.get(sender)
        return rec is not None and inc in rec.retired

    def _evict(self) -> None:
        (sender, name), _ = self._streams.popitem(last=False)
        self._evicted += 1
        rec = self._senders[sender]
        rec.streams.discard(name)
        if not rec.streams:
            del self._senders[sender]
