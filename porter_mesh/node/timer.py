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

__all__ = ["DeadlineTimer"]


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
