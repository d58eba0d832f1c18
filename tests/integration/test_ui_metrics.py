"""Each agent's own numbers on the dashboard's roster: ``porter-mesh ui`` as a process
asks every agent for its view and puts it on the peer records of ``/api/peers`` and of
the stream's ``peers`` events.

The agents are real processes on one mesh: an LLM worker against the fake
chat-completions endpoint (:mod:`tests.integration.fake_llm`), a scripted worker, and
two bare nodes: one answering the view request as an older porter-mesh does
("unsupported"), one not answering at all. Those two must be asked less often.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest

from tests.integration.fake_llm import Entry, FakeLLM, Status, completion, reply, tool_call
from tests.integration.harness import Event, NodeProcess
from tests.integration.test_ui_api import UI, LineProcess, Stream, cli, get, post, run, until

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]

DEADLINE = 60.0  # for a loaded machine: a deadline, not a wait
#: The LLM worker's model for one task: a 503 (retried), a tool call that fails (an
#: error), an answer.
SCRIPT: Final[tuple[Entry, ...]] = (
    Status(503),
    completion(reply(None, tool_call("read_file", {"path": "missing.txt"})), usage=(2400, 700)),
    completion(reply("There is no such file."), usage=(1000, 112)),
)
#: The metrics the worker reports after that task (``model`` aside).
WORKED: Final = {"brain": "llm", "model_calls": 2, "tokens_in": 3400, "tokens_out": 812,
                 "tool_calls": 1, "errors": 2, "retries": 1}


@pytest.fixture
def mesh() -> str:
    return f"uimetrics{os.getpid()}-{time.monotonic_ns() % 10**9}"


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM(SCRIPT) as server:
        yield server


class Procs:
    """Every process the test starts, stopped in reverse order whatever happens."""

    def __init__(self) -> None:
        self.lines: list[LineProcess] = []
        self.nodes: list[NodeProcess] = []

    def close(self) -> None:
        for node in reversed(self.nodes):
            node.stop()
        for proc in reversed(self.lines):
            proc.stop()


@pytest.fixture
def procs() -> Iterator[Procs]:
    p = Procs()
    try:
        yield p
    finally:
        p.close()


def _by_name(peers: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in peers["peers"]}


def _asks(node: NodeProcess) -> list[float]:
    """When ``node`` was asked for its view (its clock is this machine's monotonic)."""
    node.watch(0.5, lambda e: False, "reading its events")
    return [e["t"] for e in node.events if e["ev"] == "stats-asked"]


def _asked(events: list[Event], n: int) -> bool:
    return sum(e["ev"] == "stats-asked" for e in events) >= n


def test_the_roster_shows_each_agents_loss_queues_and_model_metrics(
        mesh: str, tmp_path: Path, fake: FakeLLM, procs: Procs) -> None:
    ui = UI(mesh, tmp_path / "ui")
    procs.lines.append(ui)
    procs.lines.append(LineProcess(cli(
        "agent", "worker", "--name", "w1", "--mesh", mesh, "--workspace", str(tmp_path / "ws"),
        "--data-dir", str(tmp_path / "w1")), "w1"))
    llm = LineProcess(cli(
        "agent", "worker", "--name", "lw1", "--mesh", mesh, "--workspace",
        str(tmp_path / "lws"), "--data-dir", str(tmp_path / "lw1"), "--brain", "llm",
        "--llm-url", fake.url, "--model", "m-7b", "--idle-timeout", "0",
        "--tools", "read_file,send_message,read_messages",
        "--subscribe", "review"), "lw1")  # not log: others' "online" notes would wake it
    procs.lines.append(llm)
    old = NodeProcess("old", "--stats", "unsupported", mesh=mesh)
    procs.nodes.append(old)
    mute = NodeProcess("mute", "--stats", "mute", mesh=mesh)
    procs.nodes.append(mute)

    async def body(session: aiohttp.ClientSession) -> None:
        async def answered() -> dict[str, dict[str, Any]] | None:
            peers = _by_name(await get(session, ui, "/api/peers"))
            # An agent's knowledge replica joins its view once it has opened, after the
            # node has started: wait for both sections.
            ready = all({"agent", "knowledge"} <= {
                key for key, value in peers.get(n, {}).get("stats", {}).items()
                if value is not None} for n in ("w1", "lw1"))
            return peers if ready and {"old", "mute"} <= peers.keys() else None

        peers = await until(answered, DEADLINE, "w1 and lw1 with stats, old and mute")
        scripted = peers["w1"]["stats"]
        assert scripted["agent"] == {"brain": "scripted"}  # no model metrics
        assert scripted["lost"] == 0 and scripted["dropped"] == 0
        assert set(scripted["queues"]) == {"inbox", "outbox", "subscribers"}
        assert all(isinstance(v, int) for v in scripted["queues"].values()), scripted
        assert isinstance(scripted["knowledge"]["observations"], int), scripted
        assert isinstance(scripted["at"], float)
        idle = peers["lw1"]["stats"]["agent"]
        assert idle["brain"] == "llm" and idle["model"] == "m-7b"
        assert idle["model_calls"] == 0 and idle["tokens_in"] == 0
        assert "stats" not in peers["old"] and "stats" not in peers["mute"]

        async with Stream(session, ui) as stream:
            sent = await post(session, ui, "/api/send", {
                "channel": "task:lw1", "text": "Read missing.txt\nand say what is in it"})
            assert sent["ok"]
            await asyncio.to_thread(fake.wait_for_requests, 3, DEADLINE)

            def worked() -> bool:
                for name, _, data in stream.got:
                    if name == "peers":
                        lw1 = _by_name(data).get("lw1", {})
                        if lw1.get("stats", {}).get("agent", {}).get("model_calls") == 2:
                            return True
                return False

            await stream.wait(worked, DEADLINE, "a peers event with lw1's two model calls")
        metrics = _by_name(await get(session, ui, "/api/peers"))["lw1"]["stats"]["agent"]
        assert metrics == {**WORKED, "model": "m-7b"}

        # The stats are fresh: the scripted worker is asked again and again.
        seen: set[float] = set()

        async def refreshed() -> bool:
            seen.add(_by_name(await get(session, ui, "/api/peers"))["w1"]["stats"]["at"])
            return len(seen) >= 3

        await until(refreshed, DEADLINE, "three answers from w1")

        # A departed agent keeps what it had done when it went.
        assert llm.stop() == 0, llm.stderr

        async def departed() -> dict[str, Any] | None:
            lw1 = _by_name(await get(session, ui, "/api/peers")).get("lw1", {})
            # "left" on its goodbye; "expired" if the goodbye was lost on the way.
            return lw1 if lw1.get("state") in ("left", "expired") and "left_at" in lw1 else None

        gone = await until(departed, DEADLINE, "lw1 departed")
        assert gone["stats"]["agent"]["model_calls"] == 2

    run(body)

    # The silent node is asked again only after a back-off (2 s deadline, then 6 s).
    mute.wait_until(lambda events: _asked(events, 2), DEADLINE, "a second view request")
    quiet = _asks(mute)
    assert quiet[1] - quiet[0] >= 7.5, quiet
    # The older node is asked once a minute.
    asked = _asks(old)
    assert asked and all(t - asked[0] >= 59 for t in asked[1:]), asked
    final = run(lambda session: get(session, ui, "/api/peers"))
    assert "stats" not in _by_name(final)["old"] and "stats" not in _by_name(final)["mute"]
