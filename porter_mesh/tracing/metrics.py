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
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["SAMPLES", "ServiceMetrics", "prometheus_text"]

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


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text(services: Mapping[str, Mapping[str, Any]]) -> str:
    """Service metrics of several agents in the Prometheus text format (version 0.0.4).

    Args:
        services: agent name -> its :meth:`ServiceMetrics.snapshot` (the ``service``
            section of its view); malformed entries are skipped.

    Returns:
        ``porter_mesh_requests_total``, ``porter_mesh_errors_total``, the summary
        ``porter_mesh_processing_seconds`` (p50, p99, sum, count) per agent and kind, and
        ``porter_mesh_model_tokens_total`` per agent and direction.
    """
    requests, errors, summary, tokens = [], [], [], []
    for agent, service in sorted(services.items()):
        kinds = service.get("kinds") if isinstance(service, Mapping) else None
        if not isinstance(kinds, Mapping):
            continue
        who = f'agent="{_label(agent)}"'
        for kind, k in sorted(kinds.items()):
            if not isinstance(k, Mapping):
                continue
            labels = f'{who},kind="{_label(str(kind))}"'
            count = int(k.get("count", 0))
            requests.append(f"porter_mesh_requests_total{{{labels}}} {count}")
            errors.append(f"porter_mesh_errors_total{{{labels}}} {int(k.get('errors', 0))}")
            for q, key in (("0.5", "p50_ms"), ("0.99", "p99_ms")):
                summary.append(f'porter_mesh_processing_seconds{{{labels},quantile="{q}"}} '
                               f"{float(k.get(key, 0)) / 1000:.6f}")
            summary.append(f"porter_mesh_processing_seconds_sum{{{labels}}} "
                           f"{float(k.get('avg_ms', 0)) * count / 1000:.6f}")
            summary.append(f"porter_mesh_processing_seconds_count{{{labels}}} {count}")
        for direction in ("in", "out"):
            tokens.append(f'porter_mesh_model_tokens_total{{{who},direction="{direction}"}} '
                          f"{int(service.get(f'tokens_{direction}', 0))}")
    lines = [
        "# HELP porter_mesh_requests_total Work an agent finished, by kind (task, tool, chat).",
        "# TYPE porter_mesh_requests_total counter", *requests,
        "# HELP porter_mesh_errors_total Work that failed, by kind.",
        "# TYPE porter_mesh_errors_total counter", *errors,
        "# HELP porter_mesh_processing_seconds Processing time over the recent samples.",
        "# TYPE porter_mesh_processing_seconds summary", *summary,
        "# HELP porter_mesh_model_tokens_total Model tokens, in (prompt) and out.",
        "# TYPE porter_mesh_model_tokens_total counter", *tokens,
    ]
    return "\n".join(lines) + "\n"


#: Most kinds of work kept from one agent's reported metrics.
MAX_KINDS: Final = 64
_FIELDS: Final = ("count", "errors", "avg_ms", "p50_ms", "p99_ms")


def service_record(value: object) -> dict[str, Any] | None:
    """A peer's reported ``service`` section, checked: at most :data:`MAX_KINDS` kinds
    with short names and numeric fields, integer tokens; ``None`` when it is not one.

    Args:
        value: the section as it arrived (untrusted).

    Returns:
        A clean copy, or ``None``.
    """
    if not isinstance(value, Mapping) or not isinstance(value.get("kinds"), Mapping):
        return None
    kinds: dict[str, Any] = {}
    for name, entry in list(value["kinds"].items())[:MAX_KINDS]:
        if isinstance(name, str) and len(name) <= 80 and isinstance(entry, Mapping):
            numbers = {f: entry.get(f) for f in _FIELDS}
            if all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0
                   for v in numbers.values()):
                kinds[name] = numbers
    tokens = {k: value.get(k) for k in ("tokens_in", "tokens_out")}
    return {"kinds": kinds, **{k: v if isinstance(v, int) and not isinstance(v, bool)
                               and v >= 0 else 0 for k, v in tokens.items()}}
