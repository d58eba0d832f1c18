"""One trace per task across real agent processes: the official SDK exports OTLP/HTTP to
a receiver here (decoded with opentelemetry-proto), and ``porter-mesh trace`` draws the
same tree from the agents' rings."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from agents.demo import DEMO_TEAM, run_demo
from tests.integration.cli_proc import Running, cli
from tests.integration.otlp_receiver import OtlpReceiver, ReceivedPoint, ReceivedSpan
from tests.integration.test_llm_brain import team  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Any:
    """An OTLP receiver; every process started here exports to it."""
    with OtlpReceiver() as rx:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rx.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
        monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
        yield rx


def by_name(spans: list[ReceivedSpan], service: str, name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.service == service and s.name == name]


def start_stayed_demo(tmp_path: Path, mesh: str) -> tuple[Running, str]:
    """``porter-mesh demo --stay``: its story told, the team stays; returns the demo and
    the trace id it printed."""
    demo = Running("demo", "--stay", "--out", str(tmp_path / "demo"), "--mesh", mesh,
                   "--timeout", "90")
    demo.wait_until(lambda: any("The story is over" in line for line in demo.out), 120,
                    "the demo's story")
    trace_id = next(line.split()[1] for line in demo.out if line.startswith("trace: "))
    return demo, trace_id


def trace_records(what: str, mesh: str) -> list[dict[str, Any]]:
    """``porter-mesh trace WHAT --json``: the span records (the command must succeed)."""
    got = cli("trace", what, "--mesh", mesh, "--json", "--wait", "2")
    assert got.returncode == 0, got.stderr
    return [orjson.loads(line) for line in got.stdout.splitlines()]


@pytest.mark.slow
def test_the_demo_story_is_one_trace_over_otlp_and_trace_draws_the_same_tree(
        tmp_path: Path, receiver: OtlpReceiver) -> None:
    mesh = f"tr{os.getpid()}"
    demo, trace_id = start_stayed_demo(tmp_path, mesh)
    try:
        records = trace_records(trace_id, mesh)
        shown = {(r["span_id"], r["parent_id"], r["name"], r["service"]) for r in records}
        # Everything the rings hold reaches the exporter (batched every 100 ms).
        assert receiver.wait_for(
            lambda spans: shown <= {(s.span_id, s.parent_id, s.name, s.service)
                                    for s in spans}, 20), "spans not exported"
        text = cli("trace", trace_id, "--mesh", mesh, "--wait", "2")
        assert text.returncode == 0, text.stderr
        # Asked by the task instead: the same trace, the request's root included.
        task = next(r["attributes"]["porter.task.context"] for r in records
                    if r["name"] == "invoke_agent worker-1")
        assert {r["span_id"] for r in trace_records(task.rsplit(":", 1)[-1], mesh)} == {
            r["span_id"] for r in records}
        # The service metrics of the same work, in stats.
        stats = cli("stats", "worker-1", "--mesh", mesh, "--json", "--wait", "2")
        assert stats.returncode == 0, stats.stderr
        service = orjson.loads(stats.stdout)["service"]["kinds"]
        assert service["task"]["count"] == 1 and service["task"]["errors"] == 0
        assert service["tool bash"]["count"] == 2
        assert service["tool bash"]["p99_ms"] >= service["tool bash"]["p50_ms"] > 0
        shown_stats = cli("stats", "worker-1", "--mesh", mesh, "--wait", "2")
        assert "  tool bash" in shown_stats.stdout, shown_stats.stdout
    finally:
        demo.stop()
    assert demo.proc.returncode == 0, demo.out[-20:]
    spans = [s for s in receiver.spans if s.trace_id == trace_id]
    # The whole story is this one trace: every span exported belongs to it ...
    assert {s.trace_id for s in receiver.spans} == {trace_id}
    # ... the same tree as the rings' ...
    assert {(s.span_id, s.parent_id, s.name, s.service) for s in spans} == shown
    ids = {s.span_id for s in spans}
    assert len(ids) == len(spans)
    # ... with one root, the human's request, and no orphan.
    roots = [s for s in spans if s.parent_id is None]
    assert [(r.service, r.name) for r in roots] == [("porter-ui", "request architect")]
    assert all(s.parent_id in ids for s in spans if s.parent_id is not None)
    spans_of = {s.span_id: s for s in spans}

    def parent(s: ReceivedSpan) -> ReceivedSpan:
        assert s.parent_id is not None
        return spans_of[s.parent_id]

    # The architect works for the request and offers the task to worker-1 ...
    (architect,) = by_name(spans, "architect", "invoke_agent architect")
    assert parent(architect) is roots[0]
    (offer,) = [s for s in by_name(spans, "architect", "send task:worker-1")]
    assert parent(offer) is architect and offer.attributes["porter.activity.type"] == "Offer"
    assert offer.attributes["messaging.destination.name"] == "task:worker-1"
    # ... the worker's work is a child of that offer, across processes ...
    (worker,) = by_name(spans, "worker-1", "invoke_agent worker-1")
    assert parent(worker) is offer
    assert worker.attributes["gen_ai.agent.name"] == "worker-1"
    tools = [s for s in spans if s.service == "worker-1" and s.name.startswith("execute_tool")]
    assert {"execute_tool bash", "execute_tool write_file", "execute_tool edit_file"} <= {
        t.name for t in tools}
    assert all(parent(t) is worker for t in tools)
    assert all(t.attributes["gen_ai.tool.name"] == t.name.split()[1] for t in tools)
    # ... each review (changes requested, then approved) is a child of the worker's ask ...
    reviews = by_name(spans, "reviewer", "invoke_agent reviewer")
    assert len(reviews) == 2
    for review in reviews:
        ask = parent(review)
        assert (ask.service, ask.name, parent(ask)) == ("worker-1", "send review", worker)
    verdicts = [s for s in spans if s.service == "reviewer" and s.name == "send review"]
    assert sorted(v.attributes["porter.activity.type"] for v in verdicts) == ["Accept", "Reject"]
    # ... and back: the architect hears the result in the same trace, and closes.
    assert any(s.service == "architect" and s.name == "receive review"
               and parent(s) in verdicts for s in spans)
    assert all(s.end_ns >= s.start_ns > 0 for s in spans)
    # The waterfall: the same spans, the root on the slowest path, nothing missing.
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"trace {trace_id}: {len(spans)} span(s)")
    assert lines[2].startswith("* porter-ui      request architect")
    assert not any(line.startswith(("missing", "note", "?")) for line in lines), lines


@pytest.mark.slow  # a kill -9 and a restart: a long fault run
def test_a_reoffer_after_a_killed_worker_stays_in_the_same_trace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The exporter's endpoint comes from the team file's [otel] table this time.
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                 "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    with OtlpReceiver() as receiver:
        team = tmp_path / "team.toml"
        team.write_text(DEMO_TEAM.read_text() + f'\n[otel]\nendpoint = "{receiver.endpoint}"\n')
        console = io.StringIO()
        status = asyncio.run(run_demo(tmp_path / "demo", timeout=90, stream=console,
                                      team_file=team,
                                      extra={"worker-1": ["--fail-after", "accept"]}))
        assert receiver.wait_for(lambda spans: any(
            s.name == "request architect" for s in spans), 20)
    check_reoffer(status, console, receiver)


def check_reoffer(status: int, console: io.StringIO, receiver: OtlpReceiver) -> None:
    assert status == 0, console.getvalue()[-4000:]
    trace_id = next(line.split()[1] for line in console.getvalue().splitlines()
                    if line.startswith("trace: "))
    spans = [s for s in receiver.spans if s.trace_id == trace_id]
    assert {s.trace_id for s in receiver.spans} == {trace_id}
    (architect,) = by_name(spans, "architect", "invoke_agent architect")
    (root,) = by_name(spans, "porter-ui", "request architect")
    assert architect.parent_id == root.span_id
    offers = [s for s in spans if s.service == "architect" and s.name.startswith("send task:")
              and s.attributes["porter.activity.type"] == "Offer"]
    assert sorted(o.name for o in offers) == ["send task:worker-1", "send task:worker-2"]
    assert all(o.parent_id == architect.span_id for o in offers)
    (second,) = by_name(spans, "worker-2", "invoke_agent worker-2")
    assert second.parent_id == next(o.span_id for o in offers if o.name.endswith("worker-2"))
    assert second.attributes["porter.task.attempt"] == 2
    assert by_name(spans, "reviewer", "invoke_agent reviewer")


@pytest.mark.slow  # a kill -9 and a restart: a long fault run
def test_trace_says_what_is_missing_when_an_agent_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)  # rings only
    mesh = f"tm{os.getpid()}"
    demo, trace_id = start_stayed_demo(tmp_path, mesh)
    try:
        records = trace_records(trace_id, mesh)
        assert {r["service"] for r in records} >= {"porter-ui", "architect", "worker-1",
                                                   "reviewer"}
        os.kill(_pid_of(demo, "worker-1"), signal.SIGKILL)  # its ring is gone with it
        partial = cli("trace", trace_id, "--mesh", mesh, "--wait", "3", "--timeout", "3")
    finally:
        demo.stop()
    assert partial.returncode == 1, partial.stdout
    lines = partial.stdout.splitlines()
    assert not any(" worker-1 " in line[:17] for line in lines[2:] if line[:1] in "*? ")
    # The reviewer's work hung under worker-1's spans: drawn as orphans, the gap named.
    assert any(line.startswith("? reviewer") and "invoke_agent reviewer" in line
               for line in lines), lines
    assert [line for line in lines if line.startswith("missing: ")], lines


def _pid_of(demo: Running, name: str) -> int:
    """The pid of one of the demo's agents (its child process named by --name)."""
    import psutil

    for child in psutil.Process(demo.proc.pid).children(recursive=True):
        cmdline = child.cmdline()
        if "--name" in cmdline and cmdline[cmdline.index("--name") + 1] == name:
            return child.pid
    raise AssertionError(f"no process of {name} under the demo")


