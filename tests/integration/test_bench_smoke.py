"""Tiny end-to-end runs of the node and CURVE benchmarks: real processes, real sockets,
real output.

The counts are far too small for meaningful figures; the point is that every measurement
runs across processes, ends on its own, and writes its table, JSON and chart.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

# Whole benchmark programs, run small: CI runs them in its second step.
pytestmark = [pytest.mark.slow]

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_payload_is_the_profile_announce_example() -> None:
    from bench.node_peer import ANNOUNCE, PAYLOAD
    from porter_mesh.core.as2 import Activity
    from porter_mesh.core.profile_examples import PROFILE_EXAMPLES

    assert PROFILE_EXAMPLES["Status announcement"] == ANNOUNCE
    assert Activity.from_dict(ANNOUNCE).to_json() == PAYLOAD


@pytest.mark.network
def test_quick_run_writes_table_json_and_chart(tmp_path: pathlib.Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "bench.bench_node",
        "--quick",
        "--out",
        str(tmp_path),
        "--broadcast",
        "300",
        "--direct",
        "300",
        "--window",
        "100",
        "--rtt",
        "30",
        "--subs",
        "2",
        "--nodes",
        "3",
        "--limit",
        "10",
        "--repeat",
        "1",
        "--systems",
        "mesh,zenoh-orjson",
    ]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]

    res = json.loads((tmp_path / "node.json").read_text())
    assert res["errors"] == {}
    for system in ("mesh", "zenoh-orjson"):
        for subs in (1, 2):
            entry = res["broadcast"][f"{system}/1->{subs}"]
            # Loopback, a few hundred messages, subscribers waited for: nothing is lost.
            assert entry["received"] == [300] * subs, (system, subs, entry["received"])
    # The prebuilt variant was not asked for; the journaled one goes with "mesh".
    assert set(res["direct"]) == {"mesh", "mesh-journal"}
    direct = res["direct"]["mesh"]
    assert (direct["acked"], direct["failed"]) == (300, 0)
    assert direct["rate"] > 0
    assert direct["receiver"]["received"] == 300
    for system in ("mesh", "zmq", "mesh-sleep", "aio", "proto", "proto-noack"):
        rtt = res["rtt"][system]
        assert rtt["n"] == 30
        assert 0 < rtt["p50_us"] <= rtt["p99_us"]
        assert rtt["echo"]["received"] >= 30, system  # every timed trip was answered
    # The mesh's nodes polled after their direct traffic; "mesh-sleep"'s never did.
    assert res["rtt"]["mesh"]["stats"].get("busy_poll.windows", 0) > 0
    assert res["rtt"]["mesh"]["echo"]["stats"].get("busy_poll.windows", 0) > 0
    assert "busy_poll.windows" not in res["rtt"]["mesh-sleep"]["stats"]
    assert "busy_poll.windows" not in res["rtt"]["mesh-sleep"]["echo"]["stats"]
    disc = res["discovery"]
    assert disc["all_seen"] and disc["peers_seen"] == [2, 2, 2]
    assert disc["from_last_start"] > 0

    verdicts = {row["measure"]: row["verdict"] for row in res["summary"]}
    assert set(verdicts) == {
        "broadcast 1->1",
        "broadcast 1->1 vs pyzmq",
        "broadcast 1->2 per sub",
        "broadcast 1->1 prebuilt",
        "broadcast 1->1 each read",
        "broadcast 1->1 from an inbox",
        "direct with acks",
        "direct with acks journaled",
        "direct with acks prebuilt",
        "round trip p50",
        "round trip p99",
        "round trip p50 loop sleeping",
        "round trip p50 asyncio floor",
        "round trip p50 protocol floor",
        "round trip p50 no-ack floor",
        "discovery 3 nodes",
        "discovery 3 incl. start-up",
    }
    assert set(verdicts.values()) <= {"PASS", "MISS", "info"}
    for row in res["summary"]:
        # Only the prebuilt-activity, reading and inbox rows are empty: those variants were
        # not run.
        assert (row["ours"] is None) == row["measure"].endswith(
            ("prebuilt", "each read", "from an inbox")), row
    # Each graded ratio was judged on its one round.
    rows = {row["measure"]: row for row in res["summary"]}
    for name in ("broadcast 1->1", "broadcast 1->2 per sub", "round trip p50", "round trip p99"):
        assert len(rows[name]["rounds"]) == 1, rows[name]
        assert rows[name]["rounds"][0] == pytest.approx(rows[name]["ratio"]), rows[name]

    assert (tmp_path / "node.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = done.stdout
    for heading in ("measure", "ours", "baseline", "best/best", "each round", "target",
                    "result"):
        assert heading in table
    assert "broadcast 1->1" in table and "round trip p50" in table


@pytest.mark.network
@pytest.mark.timeout(120)
def test_curve_benchmark_quick_run_measures_every_row_without_errors(
    tmp_path: pathlib.Path,
) -> None:
    cmd = [sys.executable, "-m", "bench.bench_curve", "--quick", "--out", str(tmp_path),
           "--broadcast", "300", "--direct", "300", "--window", "100", "--rtt", "30"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads((tmp_path / "curve.json").read_text())
    # A peer that fails, even after reporting its figures, is an error of its row.
    assert res["errors"] == {}, res["errors"]
    measured = {row["measure"]: row for row in res["summary"]}
    assert set(measured) == {
        "broadcast 1->1", "direct, acknowledged", "round trip p50", "round trip p99",
        "raw pyzmq broadcast 1->1", "raw pyzmq round trip p50",
    }
    for row in measured.values():
        assert row["off"] > 0 and row["on"] > 0, row
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.network
@pytest.mark.timeout(240)
def test_scale_benchmark_quick_run_measures_every_mesh(tmp_path: pathlib.Path) -> None:
    from tests.integration.netns import lab_namespaces_left

    cmd = [sys.executable, "-m", "bench.bench_scale", "--quick", "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=220)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads((tmp_path / "scale.json").read_text())
    assert res["errors"] == {}
    netns = res["meta"]["netns"]
    runs = {r["label"]: r for r in res["runs"]}
    assert set(runs) == ({"1 host x 4", "1 host x 4, bare"}
                         | ({"2 hosts x 2"} if netns else set()))
    for run in runs.values():
        # Every node's own view (asked over the mesh) holds every other node, alive.
        assert run["views_ok"] == run["nodes"], run["view_errors"]
        assert run["discovery_s"] is not None and run["discovery_s"] >= 0
        assert len(run["cpu_pct"]) == len(run["memory"]) == run["nodes"]
        assert all(0 < m["uss"] <= m["pss"] <= m["rss"] for m in run["memory"])
        assert run["problems"] == []  # every node left on SIGTERM
        if netns:
            assert run["traffic"]["mesh_tcp_bytes_per_node_s"] > 0
    if netns:
        heal = runs["2 hosts x 2"]["heal"]
        assert heal["remember_status"] == 0, heal.get("remember_error")
        assert heal["same_side_flaps"] == []
        assert heal["converged_s"] is not None  # rosters whole and digests equal again
        assert {t["measure"] for t in res["targets"]} >= {"idle CPU per node"}
    # The bench removed the namespaces it made (other people's labs may come and go).
    tags = [r["lab_tag"] for r in runs.values() if r["lab_tag"]]
    assert len(tags) == (len(runs) if netns else 0)
    assert [ns for ns in lab_namespaces_left() if ns.startswith(tuple(tags))] == []
    assert res["imports"][0]["step"] == "python"
    assert res["simulation"]["full_mesh"] and res["simulation"]["swim"]
    assert (tmp_path / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "views ok" in done.stdout and "import step" in done.stdout


@pytest.mark.network
def test_journal_soak_stays_bounded(tmp_path: pathlib.Path) -> None:
    """A short soak: every message sent is taken, and the journal stays near its
    compaction threshold while megabytes go through it."""
    threshold = 64 * 1024
    cmd = [sys.executable, "-m", "bench.bench_journal", "--seconds", "2", "--compact-bytes",
           str(threshold), "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads((tmp_path / "journal.json").read_text())
    assert res["sent"] == res["taken"] > 0
    assert res["received_mb"] * 1e6 > 4 * threshold  # far more than the bound went through
    assert res["max_bytes"] <= 2 * threshold + 256 * 1024  # the bound, plus what is in flight
    assert (tmp_path / "journal.png").stat().st_size > 0


@pytest.mark.network
def test_calls_benchmark_counts_both_measures(tmp_path: pathlib.Path) -> None:
    cmd = [sys.executable, "-m", "bench.bench_calls", "--quick", "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    # Closing leaves no send unsettled behind it (a failed future nobody looked at).
    assert "never retrieved" not in done.stderr, done.stderr[-3000:]
    res = json.loads((tmp_path / "calls.json").read_text())
    # Every message costs the node some calls and some CPU; a run that measured nothing
    # (no message through) would show zero or less.
    for measure in ("round trip", "broadcast"):
        assert res[measure]["calls_per_message"] > 1, res
        assert res[measure]["cpu_us_per_message"] > 0, res


@pytest.mark.network
def test_rtt_stages_benchmark_cuts_every_trip_into_its_stages(tmp_path: pathlib.Path) -> None:
    cmd = [sys.executable, "-m", "bench.bench_rtt_stages", "--quick", "--rounds", "1",
           "--out", str(tmp_path)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads((tmp_path / "rtt_stages.json").read_text())
    (one,) = res["rounds"]
    # Every timed trip was stamped on both sides and matched (the probes still fit the
    # node's direct path: a renamed method would leave them unstamped).
    assert one["trips_cut"] == res["meta"]["trips"]
    from bench.bench_rtt_stages import STAGES

    stages = res["stages_us"]
    # Every stage of the node's own work takes time; a wire stage may not (see cut()).
    assert all(stages[what] > 0 for _, _, _, what, kind in STAGES if kind != "wire"), stages
    # The stages are the trip, cut: their medians add up to about the trip's median.
    parts = sum(v for k, v in stages.items() if k != "trip")
    assert 0.5 * stages["trip"] < parts < 1.5 * stages["trip"], stages
    assert res["zmq_p50_us"] > 0 and 0 <= res["sends_preempted"] <= 1
    assert (tmp_path / "rtt_stages.png").stat().st_size > 0
