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

:func:`start_metrics` sends the agent's service metrics through an OTLP/HTTP metrics
exporter to the same endpoint.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from opentelemetry.trace import Tracer

from porter_mesh.tracing.ring import SpanRecord, SpanRing
from porter_mesh.tracing.tasks import INSTRUMENTATION

__all__ = ["MetricsExport", "Tracing", "span_record", "start_metrics", "start_tracing"]

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


class MetricsExport:
    """One process's service metrics going out over OTLP/HTTP (see :func:`start_metrics`)."""

    def __init__(self, provider: Any) -> None:
        self._provider = provider

    def flush(self, timeout: float = 5.0) -> bool:
        """Collect and export now (returns False when the exporter did not finish)."""
        return bool(self._provider.force_flush(int(timeout * 1000)))

    def close(self) -> None:
        """Export a last time and stop."""
        self._provider.shutdown()


def _metric_kinds(snapshot: Callable[[], Mapping[str, Any]], field: str,
                  scale: float = 1.0) -> Callable[[Any], Iterable[Any]]:
    """An observable instrument's callback: ``field`` of each kind of work."""
    from opentelemetry.metrics import Observation

    def observe(options: Any) -> Iterable[Any]:
        kinds = snapshot().get("kinds") or {}
        return [Observation(float(entry.get(field, 0)) * scale if scale != 1.0
                            else int(entry.get(field, 0)), {"porter.work": str(kind)})
                for kind, entry in sorted(kinds.items()) if isinstance(entry, Mapping)]

    return observe


def start_metrics(agent: str, snapshot: Callable[[], Mapping[str, Any]], *,
                  settings: Mapping[str, Any] | None = None) -> MetricsExport | None:
    """Send an agent's service metrics (:class:`~.metrics.ServiceMetrics`) over OTLP/HTTP.

    The same numbers as ``stats`` and the dashboard's ``/metrics``, read from
    ``snapshot`` at each export (every ``OTEL_METRIC_EXPORT_INTERVAL`` milliseconds, 60 s
    by default), as observable instruments of the meter ``porter_mesh``, each with the
    attribute ``porter.work`` (``task``, ``tool <name>``, ``chat``):

    * ``porter_mesh.requests`` and ``porter_mesh.errors``: counters, work done and failed;
    * ``porter_mesh.processing.p50`` and ``porter_mesh.processing.p99``: gauges, seconds;
    * ``gen_ai.client.token.usage.total``: counter of model tokens, by
      ``gen_ai.token.type`` (``input``, ``output``).

    Args:
        agent: the agent's name (the default ``service.name``).
        snapshot: returns the metrics as :meth:`~.metrics.ServiceMetrics.snapshot` does.
        settings: a team file's ``[otel]`` table (its ``endpoint`` when no variable says).

    Returns:
        The export, or ``None`` without the SDK, without an endpoint
        (``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``),
        with ``OTEL_METRICS_EXPORTER=none`` or ``OTEL_SDK_DISABLED=true``.
    """
    if not HAVE_SDK or _truthy(os.environ.get("OTEL_SDK_DISABLED")):
        return None
    if "otlp" not in os.environ.get("OTEL_METRICS_EXPORTER", "otlp").lower():
        return None
    variable = (os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
                or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    endpoint = variable or (settings or {}).get("endpoint")
    if not endpoint:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.metrics import CallbackOptions, Observation
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    except ImportError:
        _log.warning("an OTLP endpoint is set but the metrics exporter is missing; "
                     "pip install 'porter-mesh[otel]'")
        return None
    kwargs: dict[str, Any] = {}
    if not variable:
        kwargs["endpoint"] = str(endpoint).rstrip("/") + "/v1/metrics"
    # The reader takes its interval from OTEL_METRIC_EXPORT_INTERVAL when none is given.
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(**kwargs))
    service = os.environ.get("OTEL_SERVICE_NAME") or agent
    provider = MeterProvider(resource=Resource.create({SERVICE_NAME: service}),
                             metric_readers=[reader])
    meter = provider.get_meter(INSTRUMENTATION)
    meter.create_observable_counter(
        "porter_mesh.requests", [_metric_kinds(snapshot, "count")], unit="{request}",
        description="Work an agent finished, by kind (task, tool <name>, chat)")
    meter.create_observable_counter(
        "porter_mesh.errors", [_metric_kinds(snapshot, "errors")], unit="{request}",
        description="Work that failed, by kind")
    for quantile in ("p50", "p99"):
        meter.create_observable_gauge(
            f"porter_mesh.processing.{quantile}",
            [_metric_kinds(snapshot, f"{quantile}_ms", scale=0.001)], unit="s",
            description=f"Processing time, {quantile} over the recent samples, by kind")

    def tokens(options: CallbackOptions) -> Iterable[Observation]:
        taken = snapshot()
        return [Observation(int(taken.get(f"tokens_{way}", 0)), {"gen_ai.token.type": kind})
                for way, kind in (("in", "input"), ("out", "output"))]

    meter.create_observable_counter(
        "gen_ai.client.token.usage.total", [tokens], unit="{token}",
        description="Model tokens an agent used, input (prompt) and output")
    return MetricsExport(provider)
