"""The profile's story with the human as reviewer: the architect offers, the worker asks
porter-ui for review, the review is sent back and then approved from the task card, and
the verdicts reach the architect, whose board closes the task and announces it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.dashboard import Dashboard, Page, Proc, agent
from tests.browser.test_dashboard import WAIT_MS, expect, rows, wait_roster

pytestmark = [pytest.mark.browser, pytest.mark.network, pytest.mark.timeout(180)]


@pytest.fixture
def team(tmp_path: Path) -> Iterator[tuple[Dashboard, Callable[[], Proc]]]:
    """porter-ui and worker-1; the architect starts when the test calls for it."""
    mesh = f"uir-{os.getpid()}"
    procs: list[Proc] = []

    def architect() -> Proc:
        proc = agent("architect", "architect", mesh, tmp_path, "--workers", "1",
                     "--reviewer", "porter-ui", "--task-timeout", "150")
        procs.append(proc)
        return proc

    try:
        ui = Dashboard(mesh, tmp_path / "ui", log_dir=tmp_path / "logs")
        procs.append(ui)
        procs.append(agent("worker", "worker-1", mesh, tmp_path, "--reviewer", "porter-ui"))
        yield ui, architect
    finally:
        for proc in reversed(procs):
            proc.stop()


def test_the_humans_verdicts_reach_the_architect(
        browser: Any, team: tuple[Dashboard, Callable[[], Proc]]) -> None:
    ui, start_architect = team
    view = Page(browser, ui.url)
    page = view.page
    try:
        # The board folds a task from its Offer, which porter-ui sees as the worker's copy
        # of a direct message: the story starts once porter-ui watches the worker (a
        # dashboard that joins later shows the tasks offered from then on).
        wait_roster(page, "worker-1")
        architect = start_architect()
        card = page.locator('[data-testid="task-card"]').filter(has_text="Add GET /users endpoint")
        expect(card).to_have_attribute("data-state", "in-review", timeout=WAIT_MS)
        expect(card.locator(".review")).to_contain_text("worker-1 asks you to review")
        card.get_by_test_id("review-reason").fill("Validate ?limit= and add a test")
        card.get_by_test_id("review-reject").click()
        architect.wait_line(lambda s: "in-review -> changes-requested" in s, 60,
                            "the architect's board taking the human's Reject")
        # The worker fixes it (validation and a test that runs) and asks again.
        again = rows(page, type="Offer").filter(has_text="Added pagination validation and tests")
        expect(again).to_have_count(1, timeout=WAIT_MS)
        expect(card).to_have_attribute("data-state", "in-review", timeout=WAIT_MS)
        card.get_by_test_id("review-approve").click()
        expect(card).to_have_attribute("data-state", "completed", timeout=WAIT_MS)
        architect.wait_line(lambda s: "in-review -> done" in s, 60,
                            "the architect's board taking the human's Accept")
        # The architect recalls what the team learned and announces the task done.
        announce = rows(page, type="Announce").filter(has_text="Task done: Add GET /users")
        expect(announce).to_have_count(1, timeout=WAIT_MS)
        assert architect.wait(60) == 0, architect.output[-3000:]
    finally:
        view.close()
