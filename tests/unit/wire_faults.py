"""What a hostile wire does to the messages in flight, as Hypothesis rules shared by the
state machines over the in-memory wires (``session_wire`` and ``sync_wire``): drop one,
duplicate one, delay one, hand one over ahead of its turn.

A machine that uses them sets ``self.wire`` (in its ``@initialize`` rule) to a wire with
``in_flight`` (dataclasses with ``at`` and ``tie``) and ``arrive(item)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule


class WireFaults(RuleBasedStateMachine):
    """Rules that interfere with whatever is in flight on ``self.wire``."""

    wire: Any

    def _pick(self, index: int) -> int:
        return index % len(self.wire.in_flight)

    @precondition(lambda self: self.wire.in_flight)
    @rule(index=st.integers(0, 1 << 16))
    def drop(self, index: int) -> None:
        del self.wire.in_flight[self._pick(index)]

    @precondition(lambda self: self.wire.in_flight)
    @rule(index=st.integers(0, 1 << 16), delay=st.floats(0.0, 3.0))
    def duplicate(self, index: int, delay: float) -> None:
        item = self.wire.in_flight[self._pick(index)]
        self.wire.in_flight.append(dataclasses.replace(item, at=item.at + delay, tie=-1))

    @precondition(lambda self: self.wire.in_flight)
    @rule(index=st.integers(0, 1 << 16), delay=st.floats(0.1, 5.0))
    def delay(self, index: int, delay: float) -> None:
        self.wire.in_flight[self._pick(index)].at += delay

    @precondition(lambda self: self.wire.in_flight)
    @rule(index=st.integers(0, 1 << 16))
    def deliver_out_of_order(self, index: int) -> None:
        self.wire.arrive(self.wire.in_flight[self._pick(index)])
