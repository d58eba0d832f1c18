"""The membership simulation behind docs/scale.md: its models must behave as the
protocols do, or the figures drawn from them mean nothing."""

from __future__ import annotations

from bench.sim_membership import Swim, anti_entropy, full_mesh


def test_full_mesh_heartbeats_keep_every_peer_alive_but_the_crashed_one() -> None:
    result = full_mesh(200, 30.0, crash_at=5.0)
    # One heartbeat per peer per second; the crashed peer's stop at 5 s.
    assert 198 * 30 + 4 <= result["heard"] <= 198 * 30 + 6
    assert (result["false_evasive"], result["false_expired"]) == (0, 0)
    # Noticed on the first beat tick past the node's timings (3 s, 10 s), not before.
    assert 3.0 <= result["evasive_crash_s"] <= 4.0
    assert 10.0 <= result["detect_crash_s"] <= 11.0
    assert result["messages_per_node_s"] == 2 * 199
    assert result["core_us_per_heartbeat"] > 0


def test_swim_finds_the_crash_everywhere_at_a_constant_cost() -> None:
    small, large = Swim(100, loss=0.0).run(40), Swim(1000, loss=0.0).run(40)
    for result in (small, large):
        assert result["detect_first_periods"] is not None
        assert result["dead_all_periods"] is not None
        assert result["dead_all_periods"] >= result["suspicion_periods"]
        assert result["false_suspicions"] == 0 and result["false_deaths"] == 0
    # Ten times the members: not ten times the messages per member.
    assert large["messages_per_node_s"] < 2 * small["messages_per_node_s"]


def test_swim_indirect_probes_refute_suspicions_under_loss() -> None:
    result = Swim(300, loss=0.03, seed=1).run(40)
    assert result["false_suspicions"] > 0  # the loss did make probes fail
    assert result["false_deaths"] == 0
    assert result["dead_all_periods"] is not None


def test_a_digest_costs_the_same_at_any_size() -> None:
    cost = anti_entropy()
    assert cost["digest_bytes"] > 256 * 16  # one fingerprint per bucket
    assert cost["per_node_bytes_s"] == round(cost["digest_bytes"] / 2.0, 1)
