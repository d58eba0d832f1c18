"""``porter-mesh a2a --agent W`` as a real process, driven by the A2A SDK's own client.

A scripted worker process is on the mesh; the gateway serves it. The client reads the
card, streams a task to ``input-required`` (the worker asks its requester for review),
approves it and sees it completed with the worker's file as an artifact; sends work back
with a reason; cancels a task while the worker's command runs and sees that command's
process gone; drops a stream and resumes it with ``Last-Event-ID``, also across a
restart of the gateway, missing nothing.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import httpx
import pytest

pytest.importorskip("a2a.client", reason="the A2A SDK is not installed: pip install "
                    "'porter-mesh[a2a]'")

from a2a.client import ClientCallContext, ClientConfig, create_client
from a2a.types.a2a_pb2 import (
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    TaskState,
)

from tests.integration.cli_proc import Running, cli
from tests.integration.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.integration.test_tracing import receiver  # noqa: F401  (a fixture)
from tests.tinyfs import fill, tiny_filesystem

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]

DEADLINE = 60.0
STOPS = (TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_COMPLETED,
         TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED,
         TaskState.TASK_STATE_REJECTED)


class Gateway:
    """``porter-mesh a2a`` as a process; ``url`` once it serves."""

    def __init__(self, mesh: str, data: pathlib.Path, *agents: str,
                 extra: tuple[str, ...] = ()) -> None:
        self.mesh = mesh
        args = ["a2a", "--mesh", mesh, "--data-dir", str(data), *extra]
        for agent in agents:
            args += ["--agent", agent]
        self.proc = Running(*args)
        self.proc.wait_until(lambda: any("serving" in line for line in self.proc.out), 30,
                             "the gateway serves")
        line = next(line for line in self.proc.out if "serving" in line)
        self.url = line.split(" at ")[1].split()[0].rstrip("/")

    def stop(self) -> None:
        self.proc.stop()


@pytest.fixture
def worker(mesh: str, tmp_path: pathlib.Path) -> Iterator[Running]:
    # The worker runs this first on every task it accepts: a long command only while
    # the test's hold file exists (the cancel test makes it).
    pidfile, hold = tmp_path / "work.pid", tmp_path / "hold"
    proc = Running("agent", "worker", "--name", "w1", "--mesh", mesh, "--slots", "8",
                   "--workspace", str(tmp_path / "ws"), "--data-dir", str(tmp_path / "wd"),
                   "--work-command", f"if [ -e {hold} ]; then echo $$ > {pidfile}; "
                   "exec sleep 300; fi")
    try:
        found = cli("peers", "--mesh", mesh, "--json", "--wait", "3")
        assert found.returncode == 0, found.stderr
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def gateway(mesh: str, tmp_path: pathlib.Path, worker: Running) -> Iterator[Gateway]:
    gw = Gateway(mesh, tmp_path / "gw", "w1")
    try:
        yield gw
    finally:
        gw.stop()


def message(text: str, *, task_id: str = "", context_id: str = "") -> SendMessageRequest:
    return SendMessageRequest(message=Message(
        message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)],
        task_id=task_id, context_id=context_id))


@asynccontextmanager
async def client_for(url: str) -> AsyncIterator[object]:
    client = await create_client(url, ClientConfig(streaming=True))
    try:
        yield client
    finally:
        await client.close()


def task_of(event: StreamResponse) -> tuple[str, str]:
    kind = event.WhichOneof("payload")
    inner = getattr(event, kind)
    if kind == "task":
        return inner.id, inner.context_id
    return inner.task_id, inner.context_id


def state_of(event: StreamResponse) -> int | None:
    if event.HasField("status_update"):
        return int(event.status_update.status.state)
    if event.HasField("task"):
        return int(event.task.status.state)
    return None


def seq_of(event: StreamResponse) -> int:
    inner = getattr(event, event.WhichOneof("payload"))
    return int(inner.metadata["porter.seq"])


async def until_stop(stream: AsyncIterator[StreamResponse]) -> list[StreamResponse]:
    """Read a stream until the task ends or waits on the client."""
    seen: list[StreamResponse] = []
    async with asyncio.timeout(DEADLINE):
        async for event in stream:
            seen.append(event)
            if state_of(event) in STOPS:
                break
    return seen


def test_card_names_the_agent_and_localhost(gateway: Gateway) -> None:
    card = httpx.get(gateway.url + "/.well-known/agent-card.json", timeout=10).json()
    assert card["name"] == "w1"
    assert card["capabilities"]["streaming"] is True
    assert "worker" in card["description"]
    urls = [i["url"] for i in card["supportedInterfaces"]]
    assert all(u.startswith("http://localhost:") for u in urls), urls
    assert {i["protocolBinding"] for i in card["supportedInterfaces"]} == {"JSONRPC",
                                                                          "HTTP+JSON"}


def test_stream_review_approve_completed_with_artifacts(gateway: Gateway) -> None:
    async def body() -> None:
        async with client_for(gateway.url) as client:
            first = await until_stop(client.send_message(message("Write a haiku about mesh")))
            task_id, context_id = task_of(first[0])
            assert state_of(first[-1]) == TaskState.TASK_STATE_INPUT_REQUIRED
            assert any(state_of(e) == TaskState.TASK_STATE_WORKING for e in first)
            files = [e.artifact_update.artifact for e in first if e.HasField("artifact_update")]
            brief = f"tasks/{task_id}.md"
            assert any(a.name == brief for a in files), [a.name for a in files]
            seqs = [seq_of(e) for e in first]
            assert seqs == list(range(1, len(seqs) + 1)), seqs
            # Send it back once, then approve.
            again = await until_stop(client.send_message(
                message("Add a title line", task_id=task_id, context_id=context_id)))
            assert state_of(again[-1]) == TaskState.TASK_STATE_INPUT_REQUIRED
            assert any("Revised after review" in e.status_update.status.message.parts[0].text
                       for e in again if e.HasField("status_update")
                       and e.status_update.status.message.parts)
            done = await until_stop(client.send_message(
                message("approve", task_id=task_id, context_id=context_id)))
            assert state_of(done[-1]) == TaskState.TASK_STATE_COMPLETED
            task = await client.get_task(GetTaskRequest(id=task_id, history_length=50))
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
            assert any(a.name == brief for a in task.artifacts)
            assert len(task.history) >= 3
            assert task.metadata["porter.context"] == f"urn:porter:task:{task_id}"

    asyncio.run(body())


def test_blocking_send_returns_working_then_subscribe_follows(gateway: Gateway) -> None:
    async def body() -> None:
        client = await create_client(gateway.url, ClientConfig(streaming=False))
        try:
            sent = [e async for e in client.send_message(message("Write a sonnet"))]
            task = sent[0].task
            assert task.status.state == TaskState.TASK_STATE_WORKING, task.status
            async with client_for(gateway.url) as streaming:
                rest = await until_stop(streaming.subscribe(SubscribeToTaskRequest(id=task.id)))
            # The task as it stands (the worker may have asked for review already), then
            # what follows, numbered without a gap, up to the review request.
            assert rest[0].HasField("task")
            assert state_of(rest[-1]) == TaskState.TASK_STATE_INPUT_REQUIRED
            seqs = [seq_of(e) for e in rest[1:]]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else True
            stored = await client.get_task(GetTaskRequest(id=task.id))
            assert stored.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            assert any(a.name == f"tasks/{task.id}.md" for a in stored.artifacts)
        finally:
            await client.close()

    asyncio.run(body())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_cancel_stops_the_workers_command(gateway: Gateway, tmp_path: pathlib.Path) -> None:
    pidfile = tmp_path / "work.pid"
    (tmp_path / "hold").touch()

    async def body() -> None:
        async with client_for(gateway.url) as client:
            stream = client.send_message(message("Add GET /users endpoint"))
            events: list[StreamResponse] = []
            async with asyncio.timeout(DEADLINE):
                async for event in stream:
                    events.append(event)
                    if state_of(event) == TaskState.TASK_STATE_WORKING:
                        break
            task_id, _ = task_of(events[0])
            async with asyncio.timeout(DEADLINE):
                while not (pidfile.exists() and pidfile.read_text().strip()):
                    await asyncio.sleep(0.05)
            pid = int(pidfile.read_text())
            assert _alive(pid)
            from a2a.types.a2a_pb2 import CancelTaskRequest

            task = await client.cancel_task(CancelTaskRequest(id=task_id))
            assert task.status.state == TaskState.TASK_STATE_CANCELED
            async with asyncio.timeout(DEADLINE):
                while _alive(pid):
                    await asyncio.sleep(0.05)
            again = await client.get_task(GetTaskRequest(id=task_id))
            assert again.status.state == TaskState.TASK_STATE_CANCELED

    asyncio.run(body())


@pytest.mark.parametrize("stop", ["sigterm", "sigkill"])
def test_resume_after_a_dropped_stream_and_a_gateway_restart(
        mesh: str, tmp_path: pathlib.Path, worker: Running, stop: str) -> None:
    data = tmp_path / "gw"
    gw = Gateway(mesh, data, "w1")

    async def first_part() -> tuple[str, str, int]:
        async with client_for(gw.url) as client:
            stream = client.send_message(message("Write a limerick"))
            async for event in stream:  # read one event, then drop the stream
                task_id, context_id = task_of(event)
                return task_id, context_id, seq_of(event)
        raise AssertionError("no event")

    try:
        task_id, context_id, last = asyncio.run(first_part())
        assert last == 1

        async def wait_for_review() -> None:
            async with client_for(gw.url) as client, asyncio.timeout(DEADLINE):
                while (await client.get_task(GetTaskRequest(id=task_id))).status.state != \
                        TaskState.TASK_STATE_INPUT_REQUIRED:
                    await asyncio.sleep(0.1)

        asyncio.run(wait_for_review())
    finally:
        if stop == "sigkill":  # nothing is flushed or closed on the way out
            gw.proc.proc.kill()
            gw.proc.proc.wait(10)
        gw.stop()
    if stop == "sigterm":
        assert gw.proc.proc.returncode == 0, gw.proc.err[-10:]
    gw = Gateway(mesh, data, "w1")
    try:
        async def resume() -> None:
            async with client_for(gw.url) as client:
                resumed = await until_stop(client.subscribe(
                    SubscribeToTaskRequest(id=task_id),
                    context=ClientCallContext(service_parameters={"Last-Event-ID": "1"})))
                seqs = [seq_of(e) for e in resumed]
                assert seqs == list(range(2, len(seqs) + 2)), seqs
                assert state_of(resumed[-1]) == TaskState.TASK_STATE_INPUT_REQUIRED
                assert any(e.HasField("artifact_update") for e in resumed)
                done = await until_stop(client.send_message(
                    message("lgtm", task_id=task_id, context_id=context_id)))
                assert state_of(done[-1]) == TaskState.TASK_STATE_COMPLETED
                assert seq_of(done[-1]) > seqs[-1]

        asyncio.run(resume())
    finally:
        gw.stop()


def test_without_the_sdk_the_command_says_how_to_install(tmp_path: pathlib.Path) -> None:
    blocker = tmp_path / "a2a"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('a2a is blocked here')\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    import sys

    out = subprocess.run([sys.executable, "-m", "porter_mesh.cli.main", "a2a", "--agent", "w"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 2
    assert "pip install 'porter-mesh[a2a]'" in out.stderr





def test_traceparent_is_kept_and_an_empty_message_fails_saying_why(gateway: Gateway) -> None:
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    async def body() -> None:
        async with client_for(gateway.url) as client:
            events = await until_stop(client.send_message(
                message("Write a short note"),
                context=ClientCallContext(service_parameters={"traceparent": trace})))
            task_id, _ = task_of(events[0])
            task = await client.get_task(GetTaskRequest(id=task_id))
            assert task.metadata["porter.traceparent"] == trace
            empty = SendMessageRequest(message=Message(
                message_id=str(uuid.uuid4()), role=Role.ROLE_USER,
                parts=[Part(url="file:///nothing.txt")]))
            failed = await until_stop(client.send_message(empty))
            assert state_of(failed[-1]) == TaskState.TASK_STATE_FAILED
            words = failed[-1].status_update.status.message.parts[0].text
            assert "no text" in words and "send a text part" in words

    asyncio.run(body())


def test_the_callers_trace_context_is_continued_by_every_span_of_the_task(
        receiver: OtlpReceiver, gateway: Gateway) -> None:  # noqa: F811
    caller_trace, caller_span = "a1" * 16, "b2" * 8
    headers = {"traceparent": f"00-{caller_trace}-{caller_span}-01", "tracestate": "caller=1"}

    async def body() -> str:
        async with client_for(gateway.url) as client:
            events = await until_stop(client.send_message(
                message("Write a short note"),
                context=ClientCallContext(service_parameters=headers)))
            assert state_of(events[-1]) == TaskState.TASK_STATE_INPUT_REQUIRED
            task_id, context_id = task_of(events[0])
            task = await client.get_task(GetTaskRequest(id=task_id))
            assert task.metadata["porter.tracestate"] == "caller=1"
            # The approval carries no header: it continues the task's first request's.
            done = await until_stop(client.send_message(
                message("approve", task_id=task_id, context_id=context_id)))
            assert state_of(done[-1]) == TaskState.TASK_STATE_COMPLETED
            return str(task.metadata["porter.context"])

    context = asyncio.run(body())
    # The gateway's Offer is the mesh's root, a child of the caller's span; the worker's
    # work is under it, in the caller's trace, its tracestate carried along.
    def settled(spans: list[ReceivedSpan]) -> bool:
        """The worker's task span and every parent exported (batches come one by one)."""
        ours = [s for s in spans if s.trace_id == caller_trace]
        ids = {s.span_id for s in ours} | {caller_span}
        return (any(s.name == "invoke_agent w1" for s in ours)
                and all(s.parent_id in ids for s in ours))

    assert receiver.wait_for(settled, 30), "the task's spans were not all exported"
    spans = [s for s in receiver.spans if s.trace_id == caller_trace]
    ids = {s.span_id for s in spans}
    # The gateway's sends are the caller's children: the Offer, then the approval.
    offer, approval = sorted((s for s in spans if s.parent_id not in ids),
                             key=lambda s: s.start_ns)
    root = offer
    assert (root.name, root.parent_id) == ("send task:w1", caller_span)
    assert approval.parent_id == caller_span and approval.service == root.service
    assert root.service.startswith("porter-ui-") and root.attributes[
        "porter.trace.continued"] is True
    assert root.attributes["porter.activity.type"] == "Offer"
    worker_spans = [s for s in spans if s.service == "w1"]
    assert {"receive task:w1", "invoke_agent w1", "execute_tool bash"} <= {
        s.name for s in worker_spans}
    assert all(s.trace_state == "caller=1" for s in spans), {s.trace_state for s in spans}
    assert {s.trace_id for s in receiver.spans} == {caller_trace}
    # porter-mesh trace draws the same tree from the rings, the caller's span named.
    drawn = cli("trace", context, "--mesh", gateway.mesh, "--wait", "2")
    assert drawn.returncode == 0, drawn.stdout + drawn.stderr
    assert f"note: the trace continues a caller's span outside the mesh ({caller_span})" \
        in drawn.stdout


