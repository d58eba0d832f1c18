"""A subscriber that stops reading costs its publisher a bounded number of bytes.

libzmq queues broadcasts per subscriber up to a high-water mark counted in messages; a
node caps each broadcast message in bytes and sets that mark from a byte budget
(``NodeConfig.subscriber_queue_bytes``). Here a real subscriber process is stopped with
SIGSTOP while its publisher sends a burst; the publisher reports its peak RSS. The same
burst without the bound (the old mark of 100 000 messages) shows what the test guards.
Afterwards the subscriber, resumed, has counted every broadcast it missed (sequence
gaps), and ``porter-mesh stats`` shows the loss against the publisher.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.harness import NodeProcess, peers_seen

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]

_ids = itertools.count()
#: Peer timings that forgive the stop: this test is about memory, not liveness.
TIMINGS = ("--heartbeat", "0.2", "--evasive-after", "60", "--expire-after", "120")
BURST = 200_000
TEXT = "x" * 300  # some 350 bytes per activity on the wire: 70 MB for the whole burst
BUDGET = 4 * 1024 * 1024
#: Python, libzmq and allocator slack on top of the queue itself.
MARGIN = 16 * 1024 * 1024


@contextlib.contextmanager
def burst_into_stopped_subscriber(queue_bytes: int) -> Iterator[tuple[int, dict[str, Any], str]]:
    """Peak RSS growth of a publisher whose only subscriber is stopped during a burst;
    then the resumed subscriber's stats, once it has accounted for every broadcast; and
    the mesh, both nodes still running."""
    mesh = f"bound{os.getpid()}-{next(_ids)}"
    pub = NodeProcess("pub", *TIMINGS, "--subscriber-queue-bytes", str(queue_bytes), mesh=mesh)
    sub = NodeProcess("sub", *TIMINGS, "--quiet-messages", mesh=mesh)
    stopped = False
    try:
        for node, other in ((pub, "sub"), (sub, "pub")):
            node.wait_until(lambda ev, o=other: o in peers_seen(ev), 20, f"{node.name} peers")
        pub.command(op="wait-subscribers", channel="log", n=1, timeout=20)
        pub.wait_for(lambda e: e["ev"] == "subscribers", 30, "the subscriber on log")
        os.kill(sub.proc.pid, signal.SIGSTOP)
        stopped = True
        pub.command(op="burst", channel="log", text=TEXT, n=BURST, chunk=512)
        start = pub.wait_for(lambda e: e["ev"] == "burst-start", 30, "burst start")
        done = pub.wait_for(lambda e: e["ev"] == "burst-done", 120, "burst end")
        os.kill(sub.proc.pid, signal.SIGCONT)
        stopped = False

        def accounted(events: list[dict[str, Any]]) -> bool:
            stats = [e["stats"] for e in events if e["ev"] == "stats"]
            if stats and (stats[-1].get("received.broadcast", 0)
                          + stats[-1].get("lost.broadcast", 0)) >= BURST:
                return True
            sub.command(op="stats")
            return False

        sub.wait_until(accounted, 90, "the subscriber accounts for the whole burst")
        final = [e["stats"] for e in sub.events if e["ev"] == "stats"][-1]
        yield done["maxrss"] - start["maxrss"], final, mesh
    finally:
        if stopped:
            os.kill(sub.proc.pid, signal.SIGCONT)
        pub.stop()
        sub.stop()


def test_a_stopped_subscriber_costs_the_publisher_at_most_its_byte_budget() -> None:
    with burst_into_stopped_subscriber(BUDGET) as (growth, stats, mesh):
        assert growth < BUDGET + MARGIN, f"publisher grew {growth / 2**20:.1f} MiB"
        # Nothing is lost silently: every broadcast was either delivered or counted lost.
        assert stats["received.broadcast"] + stats["lost.broadcast"] == BURST
        assert stats["lost.broadcast"] > 0
        # porter-mesh stats asks the subscriber: the publisher's row carries the loss.
        out = subprocess.run([sys.executable, "-m", "porter_mesh.cli.main", "stats", "sub",
                              "--mesh", mesh, "--json"], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stderr
        view = json.loads(out.stdout)
        row = next(p for p in view["peers"] if p["name"] == "pub")
        assert row["lost"] == stats["lost.broadcast"] == view["lost"]


def test_without_the_bound_the_same_burst_exceeds_the_budget() -> None:
    """The control: the old high-water mark of 100 000 messages (of up to 64 activities
    each) keeps the whole burst in the publisher, so the bound above is what holds."""
    with burst_into_stopped_subscriber(100_000 * 64 * 1024) as (growth, stats, _):
        assert growth > BUDGET + MARGIN, f"publisher grew only {growth / 2**20:.1f} MiB"
        assert stats["received.broadcast"] == BURST and stats.get("lost.broadcast", 0) == 0
