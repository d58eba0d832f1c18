"""Task cards in a real browser: a task tree cancelled from its card, and a worker's
question answered on its card after the dashboard restarted.

Real processes: ``porter-mesh ui``, scripted workers (one delegates a sub-task to the
next, both run a long command; one asks its requester a question), headless Chromium.
"""

from __future__ import annotations

import itertools
import json
import os
import selectors
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.browser.dashboard import Dashboard, Page, Proc, agent

pytestmark = [pytest.mark.browser, pytest.mark.network, pytest.mark.timeout(240)]

WAIT_MS = 30_000
QUESTION = "Which database should I use?"
_ids = itertools.count()


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as pw_expect

    return pw_expect(locator)


class Team:
    def __init__(self, root: Path) -> None:
        self.name = f"tcb-{os.getpid()}-{next(_ids)}"
        self.root = root
        self.pids = root / "pids"
        fifo = root / "running"
        os.mkfifo(fifo)
        # Opened before the agents start, so the commands' writes never block.
        self.reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
        self.keep = os.open(fifo, os.O_WRONLY)
        long_command = (f"setsid sleep 3013 & echo $! >> {self.pids}; "
                        f"echo $$ >> {self.pids}; echo up > {fifo}; wait")
        self.ui = Dashboard(self.name, root / "ui", log_dir=root / "logs")
        self.agents: list[Proc] = []
        try:  # one that fails to start must not leave the others (and the page) running
            self.agents.append(agent("worker", "lead", self.name, root, "--delegate-to",
                                     "helper", "--work-command", long_command))
            self.agents.append(agent("worker", "helper", self.name, root, "--work-command",
                                     long_command))
            self.agents.append(agent("worker", "asker", self.name, root, "--ask", QUESTION))
        except BaseException:
            self.close()
            raise

    def api(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.ui.base + path, data=data, method=method,
            headers={"Authorization": f"Bearer {self.ui.token}",
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def wait_running(self, n: int, timeout: float = 60) -> list[int]:
        """Block until ``n`` long commands reported running; their pids."""
        got = 0
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.reader, selectors.EVENT_READ)
            while got < n:
                left = deadline - time.monotonic()
                assert left > 0, f"only {got} of {n} commands running within {timeout}s"
                if sel.select(left):
                    got += len(os.read(self.reader, 4096).split())
        return [int(x) for x in self.pids.read_text().split()]

    def close(self) -> None:
        for proc in reversed(self.agents):
            proc.stop()
        self.ui.stop()
        os.close(self.reader)
        os.close(self.keep)


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    t = Team(tmp_path)
    try:
        yield t
    finally:
        t.close()


def _card(page: Any, context: str) -> Any:
    return page.locator(f'[data-testid="task-card"][data-context="{context}"]')


def wait_roster(page: Any, *names: str) -> None:
    for name in names:
        expect(page.locator(f'[data-testid="peer-card"][data-name="{name}"]')
               ).to_have_attribute("data-state", "alive", timeout=WAIT_MS)


def test_cancel_a_task_tree_from_its_card(browser: Any, team: Team) -> None:
    top = "urn:porter:task:btop1"
    p = Page(browser, team.ui.url)
    try:
        page = p.page
        wait_roster(page, "lead", "helper")
        team.api("POST", "/api/send", {"channel": "task:lead", "type": "Offer",
                                       "text": "Prepare the release", "context": top})
        page.on("dialog", lambda dialog: dialog.accept())
        page.get_by_test_id("tab-tasks").click()
        card = _card(page, top)
        expect(card).to_have_attribute("data-state", "working", timeout=WAIT_MS)
        sub = page.locator('[data-testid="task-card"]').filter(has_text="Part of: Prepare")
        expect(sub).to_have_attribute("data-state", "working", timeout=WAIT_MS)
        expect(sub.get_by_test_id("task-parent")).to_contain_text("btop1")
        # Drawn under its parent.
        order = page.locator('[data-testid="task-card"]').evaluate_all(
            "cs => cs.map(c => c.dataset.context)")
        assert order.index(top) + 1 == order.index(sub.get_attribute("data-context")), order
        pids = team.wait_running(2)

        card.get_by_test_id("task-cancel").click()
        expect(card).to_have_attribute("data-state", "cancelled", timeout=WAIT_MS)
        expect(sub).to_have_attribute("data-state", "cancelled", timeout=WAIT_MS)
        expect(card.get_by_test_id("task-cancel")).to_have_count(0)
        _, alive = psutil.wait_procs(
            [psutil.Process(x) for x in pids if psutil.pid_exists(x)], timeout=10)
        assert not [q for q in alive if q.status() != psutil.STATUS_ZOMBIE], alive
    finally:
        p.close()


def test_answer_a_question_on_its_card_after_a_dashboard_restart(browser: Any,
                                                                  team: Team) -> None:
    ctx = "urn:porter:task:bask1"
    p = Page(browser, team.ui.url)
    try:
        page = p.page
        wait_roster(page, "asker")
        team.api("POST", "/api/send", {"channel": "task:asker", "type": "Offer",
                                       "text": "Set up storage", "context": ctx})
        page.get_by_test_id("tab-tasks").click()
        expect(_card(page, ctx)).to_have_attribute("data-state", "input-required",
                                                   timeout=WAIT_MS)
    finally:
        p.close()
    # The dashboard restarts: the card and its question come back from its message log.
    team.ui.stop()
    team.ui = Dashboard(team.name, team.root / "ui", log_dir=team.root / "logs2")
    p = Page(browser, team.ui.url)
    try:
        page = p.page
        page.get_by_test_id("tab-tasks").click()
        card = _card(page, ctx)
        expect(card).to_have_attribute("data-state", "input-required", timeout=WAIT_MS)
        expect(card.get_by_test_id("task-question")).to_have_text(QUESTION)
        card.get_by_test_id("answer-send").click()  # empty: refused on the page
        expect(card.locator(".review-status")).to_contain_text("write an answer first")
        card.get_by_test_id("answer-text").fill("Use Postgres")
        card.get_by_test_id("answer-send").click()
        expect(card).to_have_attribute("data-state", "in-review", timeout=WAIT_MS)
        card.get_by_test_id("review-approve").click()
        expect(card).to_have_attribute("data-state", "completed", timeout=WAIT_MS)
        brief = (team.root / "workspace" / "tasks" / "bask1.md").read_text()
        assert "Use Postgres" in brief, brief
    finally:
        p.close()
