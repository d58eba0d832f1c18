"""Hybrid logical clock: timestamps that order events across machines with skewed clocks.

Theory of operation
-------------------
A timestamp is one unsigned 64-bit integer: physical milliseconds since the Unix epoch in
the high 48 bits and a logical counter in the low 16 bits. Because the physical part is
the high part, comparing two timestamps as plain integers compares ``(physical,
logical)`` lexicographically, which is exactly the order a hybrid logical clock defines.

That packing turns the textbook HLC rules into one ``max``:

* a local or send event yields ``max(wall << 16, last + 1)``;
* a receive event yields ``max(wall << 16, last + 1, remote + 1)``.

``last + 1`` increments the logical counter while the wall clock stands still (or has
jumped backwards), and when the counter would pass 0xFFFF the carry moves into the
physical part: the clock then runs at most one millisecond ahead of the fastest clock it
has seen, and stays strictly monotonic. ``wall << 16`` resets the counter as soon as the
wall clock passes the last physical time.

Remote time is adopted only within a bound, ``max_skew_ms`` (the node's
``max_clock_skew``, default 24 hours). :meth:`HybridClock.receive` compares the
remote timestamp's physical part with the local wall clock:

* within the bound (either direction), the receive rule above applies: the clock adopts
  the remote time, so ordering across machines holds while their clocks differ by
  minutes or hours (a lab machine without NTP, a clock set in the wrong time zone);
* beyond it, the clock is left untouched and ``receive`` returns the offset instead.
  One peer with a wild clock (a dead RTC battery in 1970, a year typed wrong) cannot
  drag the whole mesh into the future. The caller still handles the message and flags
  the peer instead: refusing it would leave a peer that looks alive but cannot deliver
  anything, a new form of the clock-skew bug of the older IACP protocol (whose messages
  carry the sender's clock in seconds).

Why 24 hours: the skews seen in practice are minutes (no NTP) and whole hours (a
hardware clock kept in local time, up to 14 hours off); a clock more than a day off is
broken rather than skewed. The bound applies to the sender's hybrid timestamp, which is
at least its wall clock and at least every timestamp it has adopted, so a mesh whose
clocks span more than the bound flags the outliers on both sides.

The clock is pure: callers pass the wall time in, so tests drive it with any sequence.
"""

from __future__ import annotations

from typing import Final

from porter_mesh.errors import ClockError

__all__ = [
    "DEFAULT_MAX_SKEW_MS",
    "HLC_MAX",
    "LOGICAL_BITS",
    "LOGICAL_MAX",
    "MAX_SKEW_LIMIT_MS",
    "PHYSICAL_MAX",
    "HybridClock",
    "hlc_pack",
    "hlc_physical_ms",
    "hlc_unpack",
]

#: Width of the logical counter, in bits.
LOGICAL_BITS: Final = 16
#: Largest logical counter value.
LOGICAL_MAX: Final = (1 << LOGICAL_BITS) - 1
#: Largest physical time (milliseconds since the epoch) a timestamp can carry.
PHYSICAL_MAX: Final = (1 << 48) - 1
#: Largest timestamp.
HLC_MAX: Final = (1 << 64) - 1
#: Default bound on adopting remote time: 24 hours (see the module docstring).
DEFAULT_MAX_SKEW_MS: Final = 24 * 3600 * 1000
#: Largest bound a clock accepts: a year. Past it, a timestamp near the end of the 48-bit
#: physical range could be adopted and exhaust the clock.
MAX_SKEW_LIMIT_MS: Final = 366 * 24 * 3600 * 1000


def hlc_pack(physical_ms: int, logical: int) -> int:
    """Pack a physical time and a logical counter into one 64-bit timestamp.

    Args:
        physical_ms: milliseconds since the Unix epoch, ``0 <= physical_ms < 2**48``.
        logical: logical counter, ``0 <= logical <= 0xFFFF``.

    Returns:
        The timestamp ``physical_ms << 16 | logical``.

    Raises:
        ClockError: ``reason="out-of-range"`` when either part is out of range or not an
            integer.
    """
    if type(physical_ms) is not int or not 0 <= physical_ms <= PHYSICAL_MAX:
        raise ClockError(
            f"physical time {physical_ms!r} is not an integer number of milliseconds in "
            f"[0, 2**48); pass milliseconds since the Unix epoch",
            reason="out-of-range",
        )
    if type(logical) is not int or not 0 <= logical <= LOGICAL_MAX:
        raise ClockError(
            f"logical counter {logical!r} is not an integer in [0, 0xFFFF]",
            reason="out-of-range",
        )
    return physical_ms << LOGICAL_BITS | logical


def hlc_unpack(ts: int) -> tuple[int, int]:
    """Split a timestamp into ``(physical_ms, logical)``.

    Args:
        ts: a timestamp, ``0 <= ts < 2**64``.

    Returns:
        The physical milliseconds and the logical counter.

    Raises:
        ClockError: ``reason="out-of-range"`` when ``ts`` is not a 64-bit unsigned integer.
    """
    _check_ts(ts, "timestamp")
    return ts >> LOGICAL_BITS, ts & LOGICAL_MAX


