"""An idle node that keeps a knowledge replica wakes for its own deadlines only: the
replica arms the node's clock at its session's next deadline (none while no peer runs a
replica), never on a polling tick."""

from __future__ import annotations

import pytest

from bench.bench_idle import TARGET_PER_S, isolation_available, measure


@pytest.mark.network
def test_an_idle_node_with_a_knowledge_replica_wakes_only_for_its_heartbeat() -> None:
    # A real node process, alone, without discovery (nothing on the wire can wake it);
    # its loop thread's context switches over the window are its wake-ups.
    result = measure(4.0, discovery=False, isolated=isolation_available(), knowledge=True)
    assert result["main_per_s"] <= TARGET_PER_S, result