def test_the_clis_traceparent_is_continued_by_the_agent(
        tmp_path: Path, receiver: OtlpReceiver) -> None:
    mesh = f"tc{os.getpid()}"
    worker = Running("agent", "worker", "--name", "w1", "--mesh", mesh, "--workspace",
                     str(tmp_path), "--data-dir", str(tmp_path / "data"))
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    try:
        bad = cli("request", "task:w1", "do X", "--mesh", mesh, "--traceparent", "00-xyz")
        assert bad.returncode == 2 and "not a W3C traceparent" in bad.stderr, bad.stderr
        out = cli("request", "task:w1", "do X", "--type", "Offer", "--mesh", mesh,
                  "--timeout", "60", "--wait", "20", "--traceparent", parent,
                  "--tracestate", "vendor=1")
        # request follows the task until it waits on the requester's review: status 1.
        assert out.returncode == 1 and "waiting for your review" in out.stderr, out.stderr
    finally:
        worker.stop()
    assert receiver.wait_for(lambda spans: {"invoke_agent w1", "request w1"} <= {
        s.name for s in spans}, 20)
    (invoke,) = [s for s in receiver.spans if s.name == "invoke_agent w1"]
    assert invoke.trace_id == "0af7651916cd43dd8448eb211c80319c"
    # The command's request is the caller's child (the caller's span is outside the
    # mesh), its send the worker's parent.
    (request,) = [s for s in receiver.spans if s.name == "request w1"]
    assert request.parent_id == "b7ad6b7169203331"
    assert request.attributes["porter.trace.continued"] is True
    (send,) = [s for s in receiver.spans if s.name == "send task:w1"]
    assert (send.parent_id, invoke.parent_id) == (request.span_id, send.span_id)
    assert {s.trace_id for s in receiver.spans} == {invoke.trace_id}
    assert any(s.name == "execute_tool bash" and s.parent_id == invoke.span_id
               for s in receiver.spans)


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
def test_an_mcp_requests_meta_trace_context_is_continued(
        tmp_path: Path, receiver: OtlpReceiver) -> None:
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    mesh = f"tmcp{os.getpid()}"
    command = [sys.executable, "-m", "porter_mesh.cli.main", "mcp", "--name", "m1",
               "--role", "architect", "--mesh", mesh, "--data-dir", str(tmp_path / "d"),
               "--wait", "0"]
    parent = "00-5b8efff798038103d269b633813fc60c-eee19b7ec3c1b174-01"

    async def host_side() -> None:
        # The SDK passes a server only a few safe variables: hand it OTEL_* here.
        params = StdioServerParameters(command=command[0], args=command[1:],
                                       env=dict(os.environ))
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool(
                "send_message", {"channel": "task", "message": "Build the thing",
                                 "type": "Offer"},
                meta={"traceparent": parent, "tracestate": "host=1"})
            assert not result.is_error, result

    anyio.run(host_side)
    assert receiver.wait_for(lambda spans: any(s.name == "send task" for s in spans), 20)
    (invoke,) = [s for s in receiver.spans if s.name == "invoke_agent m1"]
    assert (invoke.trace_id, invoke.parent_id) == ("5b8efff798038103d269b633813fc60c",
                                                   "eee19b7ec3c1b174")
    (send,) = [s for s in receiver.spans if s.name == "send task"]
    assert (send.trace_id, send.parent_id) == (invoke.trace_id, invoke.span_id)
    assert send.attributes["porter.activity.type"] == "Offer"


