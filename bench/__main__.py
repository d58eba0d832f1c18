"""Run every benchmark: each ``bench/bench_*.py`` module's ``main()``, in name order."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import bench
from bench.common import progress


def main() -> int:
    """Run all benchmarks; return the number that failed to run."""
    failures = 0
    names = sorted(
        m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_")
    )
    for name in names:
        progress(f"running {name}")
        try:
            status = importlib.import_module(f"bench.{name}").main()
        except Exception as exc:  # one broken benchmark must not hide the others
            failures += 1
            progress(f"{name} failed: {exc!r}")
        else:
            if status:
                progress(f"{name} finished with status {status}")
    return failures


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
