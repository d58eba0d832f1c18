"""One asyncio timer kept at the earliest deadline a pure session asks for.

A session says when it next needs to be woken (``next_deadline()``, monotonic seconds);
its driver asks this timer to fire no later than that after every step. The timer only
ever moves earlier: a deadline that went away (an answered request) leaves it where it
is, and that wake-up, finding nothing due, arms it for what remains, which costs less
than moving it on every answer. ``inf`` arms nothing, so an idle session costs no
wake-up at all.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

__all__ = ["DeadlineTimer", "next_on_grid"]


def next_on_grid(now: float, interval: float, wall: float) -> float:
    """The first point of the wall clock's grid of ``interval`` more than a tenth of an
    interval after ``now``, as monotonic seconds (``wall``: the wall clock at ``now``).

    Every node whose clock is set shares that grid, so periodic messages sent on it (the
    heartbeats) reach a node at about the same moment from all its peers, and it reads
    them in a few wake-ups instead of one each. A clock that is off only spreads them
    again, as if unaligned. After a late ``now`` (a loaded machine) the next point is
    the nearer one, not one a whole interval further: the gap between two points chosen
    this way is at most 1.1 intervals plus the lateness.
    """
    due = now + interval - wall % interval
    return due + interval if due - now <= interval / 10 else due


class DeadlineTimer:
    """Calls ``fire(now)`` on the loop thread once the earliest deadline asked is due.

    Args:
        loop: the loop to arm the timer on.
        fire: called with the monotonic time (never earlier than the deadline armed).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, fire: Callable[[float], None]) -> None:
        self._loop: asyncio.AbstractEventLoop | None = loop
        self._fire = fire
        self._handle: asyncio.TimerHandle | None = None
        #: The deadline the timer is armed for (monotonic seconds; inf: not armed).
        self.at = math.inf
        #: How long after its deadline the last firing came (seconds): far more than
        #: the loop's usual delay means the process was stopped meanwhile.
        self.late = 0.0

    def wake_by(self, due: float) -> None:
        """Fire no later than ``due`` (monotonic seconds; ``inf`` asks for nothing)."""
        loop = self._loop
        if loop is None or due >= self.at:
            return
        if self._handle is not None:
            self._handle.cancel()
        self.at = due
        # The loop's clock may not be time.monotonic(): convert through the delay.
        self._handle = loop.call_at(loop.time() + max(0.0, due - time.monotonic()),
                                    self._on_due)

    def close(self) -> None:
        """Cancel the timer; it is never armed again."""
        self._loop = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _on_due(self) -> None:
        self._handle = None
        armed_at, self.at = self.at, math.inf
        if self._loop is not None:
            # Never earlier than asked: the loop may fire a hair before (clock resolution).
            now = max(time.monotonic(), armed_at)
            self.late = now - armed_at
            self._fire(now)
