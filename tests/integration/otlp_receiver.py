"""An OTLP/HTTP receiver for tests, traces and metrics: the real wire format, decoded with
the official ``opentelemetry-proto`` messages."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass
class ReceivedSpan:
    """One span as an exporter sent it."""

    service: str
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    kind: int
    start_ns: int
    end_ns: int
    status_code: int
    attributes: dict[str, Any] = field(default_factory=dict)
    trace_state: str = ""


@dataclass
class ReceivedPoint:
    """One data point of a metric as an exporter sent it (a sum's or a gauge's)."""

    service: str
    name: str
    unit: str
    kind: str  # "sum" or "gauge"
    value: float
    attributes: dict[str, Any] = field(default_factory=dict)
    monotonic: bool = False


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class OtlpReceiver:
    """Listens on 127.0.0.1 (an OS-picked port); ``endpoint`` is the base URL for
    ``OTEL_EXPORTER_OTLP_ENDPOINT``. Use as a context manager."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.points: list[ReceivedPoint] = []
        self.requests = 0
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    receiver._take(ExportTraceServiceRequest.FromString(body))
                    answer = ExportTraceServiceResponse().SerializeToString()
                elif self.path == "/v1/metrics":
                    receiver._take_metrics(ExportMetricsServiceRequest.FromString(body))
                    answer = ExportMetricsServiceResponse().SerializeToString()
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="otlp-receiver")

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _take(self, request: ExportTraceServiceRequest) -> None:
        got = []
        for rs in request.resource_spans:
            attrs = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(ReceivedSpan(
                        service=str(attrs.get("service.name", "")),
                        trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                        parent_id=s.parent_span_id.hex() or None, name=s.name,
                        kind=s.kind, start_ns=s.start_time_unix_nano,
                        end_ns=s.end_time_unix_nano, status_code=s.status.code,
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        trace_state=s.trace_state))
        with self._changed:
            self.spans += got
            self.requests += 1
            self._changed.notify_all()

    def _take_metrics(self, request: ExportMetricsServiceRequest) -> None:
        got = []
        for rm in request.resource_metrics:
            attrs = {a.key: _value(a.value) for a in rm.resource.attributes}
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    kind = metric.WhichOneof("data")
                    if kind not in ("sum", "gauge"):
                        continue
                    data = getattr(metric, kind)
                    for point in data.data_points:
                        number = point.WhichOneof("value")
                        got.append(ReceivedPoint(
                            service=str(attrs.get("service.name", "")), name=metric.name,
                            unit=metric.unit, kind=kind,
                            value=float(getattr(point, number)) if number else 0.0,
                            attributes={a.key: _value(a.value) for a in point.attributes},
                            monotonic=bool(kind == "sum" and data.is_monotonic)))
        with self._changed:
            self.points += got
            self.requests += 1
            self._changed.notify_all()

    def wait_for_points(self, predicate: Any, timeout: float) -> bool:
        """Wait until ``predicate(points)`` holds or ``timeout`` passes."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(list(self.points)), timeout)

    def wait_for(self, predicate: Any, timeout: float) -> bool:
        """Wait until ``predicate(spans)`` holds or ``timeout`` passes."""
        with self._changed:
            return self._changed.wait_for(lambda: predicate(list(self.spans)), timeout)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
