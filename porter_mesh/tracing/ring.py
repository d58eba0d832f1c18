"""The node's recent spans: a ring bounded by count and by bytes.

Every agent keeps the spans it finished lately, so that ``porter-mesh trace`` can draw a
task's waterfall from the nodes themselves, with no collector. A span is kept as a
plain JSON-able :data:`SpanRecord`; when either bound is passed the oldest records go
first, and the ring counts what it dropped so that a reader knows a trace may be
partial.

The spans still open (a task in review, waiting on its reviewer) are known too: a
reader gets them as records marked ``open``, ending now, so that the tree of a task
under way is whole.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

import orjson

from porter_mesh.errors import ConfigError

__all__ = ["CONTINUED", "DEFAULT_RING_BYTES", "DEFAULT_RING_SPANS", "SpanRecord", "SpanRing"]

#: A finished span: trace_id, span_id, parent_id (hex or None), name, kind, service,
#: start_ns, end_ns, status ("unset", "ok", "error"), status_message, attributes; a span
#: still open has ``open: true`` and ends when it was read.
SpanRecord = dict[str, Any]

#: The attribute of a span whose parent is outside the mesh (a trace context handed in
#: by a caller: ``--traceparent``, an A2A request's header, an MCP request's ``_meta``):
#: the mesh's part of the trace starts there, and its parent is not missing.
CONTINUED: Final = "porter.trace.continued"

DEFAULT_RING_SPANS: Final = 4096
DEFAULT_RING_BYTES: Final = 4 * 1024 * 1024


class SpanRing:
    """Recent span records, oldest evicted first.

    Args:
        max_spans: most records kept.
        max_bytes: most bytes kept (each record counted as its JSON size).

    Raises:
        ConfigError: a bound below 1.
    """

    def __init__(self, max_spans: int = DEFAULT_RING_SPANS,
                 max_bytes: int = DEFAULT_RING_BYTES) -> None:
        if max_spans < 1 or max_bytes < 1:
            raise ConfigError("a span ring needs max_spans >= 1 and max_bytes >= 1")
        self.max_spans = max_spans
        self.max_bytes = max_bytes
        self._records: collections.deque[tuple[SpanRecord, int]] = collections.deque()
        # span id -> how to read the span now, while it is open (bounded by max_spans).
        self._open: dict[str, Callable[[], SpanRecord]] = {}
        self._bytes = 0
        self.dropped = 0
        self._lock = threading.Lock()  # the exporter's thread adds, the node's reads

    def started(self, span_id: str, snapshot: Callable[[], SpanRecord]) -> None:
        """Know of an open span until its record is added (:meth:`add`).

        Args:
            span_id: its 16-hex id.
            snapshot: returns its record as it is now (called when it is read).
        """
        with self._lock:
            if len(self._open) < self.max_spans:
                self._open[span_id] = snapshot

    def add(self, record: SpanRecord) -> None:
        """Keep ``record``; the oldest go while a bound is passed (a record larger than
        the byte bound on its own is dropped and counted)."""
        size = len(orjson.dumps(record, default=str))
        with self._lock:
            self._open.pop(record.get("span_id", ""), None)
            if size > self.max_bytes:
                self.dropped += 1
                return
            self._records.append((record, size))
            self._bytes += size
            while len(self._records) > self.max_spans or self._bytes > self.max_bytes:
                _, gone = self._records.popleft()
                self._bytes -= gone
                self.dropped += 1

    def __len__(self) -> int:
        return len(self._records)

    @property
    def size_bytes(self) -> int:
        """Bytes held now."""
        return self._bytes

    def find(self, *, trace_ids: Iterable[str] = (), context: str | None = None,
             limit: int = 1000) -> list[SpanRecord]:
        """The records of some traces, or of the traces a task's spans belong to.

        Args:
            trace_ids: 32-hex trace ids.
            context: a task context (``urn:porter:task:...``): every trace with a span
                about it.
            limit: most records returned (the newest).

        Returns:
            The matching records, oldest first, then the open spans.
        """
        wanted = {t.lower() for t in trace_ids}
        with self._lock:
            records = [r for r, _ in self._records]
            snapshots = list(self._open.values())
        now = time.time_ns()
        for snapshot in snapshots:
            record = snapshot()
            record.update(open=True, end_ns=max(now, record["start_ns"]))
            records.append(record)
        if context is not None:
            wanted |= {r["trace_id"] for r in records
                       if r.get("attributes", {}).get("porter.task.context") == context}
        found = [r for r in records if r["trace_id"] in wanted]
        return found[-limit:]

    def stats(self) -> dict[str, int]:
        """Spans and bytes held, and how many were dropped."""
        with self._lock:
            return {"spans": len(self._records), "open": len(self._open),
                    "bytes": self._bytes,
                    "dropped": self.dropped, "max_spans": self.max_spans,
                    "max_bytes": self.max_bytes}