def test_a_token_guards_every_call_but_the_card(mesh: str, tmp_path: pathlib.Path,
                                                worker: Running) -> None:
    gw = Gateway(mesh, tmp_path / "gw", "w1", extra=("--token", "s3cret-token"))
    try:
        card = httpx.get(gw.url + "/.well-known/agent-card.json", timeout=10).json()
        assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == \
            "bearer"
        call = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
        refused = httpx.post(gw.url + "/", json=call, timeout=10,
                             headers={"A2A-Version": "1.0"})
        assert refused.status_code == 401
        assert "Authorization: Bearer" in refused.json()["error"]
        allowed = httpx.post(gw.url + "/", json=call, timeout=10, headers={
            "A2A-Version": "1.0", "Authorization": "Bearer s3cret-token"})
        assert allowed.status_code == 200 and allowed.json()["error"]["code"] == -32001
    finally:
        gw.stop()


def test_several_agents_each_at_its_path_listed_by_the_root_card(
        mesh: str, tmp_path: pathlib.Path, worker: Running) -> None:
    gw = Gateway(mesh, tmp_path / "gw", "w1", "w2")
    root = gw.url.split("/agents/")[0]
    try:
        directory = httpx.get(root + "/.well-known/agent-card.json", timeout=10).json()
        listed = {s["id"]: s["description"] for s in directory["skills"]}
        assert set(listed) == {"w1", "w2"}
        assert f"{root}/agents/w2/.well-known/agent-card.json" in listed["w2"]
        w1 = httpx.get(root + "/agents/w1/.well-known/agent-card.json", timeout=10).json()
        assert w1["name"] == "w1"
        assert w1["supportedInterfaces"][0]["url"] == f"{root}/agents/w1/"

        async def body() -> None:
            async with client_for(root + "/agents/w1") as client:
                events = await until_stop(client.send_message(message("Write a list")))
                assert state_of(events[-1]) == TaskState.TASK_STATE_INPUT_REQUIRED

        asyncio.run(body())
    finally:
        gw.stop()