def hlc_physical_ms(ts: int) -> int:
    """Return the physical part of a timestamp (milliseconds since the epoch).

    Args:
        ts: a timestamp, ``0 <= ts < 2**64``.

    Returns:
        ``ts >> 16``.

    Raises:
        ClockError: ``reason="out-of-range"`` when ``ts`` is not a 64-bit unsigned integer.
    """
    _check_ts(ts, "timestamp")
    return ts >> LOGICAL_BITS


def _check_ts(ts: int, what: str) -> None:
    if type(ts) is not int or not 0 <= ts <= HLC_MAX:
        raise ClockError(f"{what} {ts!r} is not an unsigned 64-bit integer", reason="out-of-range")


def _bad_wall(wall_ms: object) -> ClockError:
    return ClockError(
        f"wall clock {wall_ms!r} is not an integer number of milliseconds in [0, 2**48); "
        f"pass time.time_ns() // 1_000_000",
        reason="bad-wall-clock",
    )


class HybridClock:
    """A hybrid logical clock (see the module docstring for how it works).

    Not thread-safe: one clock belongs to one event loop.

    Args:
        max_skew_ms: how far (milliseconds) a remote timestamp's physical time may be from
            the local wall clock, ahead or behind, for :meth:`receive` to adopt it.

    Raises:
        ClockError: ``reason="bad-config"`` when ``max_skew_ms`` is negative or past
            :data:`MAX_SKEW_LIMIT_MS`.
    """

    __slots__ = ("_last", "_max_skew_ms")

    def __init__(self, *, max_skew_ms: int = DEFAULT_MAX_SKEW_MS) -> None:
        if type(max_skew_ms) is not int or not 0 <= max_skew_ms <= MAX_SKEW_LIMIT_MS:
            raise ClockError(
                f"max_skew_ms must be an integer in [0, {MAX_SKEW_LIMIT_MS}] (a year), got "
                f"{max_skew_ms!r}",
                reason="bad-config",
            )
        self._max_skew_ms = max_skew_ms
        self._last = 0

    @property
    def last(self) -> int:
        """The most recent timestamp this clock produced (0 before the first event)."""
        return self._last

    @property
    def max_skew_ms(self) -> int:
        """How far from the local wall clock a remote timestamp may be to be adopted."""
        return self._max_skew_ms

    def now(self, wall_ms: int) -> int:
        """Timestamp a local or send event.

        Args:
            wall_ms: the local wall clock, milliseconds since the Unix epoch. It may jump
                backwards; the result is still greater than every earlier result.

        Returns:
            A timestamp strictly greater than :attr:`last`.

        Raises:
            ClockError: ``reason="bad-wall-clock"`` when ``wall_ms`` is out of range;
                ``reason="exhausted"`` in the (theoretical) case the 64-bit space is used up.
        """
        # Checks inline: this runs for every message sent.
        if type(wall_ms) is not int or not 0 <= wall_ms <= PHYSICAL_MAX:
            raise _bad_wall(wall_ms)
        # Comparisons, not max(): no call on a path every message takes.
        ts = wall_ms << LOGICAL_BITS
        if ts <= self._last:
            ts = self._last + 1
        if ts > HLC_MAX:
            raise ClockError("hybrid clock exhausted the 64-bit range", reason="exhausted")
        self._last = ts
        return ts

    def receive(self, remote: int, wall_ms: int) -> int | None:
        """Merge a timestamp received from a peer (a receive event), within the bound.

        Args:
            remote: the peer's timestamp, as carried in its envelope.
            wall_ms: the local wall clock, milliseconds since the Unix epoch.

        Returns:
            ``None`` when ``remote`` is within ``max_skew_ms`` of ``wall_ms``: the clock
            adopted it and :attr:`last` is now greater than both its earlier value and
            ``remote``. Otherwise the offset in milliseconds (``remote``'s physical time
            minus ``wall_ms``; positive: the peer is ahead), and the clock is unchanged.

        Raises:
            ClockError: ``reason="out-of-range"`` / ``"bad-wall-clock"`` for malformed
                values; ``reason="exhausted"`` when the 64-bit space is used up.
        """
        # Checks inline: this runs for every message received.
        if type(remote) is not int or not 0 <= remote <= HLC_MAX:
            _check_ts(remote, "remote timestamp")  # raises with the explanation
        if type(wall_ms) is not int or not 0 <= wall_ms <= PHYSICAL_MAX:
            raise _bad_wall(wall_ms)
        offset = (remote >> LOGICAL_BITS) - wall_ms
        if not -self._max_skew_ms <= offset <= self._max_skew_ms:
            return offset
        ts = wall_ms << LOGICAL_BITS
        if ts <= self._last:
            ts = self._last + 1
        if ts <= remote:
            ts = remote + 1
        if ts > HLC_MAX:
            raise ClockError("hybrid clock exhausted the 64-bit range", reason="exhausted")
        self._last = ts
        return None