def test_an_llm_brains_model_calls_are_chat_spans_of_its_task(team: Any) -> None:  # noqa: F811
    """The LLM brain against the fake chat endpoint, on real nodes; spans through the SDK
    into an in-memory exporter."""
    import threading

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agents.context import AgentContext, TappedPort
    from agents.llm import EXIT_DONE
    from porter_mesh.core import as2
    from porter_mesh.core.tracecontext import TraceContext
    from porter_mesh.node.port import NodePort
    from porter_mesh.tools.toolbox import Toolbox
    from porter_mesh.tracing.tasks import TaskTracer
    from tests.integration.fake_llm import FakeLLM, completion, reply, tool_call
    from tests.integration.test_llm_brain import TASK, brain, run_brain

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    traces = TaskTracer("w1", provider.get_tracer("test"))
    parent = TraceContext("00-1f3c4e5d6a7b8c9d0e1f2a3b4c5d6e7f-0123456789abcdef-01")
    script = [
        completion(reply(None, tool_call("write_file", {"path": "a.txt", "content": "a"},
                                         "c1")), usage=(30, 7)),
        reply("Done."),
    ]
    team.boss.send_to_channel("task:w1", as2.offer("boss", "Write a.txt", "Put a in it.",
                                                   target="w1", context=TASK), trace=parent)
    port = TappedPort(NodePort(team.agent, traces=traces))
    box = Toolbox(port, team.workspace, role="worker", traces=traces)
    ctx = AgentContext("w1", "worker", box, port, threading.Event(), {})
    with FakeLLM(script) as fake:
        status, _ = run_brain(brain(fake), ctx)
    assert status == EXIT_DONE
    traces.close()  # the task stays open in this brain: its span ends here
    spans = exporter.get_finished_spans()
    (invoke,) = [s for s in spans if s.name == "invoke_agent w1"]
    assert f"{invoke.context.trace_id:032x}" == parent.trace_id
    chats = [s for s in spans if s.name == "chat fake-model"]
    assert len(chats) == 2
    assert all(s.parent is not None and s.parent.span_id == invoke.context.span_id
               for s in chats)
    first = dict(chats[0].attributes or {})
    assert first["gen_ai.request.model"] == "fake-model"
    assert first["gen_ai.operation.name"] == "chat"
    assert (first["gen_ai.usage.input_tokens"], first["gen_ai.usage.output_tokens"]) == (30, 7)
    assert first["gen_ai.response.finish_reasons"] == ("tool_calls",)
    (tool,) = [s for s in spans if s.name == "execute_tool write_file"]
    assert tool.parent is not None and tool.parent.span_id == invoke.context.span_id
    assert traces.metrics.snapshot()["tokens_in"] >= 30


