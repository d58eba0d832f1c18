"""The LLM brain against a scripted OpenAI-compatible endpoint, over real nodes.

Each network test runs two nodes on loopback joined by a static seed: ``boss`` (the
peer that writes to the agent and watches what it does) and ``w1`` (the agent whose
brain is under test). The model is :class:`~tests.integration.fake_llm.FakeLLM`, a real
HTTP server on 127.0.0.1. The brain runs on a thread that each test joins with a
deadline; nothing waits on a sleep.
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest

from agents.context import AgentContext, TappedPort
from agents.llm import (
    EXIT_DONE,
    EXIT_MODEL_FAILED,
    EXIT_STEP_LIMIT,
    ROLE_PROMPTS,
    LLMBrain,
    chat_completions_url,
    openai_tools,
    trim_conversation,
)
from porter_mesh.cli.cmd_send import build_activity
from porter_mesh.core import as2
from porter_mesh.errors import ConfigError, OperationTimeout
from porter_mesh.node.node import Message
from porter_mesh.node.port import NodePort
from porter_mesh.node.sync import SyncNode
from porter_mesh.tools import MESSAGING_SECTION, Toolbox
from porter_mesh.tools.messaging import render_item
from porter_mesh.tools.port import InboxItem
from porter_mesh.tools.schemas import TOOL_SPECS, check_arguments, strict_schema, to_openai
from tests.integration.cli_proc import Running, cli
from tests.integration.fake_llm import (
    Drop,
    FakeLLM,
    Hang,
    Hold,
    Raw,
    Received,
    Status,
    completion,
    reply,
    tool_call,
)

pytestmark = pytest.mark.timeout(90)
TASK = "urn:porter:task:llm1"


# -- fixtures and helpers ------------------------------------------------------------------


@dataclass
class Team:
    boss: SyncNode
    agent: SyncNode
    workspace: Path


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    mesh = f"llm{os.getpid()}-{time.monotonic_ns()}"
    boss = SyncNode(name="boss", role="architect", mesh=mesh, discovery=False)
    try:
        agent = SyncNode(name="w1", role="worker", mesh=mesh, discovery=False,
                         seeds=(f"127.0.0.1:{boss.node.router_port}",))
    except BaseException:
        boss.close()
        raise
    try:
        boss.wait_for_peers(["w1"], 10)
        agent.wait_for_peers(["boss"], 10)
        workspace = tmp_path / "ws"
        workspace.mkdir()
        yield Team(boss, agent, workspace)
    finally:
        agent.close()
        boss.close()


def context(team: Team, role: str = "worker", **options: Any) -> AgentContext:
    """The agent ``w1`` as its brain sees it, built as the agent runtime builds it."""
    port = TappedPort(NodePort(team.agent))
    box = Toolbox(port, None if role == "architect" else team.workspace, role=role)
    return AgentContext("w1", role, box, port, threading.Event(), options)


def offer_task(team: Team, text: str = "Write hello.txt") -> None:
    """``boss`` hands ``w1`` a task (acknowledged: it waits in w1's inbox on return)."""
    team.boss.send_to_channel("task:w1", as2.offer("boss", text, "Say hello in it.",
                                                   target="w1", context=TASK))


def run_brain(brain: LLMBrain, ctx: AgentContext, timeout: float = 30.0) -> tuple[int, float]:
    """Run the brain on a thread; its exit status and how long it took."""
    result: list[int] = []
    start = time.monotonic()
    thread = threading.Thread(target=lambda: result.append(brain.run(ctx)), name="brain")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        ctx.stop.set()
        thread.join(10)
        raise AssertionError(f"the brain did not finish within {timeout}s")
    assert result, "the brain raised (see the captured output)"
    return result[0], time.monotonic() - start


def brain(fake: FakeLLM, **settings: Any) -> LLMBrain:
    defaults: dict[str, Any] = {"idle_timeout": 0.5, "retry_backoff": 0.01,
                                "request_timeout": 10.0}
    return LLMBrain(url=fake.url, model="fake-model", **{**defaults, **settings})


def tool_results(request: Received) -> dict[str, str]:
    """The ``tool`` messages of a request, by call id."""
    return {m["tool_call_id"]: m["content"] for m in request.body["messages"]
            if m["role"] == "tool"}


def collect(node: SyncNode, wanted: dict[str, Callable[[Message], bool]],
            timeout: float = 10.0) -> dict[str, Message]:
    """The first message ``node`` receives matching each predicate, by name."""
    deadline = time.monotonic() + timeout
    found: dict[str, Message] = {}
    while len(found) < len(wanted):
        left = deadline - time.monotonic()
        if left <= 0:
            missing = sorted(set(wanted) - set(found))
            raise AssertionError(f"no message arrived for {missing} within {timeout}s")
        try:
            msg = node.receive(left)
        except OperationTimeout:
            continue
        for name, pred in wanted.items():
            if name not in found and pred(msg):
                found[name] = msg
    return found


# -- the tool-calling loop -----------------------------------------------------------------


@pytest.mark.network
def test_scripted_tool_calls_act_on_the_mesh(team: Team,
                                             capfd: pytest.CaptureFixture[str]) -> None:
    script = [
        reply(None, tool_call("write_file", {"path": "hello.txt", "content": "hello\n"}, "c1")),
        reply("Writing done, telling boss.",
              tool_call("send_message", {"channel": "task:boss", "message": "hello.txt is "
                                         "written", "type": "Announce"}, "c2")),
        reply("Task finished."),
    ]
    with FakeLLM(script) as fake:
        offer_task(team)
        ctx = context(team)
        status, _elapsed = run_brain(brain(fake), ctx)
        requests = fake.wait_for_requests(3, 5)

    assert status == EXIT_DONE
    assert (team.workspace / "hello.txt").read_text() == "hello\n"
    seen = collect(team.boss, {
        "create": lambda m: m.channel == "log" and m.activity.type == "Create",
        "note": lambda m: m.channel == "task:boss" and m.sender == "w1"})
    create, note = seen["create"], seen["note"]
    assert create.sender == "w1"
    assert create.activity.to_dict()["object"] == {"type": "Document", "url": "hello.txt"}
    assert create.activity.context == TASK  # the offer made the task current
    assert note.activity.type == "Announce" and note.activity.summary == "hello.txt is written"

    first = requests[0].body["messages"]
    assert first[-1]["role"] == "user" and first[-1]["content"].startswith("New messages:\n")
    assert "Write hello.txt" in first[-1]["content"]
    assert tool_results(requests[1]) == {"c1": "Created hello.txt (6 bytes)."}
    assert tool_results(requests[2])["c2"].startswith("Sent Announce on task:boss")
    assert ctx.toolbox.context == TASK
    assert ctx.port.last_items == []  # the structured copies do not pile up
    out = capfd.readouterr().err
    assert "tool write_file(path=hello.txt, content=hello) -> Created hello.txt" in out
    assert "model: Task finished." in out


@pytest.mark.network
def test_request_carries_tools_and_system_prompt(team: Team) -> None:
    with FakeLLM([reply("ok")]) as fake:
        offer_task(team)
        ctx = context(team)
        status, _ = run_brain(brain(fake, api_key="sk-test-key"), ctx)
        (request,) = fake.wait_for_requests(1, 5)
    assert status == EXIT_DONE
    assert request.path == "/v1/chat/completions"
    assert request.headers["Authorization"] == "Bearer sk-test-key"
    body = request.body
    assert body["model"] == "fake-model" and body["tool_choice"] == "auto"
    assert body["max_tokens"] == 4096 and "temperature" not in body
    assert body["tools"] == openai_tools(ctx.toolbox.specs())
    assert {t["function"]["name"] for t in body["tools"]} >= {"send_message", "write_file"}
    # Strict mode: every property required, the optional ones nullable, nothing extra.
    for tool in body["tools"]:
        function = tool["function"]
        params = function["parameters"]
        assert function["strict"] is True, function["name"]
        assert params["required"] == list(params["properties"]), function["name"]
        assert params["additionalProperties"] is False
        assert "minLength" not in str(params) and "maximum" not in str(params)
    send = next(t["function"]["parameters"] for t in body["tools"]
                if t["function"]["name"] == "send_message")
    assert send["properties"]["channel"]["type"] == "string"
    assert send["properties"]["type"]["type"] == ["string", "null"]
    assert send["properties"]["type"]["enum"][-1] is None
    assert send["properties"]["tag"] == {
        "type": ["array", "null"], "items": {"type": "string"},
        "description": "Optional labels: priority, language, framework."}
    system = body["messages"][0]
    assert system["role"] == "system"
    assert system["content"].startswith(ROLE_PROMPTS["worker"])
    assert MESSAGING_SECTION in system["content"]
    assert "You are w1 (worker)." in system["content"]
    assert "- boss: architect, alive" in system["content"]


@pytest.mark.network
def test_malformed_tool_calls_are_answered_and_the_loop_goes_on(
        team: Team, capfd: pytest.CaptureFixture[str]) -> None:
    script = [
        reply(None,
              tool_call("write_file", '{"path": "a.txt", "content": ', "bad-json"),
              tool_call("fly", {"to": "the moon"}, "no-such-tool"),
              tool_call("write_file", {"path": "a.txt"}, "missing-arg"),
              tool_call("write_file", "[1, 2]", "not-object"),
              tool_call("read_file", {"path": "../../etc/passwd"}, "escape")),
        # Object arguments and no id, as some servers send them: accepted and normalised.
        reply(None, {"type": "function",
                     "function": {"name": "write_file",
                                  "arguments": {"path": "a.txt", "content": "fixed"}}}),
        reply("Fixed it."),
    ]
    with FakeLLM(script) as fake:
        offer_task(team)
        ctx = context(team)
        b = brain(fake)
        status, _ = run_brain(b, ctx)
        requests = fake.wait_for_requests(3, 5)

    assert status == EXIT_DONE
    assert (team.workspace / "a.txt").read_text() == "fixed"
    errors = tool_results(requests[1])
    assert set(errors) == {"bad-json", "no-such-tool", "missing-arg", "not-object", "escape"}
    assert errors["bad-json"].startswith("error: the arguments of this write_file call are "
                                         "not valid JSON")
    assert "unknown tool 'fly'; your tools are: send_message" in errors["no-such-tool"]
    assert "missing required argument(s) content" in errors["missing-arg"]
    assert "must be a JSON object" in errors["not-object"]
    assert "outside the workspace" in errors["escape"]
    # The call without an id got one, and the request carries it back consistently.
    assistant = requests[2].body["messages"][-2]
    (call,) = assistant["tool_calls"]
    assert call["id"] and call["function"]["arguments"] == (
        '{"path":"a.txt","content":"fixed"}')
    assert tool_results(requests[2])[call["id"]] == "Created a.txt (5 bytes)."
    assert b.stats["malformed_calls"] == 2 and b.stats["tool_errors"] == 3
    assert b.stats["tool_calls"] == 6 and b.stats["model_calls"] == 3
    assert "tool fly(to=the moon) failed: unknown tool 'fly'" in capfd.readouterr().err


@pytest.mark.network
def test_architect_starts_from_its_goal(team: Team) -> None:
    script = [
        reply(None, tool_call("send_message", {"channel": "task:boss", "message": "Plan ready",
                                               "type": "Offer"}, "o1")),
        reply("Offered."),
    ]
    with FakeLLM(script) as fake:
        ctx = context(team, role="architect", goal="Build a greeting service")
        status, _ = run_brain(brain(fake), ctx)
        requests = fake.wait_for_requests(2, 5)
    assert status == EXIT_DONE
    assert requests[0].body["messages"][1] == {
        "role": "user", "content": "Your goal:\nBuild a greeting service"}
    assert ROLE_PROMPTS["architect"] in requests[0].body["messages"][0]["content"]
    offer = collect(team.boss, {"offer": lambda m: m.channel == "task:boss"})["offer"]
    assert offer.activity.type == "Offer" and offer.activity.context is not None


@pytest.mark.network
def test_an_answer_cut_at_max_tokens_runs_no_call_and_the_model_hears_why(
        team: Team, capfd: pytest.CaptureFixture[str]) -> None:
    cut = reply("Writing the file", tool_call("write_file", '{"path": "cut.txt", "cont', "c1"))
    # Strict mode sends every optional argument, as null: it counts as left out.
    nulls = tool_call("send_message", {"channel": "log", "message": "short now",
                                       "type": None, "context": None, "tag": None}, "c2")
    script = [completion(cut, "length"), reply(None, nulls), reply("Done.")]
    with FakeLLM(script) as fake:
        offer_task(team)
        b = brain(fake, max_tokens=64, temperature=0.2)
        status, _ = run_brain(b, context(team))
        requests = fake.wait_for_requests(3, 5)
    assert status == EXIT_DONE
    assert not (team.workspace / "cut.txt").exists()
    assert requests[0].body["max_tokens"] == 64 and requests[0].body["temperature"] == 0.2
    second = requests[1].body["messages"]
    assert second[-2] == {"role": "assistant", "content": "Writing the file"}
    assert second[-1]["role"] == "user"
    assert "cut off at the limit of 64 tokens" in second[-1]["content"]
    assert "none of its 1 tool call(s) was run" in second[-1]["content"]
    assert tool_results(requests[2]) == {"c2": f"Sent Announce on log about task {TASK}."}
    assert b.stats["cut_answers"] == 1 and b.stats["tool_calls"] == 1
    assert "cut at max_tokens (64); 1 tool call(s) not run" in capfd.readouterr().err


@pytest.mark.network
def test_two_cut_answers_in_a_row_end_the_turn(team: Team,
                                                capfd: pytest.CaptureFixture[str]) -> None:
    cut = completion(reply("a very long"), "length")
    with FakeLLM([cut, cut]) as fake:
        offer_task(team)
        b = brain(fake, max_tokens=16)
        status, _ = run_brain(b, context(team))
        assert len(fake.requests) == 2
    assert status == EXIT_DONE and b.stats["failed_turns"] == 0
    assert "cut at max_tokens (16) twice in a row; turn ended" in capfd.readouterr().err


@pytest.mark.network
def test_tool_calls_finish_without_calls_is_answered_once(team: Team) -> None:
    lost = completion(reply("calling"), "tool_calls")
    with FakeLLM([lost, lost]) as fake:
        offer_task(team)
        b = brain(fake)
        status, _ = run_brain(b, context(team))
        requests = fake.wait_for_requests(2, 5)
        assert len(fake.requests) == 2  # the second lost call ends the turn
    assert status == EXIT_DONE
    assert "contained no tool call that could be read" in (
        requests[1].body["messages"][-1]["content"])
    assert b.stats["malformed_calls"] == 1


@pytest.mark.network
def test_metrics_count_calls_tokens_tools_errors_and_retries(team: Team) -> None:
    script = [
        Status(503, b"busy"),
        completion(reply(None, tool_call("read_file", {"path": "nope.txt"})), usage=(120, 7)),
        completion(reply("Done."), usage=(150, 3)),
    ]
    with FakeLLM(script) as fake:
        offer_task(team)
        b = brain(fake)
        assert b.metrics()["model_calls"] == 0
        status, _ = run_brain(b, context(team))
    assert status == EXIT_DONE
    metrics = b.metrics()
    assert metrics["brain"] == "llm" and metrics["model"] == "fake-model"
    assert {k: metrics[k] for k in ("model_calls", "tokens_in", "tokens_out", "tool_calls",
                                    "retries", "model_errors", "tool_errors", "errors")} == {
        "model_calls": 2, "tokens_in": 270, "tokens_out": 10, "tool_calls": 1, "retries": 1,
        "model_errors": 1, "tool_errors": 1, "errors": 2}


@pytest.mark.network
def test_a_two_line_message_from_send_reaches_the_model_once(team: Team) -> None:
    text = "Fix the login form\nIt fails on empty passwords."
    sent = cli("send", "task:w1", text, "--mesh", team.agent.node.config.mesh,
               "--no-discovery", "--peer", f"127.0.0.1:{team.agent.node.router_port}")
    assert sent.returncode == 0, sent.stderr
    with FakeLLM([reply("On it.")]) as fake:
        status, _ = run_brain(brain(fake), context(team))
        (request,) = fake.wait_for_requests(1, 5)
    assert status == EXIT_DONE
    seen = request.body["messages"][-1]["content"]
    assert seen.count("Fix the login form") == 1, seen
    assert seen.count("It fails on empty passwords.") == 1, seen
    # The command's seat is one of the human's names (porter-ui-<hex>).
    assert re.search(r"porter-ui-[0-9a-f]+ \(the human user\): Fix the login form -- It "
                     r"fails on empty passwords\.", seen), seen


def test_details_that_only_start_like_the_summary_are_kept() -> None:
    one_line = build_activity("log", "Fixed", "Announce", None)
    assert one_line.object is None
    note = as2.announce("w2", "Fix", "Fixed the bug in login.py")
    line = render_item(InboxItem("log", "w2", note, 0.0))
    assert line.startswith("[log] w2: Fix -- Fixed the bug in login.py (Announce")
    whole = build_activity("log", "Done\nall tests pass", "Announce", None)
    seat = whole.actor
    assert render_item(InboxItem("log", seat, whole, 0.0)).startswith(
        f"[log] {seat} (the human user): Done -- all tests pass (Announce")


# -- endpoint failures ---------------------------------------------------------------------


@pytest.mark.network
def test_transient_failures_are_retried(team: Team, capfd: pytest.CaptureFixture[str]) -> None:
    script = [
        Status(500, b"boom"),
        Status(503, b"busy", {"Retry-After": "0"}),
        Raw(b"<html>gateway</html>"),
        Raw(b'{"object": "chat.completion"}'),
        Drop(),
        reply("Recovered."),
    ]
    with FakeLLM(script) as fake:
        offer_task(team)
        b = brain(fake, max_retries=5)
        status, _ = run_brain(b, context(team))
        requests = fake.wait_for_requests(6, 5)
    assert status == EXIT_DONE
    assert len(requests) == 6 and fake.remaining == 0
    # Every retry sends the same conversation.
    assert all(r.body == requests[0].body for r in requests)
    assert b.stats["retries"] == 5 and b.stats["model_calls"] == 1
    assert b.stats["failed_turns"] == 0
    err = capfd.readouterr().err
    for text in ("HTTP 500", ": boom", "HTTP 503", "is not JSON: <html>gateway</html>",
                 "has no choices[0].message", "RemoteProtocolError", "model: Recovered."):
        assert text in err, text


@pytest.mark.network
def test_a_hanging_endpoint_times_out_and_is_retried(team: Team) -> None:
    with FakeLLM([Hang(20), reply("Back.")]) as fake:
        offer_task(team)
        b = brain(fake, request_timeout=0.5)
        status, elapsed = run_brain(b, context(team))
        fake.wait_for_requests(2, 5)
    assert status == EXIT_DONE and b.stats["retries"] == 1
    assert elapsed < 10


@pytest.mark.network
def test_an_endpoint_that_always_fails_stops_the_brain(
        team: Team, capfd: pytest.CaptureFixture[str]) -> None:
    with FakeLLM(when_done=Status(500, b"model overloaded")) as fake:
        offer_task(team)
        b = brain(fake, max_retries=2, max_failed_turns=2)
        status, elapsed = run_brain(b, context(team), timeout=30)
        requests = fake.requests
    assert status == EXIT_MODEL_FAILED
    assert len(requests) == 3 * 2  # (1 + retries) per turn, two turns
    assert b.stats["failed_turns"] == 2
    err = capfd.readouterr().err
    assert "model endpoint failed 2 turns in a row" in err
    assert "HTTP 500" in err and "model overloaded" in err
    assert elapsed < 20


@pytest.mark.network
def test_a_refused_connection_stops_the_brain(team: Team,
                                              capfd: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a loopback port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    offer_task(team)
    b = LLMBrain(url=f"http://127.0.0.1:{port}/v1", model="m", idle_timeout=0.5,
                 retry_backoff=0.01, max_retries=1, max_failed_turns=2)
    status, _ = run_brain(b, context(team))
    assert status == EXIT_MODEL_FAILED
    assert b.stats["model_errors"] == 4
    assert f"cannot reach http://127.0.0.1:{port}/v1/chat/completions" in capfd.readouterr().err


@pytest.mark.network
@pytest.mark.parametrize("code", [401, 403, 404])
def test_bad_credentials_or_url_stop_at_once(team: Team, code: int,
                                             capfd: pytest.CaptureFixture[str]) -> None:
    with FakeLLM([Status(code, b'{"error": "invalid api key"}')]) as fake:
        offer_task(team)
        b = brain(fake, max_retries=3)
        status, _ = run_brain(b, context(team))
        assert len(fake.requests) == 1
    assert status == EXIT_MODEL_FAILED
    assert b.stats["retries"] == 0
    err = capfd.readouterr().err
    assert f"HTTP {code}" in err and "invalid api key" in err and "check --llm-url" in err


@pytest.mark.network
def test_retry_after_is_honoured(team: Team) -> None:
    with FakeLLM([Status(429, b"slow down", {"Retry-After": "1"}), reply("Done.")]) as fake:
        offer_task(team)
        b = brain(fake, retry_backoff=0.01)
        status, _ = run_brain(b, context(team))
        first, second = fake.wait_for_requests(2, 5)
    assert status == EXIT_DONE and b.stats["retries"] == 1
    # The backoff alone would have waited 0.01 s; the server asked for 1 s.
    assert second.at - first.at >= 0.95


@pytest.mark.network
def test_proxy_settings_from_the_environment_are_ignored(
        team: Team, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as proxy:  # a proxy that would record every connection
        proxy.bind(("127.0.0.1", 0))
        proxy.listen(8)
        proxy.setblocking(False)
        address = f"http://127.0.0.1:{proxy.getsockname()[1]}"
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
            monkeypatch.setenv(name, address)
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        with FakeLLM([reply("Direct.")]) as fake:
            offer_task(team)
            status, _ = run_brain(brain(fake), context(team))
            assert len(fake.requests) == 1
        with pytest.raises(BlockingIOError):
            proxy.accept()
    assert status == EXIT_DONE


@pytest.mark.network
def test_a_redirect_is_not_followed(team: Team, capfd: pytest.CaptureFixture[str]) -> None:
    elsewhere = "http://127.0.0.1:9/v1/chat/completions"
    with FakeLLM([Status(307, b"", {"Location": elsewhere})]) as fake:
        offer_task(team)
        status, _ = run_brain(brain(fake), context(team))
        assert len(fake.requests) == 1
    assert status == EXIT_MODEL_FAILED
    assert f"redirects are not followed; configure the final URL ({elsewhere})" in (
        capfd.readouterr().err)


@pytest.mark.network
def test_a_client_error_fails_the_turn_and_the_next_try_works(
        team: Team, capfd: pytest.CaptureFixture[str]) -> None:
    with FakeLLM([Status(400, b'{"error": "context length exceeded"}'), reply("Fine.")]
                 ) as fake:
        offer_task(team)
        b = brain(fake)
        status, _ = run_brain(b, context(team))
        requests = fake.wait_for_requests(2, 5)
    assert status == EXIT_DONE
    assert b.stats["retries"] == 0 and b.stats["failed_turns"] == 1
    assert requests[0].body["messages"] == requests[1].body["messages"]
    err = capfd.readouterr().err
    assert "turn given up: HTTP 400" in err and "context length exceeded" in err


@pytest.mark.network
def test_the_step_budget_ends_the_run(team: Team) -> None:
    with FakeLLM(when_done=reply(None, tool_call("read_messages", {}))) as fake:
        offer_task(team)
        b = brain(fake, max_steps=3)
        status, _ = run_brain(b, context(team))
        assert len(fake.requests) == 3
    assert status == EXIT_STEP_LIMIT


@pytest.mark.network
def test_stop_ends_a_waiting_brain(team: Team) -> None:
    with FakeLLM([reply("Waiting for more.")]) as fake:
        offer_task(team)
        ctx = context(team)
        b = brain(fake, idle_timeout=None)
        result: list[int] = []
        thread = threading.Thread(target=lambda: result.append(b.run(ctx)), name="brain")
        thread.start()
        try:
            fake.wait_for_requests(1, 10)
        finally:
            ctx.stop.set()
            thread.join(10)
    assert not thread.is_alive() and result == [EXIT_DONE]


@pytest.mark.network
@pytest.mark.parametrize("how", ["withdraw", "halt"])
def test_a_withdrawal_or_halt_abandons_the_call_in_flight(team: Team, how: str) -> None:
    with FakeLLM([Hold()]) as fake:
        offer_task(team)
        ctx = context(team)
        b = brain(fake, request_timeout=60.0, idle_timeout=0.5)
        result: list[int] = []
        thread = threading.Thread(target=lambda: result.append(b.run(ctx)), name="brain")
        thread.start()
        try:
            fake.wait_for_requests(1, 10)
            started = time.monotonic()
            if how == "withdraw":  # as the node's thread does when the Delete arrives
                assert ctx.toolbox.withdraw(TASK, None, sender="boss", reason="re-offered")
            else:
                ctx.toolbox.halt("halted by boss")
            [(_, cut_at)] = fake.wait_for_disconnects(1, 5)
            thread.join(10)
        finally:
            ctx.stop.set()
            thread.join(10)
        requests = list(fake.requests)
    print(f"{how} to the model connection closed: {cut_at - started:.3f}s")
    assert cut_at - started < 2
    # Back to waiting, then idle: nothing more was asked of the model.
    assert result == [EXIT_DONE] and len(requests) == 1
    assert b.stats["abandoned_calls"] == 1 and b.metrics()["errors"] == 0
    assert b.stats["failed_turns"] == 0 and b.stats["retries"] == 0
    note = b.messages[-1]["content"]
    if how == "withdraw":
        assert note.startswith(f"Task {TASK} was stopped (withdrawn: re-offered)")
    else:
        assert note.startswith("This agent was stopped (halted: halted by boss)")


# -- pure parts (no sockets) ---------------------------------------------------------------


@pytest.mark.parametrize(("given", "expected"), [
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1/chat/completions"),
    ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1/chat/completions"),
    ("https://llm.example/openai/v1/chat/completions",
     "https://llm.example/openai/v1/chat/completions"),
    ("http://localhost:11434", "http://localhost:11434/chat/completions"),
    ("https://h/v1?api-version=2", "https://h/v1/chat/completions?api-version=2"),
])
def test_endpoint_urls(given: str, expected: str) -> None:
    assert chat_completions_url(given) == expected


@pytest.mark.parametrize(("url", "message"), [
    ("file:///etc/passwd", "must start with http:// or https://"),
    ("ftp://h/v1", "must start with http:// or https://"),
    ("127.0.0.1:8000/v1", "must start with http:// or https://"),
    ("http:///v1", "has no host"),
    ("http://user:secret@h/v1", "give the key as api_key"),
    ("http://[::1/v1", "cannot be parsed"),
])
def test_bad_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        LLMBrain(url=url, model="m")


@pytest.mark.parametrize("settings", [
    {"model": " "}, {"max_steps": 0}, {"max_retries": -1}, {"request_timeout": 0},
    {"idle_timeout": -1}, {"max_failed_turns": 0}, {"max_context_chars": 10},
])
def test_bad_settings_are_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        LLMBrain(**{"url": "http://127.0.0.1:1/v1", "model": "m", **settings})


def test_strict_schemas_require_everything_and_null_means_left_out() -> None:
    for spec in TOOL_SPECS.values():
        schema = strict_schema(spec.parameters)
        assert schema["required"] == list(spec.parameters["properties"])
        optional = set(schema["properties"]) - set(spec.parameters["required"])
        for name in optional:
            assert "null" in schema["properties"][name]["type"], (spec.name, name)
            # What strict mode lets a model send for an optional argument is accepted.
            args = {k: None for k in optional}
            args.update({k: spec.parameters["properties"][k].get("enum", ["x"])[0]
                         for k in spec.parameters["required"]})
            assert set(check_arguments(spec, args)) == set(spec.parameters["required"])
    bash = strict_schema(TOOL_SPECS["bash"].parameters)
    assert bash is not None
    assert bash["properties"]["timeout"]["type"] == ["number", "null"]
    assert bash["additionalProperties"] is False
    assert strict_schema(TOOL_SPECS["bash"].parameters) is not strict_schema(
        TOOL_SPECS["bash"].parameters)
    assert TOOL_SPECS["bash"].parameters["required"] == ["command"]  # the spec is unchanged
    plain = openai_tools(TOOL_SPECS.values(), strict=False)
    assert plain == to_openai(TOOL_SPECS.values())


@pytest.mark.parametrize("settings", [{"temperature": 2.5}, {"max_tokens": 0}])
def test_bad_sampling_settings_are_refused(settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match=next(iter(settings))):
        LLMBrain(url="http://127.0.0.1:1/v1", model="m", **settings)


def test_trimming_keeps_pinned_messages_and_whole_exchanges() -> None:
    system = {"role": "system", "content": "s" * 100}
    goal = {"role": "user", "content": "goal"}
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "bash", "arguments": "x" * 500}}]}
    result = {"role": "tool", "tool_call_id": "a", "content": "r" * 500}
    newest = {"role": "user", "content": "n" * 200}
    messages = [system, goal, call, result, {"role": "assistant", "content": "t" * 300},
                newest]
    assert trim_conversation(messages, max_chars=10_000, pinned=2) == messages
    text = messages[4]
    # The call goes with its result: never one without the other.
    assert trim_conversation(messages, max_chars=800, pinned=2) == [system, goal, text, newest]
    assert trim_conversation(messages, max_chars=600, pinned=2) == [system, goal, newest]
    for size in range(0, 2000, 50):
        kept = trim_conversation(messages, max_chars=size, pinned=2)
        assert (call in kept) == (result in kept) and kept[:2] == [system, goal]
    # The newest exchange stays even when it alone is over the size.
    assert trim_conversation(messages, max_chars=10, pinned=2) == [system, goal, newest]
    assert trim_conversation(messages[:4], max_chars=10, pinned=2) == messages[:4]


