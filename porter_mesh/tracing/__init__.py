"""Tracing: one trace per task across every agent, OpenTelemetry out, spans kept locally.

* :mod:`.tasks`: the spans an agent opens while it works and the trace context its
  messages carry (``opentelemetry-api`` only, a no-op until configured);
* :mod:`.ring`: the node's bounded ring of recent spans;
* :mod:`.export`: the SDK, the ring processor and the OTLP/HTTP exporter (the
  ``[otel]`` extra).
"""

from porter_mesh.tracing.ring import SpanRecord, SpanRing
from porter_mesh.tracing.tasks import TaskTracer

__all__ = ["SpanRecord", "SpanRing", "TaskTracer"]