def test_the_dashboards_metrics_are_prometheus_text_behind_the_token(tmp_path: Path) -> None:
    import aiohttp

    from tests.integration.test_ui_api import UI, LineProcess, run, until
    from tests.integration.test_ui_api import cli as command

    mesh = f"tp{os.getpid()}"
    ui = UI(mesh, tmp_path / "ui")
    worker = LineProcess(command("agent", "worker", "--name", "w1", "--mesh", mesh,
                                 "--workspace", str(tmp_path / "ws"), "--data-dir",
                                 str(tmp_path / "w1")), "w1")
    try:
        done = cli("request", "task:w1", "do X", "--type", "Offer", "--mesh", mesh,
                   "--timeout", "60", "--wait", "20")
        assert done.returncode == 1 and "waiting for your review" in done.stderr, done.stderr

        async def scrape(session: aiohttp.ClientSession) -> tuple[int, str]:
            async with session.get(ui.base + "/metrics") as resp:
                refused = resp.status

            async def task_counted() -> str | None:
                async with session.get(ui.base + "/metrics", headers=ui.auth) as resp:
                    assert resp.status == 200
                    assert resp.headers["Content-Type"].startswith("text/plain")
                    text = await resp.text()
                # The worker ran the task's command (it holds the task itself open).
                return text if 'porter_mesh_requests_total{agent="w1",kind="tool bash"} 1' \
                    in text else None

            return refused, await until(task_counted, 60, "w1's bash call in /metrics")

        refused, text = run(scrape)
    finally:
        worker.stop()
        ui.stop()
    assert refused == 401
    assert "# TYPE porter_mesh_processing_seconds summary" in text
    assert 'porter_mesh_errors_total{agent="w1",kind="tool bash"} 0' in text
    assert 'porter_mesh_processing_seconds_count{agent="w1",kind="tool bash"} 1' in text
    assert 'porter_mesh_model_tokens_total{agent="w1",direction="in"} 0' in text


