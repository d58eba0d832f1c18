"""Turning spans on: the OpenTelemetry SDK, the node's span ring, and OTLP export.

Needs the ``[otel]`` extra (``pip install 'porter-mesh[otel]'``). :func:`start_tracing`
builds a tracer provider for one agent process:

* resource ``service.name``: ``OTEL_SERVICE_NAME``, else the agent's name;
* sampler: the SDK reads ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` (default
  ``parentbased_always_on``, so a sampled request stays sampled across the mesh);
* always a :class:`RingProcessor` into the node's :class:`~.ring.SpanRing` (what
  ``porter-mesh trace`` reads, no collector needed);
* an OTLP/HTTP exporter in a batch processor when an endpoint is set:
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the
  exporter reads them, headers and timeouts included) or ``[otel] endpoint``, unless
  ``OTEL_TRACES_EXPORTER=none`` or ``OTEL_SDK_DISABLED=true``.

Without the SDK, :func:`start_tracing` returns ``None`` and the API stays a no-op: trace
context still travels through the agent unchanged.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from opentelemetry.trace import Tracer

from porter_mesh.tracing.ring import SpanRecord, SpanRing
from porter_mesh.tracing.tasks import INSTRUMENTATION

__all__ = ["Tracing", "span_record", "start_tracing"]

_log = logging.getLogger("porter_mesh.tracing")

try:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
except ImportError:  # the [otel] extra is not installed
    HAVE_SDK = False
else:
    HAVE_SDK = True

_STATUS = {0: "unset", 1: "ok", 2: "error"}
_KIND = {0: "internal", 1: "server", 2: "client", 3: "producer", 4: "consumer"}


def span_record(span: Any) -> SpanRecord:
    """A finished SDK span as a ring record (JSON-able).

    Args:
        span: an ``opentelemetry.sdk.trace.ReadableSpan``.

    Returns:
        The record.
    """
    ctx = span.context
    parent = span.parent
    status = span.status
    resource = span.resource.attributes if span.resource is not None else {}
    return {
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_id": None if parent is None else f"{parent.span_id:016x}",
        "remote_parent": bool(parent is not None and parent.is_remote),
        "name": span.name,
        "kind": _KIND.get(int(span.kind.value), str(span.kind)),
        "service": str(resource.get("service.name", "")),
        "start_ns": int(span.start_time or 0),
        "end_ns": int(span.end_time or 0),
        "status": _STATUS.get(int(status.status_code.value), "unset"),
        "status_message": status.description or "",
        "attributes": {k: (list(v) if isinstance(v, tuple) else v)
                       for k, v in (span.attributes or {}).items()},
    }


if HAVE_SDK:

    class RingProcessor(SpanProcessor):
        """Keeps every finished span in a :class:`SpanRing`, and tells it of the open
        ones."""

        def __init__(self, ring: SpanRing) -> None:
            self.ring = ring

        def on_start(self, span: Any, parent_context: Any = None) -> None:
            self.ring.started(f"{span.context.span_id:016x}", lambda: span_record(span))

        def on_end(self, span: ReadableSpan) -> None:
            self.ring.add(span_record(span))


class Tracing:
    """One process's tracing: its provider, tracer and ring.

    Attributes:
        tracer: the tracer spans are made with.
        ring: the recent spans.
        service: the service name.
        exporting: whether an OTLP exporter is attached.
    """

    def __init__(self, provider: Any, ring: SpanRing, service: str, exporting: bool) -> None:
        self._provider = provider
        self.tracer: Tracer = provider.get_tracer(INSTRUMENTATION)
        self.ring = ring
        self.service = service
        self.exporting = exporting

    def flush(self, timeout: float = 5.0) -> bool:
        """Export what is pending (returns False when the exporter did not finish)."""
        return bool(self._provider.force_flush(int(timeout * 1000)))

    def close(self) -> None:
        """Flush and stop the exporter."""
        self._provider.shutdown()


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def start_tracing(agent: str, *, settings: Mapping[str, Any] | None = None,
                  ring: SpanRing | None = None,
                  export_timeout: float | None = None) -> Tracing | None:
    """Set up spans for one agent process.

    Args:
        agent: the agent name (the default service name).
        settings: a team file's ``[otel]`` table; its ``endpoint`` is used when no
            ``OTEL_*`` variable names one (agents get the table as variables instead,
            see :func:`agents.team.otel_env`).
        ring: the ring to fill (a new one by default).
        export_timeout: seconds an export may take, when no ``OTEL_EXPORTER_OTLP_*TIMEOUT``
            variable says (a short-lived command's seat must not wait the default 10 s
            for a backend that is down before it exits).

    Returns:
        The tracing, or ``None`` when the SDK is not installed or
        ``OTEL_SDK_DISABLED`` is set (the API then stays a no-op).
    """
    if not HAVE_SDK or _truthy(os.environ.get("OTEL_SDK_DISABLED")):
        return None
    settings = settings or {}
    service = os.environ.get("OTEL_SERVICE_NAME") or agent
    if ring is None:
        ring = SpanRing()
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    provider.add_span_processor(RingProcessor(ring))
    exporting = False
    exporter_names = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").lower()
    endpoint = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or settings.get("endpoint"))
    if endpoint and "otlp" in exporter_names:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            _log.warning("an OTLP endpoint is set but the exporter is missing; "
                         "pip install 'porter-mesh[otel]'")
        else:
            kwargs: dict[str, Any] = {}
            if not (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                    or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
                kwargs["endpoint"] = str(endpoint).rstrip("/") + "/v1/traces"
            if export_timeout is not None and not (
                    os.environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
                    or os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT")):
                kwargs["timeout"] = export_timeout
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(**kwargs)))
            exporting = True
    return Tracing(provider, ring, service, exporting)
