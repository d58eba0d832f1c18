"""A property-based state machine over the in-memory wire: three endpoints send direct
messages (some keyed) while the wire drops, duplicates, delays and reorders frames, disks
fill, inboxes shrink, endpoints pause and restart. Whatever happens:

* each direct message is delivered at most once per sender incarnation, across the
  receiver's restarts (its journal is restored);
* every completion token is settled or failed exactly once, and by the end (faults
  lifted, deadlines passed) all of them are;
* nothing is acknowledged that was not journaled first.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from porter_mesh.core.session.endpoint import DirectFrame
from tests.fuzzing import examples
from tests.unit.session_wire import Wire
from tests.unit.wire_faults import WireFaults

NAMES = ("a", "b", "c")
TIMEOUT = 6.0
names = st.sampled_from(NAMES)


class WireMachine(WireFaults):
    """Random traffic over a hostile wire; the rules hold whatever it does."""

    @initialize()
    def start(self) -> None:
        # A key window longer than any run, so that a repeated key is always inside it.
        self.wire = Wire(*NAMES, key_window=10_000.0)
        self.wire.advance(0.1)
        self.keys = 0

    @rule(src=names, dst=names, keyed=st.booleans(), repeat_key=st.booleans(),
          count=st.integers(1, 3))
    def send(self, src: str, dst: str, keyed: bool, repeat_key: bool, count: int) -> None:
        if src == dst:
            return
        key = None
        if keyed:
            if not repeat_key or not self.keys:
                self.keys += 1
            key = f"key-{self.keys}"
        self.wire.send(src, dst, timeout=TIMEOUT, key=key, count=count)

    @rule(seconds=st.floats(0.0, 2.0))
    def advance(self, seconds: float) -> None:
        self.wire.advance(seconds)

    @rule(name=names, full=st.booleans())
    def disk(self, name: str, full: bool) -> None:
        self.wire.sides[name].disk_full = full

    @rule(name=names, room=st.sampled_from([None, 0, 1, 5]))
    def inbox(self, name: str, room: int | None) -> None:
        self.wire.sides[name].room = room

    @rule(name=names)
    def restart(self, name: str) -> None:
        self.wire.restart(name)

    @rule(name=names)
    def pause(self, name: str) -> None:
        self.wire.pause(name)

    @precondition(lambda self: any(s.paused for s in self.wire.sides.values()))
    @rule(name=names)
    def resume(self, name: str) -> None:
        if self.wire.sides[name].paused:
            self.wire.resume(name)

    @rule(seconds=st.floats(2.0, 10.0))
    def wait_long(self, seconds: float) -> None:
        self.wire.advance(seconds)

    @invariant()
    def delivered_at_most_once_per_incarnation(self) -> None:
        for name in NAMES:
            seen = Counter(self.wire.direct_delivered(name))
            assert not [m for m, n in seen.items() if n > 1], (name, seen)

    @invariant()
    def each_token_resolved_at_most_once(self) -> None:
        resolved = Counter(self.wire.settled + [t for t, _ in self.wire.failed])
        assert not [t for t, n in resolved.items() if n > 1], resolved

    @invariant()
    def nothing_acknowledged_before_it_was_journaled(self) -> None:
        assert self.wire.acked_unjournaled == []

    @invariant()
    def keyed_messages_delivered_once_within_the_window(self) -> None:
        # The window outlasts the run: a key is delivered once per receiver, across its
        # restarts (the journal keeps it).
        for name in NAMES:
            keys = Counter((f.sender, f.msg_id) for f in self.wire.sides[name].delivered
                           if isinstance(f, DirectFrame) and f.msg_id.startswith("k:"))
            assert not [k for k, n in keys.items() if n > 1], keys

    def teardown(self) -> None:
        wire = getattr(self, "wire", None)
        if wire is None:
            return
        for name, side in wire.sides.items():
            side.disk_full, side.room = False, None
            if side.paused:
                wire.resume(name)
        wire.run(wire.now + TIMEOUT + 1.0)
        resolved = Counter(wire.settled + [t for t, _ in wire.failed])
        assert set(resolved) == set(wire.tokens), set(wire.tokens) - set(resolved)
        assert all(n == 1 for n in resolved.values()), resolved
        self.delivered_at_most_once_per_incarnation()
        self.nothing_acknowledged_before_it_was_journaled()


WireMachine.TestCase.settings = settings(
    max_examples=examples(150), stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_wire_machine = WireMachine.TestCase
