"""Service metrics of one agent, as NATS's service framework keeps them: per kind of work
(tasks handled, each tool, model calls), how many, how many failed, and the processing
time (average, p50, p99 over the most recent samples); model tokens in and out.

Pure and thread-safe; the agent's :class:`~.tasks.TaskTracer` feeds it, ``stats`` shows
it (the view's ``service`` section).
"""

from __future__ import annotations

import collections
import math
import threading
from typing import Any, Final

__all__ = ["SAMPLES", "ServiceMetrics"]

#: Processing times kept per kind for the percentiles (the most recent ones).
SAMPLES: Final = 1024


class _Kind:
    __slots__ = ("count", "errors", "samples", "total")

    def __init__(self) -> None:
        self.count = 0
        self.errors = 0
        self.total = 0.0
        self.samples: collections.deque[float] = collections.deque(maxlen=SAMPLES)


def _percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank percentile ``q`` (0..1) of sorted values."""
    index = max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


class ServiceMetrics:
    """Counters and processing times per kind of work."""

    def __init__(self) -> None:
        self._kinds: dict[str, _Kind] = {}
        self.tokens_in = 0
        self.tokens_out = 0
        self._lock = threading.Lock()

    def observe(self, kind: str, seconds: float, *, error: bool = False) -> None:
        """Count one piece of work of ``kind`` that took ``seconds``."""
        with self._lock:
            entry = self._kinds.get(kind)
            if entry is None:
                entry = self._kinds[kind] = _Kind()
            entry.count += 1
            entry.errors += error
            entry.total += seconds
            entry.samples.append(seconds)

    def add_tokens(self, tokens_in: int, tokens_out: int) -> None:
        """Count a model call's tokens."""
        with self._lock:
            self.tokens_in += tokens_in
            self.tokens_out += tokens_out

    def snapshot(self) -> dict[str, Any]:
        """The metrics as JSON-able values: ``kinds`` maps each kind to ``count``,
        ``errors``, ``avg_ms``, ``p50_ms`` and ``p99_ms``; then the tokens."""
        with self._lock:
            kinds: dict[str, Any] = {}
            for name, entry in sorted(self._kinds.items()):
                ordered = sorted(entry.samples)
                kinds[name] = {
                    "count": entry.count, "errors": entry.errors,
                    "avg_ms": round(entry.total / entry.count * 1000, 3),
                    "p50_ms": round(_percentile(ordered, 0.50) * 1000, 3),
                    "p99_ms": round(_percentile(ordered, 0.99) * 1000, 3),
                }
            return {"kinds": kinds, "tokens_in": self.tokens_in,
                    "tokens_out": self.tokens_out}
