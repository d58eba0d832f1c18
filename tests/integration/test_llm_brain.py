"""The LLM brain against a scripted OpenAI-compatible endpoint, over real nodes.

Each network test runs two nodes on loopback joined by a static seed: ``boss`` (the
peer that writes to the agent and watches what it does) and ``w1`` (the agent whose
brain is under test). The model is :class:`~tests.integration.fake_llm.FakeLLM`, a real
HTTP server on 127.0.0.1. The brain runs on a thread that each test joins with a
deadline; nothing waits on a sleep.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agents.context import AgentContext, TappedPort
from agents.llm import (
    EXIT_DONE,
    EXIT_MODEL_FAILED,
    EXIT_STEP_LIMIT,
    ROLE_PROMPTS,
    LLMBrain,
    chat_completions_url,
    trim_conversation,
)
from porter_mesh.core import as2
from porter_mesh.errors import ConfigError, OperationTimeout
from porter_mesh.node.node import Message
from porter_mesh.node.port import NodePort
from porter_mesh.node.sync import SyncNode
from porter_mesh.tools import MESSAGING_SECTION, Toolbox
from porter_mesh.tools.schemas import to_openai
from tests.integration.fake_llm import (
    Drop,
    FakeLLM,
    Hang,
    Raw,
    Received,
    Status,
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
    assert body["tools"] == to_openai(ctx.toolbox.specs())
    assert {t["function"]["name"] for t in body["tools"]} >= {"send_message", "write_file"}
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
                 "has no choices[0].message", "RemoteDisconnected", "model: Recovered."):
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
def test_bad_credentials_stop_at_once(team: Team, capfd: pytest.CaptureFixture[str]) -> None:
    with FakeLLM([Status(401, b'{"error": "invalid api key"}')]) as fake:
        offer_task(team)
        b = brain(fake, max_retries=3)
        status, _ = run_brain(b, context(team))
        assert len(fake.requests) == 1
    assert status == EXIT_MODEL_FAILED
    err = capfd.readouterr().err
    assert "HTTP 401" in err and "invalid api key" in err and "check --llm-url" in err


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
