"""A task's waterfall on its card, and the worker's service metrics on its roster card,
in a real browser: ``porter-mesh ui`` and a scripted worker as processes, headless
Chromium.

A task offered from the compose box is done and approved on its card; the card's Trace
button opens the waterfall the dashboard gathered from the agents' rings: the
dashboard's send of the Offer at the root, the worker's spans under it, the slowest path
marked, nothing missing. The worker's card then counts that work in its table.
"""

from __future__ import annotations

import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.dashboard import Dashboard, Page, Proc, agent, send_offer

pytestmark = [pytest.mark.browser, pytest.mark.network, pytest.mark.timeout(180)]

WAIT_MS = 30_000  # Playwright deadlines (milliseconds) for a loaded machine


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as pw_expect

    return pw_expect(locator)


@pytest.fixture
def ui(tmp_path: Path) -> Iterator[Dashboard]:
    mesh = f"uit-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    procs: list[Proc] = []
    try:
        dashboard = Dashboard(mesh, tmp_path / "ui", log_dir=tmp_path / "logs")
        procs.append(dashboard)
        procs.append(agent("worker", "w1", mesh, tmp_path))
        yield dashboard
    finally:
        for proc in reversed(procs):
            proc.stop()


def test_the_task_cards_trace_button_opens_its_waterfall(browser: Any, ui: Dashboard) -> None:
    with pytest.raises(urllib.error.HTTPError) as refused:  # the token guards it too
        urllib.request.urlopen(ui.base + "/api/trace?context=abc", timeout=10)
    assert refused.value.code == 401
    p = Page(browser, ui.url)
    page = p.page
    try:
        expect(page.locator('[data-testid="peer-card"][data-name="w1"]')).to_have_attribute(
            "data-state", "alive", timeout=WAIT_MS)
        send_offer(page, "w1", "Write the trace notes\nOne paragraph.", WAIT_MS)
        page.get_by_test_id("tab-tasks").click()
        card = page.locator('[data-testid="task-card"]').filter(has_text="Write the trace notes")
        expect(card).to_have_attribute("data-state", "in-review", timeout=WAIT_MS)
        card.get_by_test_id("review-approve").click()
        expect(card).to_have_attribute("data-state", "completed", timeout=WAIT_MS)

        # The worker's task span ends with its closing Announce: open the waterfall then.
        def opened() -> Any:
            card.get_by_test_id("task-trace").click()
            dialog = page.get_by_test_id("waterfall-dialog")
            expect(dialog.get_by_test_id("waterfall")).to_be_visible(timeout=WAIT_MS)
            return dialog

        dialog = opened()
        deadline = time.monotonic() + 30
        while dialog.locator('[data-testid="waterfall-row"][data-name="invoke_agent w1"]'
                             '[data-status="running"]').count():
            assert time.monotonic() < deadline, "the worker's task span never ended"
            dialog.get_by_test_id("waterfall-close").click()
            dialog = opened()
        rows = dialog.get_by_test_id("waterfall-row")
        expect(dialog.get_by_test_id("waterfall")).to_have_attribute("data-complete", "true")
        expect(dialog.get_by_test_id("waterfall-missing")).to_have_count(0)
        named = [(r.get_attribute("data-agent"), r.get_attribute("data-name"))
                 for r in rows.all()]
        # The dashboard's Offer is the root; the worker's work is under it.
        assert named[0] == ("porter-ui", "send task:w1"), named
        assert {("w1", "receive task:w1"), ("w1", "invoke_agent w1"),
                ("w1", "execute_tool write_file"), ("w1", "execute_tool bash"),
                ("w1", "send review")} <= set(named), named
        first = rows.first
        assert first.get_attribute("data-slowest") == "true"
        slowest = [r.get_attribute("data-name") for r in rows.all()
                   if r.get_attribute("data-slowest") == "true"]
        assert slowest[:2] == ["send task:w1", "invoke_agent w1"], slowest
        expect(first.locator(".wf-mark")).to_have_text("\u2605")
        # Bars by start offset and duration: the root's starts at 0, each one is drawn.
        assert first.locator(".wf-bar").evaluate("b => b.style.left") == "0%"
        for bar in dialog.locator(".wf-bar").all():
            box = bar.bounding_box()
            assert box is not None and box["width"] > 0
        # The statuses are coloured by kind; the agent and span are shown as text.
        expect(rows.filter(has_text="invoke_agent w1").locator(".wf-status")).to_have_text(
            "unset")
        expect(first.locator(".wf-agent")).to_have_text("porter-ui")
        dialog.get_by_test_id("waterfall-close").click()
        expect(page.get_by_test_id("waterfall-dialog")).to_have_count(0)

        # The same work in the worker's service metrics, on its roster card (the
        # dashboard asks every agent for its view every few seconds).
        worker = page.locator('[data-testid="peer-card"][data-name="w1"]')
        service = worker.get_by_test_id("peer-service")
        expect(service.locator("summary")).to_contain_text("tasks 1 · tool calls ",
                                                           timeout=WAIT_MS)
        expect(service.locator("summary")).to_contain_text("tokens 0 in / 0 out")
        service.locator("summary").click()
        bash = service.locator('[data-testid="service-row"][data-kind="tool bash"]')
        expect(bash.locator("td")).to_have_count(4)
        cells = bash.locator("td").all_text_contents()
        assert cells[:2] == ["1", "0"] and all(c.endswith(("ms", "s")) for c in cells[2:])
        task = service.locator('[data-testid="service-row"][data-kind="task"]')
        assert task.locator("td").all_text_contents()[:2] == ["1", "0"]
        # Unfolded it stays so when the card is drawn again with newer numbers.
        service.evaluate("d => { d.drawnBefore = true; }")
        page.wait_for_function("""() => {
            const d = document.querySelector(
                '[data-testid="peer-card"][data-name="w1"] [data-testid="peer-service"]');
            return d !== null && !d.drawnBefore;
        }""", timeout=WAIT_MS, polling=250)
        expect(worker.get_by_test_id("peer-service")).to_have_attribute("open", "")
    finally:
        p.close()
