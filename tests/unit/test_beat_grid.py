"""The heartbeat grid: every node beats on the wall clock's grid of its interval."""

from __future__ import annotations

import pytest

from porter_mesh.node.timer import next_on_grid


@pytest.mark.parametrize("interval", [0.2, 1.0, 2.5])
@pytest.mark.parametrize("phase", [0.0, 0.05, 0.3, 0.5, 0.89, 0.95, 0.999])
def test_the_next_beat_is_on_the_grid_and_not_too_close(interval: float, phase: float) -> None:
    now = 1000.0  # monotonic
    wall = 1_700_000_000 * interval + phase * interval
    due = next_on_grid(now, interval, wall)
    gap = due - now
    # On the grid: the wall clock at ``due`` is a multiple of the interval.
    assert (wall + gap) / interval == pytest.approx(round((wall + gap) / interval), abs=1e-6)
    assert interval / 10 < gap <= interval * 1.1 + 1e-9


def test_two_nodes_with_different_phases_beat_together() -> None:
    # Started at different moments, with different monotonic clocks, two nodes beat at
    # the same wall-clock instants after their first beat.
    wall0 = 1_800_000_000.0
    beats: list[list[float]] = []
    for start, mono0 in ((0.13, 50.0), (0.71, 9_000.0)):
        now, wall = mono0 + start, wall0 + start
        walls = []
        for _ in range(4):
            due = next_on_grid(now, 1.0, wall)
            wall += due - now
            now = due
            walls.append(round(wall, 6))
        beats.append(walls)
    assert beats[0] == beats[1] == [wall0 + k for k in (1, 2, 3, 4)]


def test_a_late_wakeup_beats_at_the_nearer_point() -> None:
    # The timer for the beat at wall 100.0 fired 0.6 s late: the next beat is at 101.0,
    # 0.4 s later, not 1.4 s later.
    assert next_on_grid(5.6, 1.0, 100.6) == pytest.approx(6.0)
    # Almost at the next point: that one is skipped, not sent twice in a row.
    assert next_on_grid(5.95, 1.0, 100.95) == pytest.approx(7.0)
