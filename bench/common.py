"""Shared helpers for the benchmarks: timing, result files, a ratio plot, a table.

Benchmarks report ratios to a baseline measured in the same run, because absolute
microseconds depend on the machine and on whatever else it is doing. To keep ratios
honest on a busy, shared machine, :func:`measure_interleaved`

* counts the CPU time of the measuring thread (``time.thread_time_ns``), not wall time,
  so time spent descheduled while other processes run is not charged to the code;
* times every case once per round, round after round, so that slower phases (cache
  pressure, frequency changes) hit all cases alike; the reported figure is the median
  over rounds, and ratios are medians of per-round ratios.

Progress goes to stderr, tables to stdout, results to ``bench/results/<name>.json`` and
``bench/results/<name>.png``.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def progress(message: str) -> None:
    """Print a progress line on stderr (stdout is kept for the result table)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Timing:
    """Per-operation CPU time of one case over several rounds, in microseconds.

    Attributes:
        name: the case.
        ops_per_call: operations one call of the timed function performs (a batch of
            64 activities is 64 operations); every figure here is per operation.
        samples_us: one figure per round.
    """

    name: str
    ops_per_call: int
    samples_us: tuple[float, ...]

    @property
    def best_us(self) -> float:
        """The fastest round."""
        return min(self.samples_us)

    @property
    def median_us(self) -> float:
        """The median round (the figure to report)."""
        return statistics.median(self.samples_us)

    def to_json(self) -> dict[str, Any]:
        """The timing as a JSON-ready dict, with best and median."""
        return {**asdict(self), "best_us": self.best_us, "median_us": self.median_us}


def _calibrate(fn: Callable[[], object], target_s: float) -> int:
    """How many calls of ``fn`` take about ``target_s`` seconds."""
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - start
        if elapsed >= target_s / 4 or number >= 1 << 24:
            return max(1, int(number * target_s / max(elapsed, 1e-9)))
        number *= 4


def measure_interleaved(
    cases: Mapping[str, tuple[Callable[[], object], int]],
    *,
    rounds: int = 15,
    round_s: float = 0.05,
) -> dict[str, Timing]:
    """Time several cases round-robin and return per-operation timings.

    Args:
        cases: name -> (function to call, operations per call).
        rounds: how many rounds; each round times every case once.
        round_s: about how long each case runs per round.

    Returns:
        name -> :class:`Timing`.
    """
    clock = time.thread_time_ns
    numbers = {name: _calibrate(fn, round_s) for name, (fn, _) in cases.items()}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection in the middle of one case would bias it
    try:
        for index in range(rounds):
            for name, (fn, _ops) in cases.items():
                number = numbers[name]
                start = clock()
                for _ in range(number):
                    fn()
                elapsed_ns = clock() - start
                samples[name].append(elapsed_ns / 1000 / number / cases[name][1])
            gc.collect()
            progress(f"round {index + 1}/{rounds}")
    finally:
        if gc_was_enabled:
            gc.enable()
    return {
        name: Timing(name=name, ops_per_call=cases[name][1], samples_us=tuple(samples[name]))
        for name in cases
    }


def ratio(timing: Timing, baseline: Timing) -> float:
    """Median over rounds of the per-round ratio ``timing / baseline``.

    Pairing rounds cancels load that changes between rounds better than dividing the
    two medians.
    """
    return statistics.median(
        t / b for t, b in zip(timing.samples_us, baseline.samples_us, strict=True)
    )


def environment() -> dict[str, Any]:
    """What the figures were measured on (``loop``: the event loop the mesh's processes
    run on)."""
    from porter_mesh import eventloop

    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "system": platform.system(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loop": eventloop.loop_name(),
    }


def write_results(name: str, data: Mapping[str, Any]) -> Path:
    """Write ``bench/results/<name>.json`` (with the environment added) and return its path."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    document = {"benchmark": name, "environment": environment(), **data}
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    return path


def plot_ratios(
    name: str,
    labels: Sequence[str],
    ratios: Sequence[float],
    *,
    targets: Sequence[float | None] | None = None,
    title: str = "",
    ylabel: str = "ratio to baseline",
) -> Path:
    """Draw a bar chart of ratios (1.0 = baseline) to ``bench/results/<name>.png``.

    Args:
        name: file name stem.
        labels: one label per bar.
        ratios: one ratio per bar.
        targets: optional target per bar, drawn as a dashed marker; a bar over its
            target is drawn in a warning colour.
        title: chart title.
        ylabel: axis label.

    Returns:
        The PNG path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.png"
    goals = list(targets) if targets is not None else [None] * len(ratios)
    colours = [
        "#c0392b" if goal is not None and value > goal else "#2e86c1"
        for value, goal in zip(ratios, goals, strict=True)
    ]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(labels)), 3.6))
    bars = ax.bar(labels, ratios, color=colours)
    ax.axhline(1.0, color="#555555", linewidth=0.8)
    for bar, value, goal in zip(bars, ratios, goals, strict=True):
        x = bar.get_x()
        ax.annotate(
            f"{value:.2f}x",
            (x + bar.get_width() / 2, value),
            ha="center",
            va="bottom",
            fontsize=9,
        )
        if goal is not None:
            ax.hlines(goal, x, x + bar.get_width(), colors="#000000", linestyles="dashed")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Print an aligned text table on stdout (floats with two decimals)."""
    cells = [[f"{c:.2f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(str(h)), *(len(row[i]) for row in cells)) for i, h in enumerate(headers)]
    line = "  ".join(str(h).ljust(w) for h, w in zip(headers, widths, strict=True))
    print(line)
    print("-" * len(line))
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
