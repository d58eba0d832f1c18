"""The spans of a command's seat: the root of a task started from ``send`` or ``request``.

A seat (``porter-ui-<suffix>``) lives for one command, so its ring goes when the command
ends. Yet the span of the human's request is the root of the task's trace: without it
every span the agents make for the task hangs under a parent nobody has. So the seat
makes its spans like any agent (the SDK, exported over OTLP by the seat itself when the
``OTEL_*`` variables name an endpoint, as any instrumented process does), and before it
leaves hands the finished ones to the agents it reached (``spans-keep``), which keep
them in their rings for ``porter-mesh trace`` and the dashboard. Each span is exported
once, by the process that measured it; the agents only keep the copy.

::

    request <agent>        CLIENT, ``request`` only: from the send to the reply that ends it
      '- send task:<agent> PRODUCER: the Offer; its context travels in the envelope
           '- (the agent's receive and invoke_agent spans)

``send`` makes only the ``send`` span, the trace's root. A trace context handed in
(``--traceparent``) is the parent of the seat's root, which is then marked
``porter.trace.continued``: its parent is outside the mesh.

A long-lived seat (the A2A gateway) makes the same ``send`` spans, each under the trace
context of the request that caused it, and keeps them in its own ring.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Final

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from porter_mesh.core import constants as C
from porter_mesh.core.as2 import Activity
from porter_mesh.core.tracecontext import TraceContext
from porter_mesh.node.node import Node
from porter_mesh.tracing.export import Tracing, start_tracing
from porter_mesh.tracing.ring import SpanRecord
from porter_mesh.tracing.tasks import CONTINUED, context_of, trace_of_span
from porter_mesh.tracing.views import hand_spans

__all__ = ["SeatSpans", "seat_spans"]

_MESSAGING_SYSTEM: Final = "porter_mesh"
#: Seconds the seat's exporter may take per export (unless ``OTEL_*`` says): the command
#: exits after it.
EXPORT_SECONDS: Final = 3.0


class SeatSpans:
    """The spans one command's seat makes (see the module docstring).

    Args:
        tracing: the seat's tracing (:func:`~.export.start_tracing`).
        origin: the trace context handed to the command, if any.
    """

    def __init__(self, tracing: Tracing, origin: TraceContext | None = None) -> None:
        self.tracing = tracing
        self.origin = origin
        self.root: Span | None = None
        # Its traces and the span ids already handed over (send --count N), oldest
        # first. A long-lived seat (the dashboard, the A2A gateway) starts traces for
        # weeks: each keeps no more ids than its ring holds spans, since the ring has
        # nothing of the older ones.
        self._trace_ids: dict[str, None] = {}
        self._handed: dict[str, None] = {}

    @classmethod
    def start(cls, seat: str, origin: TraceContext | None = None) -> SeatSpans | None:
        """The seat's spans, or ``None`` when the SDK is missing or turned off."""
        tracing = start_tracing(seat, export_timeout=EXPORT_SECONDS)
        return None if tracing is None else cls(tracing, origin)

    @staticmethod
    def traced(activity: Activity, origin: TraceContext | None) -> bool:
        """Whether sending ``activity`` starts (or continues) a trace: an Offer of a task
        starts one; anything else only continues a trace handed in."""
        return origin is not None or (activity.type == "Offer" and activity.context is not None)

    def _parent(self, origin: TraceContext | None) -> tuple[Any, bool]:
        """The context to start the next span in, and whether it is outside the mesh."""
        if self.root is not None:
            return trace.set_span_in_context(self.root), False
        parent = context_of(origin)
        return parent, parent is not None

    def _start(self, name: str, kind: SpanKind, attributes: dict[str, Any],
               origin: TraceContext | None = None) -> Span:
        parent, outside = self._parent(origin or self.origin)
        if outside:
            attributes[CONTINUED] = True
        span = self.tracing.tracer.start_span(name, context=parent, kind=kind,
                                              attributes=attributes)
        self._remember(self._trace_ids, [f"{span.get_span_context().trace_id:032x}"])
        return span

    def _remember(self, ids: dict[str, None], new: list[str]) -> None:
        """Add ``new`` to ``ids``, forgetting the oldest past the ring's bound."""
        for one in new:
            ids.pop(one, None)
            ids[one] = None
        for _ in range(len(ids) - self.tracing.ring.max_spans):
            del ids[next(iter(ids))]

    def begin_request(self, recipient: str, activity: Activity) -> None:
        """Open ``request <recipient>``, the root of what ``request`` does."""
        if not self.traced(activity, self.origin):
            return
        attributes: dict[str, Any] = {"gen_ai.agent.name": recipient,
                                      "porter.activity.type": activity.type}
        if activity.context is not None:
            attributes["porter.task.context"] = activity.context
        self.root = self._start(f"request {recipient}", SpanKind.CLIENT, attributes)

    def end_request(self, problem: str | None = None) -> None:
        """End ``request``'s span (an error with ``problem`` when it failed)."""
        if self.root is None:
            return
        if problem is not None:
            self.root.set_status(Status(StatusCode.ERROR, problem))
        self.root.end()

    def sending(self, channel: str, activity: Activity, origin: TraceContext | None = None,
                ) -> tuple[TraceContext | None, Span | None]:
        """Open the ``send`` span of the seat's message.

        Args:
            channel: where it goes.
            activity: what it is.
            origin: the trace context this message continues, when it is not the one
                the seat was made with (a gateway's request's own).

        Returns:
            The trace context for its envelope (the one handed in when the message is
            not traced) and the span, for :meth:`sent`.
        """
        origin = origin or self.origin
        if not self.traced(activity, origin):
            return origin, None
        attributes: dict[str, Any] = {
            "messaging.system": _MESSAGING_SYSTEM,
            "messaging.operation.type": "send",
            "messaging.destination.name": channel,
            "messaging.client.id": self.tracing.service,
            "porter.activity.type": activity.type,
        }
        if activity.context is not None:
            attributes["porter.task.context"] = activity.context
        if channel.startswith(C.DIRECT_PREFIX):
            attributes["porter.recipient"] = channel[len(C.DIRECT_PREFIX):]
        span = self._start(f"send {channel}", SpanKind.PRODUCER, attributes, origin)
        return trace_of_span(span) or origin, span

    @staticmethod
    def sent(span: Span | None, problem: str | None = None) -> None:
        """End a ``send`` span (an error with ``problem`` when nobody was reached)."""
        if span is None:
            return
        if problem is not None:
            span.set_status(Status(StatusCode.ERROR, problem))
        span.end()

    def records(self) -> list[SpanRecord]:
        """The finished spans of the seat's traces not handed over yet."""
        return [r for r in self.tracing.ring.find(trace_ids=sorted(self._trace_ids))
                if not r.get("open") and r["span_id"] not in self._handed]

    async def hand_over(self, node: Node, peers: set[str], timeout: float) -> set[str]:
        """Hand the finished spans to ``peers`` to keep (:func:`~.views.hand_spans`).

        Returns:
            The peers that kept them.
        """
        records = self.records()
        kept = await hand_spans(node, sorted(peers), records, timeout)
        if kept:
            self._remember(self._handed, [r["span_id"] for r in records])
        return kept

    def close(self, timeout: float = 5.0) -> None:
        """Export what is pending (within ``timeout`` seconds) and stop."""
        self.tracing.flush(timeout)
        self.tracing.close()


@contextlib.contextmanager
def seat_spans(seat: str, origin: TraceContext | None = None) -> Iterator[SeatSpans | None]:
    """A command's seat's spans while the command runs (``None`` without the SDK);
    what is pending is exported when it ends.

    Args:
        seat: the seat's name (the service name unless ``OTEL_SERVICE_NAME`` says).
        origin: the trace context handed to the command, if any.
    """
    spans = SeatSpans.start(seat, origin)
    try:
        yield spans
    finally:
        if spans is not None:
            spans.close()