def _context_of(stderr: str) -> str:
    """The task context ``send``/``request`` printed for a new Offer."""
    return next(line.split()[1] for line in stderr.splitlines() if line.startswith("context "))


def _one_tree(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The one root of span records that leave no span without its parent."""
    ids = {r["span_id"] for r in records}
    roots = [r for r in records if r["parent_id"] is None]
    assert len(roots) == 1, roots
    assert all(r["parent_id"] in ids for r in records if r["parent_id"] is not None)
    assert len({r["trace_id"] for r in records}) == 1
    return roots[0]


def test_a_task_sent_from_the_cli_is_one_trace_rooted_at_the_commands_seat(
        tmp_path: Path, receiver: OtlpReceiver) -> None:
    mesh = f"tcs{os.getpid()}"
    worker = Running("agent", "worker", "--name", "w1", "--mesh", mesh, "--workspace",
                     str(tmp_path / "ws"), "--data-dir", str(tmp_path / "data"),
                     "--slots", "2")
    try:
        # 'send' leaves at once, the task stays open; the seat's span, kept by the worker,
        # is the root all the same.
        worker.wait_until(lambda: any("worker up" in line for line in worker.err), 30,
                          "the worker's start")
        sent = cli("send", "task:w1", "do Y", "--mesh", mesh, "--wait", "20")
        assert sent.returncode == 0, sent.stderr
        first = _context_of(sent.stderr)
        # The worker's accept reaches the seat or not (it may have left): either way the
        # task stays open, waiting on the human.
        worker.wait_until(lambda: any("could not act" in line or "review of " + first in line
                                      for line in worker.err), 30, "the worker's turn")
        drawn = cli("trace", first, "--mesh", mesh, "--wait", "2")
        assert drawn.returncode == 0, drawn.stdout + drawn.stderr
        rows = drawn.stdout.splitlines()[2:]
        assert rows[0].startswith("* porter-ui-") and rows[0][17:].startswith("send task:w1")
        assert [r for r in rows if r[17:18] != " "] == rows[:1], rows  # one root
        assert any("invoke_agent w1" in r and "running" in r for r in rows), rows
        sent_records = trace_records(first, mesh)
        root = _one_tree(sent_records)
        assert (root["name"], root["kind"]) == ("send task:w1", "producer")
        # 'request' stays for the replies until the task waits on the human's review;
        # another command's verdict then closes it: the whole task, one tree.
        asked = cli("request", "task:w1", "do X", "--mesh", mesh, "--wait", "20",
                    "--timeout", "60")
        assert asked.returncode == 1 and "waiting for your review" in asked.stderr
        second = _context_of(asked.stderr)
        verdict = cli("send", "review", "fine", "--type", "Accept", "--context", second,
                      "--mesh", mesh, "--wait", "5")
        assert verdict.returncode == 0, verdict.stderr
        worker.wait_until(lambda: any("Announce on log" in line for line in worker.err), 30,
                          "the worker's result")

        def closed() -> list[dict[str, Any]] | None:
            records = trace_records(second, mesh)
            invoke = [r for r in records if r["name"] == "invoke_agent w1"]
            return records if invoke and not invoke[0].get("open") else None

        records = _wait(closed, 20, "the worker's task span ended")
        root = _one_tree(records)
        assert (root["name"], root["kind"]) == ("request w1", "client")
        assert root["service"].startswith("porter-ui-")
        spans_of = {r["span_id"]: r for r in records}
        (invoke,) = [r for r in records if r["name"] == "invoke_agent w1"]
        send = spans_of[invoke["parent_id"]]
        assert (send["name"], send["parent_id"]) == ("send task:w1", root["span_id"])
        assert {r["name"] for r in records} >= {"execute_tool bash", "send review",
                                                "receive task:w1"}
    finally:
        worker.stop()
    # Over OTLP the same two trees: each span exported once, by the process that made it
    # (the commands their own, the worker its own, its open task ended as it stopped).
    for tree in (sent_records, records):
        trace_id = tree[0]["trace_id"]
        wanted = {r["span_id"] for r in tree}
        assert receiver.wait_for(lambda spans, t=trace_id, w=wanted: w <= {
            s.span_id for s in spans if s.trace_id == t}, 20), "spans not exported"
        spans = [s for s in receiver.spans if s.trace_id == trace_id]
        ids = [s.span_id for s in spans]
        assert len(ids) == len(set(ids))
        roots = [s for s in spans if s.parent_id is None]
        assert [(r.span_id, r.name) for r in roots] == [
            (r["span_id"], r["name"]) for r in tree if r["parent_id"] is None]
        assert all(s.parent_id in ids for s in spans if s.parent_id is not None)


def _wait(probe: Any, timeout: float, what: str) -> Any:
    """``probe()`` once it returns something, polled until ``timeout`` seconds pass."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got is not None:
            return got
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout}s")


