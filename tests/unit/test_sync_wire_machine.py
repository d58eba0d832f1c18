"""A property-based state machine over the in-memory sync wire: three replicas write
records at random while the wire drops, duplicates, delays and reorders messages, disks
fill, and peers lose and find each other again. Whatever happens:

* no replica ever holds a record its origin did not write (same slot, same content);
* once the faults stop and time passes, every replica holds every record written, and
  every digest is equal.
"""

from __future__ import annotations

import pathlib
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule

from tests.fuzzing import examples
from tests.unit.sync_wire import SyncWire
from tests.unit.wire_faults import WireFaults

NAMES = ("a", "b", "c")
#: Virtual seconds that convergence may take once the faults stop.
SETTLE = 60.0
names = st.sampled_from(NAMES)


class SyncMachine(WireFaults):
    """Random writes over a hostile wire; the replicas converge whatever it does."""

    @initialize(chunk=st.sampled_from([2, 5, 4096]))
    def start(self, chunk: int) -> None:
        self.root = pathlib.Path(tempfile.mkdtemp(prefix="sync-machine-"))
        self.wire = SyncWire(self.root, *NAMES, catchup_chunk=chunk)
        self.written: dict[tuple[str, int], bytes] = {}

    @rule(name=names, n=st.integers(1, 3))
    def write(self, name: str, n: int) -> None:
        node = self.wire.nodes[name]
        if node.disk_full:
            return  # a local write on a full disk fails before anything is sent
        for record in self.wire.write(name, n):
            self.written[(record.origin, record.seq)] = record.key

    @rule(seconds=st.floats(0.0, 2.0))
    def advance(self, seconds: float) -> None:
        self.wire.advance(seconds)

    @rule(a=names, b=names)
    def lose_each_other(self, a: str, b: str) -> None:
        if a != b and frozenset((a, b)) in self.wire.links:
            self.wire.leave(a, b)

    @rule(a=names, b=names)
    def find_each_other(self, a: str, b: str) -> None:
        if a != b and frozenset((a, b)) not in self.wire.links:
            self.wire.join(a, b)

    @rule(name=names, full=st.booleans())
    def disk(self, name: str, full: bool) -> None:
        self.wire.nodes[name].disk_full = full

    @invariant()
    def nothing_held_that_its_origin_did_not_write(self) -> None:
        wire = getattr(self, "wire", None)
        if wire is None:
            return
        for name, node in wire.nodes.items():
            for origin, seq, key in node.shard.state.bucket_entries(range(256)).entries:
                assert self.written.get((origin, seq)) == key, (name, origin, seq)

    def teardown(self) -> None:
        wire = getattr(self, "wire", None)
        if wire is None:
            return
        try:
            for node in wire.nodes.values():
                node.disk_full = False
            for i, a in enumerate(NAMES):
                for b in NAMES[i + 1:]:
                    if frozenset((a, b)) not in wire.links:
                        wire.join(a, b)
            wire.advance(SETTLE)
            tops: dict[str, int] = {}
            for origin, seq in self.written:
                tops[origin] = max(tops.get(origin, 0), seq)
            for name, node in wire.nodes.items():
                assert node.shard.state.version_vector() == dict(sorted(tops.items())), name
            digests = wire.digests()
            assert len(set(digests.values())) == 1, digests
        finally:
            wire.close()
            shutil.rmtree(self.root, ignore_errors=True)


SyncMachine.TestCase.settings = settings(
    max_examples=examples(60), stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_sync_machine = SyncMachine.TestCase
