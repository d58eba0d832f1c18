"""The dashboard's roster and layout in a real browser: only agents get cards (a command
line's seat and a ``tail`` are named apart, and forgotten once they go), and the page is
usable at 1024x700: the timeline's summary column, the roster's and the cards' buttons
and the compose button are on screen, inside their panels."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.dashboard import Dashboard, Page, Proc, agent
from tests.browser.test_dashboard import WAIT_MS, expect, rows, wait_roster

pytestmark = [pytest.mark.browser, pytest.mark.network, pytest.mark.timeout(180)]
_ids = itertools.count()


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Dashboard]]:
    """A dashboard and two workers whose names are as long as the demo's."""
    root = tmp_path_factory.mktemp("layout")
    mesh = f"uil-{os.getpid()}-{next(_ids)}"
    procs: list[Proc] = []
    try:
        ui = Dashboard(mesh, root / "ui", log_dir=root / "logs")
        procs.append(ui)
        procs += [agent("worker", name, mesh, root) for name in ("worker-1", "reviewer-2")]
        yield mesh, ui
    finally:
        for proc in reversed(procs):
            proc.stop()


def card(page: Any, name: str) -> Any:
    return page.locator(f'[data-testid="peer-card"][data-name="{name}"]')


def other(page: Any, name: str) -> Any:
    return page.get_by_test_id("roster-others").locator(f'[data-name="{name}"]')


def test_seats_and_watchers_are_not_agents(browser: Any, team: tuple[str, Dashboard],
                                           tmp_path: Path) -> None:
    mesh, ui = team
    view = Page(browser, ui.url)
    page = view.page
    tail: Proc | None = None
    try:
        wait_roster(page, "worker-1", "reviewer-2")
        tail = Proc("tail", ["tail", "--mesh", mesh], log_dir=tmp_path)
        watcher = f"porter-tail-{tail.proc.pid}"
        expect(other(page, watcher)).to_have_count(1, timeout=WAIT_MS)
        expect(other(page, watcher)).to_have_attribute("data-kind", "watcher")

        row = announce(page, mesh, f"hello from seat {next(_ids)}")
        seat = row.locator(".sender").inner_text().strip()
        assert seat.startswith("porter-ui-"), seat
        # The seat has gone: no card, no name (a roster of every command that ever ran
        # would say nothing), while the agents keep theirs.
        expect(other(page, seat)).to_have_count(0, timeout=WAIT_MS)
        expect(card(page, seat)).to_have_count(0)
        expect(card(page, watcher)).to_have_count(0)
        expect(page.get_by_test_id("roster").locator(".count")).to_have_text("2/2")

        tail.stop()
        expect(other(page, watcher)).to_have_count(0, timeout=WAIT_MS)
        expect(page.get_by_test_id("roster-others")).to_be_hidden()
    finally:
        if tail is not None:
            tail.stop()
        view.close()


def announce(page: Any, mesh: str, text: str) -> Any:
    """``porter-mesh send log TEXT`` (a seat that comes and goes); its timeline row."""
    sent = subprocess.run([sys.executable, "-m", "porter_mesh.cli.main", "send", "log", text,
                           "--mesh", mesh], capture_output=True, text=True, timeout=60)
    assert sent.returncode == 0, sent.stderr
    row = rows(page, type="Announce").filter(has_text=text)
    expect(row).to_have_count(1, timeout=WAIT_MS)
    return row


#: The viewport boxes of the card of an agent and of its button with the test id given,
#: found and read in one evaluation (a locator's evaluate finds the element first, and
#: the card can be drawn again before the function runs on it).
_CARD_AND_BUTTON = """([name, id]) => {
    const card = document.querySelector(`[data-testid="peer-card"][data-name="${name}"]`);
    const button = card === null ? null : card.querySelector(`[data-testid="${id}"]`);
    if (button === null) return null;
    const box = (el) => {
        const r = el.getBoundingClientRect();
        return {x: r.x, y: r.y, width: r.width, height: r.height};
    };
    return {card: box(card), button: box(button)};
}"""


def _inside(inner: Any, outer: dict[str, float], what: str) -> None:
    box = inner.bounding_box()
    assert box is not None, f"{what} is not shown"
    _box_inside(box, outer, what)


def _box_inside(box: dict[str, float], outer: dict[str, float], what: str) -> None:
    assert box["width"] > 0 and box["height"] > 0, (what, box)
    assert box["x"] >= outer["x"] - 0.5 and box["y"] >= outer["y"] - 0.5, (what, box, outer)
    assert box["x"] + box["width"] <= outer["x"] + outer["width"] + 0.5, (what, box, outer)
    assert box["y"] + box["height"] <= outer["y"] + outer["height"] + 0.5, (what, box, outer)


def test_usable_at_1024_by_700(browser: Any, team: tuple[str, Dashboard],
                               tmp_path: Path) -> None:
    mesh, ui = team
    context = browser.new_context(viewport={"width": 1024, "height": 700})
    page = context.new_page()
    try:
        page.goto(ui.url)
        wait_roster(page, "worker-1", "reviewer-2")
        summary = ("Ready for review: the pagination rules, with an example request "
                   f"and its answer ({next(_ids)})")
        row = announce(page, mesh, summary)
        screen = {"x": 0, "y": 0, "width": 1024, "height": 700}
        assert page.evaluate("document.documentElement.scrollWidth") <= 1024  # no sideways

        timeline = page.get_by_test_id("timeline").bounding_box()
        _inside(page.get_by_test_id("timeline"), screen, "the timeline")
        cell = row.locator(".summary")
        _inside(cell, timeline, "the summary column")
        assert cell.bounding_box()["width"] >= 120, cell.bounding_box()  # readable, not a sliver
        for part in (".t", ".chan", ".who", ".raw-toggle"):
            _inside(row.locator(part), timeline, f"the row's {part}")

        roster = page.get_by_test_id("roster").bounding_box()
        _inside(page.get_by_test_id("roster"), screen, "the roster")
        for button in (".drain-all", ".halt-all"):
            _inside(page.get_by_test_id("roster").locator(button), roster, button)
        for name in ("worker-1", "reviewer-2"):
            for button in (f"drain-{name}", f"halt-{name}"):
                # A card is drawn again when the agent's view arrives: wait for the button,
                # then read the card's box and the button's in one evaluation (separate
                # reads could fall on either side of a redraw, the card gone in between).
                shown_button = card(page, name).get_by_test_id(button)
                expect(shown_button).to_be_visible(timeout=WAIT_MS)
                boxes = page.evaluate(_CARD_AND_BUTTON, [name, button])
                assert boxes is not None, f"{button} is not in the card of {name}"
                if boxes["button"]["y"] < 700:
                    _box_inside(boxes["button"], boxes["card"], button)
            shown = card(page, name).locator(".name")
            # The whole name is shown, not cut with an ellipsis.
            assert shown.evaluate("n => n.scrollWidth <= n.clientWidth"), name

        _inside(page.get_by_test_id("compose-send"), screen, "the Send button")
        for tab in ("tab-tasks", "tab-inbox", "tab-knowledge"):
            _inside(page.get_by_test_id(tab), screen, tab)
        image = page.screenshot()
        (tmp_path / "dashboard-1024.png").write_bytes(image)
        print(f"screenshot: {tmp_path / 'dashboard-1024.png'}")
    finally:
        context.close()