# -- the agent command (real processes) ----------------------------------------------------


def _mesh() -> str:
    return f"llmcli{os.getpid()}-{time.monotonic_ns() % 10**9}"


def _llm_agent(fake: FakeLLM, mesh: str, workspace: Path, *options: str) -> Running:
    return Running("agent", "worker", "--name", "lw1", "--mesh", mesh, "--workspace",
                   str(workspace), "--brain", "llm", "--llm-url", fake.url, *options)


@pytest.mark.network
def test_agent_options_reach_the_model_and_stats_show_the_metrics(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEAM_TEST_KEY", "sk-from-env")
    prompt = tmp_path / "prompt.md"
    prompt.write_text("You are the greeter. Be brief.\n")
    mesh = _mesh()
    script = [
        completion(reply(None, tool_call("read_file", {"path": "missing.txt"})),
                   usage=(100, 10)),
        completion(reply("There is no such file."), usage=(120, 5)),
    ]
    with FakeLLM(script) as fake:
        agent = _llm_agent(fake, mesh, tmp_path / "ws", "--model", "m-7b", "--temperature",
                           "0.3", "--max-tokens", "200", "--max-steps", "5", "--idle-timeout",
                           "0", "--system-prompt-file", str(prompt), "--tools",
                           "read_file,send_message,read_messages", "--api-key-env",
                           "TEAM_TEST_KEY")
        try:
            agent.wait_until(lambda: any("up on mesh" in line for line in agent.err), 30,
                             "the agent up")
            sent = cli("send", "task:lw1", "Read missing.txt\nand say what is in it",
                       "--mesh", mesh, "--wait", "10")
            assert sent.returncode == 0, sent.stderr
            first, _second = fake.wait_for_requests(2, 30)
            deadline = time.monotonic() + 30
            metrics: dict[str, Any] = {}
            while metrics.get("model_calls") != 2:
                assert time.monotonic() < deadline, f"metrics never showed 2 calls: {metrics}"
                stats = cli("stats", "lw1", "--mesh", mesh, "--json", "--wait", "10")
                assert stats.returncode == 0, stats.stderr
                metrics = orjson.loads(stats.stdout)["agent"]
            text = cli("stats", "lw1", "--mesh", mesh, "--wait", "10")
        finally:
            agent.stop()
    assert agent.proc.returncode == 0, agent.err[-10:]
    body = first.body
    assert first.headers["Authorization"] == "Bearer sk-from-env"
    assert body["model"] == "m-7b" and body["temperature"] == 0.3
    assert body["max_tokens"] == 200
    assert body["messages"][0]["content"].startswith("You are the greeter. Be brief.\n")
    assert ROLE_PROMPTS["worker"] not in body["messages"][0]["content"]
    assert [t["function"]["name"] for t in body["tools"]] == [
        "send_message", "read_messages", "read_file"]
    assert {k: metrics[k] for k in ("brain", "model", "model_calls", "tokens_in",
                                    "tokens_out", "tool_calls", "errors", "retries")} == {
        "brain": "llm", "model": "m-7b", "model_calls": 2, "tokens_in": 220, "tokens_out": 15,
        "tool_calls": 1, "errors": 1, "retries": 0}
    assert ("brain      llm, model 'm-7b': 2 model call(s), tokens 220 in / 15 out, "
            "1 tool call(s), 1 error(s), 0 retry(ies), 0 abandoned (task stopped)"
            ) in text.stdout


@pytest.mark.network
def test_agent_max_steps_and_idle_timeout(tmp_path: Path) -> None:
    mesh = _mesh()
    with FakeLLM(when_done=reply(None, tool_call("read_messages", {}))) as fake:
        idle = _llm_agent(fake, mesh, tmp_path / "ws", "--idle-timeout", "0.5")
        try:
            idle.proc.wait(60)
        finally:
            idle.stop()
        assert idle.proc.returncode == EXIT_DONE and not fake.requests
        assert any("no new messages for 0.5s; done" in line for line in idle.err)
        busy = _llm_agent(fake, mesh, tmp_path / "ws", "--max-steps", "2",
                          "--goal", "Keep reading")
        try:
            busy.proc.wait(60)
        finally:
            busy.stop()
    assert busy.proc.returncode == EXIT_STEP_LIMIT, busy.err[-10:]
    assert len(fake.requests) == 2
    assert any("step budget spent (2 model calls)" in line for line in busy.err)


def _said(received: Received, text: str) -> bool:
    return any(text in str(m.get("content")) for m in received.body["messages"])


@pytest.mark.network
def test_a_cancel_abandons_the_model_call_and_no_call_follows_for_the_task(
        tmp_path: Path) -> None:
    mesh = _mesh()
    task = "urn:porter:task:held1"
    # The first answer runs a tool; the model call after it is held open by the server.
    script = [reply(None, tool_call("list_dir", {})), Hold()]
    with FakeLLM(script) as fake:
        agent = _llm_agent(fake, mesh, tmp_path / "ws", "--idle-timeout", "0")
        request = None
        try:
            agent.wait_until(lambda: any("up on mesh" in line for line in agent.err), 30,
                             "the agent up")
            request = Running("request", "task:lw1", "Write hello.txt", "--type", "Offer",
                              "--context", task, "--mesh", mesh, "--timeout", "60",
                              "--wait", "20")
            fake.wait_for_requests(2, 30)
            started = time.monotonic()
            out = cli("cancel", task, "--reason", "not needed", "--mesh", mesh,
                      "--timeout", "20")
            assert out.returncode == 0, (out.stdout, out.stderr)  # the holder confirmed
            [(held, cut_at)] = fake.wait_for_disconnects(1, 10)
            took = cut_at - started
            assert held is fake.requests[1]
            agent.wait_until(lambda: any("model call abandoned: cancelled by" in line
                                         for line in agent.err), 10, "the abandonment")
            # Nothing more for the cancelled task; the next message is the next work.
            sent = cli("send", "task:lw1", "Ping: anything left?", "--mesh", mesh,
                       "--wait", "10")
            assert sent.returncode == 0, sent.stderr
            requests = fake.wait_for_requests(3, 30)
            stats = cli("stats", "lw1", "--mesh", mesh, "--json", "--wait", "10")
            assert stats.returncode == 0, stats.stderr
            metrics = orjson.loads(stats.stdout)["agent"]
        finally:
            if request is not None:
                request.stop()
            agent.stop()
    print(f"cancel to the model connection closed: {took:.2f}s")
    assert took < 5, took
    assert len(requests) == 3 and _said(requests[2], "Ping: anything left?")
    # The conversation says why, so the model does not take the task up again.
    assert _said(requests[2], f"Task {task} was stopped (cancelled by")
    assert _said(requests[2], "Do no more work on it")
    assert metrics["abandoned_calls"] == 1 and metrics["model_calls"] == 3, metrics
    assert metrics["errors"] == 0, metrics
    assert agent.proc.returncode == 0, agent.err[-10:]


@pytest.mark.parametrize(("options", "message"), [
    (["--temperature", "3"], "'3' is not a temperature from 0 to 2"),
    (["--max-steps", "0"], "'0' is not a whole number >= 1"),
    (["--tools", "read_file,fly"], "unknown tool(s) fly; known tools:"),
    (["--subscribe", "control"], "invalid choice: 'control'"),
    (["--system-prompt-file", "/nonexistent/prompt.md"],
     "cannot read --system-prompt-file /nonexistent/prompt.md: No such file"),
    (["--llm-url", "ftp://h/v1"], "must start with http:// or https://"),
])
def test_agent_bad_llm_options_are_one_line_and_status_2(
        tmp_path: Path, options: list[str], message: str) -> None:
    proc = cli("agent", "worker", "--name", "bad1", "--mesh", _mesh(), "--workspace",
               str(tmp_path), "--brain", "llm", "--llm-url", "http://127.0.0.1:9/v1",
               *options)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