@pytest.fixture
def small_disk(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A 4 MiB tmpfs of the test's own (root only)."""
    with tiny_filesystem(tmp_path / "small", size="4m") as disk:
        yield disk


def test_a_full_disk_is_a_clear_error_and_the_gateway_serves_on(
        mesh: str, small_disk: pathlib.Path, worker: Running) -> None:
    gw = Gateway(mesh, small_disk / "gw", "w1")
    try:
        async def body() -> None:
            async with client_for(gw.url) as client:
                before = await until_stop(client.send_message(message("Write a rhyme")))
                assert state_of(before[-1]) == TaskState.TASK_STATE_INPUT_REQUIRED
                kept, _ = task_of(before[0])
                filler = fill(small_disk)
                with pytest.raises(Exception) as refused:
                    await until_stop(client.send_message(message("Write another rhyme")))
                assert "free some space" in str(refused.value), refused.value
                # Still serving: what it kept is there, and with room again it works.
                task = await client.get_task(GetTaskRequest(id=kept))
                assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
                filler.unlink()
                after = await until_stop(client.send_message(message("Write a third")))
                assert state_of(after[-1]) == TaskState.TASK_STATE_INPUT_REQUIRED

        asyncio.run(body())
        assert gw.proc.proc.poll() is None
        # The gateway's own log says it once (the SDK logs what it caught its own way);
        # its stderr is read by a thread, so the line is waited for.
        gw.proc.wait_until(lambda: any("porter_mesh.a2a" in line and "free some space" in line
                                       for line in gw.proc.err), 30, "the full-disk log line")
        ours = [line for line in gw.proc.err if "porter_mesh.a2a" in line]
        assert sum("free some space" in line for line in ours) == 1, ours
    finally:
        gw.stop()
