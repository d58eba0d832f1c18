"""An idle node sleeps: its event loop wakes for its timers' deadlines, not on a poll.

A real ``porter-mesh node`` process alone on a mesh (in a network namespace of its own
when root, so other processes' mDNS on this machine's loopback cannot wake it), measured
by :mod:`bench.bench_idle` from ``/proc``: the context switches of its main thread over a
few seconds. With a 1 s heartbeat it wakes about twice a second (the beat, and the
check of its peers' silence half a beat later); a 50 ms poll would make that twenty.
"""

from __future__ import annotations

import pytest

from bench.bench_idle import isolation_available, measure

pytestmark = pytest.mark.network


@pytest.mark.timeout(120)
def test_idle_node_wakes_about_once_a_heartbeat() -> None:
    isolated = isolation_available()
    if not isolated:
        print("not root: the node shares the machine's loopback (others' mDNS may wake it)")
    result = measure(4.0, discovery=True, isolated=isolated, settle=1.0)
    # A beat and a silence check a second, plus the odd mDNS answer; a poll would be
    # 20/s and more.
    assert result["main_per_s"] <= 3.0, result
