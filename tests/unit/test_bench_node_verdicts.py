"""The node benchmark's verdicts: a target holds only when every round meets it, with
each round's ratio taken against the baseline of that same round."""

from __future__ import annotations

from typing import Any

from bench.bench_node import _keep_best, summarize


def _results(mesh: list[float | None], zenoh: list[float]) -> dict[str, Any]:
    """Broadcast 1->1 rates, round by round (``None``: the mesh failed that round)."""
    res: dict[str, Any] = {"counts": {"subs": 4, "nodes": 10}}
    store = res.setdefault("broadcast", {})
    for n, (ours, theirs) in enumerate(zip(mesh, zenoh, strict=True), start=1):
        if ours is not None:
            _keep_best(store, "mesh/1->1", {"mean": ours}, "mean", True, n)
        _keep_best(store, "zenoh-orjson/1->1", {"mean": theirs}, "mean", True, n)
    return res


def _row(res: dict[str, Any]) -> Any:
    return next(r for r in summarize(res) if r.measure == "broadcast 1->1")


def test_every_round_must_meet_the_target_not_only_the_best() -> None:
    # Best against best is 600/400 = 1.5x, but round 2 alone is 300/400 = 0.75x.
    row = _row(_results([600.0, 300.0, 550.0], [400.0, 400.0, 380.0]))
    assert row.ratio == 1.5
    assert row.rounds == (1.5, 0.75, 550.0 / 380.0)
    assert row.verdict == "MISS"
    assert _row(_results([600.0, 500.0, 550.0], [400.0, 400.0, 380.0])).verdict == "PASS"


def test_a_round_the_mesh_failed_is_a_miss() -> None:
    row = _row(_results([600.0, None, 550.0], [400.0, 400.0, 380.0]))
    assert row.verdict == "MISS"
    assert row.rounds_text().split(" / ")[1] == "failed"


def test_the_best_round_is_kept_and_every_round_listed() -> None:
    store: dict[str, Any] = {}
    for n, rate in enumerate((5.0, 9.0, 7.0), start=1):
        _keep_best(store, "k", {"mean": rate, "round_of": n}, "mean", True, n)
    assert store["k"]["round_of"] == 2
    assert [r["mean"] for r in store["k"]["per_round"]] == [5.0, 9.0, 7.0]


def test_a_measure_not_run_has_no_rounds_and_no_verdict_but_a_miss() -> None:
    row = _row(_results([None, None], [400.0, 380.0]))
    assert (row.ours, row.rounds, row.rounds_text()) == (None, (), "")
    assert row.verdict == "MISS"
