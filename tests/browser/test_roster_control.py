"""The roster's Drain and Halt buttons in a real browser: drain on a worker's card turns
the card ``draining`` (the worker says so in its heartbeats), and Halt, confirmed, ends
the worker's process, seen by its pid."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.browser.dashboard import Dashboard, Page, Proc, agent
from tests.browser.test_dashboard import WAIT_MS, expect, wait_roster

pytestmark = [pytest.mark.browser, pytest.mark.network, pytest.mark.timeout(180)]
_ids = itertools.count()


@pytest.fixture
def team(tmp_path: Path) -> Iterator[tuple[Dashboard, Proc, Proc]]:
    mesh = f"uic-{os.getpid()}-{next(_ids)}"
    procs: list[Proc] = []
    try:
        ui = Dashboard(mesh, tmp_path / "ui", log_dir=tmp_path / "logs")
        procs.append(ui)
        procs.append(agent("worker", "w1", mesh, tmp_path))
        procs.append(agent("worker", "w2", mesh, tmp_path))
        yield ui, procs[1], procs[2]
    finally:
        for proc in reversed(procs):
            proc.stop()


def card(page: Any, name: str) -> Any:
    return page.locator(f'[data-testid="peer-card"][data-name="{name}"]')


def test_drain_then_halt_a_worker_from_its_card(browser: Any,
                                                team: tuple[Dashboard, Proc, Proc]) -> None:
    ui, w1, w2 = team
    view = Page(browser, ui.url)
    page = view.page
    try:
        # Up as agents, not only as nodes: a drain that arrives while the agent starts
        # reaches its node (the card says draining) before the agent listens for it.
        for worker in (w1, w2):
            worker.wait_line(lambda s: "worker up" in s, 60, "the worker's start")
        wait_roster(page, "w1", "w2")
        page.get_by_test_id("drain-w1").click()
        expect(card(page, "w1")).to_have_attribute("data-state", "draining", timeout=WAIT_MS)
        w1.wait_line(lambda s: "drain requested by porter-ui" in s, 30, "the worker's drain")
        # Only w1 was asked: w2 keeps taking work.
        expect(card(page, "w2")).to_have_attribute("data-state", "alive")
        assert w1.proc.poll() is None, "a drain is not a halt"

        halt = page.get_by_test_id("halt-w1")
        halt.click()
        expect(halt).to_have_text("Halt: sure?")  # armed: nothing sent yet
        assert w1.proc.poll() is None
        halt.click()
        expect(page.locator("#toast")).to_contain_text("halt sent to w1", timeout=WAIT_MS)
        w1.wait_line(lambda s: "halt requested by porter-ui" in s, 30, "the worker's halt")
        pid = w1.proc.pid
        assert w1.wait(60) == 0, w1.output[-3000:]
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        # Gone from the roster's live peers: left (its goodbye), or expired when the
        # goodbye was lost on the way.
        expect(card(page, "w1")).to_have_attribute("data-state", re.compile("^(left|expired)$"),
                                                   timeout=WAIT_MS)
        assert w2.proc.poll() is None, "halting w1 stopped w2 too"
        expect(card(page, "w2")).to_have_attribute("data-state", "alive")
    finally:
        view.close()
