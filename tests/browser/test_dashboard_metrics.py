"""Each agent's own numbers on its roster card, in a real browser: a ``porter-mesh ui``
process, an LLM worker against the fake chat-completions endpoint and a scripted worker.

The LLM worker's card shows its metrics line (model calls, tokens, tool calls, errors,
retries) and follows it live as the worker does a task sent from the compose box; the
scripted worker's card has no line until it drops a message (a malformed knowledge
sync message from a bare node), then ``dropped 1``. The model's name (here markup)
reaches the card only as an attribute value.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.dashboard import Dashboard, Page, Proc, agent, send_offer
from tests.integration.fake_llm import FakeLLM
from tests.integration.harness import NodeProcess
from tests.integration.test_ui_metrics import SCRIPT

pytestmark = [pytest.mark.browser, pytest.mark.network, pytest.mark.timeout(180)]

WAIT_MS = 30_000  # Playwright deadlines (milliseconds) for a loaded machine
MODEL = "m<img src=x onerror=window.__pwned=1>"


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as pw_expect

    return pw_expect(locator)


@pytest.fixture
def fake() -> Iterator[FakeLLM]:
    with FakeLLM(SCRIPT) as server:  # 2 calls, 3400/812 tokens, 1 tool call, 2 errors, 1 retry
        yield server


class Team:
    def __init__(self, ui: Dashboard, probe: NodeProcess) -> None:
        self.ui, self.probe = ui, probe


@pytest.fixture
def team(tmp_path: Path, fake: FakeLLM) -> Iterator[Team]:
    mesh = f"uim-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    procs: list[Proc] = []
    probe: NodeProcess | None = None
    try:
        ui = Dashboard(mesh, tmp_path / "ui", log_dir=tmp_path / "logs")
        procs.append(ui)
        procs.append(agent("worker", "w1", mesh, tmp_path))
        procs.append(agent("worker", "lw1", mesh, tmp_path, "--brain", "llm", "--llm-url",
                           fake.url, "--model", MODEL, "--idle-timeout", "0", "--tools",
                           "read_file,send_message,read_messages", "--subscribe", "review"))
        probe = NodeProcess("probe", "--data-dir", str(tmp_path / "probe"), mesh=mesh)
        yield Team(ui, probe)
    finally:
        if probe is not None:
            probe.stop()
        for proc in reversed(procs):
            proc.stop()


def card(page: Any, name: str) -> Any:
    return page.locator(f'[data-testid="peer-card"][data-name="{name}"]')


def test_the_cards_show_each_agents_metrics_line(browser: Any, team: Team) -> None:
    p = Page(browser, team.ui.url)
    page = p.page
    try:
        llm = card(page, "lw1")
        expect(llm).to_have_attribute("data-state", "alive", timeout=WAIT_MS)
        line = llm.get_by_test_id("peer-stats")
        expect(line).to_have_text(
            "model 0 calls · 0 tok in / 0 out · tools 0 · errors 0 · retries 0", timeout=WAIT_MS)

        send_offer(page, "lw1", "Read missing.txt\nand say what is in it", WAIT_MS)
        # Live, from the stream's peers events: no reload.
        expect(line).to_have_text(
            "model 2 calls · 3.4k tok in / 812 out · tools 1 · errors 2 · retries 1",
            timeout=WAIT_MS)
        expect(line.locator(".bad")).to_have_text(["errors 2"])
        title = line.get_attribute("title") or ""
        assert f"model {MODEL}" in title and "queues: inbox" in title, title
        assert line.locator("img").count() == 0
        assert page.evaluate("window.__pwned") is None

        # The scripted worker has numbers too, but no model metrics and nothing lost:
        # no line, until it drops something.
        scripted = card(page, "w1")
        expect(scripted).to_have_attribute("data-state", "alive", timeout=WAIT_MS)
        page.wait_for_function("""async () => {
            const answer = await (await fetch("/api/peers")).json();
            return answer.peers.some((p) => p.name === "w1" && p.stats && p.stats.agent);
        }""", timeout=WAIT_MS, polling=250)
        expect(scripted.get_by_test_id("peer-stats")).to_have_count(0)
        team.probe.wait_for(lambda e: e["ev"] == "peer" and e["peer"] == "w1"
                            and e["kind"] == "joined", 30, "w1 on the probe's roster")
        team.probe.ask("send-kind", "sent-kind", to="w1", kind="sync", payload="80")
        dropped = scripted.get_by_test_id("peer-stats")
        expect(dropped).to_have_text("dropped 1", timeout=WAIT_MS)
        expect(dropped.locator(".bad")).to_have_text(["dropped 1"])
    finally:
        p.close()
