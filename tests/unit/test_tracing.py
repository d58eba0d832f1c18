"""The tracing parts without sockets: trace context, the span ring, the waterfall, and
the task spans made through the real SDK."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from porter_mesh.core.as2 import Activity
from porter_mesh.core.control import span_record_problem
from porter_mesh.core.tracecontext import (
    TraceContext,
    format_traceparent,
    parse_traceparent,
    valid_traceparent,
)
from porter_mesh.errors import ConfigError
from porter_mesh.tracing.export import RingProcessor, Tracing
from porter_mesh.tracing.ring import CONTINUED, SpanRing
from porter_mesh.tracing.seat import SeatSpans
from porter_mesh.tracing.tasks import TaskTracer
from porter_mesh.tracing.waterfall import build_waterfall, render_waterfall, waterfall_json

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
TASK = "urn:porter:task:t1"


def test_traceparent_parse_and_format_round_trip() -> None:
    assert format_traceparent(*parse_traceparent(TP)) == TP
    ctx = TraceContext(TP)
    assert ctx.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert ctx.span_id == "00f067aa0ba902b7"
    with pytest.raises(ValueError, match="W3C traceparent"):
        parse_traceparent("nonsense")
    assert not valid_traceparent(TP[:-1])
    with pytest.raises(ValueError):
        format_traceparent(0, 1, 1)


def record(span_id: str, parent: str | None, start: int, end: int, **extra: Any
           ) -> dict[str, Any]:
    return {"trace_id": "ab" * 16, "span_id": span_id, "parent_id": parent,
            "name": f"span {span_id}", "service": extra.pop("service", "a"),
            "start_ns": start, "end_ns": end, "status": "unset", "status_message": "",
            "attributes": extra}


def test_the_ring_is_bounded_by_count_and_bytes() -> None:
    ring = SpanRing(max_spans=3, max_bytes=10_000)
    for i in range(5):
        ring.add(record(f"{i:016x}", None, i, i + 1))
    assert len(ring) == 3 and ring.dropped == 2
    assert [r["span_id"][-1] for r in ring.find(trace_ids=["AB" * 16])] == ["2", "3", "4"]
    small = SpanRing(max_spans=100, max_bytes=700)
    for i in range(10):
        small.add(record(f"{i:016x}", None, i, i + 1))
    assert small.size_bytes <= 700 and 0 < len(small) < 10
    assert small.dropped == 10 - len(small)
    small.add(record("f" * 16, None, 0, 1, blob="x" * 1000))  # bigger than the ring
    assert small.stats()["dropped"] == 11 - len(small)
    with pytest.raises(ConfigError):
        SpanRing(max_spans=0)


def test_the_ring_finds_the_traces_of_a_task() -> None:
    ring = SpanRing()
    ring.add(record("1" * 16, None, 0, 5, **{"porter.task.context": TASK}))
    ring.add(record("2" * 16, "1" * 16, 1, 2))
    other = record("3" * 16, None, 0, 1)
    other["trace_id"] = "cd" * 16
    ring.add(other)
    assert {r["span_id"] for r in ring.find(context=TASK)} == {"1" * 16, "2" * 16}


def test_the_waterfall_marks_the_slowest_path_and_names_what_is_missing() -> None:
    spans = [record("r", None, 0, 100), record("a", "r", 10, 40), record("b", "r", 20, 95),
             record("c", "b", 30, 90), record("d", "b", 31, 35),
             record("x", "gone", 50, 60, service="lost")]
    waterfall = build_waterfall(spans + spans[:2], ["agent z: no answer"])
    names = [(r.depth, r.name.split()[1], r.slowest, r.orphan) for r in waterfall.rows]
    assert names == [(0, "r", True, False), (1, "a", False, False), (1, "b", True, False),
                     (2, "c", True, False), (2, "d", False, False), (0, "x", False, True)]
    assert waterfall.missing == ["gone"] and not waterfall.complete
    text = render_waterfall(waterfall)
    assert "? lost" in text and "missing: 1 parent span(s)" in text
    assert "note: agent z: no answer" in text
    assert build_waterfall(spans[:5]).complete
    assert "no spans found" in render_waterfall(build_waterfall([]))


def test_a_chain_of_spans_deeper_than_the_stack_is_drawn() -> None:
    # One reply may hold thousands of small records; a peer that chains them must not
    # make the waterfall blow the interpreter's stack.
    depth = 3 * sys.getrecursionlimit()
    spans = [record(f"s{i}", f"s{i - 1}" if i else None, i, 2 * depth - i)
             for i in range(depth)]
    waterfall = build_waterfall(spans)
    assert [r.depth for r in waterfall.rows] == list(range(depth))
    assert all(r.slowest for r in waterfall.rows) and waterfall.complete


def tracer_and_spans() -> tuple[TaskTracer, InMemorySpanExporter, SpanRing]:
    exporter = InMemorySpanExporter()
    ring = SpanRing()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.add_span_processor(RingProcessor(ring))
    return TaskTracer("w1", provider.get_tracer("test")), exporter, ring


def offer(attempt: int) -> Activity:
    return Activity.from_dict({"type": "Offer", "actor": "arch", "summary": "do it",
                               "context": TASK, "attempt": attempt})


def test_an_offer_opens_the_task_span_and_a_reoffer_opens_another_in_the_same_trace() -> None:
    traces, exporter, ring = tracer_and_spans()
    traces.received("task:w1", "arch", offer(1), TraceContext(TP), msg_id="m1")
    with traces.tool_call("bash", TASK, {"command": "ls"}):
        sent_trace, span = traces.sending("log", Activity.from_dict(
            {"type": "Invoke", "actor": "w1", "summary": "ran", "context": TASK}))
        traces.sent("log", Activity.from_dict(
            {"type": "Invoke", "actor": "w1", "summary": "ran", "context": TASK}), span)
    traces.received("task:w1", "arch", offer(2), TraceContext(TP))
    with traces.tool_call("read_messages", TASK):  # the inbox poll makes no span
        pass
    closing = Activity.from_dict({"type": "Announce", "actor": "w1", "summary": "done",
                                  "context": TASK})
    _, span = traces.sending("log", closing)
    traces.sent("log", closing, span)
    traces.close()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    invokes = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent w1"]
    assert len(invokes) == 2
    assert all(f"{s.context.trace_id:032x}" == TraceContext(TP).trace_id for s in invokes)
    assert all(s.parent is not None and f"{s.parent.span_id:016x}" == "00f067aa0ba902b7"
               for s in invokes)
    assert invokes[0].attributes is not None
    assert invokes[0].attributes["porter.task.superseded"] is True
    assert [s.attributes["porter.task.attempt"] for s in invokes if s.attributes] == [1, 2]
    tool = spans["execute_tool bash"]
    assert tool.parent is not None and tool.parent.span_id == invokes[0].context.span_id
    assert sent_trace is not None
    sends = [s for s in exporter.get_finished_spans() if s.name == "send log"]
    assert sends[0].parent is not None and sends[0].parent.span_id == tool.context.span_id
    assert sent_trace.span_id == f"{sends[0].context.span_id:016x}"
    assert "execute_tool read_messages" not in spans
    assert len(ring) == len(exporter.get_finished_spans())


def test_a_withdrawal_ends_the_task_span_as_cancelled_and_untraced_work_makes_none() -> None:
    traces, exporter, _ = tracer_and_spans()
    note = Activity.from_dict({"type": "Note", "actor": "w1", "summary": "hi"})
    assert traces.sending("log", note) == (None, None)
    traces.received("log", "x", Activity.from_dict(
        {"type": "Announce", "actor": "x", "summary": "s", "context": TASK}), None)
    assert exporter.get_finished_spans() == ()
    traces.received("task:w1", "arch", offer(1), None)  # an untraced offer: a new trace
    traces.received("task:w1", "arch", Activity.from_dict(
        {"type": "Delete", "actor": "arch", "summary": "withdrawn", "context": TASK,
         "object": TASK}), TraceContext(TP))
    (invoke,) = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent w1"]
    assert invoke.parent is None
    assert invoke.status.description is not None
    assert invoke.status.description.startswith("cancelled: withdrawn by arch")


def test_a_subtask_stays_in_its_parents_trace() -> None:
    traces, exporter, _ = tracer_and_spans()
    traces.received("task:w1", "arch", offer(1), TraceContext(TP))
    sub = Activity.from_dict({"type": "Offer", "actor": "w1", "summary": "part",
                              "context": "urn:porter:task:sub1"})
    with traces.tool_call("send_message", TASK):
        trace_context, span = traces.sending("task", sub)
        traces.sent("task", sub, span)
    traces.close()
    assert trace_context is not None and trace_context.trace_id == TraceContext(TP).trace_id
    (sub_span,) = [s for s in exporter.get_finished_spans()
                   if s.attributes and s.attributes.get("porter.task.context")
                   == "urn:porter:task:sub1" and s.name == "invoke_agent w1"]
    tool = next(s for s in exporter.get_finished_spans() if s.name == "execute_tool send_message")
    assert sub_span.parent is not None and sub_span.parent.span_id == tool.context.span_id


def test_a_team_files_otel_table_becomes_the_agents_variables(tmp_path: Any) -> None:
    from agents.team import TeamError, otel_env, parse_team

    base = '[mesh]\nname = "m"\n[[agents]]\nname = "a"\nrole = "architect"\n'
    team = parse_team(base + '[otel]\nendpoint = "http://127.0.0.1:4318"\n'
                      'sampler = "parentbased_traceidratio"\nsampler_arg = 0.5\n',
                      path=tmp_path / "t.toml")
    assert otel_env(team, {}) == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"}
    # The environment's own OTEL_* wins over the file.
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in otel_env(
        team, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://elsewhere:4318"})
    assert otel_env(parse_team(base, path=tmp_path / "t.toml"), {}) == {}
    for bad, says in (('endpoint = "127.0.0.1:4318"', "http:// or https:// URL"),
                      ('sampler = "sometimes"', "sampler"), ("endpont = 'x'", "endpoint")):
        with pytest.raises(TeamError) as info:
            parse_team(base + "[otel]\n" + bad + "\n", path=tmp_path / "t.toml")
        assert "otel." in str(info.value) and says in str(info.value), str(info.value)


def test_an_mcp_requests_meta_gives_its_trace_context() -> None:
    from porter_mesh.gateways.mcp.server import _trace_of_meta

    assert _trace_of_meta({"traceparent": TP, "tracestate": "a=1", "progressToken": 3}) == \
        TraceContext(TP, "a=1")
    assert _trace_of_meta({"traceparent": TP, "tracestate": 5}) == TraceContext(TP)
    for meta in (None, {}, {"traceparent": "00-zz"}, {"traceparent": 7}):
        assert _trace_of_meta(meta) is None


def test_service_metrics_count_time_and_percentiles() -> None:
    from porter_mesh.tracing.metrics import SAMPLES, ServiceMetrics

    metrics = ServiceMetrics()
    for ms in range(1, 101):
        metrics.observe("tool bash", ms / 1000, error=ms % 10 == 0)
    metrics.add_tokens(12, 5)
    snap = metrics.snapshot()
    bash = snap["kinds"]["tool bash"]
    assert (bash["count"], bash["errors"]) == (100, 10)
    assert (bash["avg_ms"], bash["p50_ms"], bash["p99_ms"]) == (50.5, 50.0, 99.0)
    assert (snap["tokens_in"], snap["tokens_out"]) == (12, 5)
    for _ in range(SAMPLES):
        metrics.observe("tool bash", 1.0)
    assert metrics.snapshot()["kinds"]["tool bash"]["p50_ms"] == 1000.0  # recent samples


def test_the_task_tracer_feeds_the_service_metrics() -> None:
    traces, _, _ = tracer_and_spans()
    traces.received("task:w1", "arch", offer(1), TraceContext(TP))
    with traces.tool_call("bash", TASK):
        pass
    with pytest.raises(RuntimeError), traces.tool_call("write_file", None):
        raise RuntimeError("disk")
    with traces.tool_call("read_messages", TASK):
        pass
    with traces.model_call("m", TASK) as span:
        traces.model_usage(span, response_model=None, input_tokens=3, output_tokens=4,
                           finish_reason="stop")
    traces.cancelled(TASK, "withdrawn")
    kinds = traces.metrics.snapshot()["kinds"]
    assert {k: (v["count"], v["errors"]) for k, v in kinds.items()} == {
        "chat": (1, 0), "task": (1, 1), "tool bash": (1, 0), "tool write_file": (1, 1)}
    assert traces.metrics.snapshot()["tokens_in"] == 3


def test_prometheus_text_of_the_service_metrics() -> None:
    from porter_mesh.tracing.metrics import prometheus_text

    text = prometheus_text({
        'w"1': {"kinds": {"task": {"count": 2, "errors": 1, "avg_ms": 1500.0,
                                   "p50_ms": 1000.0, "p99_ms": 2000.0}},
                "tokens_in": 5, "tokens_out": 7},
        "broken": {"kinds": 3}})
    assert 'porter_mesh_requests_total{agent="w\\"1",kind="task"} 2' in text
    assert 'porter_mesh_errors_total{agent="w\\"1",kind="task"} 1' in text
    assert 'porter_mesh_processing_seconds{agent="w\\"1",kind="task",quantile="0.99"} 2.000000' \
        in text
    assert 'porter_mesh_processing_seconds_sum{agent="w\\"1",kind="task"} 3.000000' in text
    assert 'porter_mesh_model_tokens_total{agent="w\\"1",direction="out"} 7' in text
    assert "broken" not in text and text.endswith("\n")


def test_a_peers_reported_service_metrics_are_checked() -> None:
    from porter_mesh.tracing.metrics import MAX_KINDS, service_record

    good = {"count": 1, "errors": 0, "avg_ms": 1.5, "p50_ms": 1.0, "p99_ms": 2.0}
    got = service_record({"kinds": {"task": good, "bad": {**good, "count": "x"},
                                    "neg": {**good, "errors": -1}, "b": {**good, "p50_ms": True},
                                    5: good, "x" * 81: good},
                          "tokens_in": 3, "tokens_out": "many"})
    assert got == {"kinds": {"task": good}, "tokens_in": 3, "tokens_out": 0}
    many = service_record({"kinds": {f"k{i}": good for i in range(MAX_KINDS + 10)}})
    assert many is not None and len(many["kinds"]) == MAX_KINDS
    for bad in (None, [], {"kinds": []}, "text"):
        assert service_record(bad) is None


def test_the_ring_gives_open_spans_as_running_and_forgets_them_once_ended() -> None:
    provider = TracerProvider()
    ring = SpanRing()
    provider.add_span_processor(RingProcessor(ring))
    tracer = provider.get_tracer("test")
    task = tracer.start_span("invoke_agent w1", attributes={"porter.task.context": TASK})
    with tracer.start_as_current_span("execute_tool bash",
                                      context=trace_api.set_span_in_context(task)):
        pass
    found = ring.find(context=TASK)
    assert [(r["name"], r.get("open", False)) for r in found] == [
        ("execute_tool bash", False), ("invoke_agent w1", True)]
    assert found[1]["end_ns"] >= found[1]["start_ns"] > 0
    assert ring.stats()["open"] == 1
    waterfall = build_waterfall(found)
    assert waterfall.complete and waterfall.rows[0].status == "running"
    task.end()
    assert [r.get("open", False) for r in ring.find(context=TASK)] == [False, False]
    assert ring.stats()["open"] == 0


def test_a_span_that_continues_a_callers_trace_is_a_root_not_an_orphan() -> None:
    spans = [record("r", "caller", 0, 10, **{CONTINUED: True}), record("a", "r", 1, 5)]
    waterfall = build_waterfall(spans)
    assert waterfall.complete and not waterfall.missing
    assert not waterfall.rows[0].orphan
    assert waterfall.notes == ["the trace continues a caller's span outside the mesh (caller)"]
    text = render_waterfall(waterfall)
    assert "note: the trace continues" in text and "missing" not in text
    orphan = build_waterfall([record("r", "caller", 0, 10)])
    assert orphan.missing == ["caller"] and orphan.rows[0].orphan


def test_a_seats_spans_are_the_root_and_only_an_offer_starts_a_trace() -> None:
    ring = SpanRing()
    provider = TracerProvider()
    provider.add_span_processor(RingProcessor(ring))
    seat = SeatSpans(Tracing(provider, ring, "porter-ui-1", exporting=False))
    offer = Activity.from_dict({"type": "Offer", "actor": "porter-ui-1", "summary": "x",
                                "context": TASK, "target": "w1"})
    note = Activity.from_dict({"type": "Note", "actor": "porter-ui-1", "summary": "x"})
    assert seat.sending("log", note) == (None, None)
    seat.begin_request("w1", offer)
    carried, span = seat.sending("task:w1", offer)
    assert carried is not None and span is not None
    seat.sent(span, "no agent 'w1'")
    seat.end_request()
    records = seat.records()
    assert [(r["name"], r["kind"]) for r in records] == [("send task:w1", "producer"),
                                                         ("request w1", "client")]
    send, request = records
    assert send["parent_id"] == request["span_id"] and request["parent_id"] is None
    assert carried.traceparent.split("-")[2] == send["span_id"]
    assert send["status"] == "error" and send["status_message"] == "no agent 'w1'"
    assert all(span_record_problem(r) is None for r in records)
    # A context handed in is the parent of the root, marked as outside the mesh.
    handed = SeatSpans(Tracing(provider, ring, "porter-ui-2", exporting=False),
                       TraceContext(TP))
    carried, span = handed.sending("task:w1", offer)
    handed.sent(span)
    (root,) = handed.records()
    assert (root["trace_id"], root["parent_id"]) == (TraceContext(TP).trace_id,
                                                    TraceContext(TP).span_id)
    assert root["attributes"][CONTINUED] is True
    # With a trace handed in, any message continues it.
    carried, span = handed.sending("log", note)
    assert carried is not None and carried.trace_id == TraceContext(TP).trace_id


def test_a_long_lived_seat_remembers_only_the_traces_its_ring_can_hold() -> None:
    # The dashboard and the A2A gateway are seats that run for weeks: what a seat keeps
    # about its traces must stay within its ring's bound, however many it starts.
    ring = SpanRing(max_spans=8)
    provider = TracerProvider()
    provider.add_span_processor(RingProcessor(ring))
    seat = SeatSpans(Tracing(provider, ring, "porter-ui", exporting=False))
    for i in range(100):
        offer = Activity.from_dict({"type": "Offer", "actor": "porter-ui", "summary": "x",
                                    "context": f"urn:porter:task:long{i}", "target": "w1"})
        seat.sent(seat.sending("task:w1", offer)[1])
    assert len(seat._trace_ids) <= ring.max_spans  # what it holds about its traces
    # The newest are still found and handed over.
    assert [r["attributes"]["porter.task.context"] for r in seat.records()] == [
        f"urn:porter:task:long{i}" for i in range(92, 100)]


def test_each_request_of_a_caller_may_root_the_trace_and_the_page_gets_the_rows() -> None:
    ms = 1_000_000
    offer = record("r1", "caller", 0, 10 * ms, **{CONTINUED: True})
    answer = record("r2", "caller", 50 * ms, 60 * ms, **{CONTINUED: True})
    spans = [offer, answer, record("a", "r1", 1 * ms, 40 * ms), record("b", "a", 2 * ms, 30 * ms)]
    waterfall = build_waterfall(spans)
    assert waterfall.complete  # two roots, both the caller's children
    assert not build_waterfall([record("x", None, 0, 1), record("y", None, 2, 3)]).complete
    running = record("c", "a", 35 * ms, 45 * ms)
    running["open"] = True
    drawn = waterfall_json(build_waterfall([*spans, running]))
    assert drawn["total_ms"] == 60.0
    by_name = {r["name"]: r for r in drawn["rows"]}
    assert by_name["span c"]["status"] == "running"
    assert (by_name["span c"]["offset_ms"], by_name["span c"]["duration_ms"]) == (35.0, 10.0)
    assert [r["name"] for r in drawn["rows"] if r["slowest"]] == ["span r1", "span a",
                                                                  "span b"]
    assert by_name["span b"]["depth"] == 2 and by_name["span b"]["parent_id"] == "a"
    assert drawn["notes"] == ["the trace continues a caller's span outside the mesh (caller)"]