def test_a_workers_service_metrics_go_out_as_otlp_metrics(
        tmp_path: Path, receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")  # milliseconds, honoured
    mesh = f"tme{os.getpid()}"
    worker = Running("agent", "worker", "--name", "w1", "--mesh", mesh, "--workspace",
                     str(tmp_path / "ws"), "--data-dir", str(tmp_path / "data"))
    try:
        # Before any work: counters of nothing, the tokens at zero, every 200 ms.
        assert receiver.wait_for_points(lambda points: any(
            p.service == "w1" and p.name == "gen_ai.client.token.usage.total"
            for p in points), 30), "no metrics from w1"
        asked = cli("request", "task:w1", "do X", "--mesh", mesh, "--wait", "20",
                    "--timeout", "60")
        assert asked.returncode == 1 and "waiting for your review" in asked.stderr

        def bash_counted(points: list[ReceivedPoint]) -> bool:
            return any(p.service == "w1" and p.name == "porter_mesh.requests"
                       and p.attributes == {"porter.work": "tool bash"} and p.value == 1
                       for p in points)

        assert receiver.wait_for_points(bash_counted, 30), {
            (p.name, str(p.attributes), p.value) for p in receiver.points}
    finally:
        worker.stop()
    points = [p for p in receiver.points if p.service == "w1"]
    requests = [p for p in points if p.name == "porter_mesh.requests"]
    assert all(p.kind == "sum" and p.monotonic and p.unit == "{request}" for p in requests)
    assert {p.attributes["porter.work"] for p in requests} >= {"tool bash", "tool write_file"}
    assert any(p.name == "porter_mesh.errors" and p.attributes == {"porter.work": "tool bash"}
               and p.value == 0 for p in points)
    p99 = [p for p in points if p.name == "porter_mesh.processing.p99"
           and p.attributes == {"porter.work": "tool bash"}]
    assert p99 and all(p.kind == "gauge" and p.unit == "s" and 0 < p.value < 30 for p in p99)
    assert {p.attributes["gen_ai.token.type"] for p in points
            if p.name == "gen_ai.client.token.usage.total"} == {"input", "output"}
