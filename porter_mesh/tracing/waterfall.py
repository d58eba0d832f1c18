"""A trace as a waterfall: span records gathered from the agents, drawn as a tree with
start offsets and durations, the slowest path marked, and what is missing said.

Pure: takes records (:data:`~.ring.SpanRecord`), returns rows and text.

The slowest path starts at the earliest root and, at each span, follows the child whose
subtree (the child and everything under it, across agents) takes longest from the
child's start to the subtree's last end: where the time went. A span whose parent is not
among the records (its agent restarted, its ring overflowed, or it did not answer) is
drawn as a root of its own, marked ``?``, and named in :attr:`Waterfall.missing`,
rather than hung under a wrong parent. A span that continues a trace from outside the
mesh (marked :data:`~.ring.CONTINUED`: its parent is the caller's) is a root, not an
orphan; a note names the caller's span.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from porter_mesh.tracing.ring import CONTINUED, SpanRecord

__all__ = ["Row", "Waterfall", "build_waterfall", "record_problem", "render_waterfall",
           "waterfall_json"]


@dataclass(frozen=True, slots=True)
class Row:
    """One span of the waterfall.

    Attributes:
        depth: nesting level (0 for a root).
        agent: the service that made the span.
        name: the span name.
        offset_ms: start, in milliseconds after the trace's first span.
        duration_ms: duration in milliseconds.
        status: ``unset``, ``ok`` or ``error`` (with the message after a colon);
            ``running`` for a span still open.
        slowest: on the slowest path.
        orphan: its parent span is missing.
        record: the span record.
    """

    depth: int
    agent: str
    name: str
    offset_ms: float
    duration_ms: float
    status: str
    slowest: bool
    orphan: bool
    record: SpanRecord


@dataclass
class Waterfall:
    """A trace drawn from span records.

    Attributes:
        trace_ids: the traces shown.
        rows: the spans in tree order.
        missing: parent span ids referred to but not found.
        notes: what else a reader must know (agents that did not answer, rings that
            dropped spans).
    """

    trace_ids: list[str]
    rows: list[Row] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """No missing parent, and one root per trace (or only roots under a caller's
        span outside the mesh: each request of the caller is one)."""
        if self.missing:
            return False
        roots: dict[str, list[Row]] = {}
        for row in self.rows:
            if row.depth == 0:
                roots.setdefault(row.record["trace_id"], []).append(row)
        return len(roots) == len(self.trace_ids) and all(
            len(rows) == 1 or all(_continued(r.record) for r in rows)
            for rows in roots.values())


def record_problem(record: object) -> str | None:
    """What keeps a span record from a peer out of a waterfall (``None``: it can be drawn).

    Only the shape the drawing reads is checked (ids and name as strings, times as
    integers, status text as strings, attributes as a map), not the limits of a record
    handed over to keep: a peer's ring may hold long attributes of its own.
    """
    if not isinstance(record, dict):
        return f"a span record must be an object, not {type(record).__name__}"
    for key in ("trace_id", "span_id", "name"):
        if not isinstance(record.get(key), str):
            return f"{key} must be a string"
    if not isinstance(record.get("parent_id"), str | None):
        return "parent_id must be a string or null"
    if not all(type(record.get(key)) is int for key in ("start_ns", "end_ns")):
        return "start_ns and end_ns must be integers"
    for key in ("service", "status", "status_message"):
        if not isinstance(record.get(key, ""), str):
            return f"{key} must be a string"
    if not isinstance(record.get("attributes", {}), dict):
        return "attributes must be an object"
    return None


def build_waterfall(records: Iterable[SpanRecord], notes: Sequence[str] = ()) -> Waterfall:
    """Arrange span records as a tree.

    Args:
        records: spans of one or more traces, from any number of agents (duplicates,
            e.g. from an agent asked twice, are dropped).
        notes: messages to carry along (who did not answer).

    Returns:
        The waterfall.
    """
    spans: dict[str, SpanRecord] = {}
    for record in records:
        spans.setdefault(record["span_id"], record)
    ordered = sorted(spans.values(), key=lambda r: (r["start_ns"], r["span_id"]))
    children: dict[str, list[SpanRecord]] = {}
    roots: list[SpanRecord] = []
    missing: list[str] = []
    callers: list[str] = []
    for record in ordered:
        parent = record.get("parent_id")
        if parent is not None and parent in spans:
            children.setdefault(parent, []).append(record)
            continue
        roots.append(record)
        if parent is None:
            continue
        outside = callers if _continued(record) else missing
        if parent not in outside:
            outside.append(parent)
    trace_ids = sorted({r["trace_id"] for r in ordered})
    result = Waterfall(trace_ids, missing=missing, notes=list(notes))
    result.notes += [f"the trace continues a caller's span outside the mesh ({parent})"
                     for parent in callers]
    if not ordered:
        return result
    first = ordered[0]["start_ns"]
    subtree_end: dict[str, int] = {}
    for record in reversed(ordered):  # children start after their parents: done first
        ends = [subtree_end.get(c["span_id"], c["end_ns"])
                for c in children.get(record["span_id"], [])]
        subtree_end[record["span_id"]] = max([record["end_ns"], *ends])
    slowest: set[str] = set()
    if roots:
        node: SpanRecord | None = roots[0]
        while node is not None:
            slowest.add(node["span_id"])
            kids = children.get(node["span_id"], [])
            node = max(kids, key=lambda r: subtree_end[r["span_id"]] - r["start_ns"],
                       default=None)

    def row(record: SpanRecord, depth: int) -> None:
        status = "running" if record.get("open") else record.get("status", "unset")
        if record.get("status_message"):
            status = f"{status}: {record['status_message']}"
        result.rows.append(Row(
            depth=depth, agent=str(record.get("service", "")), name=record["name"],
            offset_ms=(record["start_ns"] - first) / 1e6,
            duration_ms=max(0, record["end_ns"] - record["start_ns"]) / 1e6,
            status=status, slowest=record["span_id"] in slowest,
            orphan=(depth == 0 and record.get("parent_id") is not None
                    and not _continued(record)), record=record))

    # Depth first with a stack of its own: a chain of spans a peer sent may be deeper
    # than the interpreter's.
    stack = [(root, 0) for root in reversed(roots)]
    while stack:
        record, depth = stack.pop()
        row(record, depth)
        stack += [(child, depth + 1) for child in reversed(children.get(record["span_id"], []))]
    return result


def _continued(record: SpanRecord) -> bool:
    """Whether the span's parent is a caller's outside the mesh."""
    attributes = record.get("attributes")
    return isinstance(attributes, dict) and attributes.get(CONTINUED) is True


def _ms(value: float) -> str:
    return f"{value / 1000:.2f}s" if value >= 1000 else f"{value:.1f}ms"


def render_waterfall(waterfall: Waterfall, *, width: int = 40) -> str:
    """The waterfall as text for a terminal.

    Args:
        waterfall: what :func:`build_waterfall` made.
        width: columns of the bar chart.

    Returns:
        Lines: a header, one per span (``*`` on the slowest path, ``?`` where the parent
        is missing), then what is missing.
    """
    if not waterfall.rows:
        lines = ["no spans found for this trace: the agents that had them may have "
                 "restarted, or their rings overflowed"]
        return "\n".join(lines + [f"note: {n}" for n in waterfall.notes])
    total = max(r.offset_ms + r.duration_ms for r in waterfall.rows) or 1.0
    lines = [f"trace {', '.join(waterfall.trace_ids)}: {len(waterfall.rows)} span(s) in "
             f"{_ms(total)}; * marks the slowest path",
             f"  {'AGENT':14} {'SPAN':44} {'START':>9} {'DURATION':>9}  {'STATUS':8} TIMELINE"]
    for row in waterfall.rows:
        mark = "?" if row.orphan else ("*" if row.slowest else " ")
        label = ("  " * row.depth + row.name)[:44]
        start = int(row.offset_ms / total * width)
        length = max(1, int(row.duration_ms / total * width))
        bar = " " * start + "#" * min(length, width - start if start < width else 1)
        lines.append(f"{mark} {row.agent[:14]:14} {label:44} {_ms(row.offset_ms):>9} "
                     f"{_ms(row.duration_ms):>9}  {row.status[:8]:8} |{bar:{width}}|")
    if waterfall.missing:
        shown = ", ".join(waterfall.missing[:4]) + (", ..." if len(waterfall.missing) > 4 else "")
        lines.append(f"missing: {len(waterfall.missing)} parent span(s) of the spans marked ? "
                     f"were not found ({shown}); their agents may have restarted, dropped them "
                     "from their rings, or not answered: the tree is partial")
    lines += [f"note: {n}" for n in waterfall.notes]
    return "\n".join(lines)


def waterfall_json(waterfall: Waterfall) -> dict[str, Any]:
    """The waterfall as JSON-able values, for a page to draw.

    Returns:
        ``trace_ids``, ``total_ms`` (the last end after the first start), ``complete``,
        ``missing``, ``notes`` and ``rows``: each with ``depth``, ``agent``, ``name``,
        ``kind``, ``offset_ms``, ``duration_ms``, ``status`` (``unset``, ``ok``,
        ``error`` or ``running``), ``message`` (the status's), ``slowest``, ``orphan``,
        ``span_id`` and ``parent_id``.
    """
    rows = waterfall.rows
    total = max((r.offset_ms + r.duration_ms for r in rows), default=0.0)
    return {
        "trace_ids": waterfall.trace_ids, "total_ms": round(total, 3),
        "complete": waterfall.complete, "missing": waterfall.missing,
        "notes": waterfall.notes,
        "rows": [{"depth": r.depth, "agent": r.agent, "name": r.name,
                  "kind": r.record.get("kind", ""), "offset_ms": round(r.offset_ms, 3),
                  "duration_ms": round(r.duration_ms, 3),
                  "status": "running" if r.record.get("open")
                  else r.record.get("status", "unset"),
                  "message": r.record.get("status_message", ""), "slowest": r.slowest,
                  "orphan": r.orphan, "span_id": r.record.get("span_id"),
                  "parent_id": r.record.get("parent_id")} for r in rows],
    }
