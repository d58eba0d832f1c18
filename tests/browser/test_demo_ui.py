"""``porter-mesh demo --ui`` as a person uses it: open the printed address, watch the
story's task reach done, send a task to a worker from the compose box, approve its review
on the card, then Ctrl-C (SIGINT) ends every process the demo started.

Set PORTER_UI_SCREENSHOT=docs/dashboard.png to refresh the README's screenshot, taken
while the human's review waits on its card.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.browser.dashboard import Page, Proc
from tests.browser.test_dashboard import WAIT_MS, expect, rows

pytestmark = [pytest.mark.browser, pytest.mark.network, pytest.mark.slow,
              pytest.mark.timeout(240)]


def test_demo_ui_story_then_a_task_from_the_page(browser: Any, tmp_path: Path) -> None:
    out = tmp_path / "demo"
    demo = Proc("demo", ["demo", "--ui", "--out", str(out), "--timeout", "90"],
                log_dir=tmp_path / "logs")
    view: Page | None = None
    try:
        line = demo.wait_line(lambda s: s.startswith("dashboard: open "), 60, "address")
        view = Page(browser, line.split("open ", 1)[1].strip())
        page = view.page
        story = page.locator('[data-testid="task-card"]').filter(
            has_text="Add GET /users endpoint")
        expect(story).to_have_attribute("data-state", "completed", timeout=90_000)
        expect(rows(page, type="Announce").filter(has_text="Task done: Add GET /users")
               ).to_have_count(1, timeout=WAIT_MS)
        demo.wait_line(lambda s: "keeps running" in s, 30, "the story's end")

        # The mesh is still up: a person sends a task to a worker ...
        expect(page.locator('[data-testid="peer-card"][data-name="worker-1"]')
               ).to_have_attribute("data-state", "alive", timeout=WAIT_MS)
        page.get_by_test_id("compose-target").fill("@worker-1")
        page.get_by_test_id("compose-type").select_option("Offer")
        page.get_by_test_id("compose-text").fill(
            "Document the users endpoint\nWrite down the pagination rules the review asked "
            "for, with an example request.")
        page.get_by_test_id("compose-send").click()
        expect(page.get_by_test_id("compose-status")).to_contain_text(
            "sent Offer to @worker-1", timeout=WAIT_MS)
        card = page.locator('[data-testid="task-card"]').filter(
            has_text="Document the users endpoint")
        expect(card).to_have_attribute("data-state", "in-review", timeout=WAIT_MS)
        expect(card.get_by_test_id("review-approve")).to_be_visible()
        shot = os.environ.get("PORTER_UI_SCREENSHOT")
        # Written here: Playwright's own path= writes from executor threads it keeps.
        image = page.screenshot()
        (tmp_path / "dashboard.png").write_bytes(image)
        if shot:
            Path(shot).write_bytes(image)
        # ... and approves its review from the card.
        card.get_by_test_id("review-approve").click()
        expect(card).to_have_attribute("data-state", "completed", timeout=WAIT_MS)
        expect(rows(page, type="Announce").filter(has_text="Done: Document the users endpoint")
               ).to_have_count(1, timeout=WAIT_MS)
        assert (out / "workspace" / "tasks").is_dir()

        demo.signal(signal.SIGINT)
        assert demo.wait(60) == 130, demo.output[-3000:]  # Ctrl-C, as for every command
        assert "stopping every process the demo started" in demo.output
    finally:
        if view is not None:
            view.close()
        demo.stop()
