"""Cost of tracing per message: the spans an agent makes around one send.

Run from the repository root::

    .venv/bin/python -m bench.bench_tracing [--count N]

Measures, per traced message, :meth:`TaskTracer.sending` + :meth:`TaskTracer.sent`
(one ``send`` span, its W3C context for the envelope) and the encoding of the traced
envelope, in three set-ups: no SDK configured (the API's no-op), the SDK with the span
ring only (``porter-mesh trace``, no collector), and the ring plus the OTLP/HTTP
exporter in its batch processor, exporting to a receiver on 127.0.0.1 (the tests'
OTLP receiver). The untraced envelope encoding is printed beside them for scale.
"""

from __future__ import annotations

import argparse
import os
import time

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from porter_mesh.core.as2 import Activity
from porter_mesh.core.constants import PROTOCOL_VERSION
from porter_mesh.core.envelope import Envelope, encode_envelope, make_msg_id
from porter_mesh.core.tracecontext import TraceContext
from porter_mesh.tracing.export import RingProcessor
from porter_mesh.tracing.ring import SpanRing
from porter_mesh.tracing.tasks import TaskTracer

TASK = "urn:porter:task:bench"


def _per_message(traces: TaskTracer, count: int) -> float:
    """Microseconds per traced send (span + context + envelope)."""
    activity = Activity.from_dict({"type": "Invoke", "actor": "w", "summary": "ran",
                                   "context": TASK})
    offer = Activity.from_dict({"type": "Offer", "actor": "a", "summary": "x",
                                "context": TASK})
    # A traced offer: without an SDK the API's spans pass its context on unchanged.
    traces.received("task:w", "a", offer, TraceContext(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"))
    started = time.perf_counter()
    for seq in range(1, count + 1):
        trace, span = traces.sending("log", activity)
        assert trace is not None
        encode_envelope(Envelope(PROTOCOL_VERSION, make_msg_id(7, "log", seq), "w", "log",
                                 seq, 7, seq, None, None, 1, None, *trace))
        traces.sent("log", activity, span)
    elapsed = time.perf_counter() - started
    traces.close()
    return elapsed / count * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_tracing")
    parser.add_argument("--count", type=int, default=20_000)
    args = parser.parse_args()
    started = time.perf_counter()
    for seq in range(1, args.count + 1):
        encode_envelope(Envelope(PROTOCOL_VERSION, make_msg_id(7, "log", seq), "w", "log",
                                 seq, 7, seq))
    plain = (time.perf_counter() - started) / args.count * 1e6
    print(f"untraced envelope encode            {plain:7.2f} us/message")
    print(f"no SDK (API no-op)                  {_per_message(TaskTracer('w'), args.count):7.2f}"
          " us/message")
    provider = TracerProvider(resource=Resource.create({"service.name": "bench"}))
    provider.add_span_processor(RingProcessor(SpanRing()))
    cost = _per_message(TaskTracer("w", provider.get_tracer("bench")), args.count)
    print(f"SDK, span ring only                 {cost:7.2f} us/message")
    from tests.integration.otlp_receiver import OtlpReceiver

    with OtlpReceiver() as rx:
        provider = TracerProvider(resource=Resource.create({"service.name": "bench"}))
        provider.add_span_processor(RingProcessor(SpanRing()))
        provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=rx.endpoint + "/v1/traces")))
        cost = _per_message(TaskTracer("w", provider.get_tracer("bench")), args.count)
        provider.shutdown()
        print(f"SDK, ring + OTLP/HTTP batch export  {cost:7.2f} us/message "
              f"({len(rx.spans)} spans received)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OTEL_BSP_MAX_QUEUE_SIZE", "65536")
    raise SystemExit(main())
