"""The dashboard in a real browser against a real mesh: a ``porter-mesh ui`` process, a
worker agent process and a bare node process, all sharing one mesh for the module.

Covers: the roster, a task sent from the compose box and approved on its card, the
worker's replies in the inbox and the timeline, the filters, a recall and a refused
query, the token and Host refusals, markup shown as text, a reload showing history, and
1,000 activities a second without freezing the page.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.dashboard import Dashboard, Page, Proc, agent
from tests.integration.harness import NodeProcess

pytestmark = [pytest.mark.browser, pytest.mark.network, pytest.mark.timeout(180)]

MARKUP = "<img src=x onerror=window.__pwned=1>"
WAIT_MS = 30_000  # Playwright deadlines (milliseconds) for a loaded machine
_ids = itertools.count()


class Mesh:
    def __init__(self, root: Path) -> None:
        self.name = f"uib-{os.getpid()}-{next(_ids)}"
        self.root = root
        self.procs: list[Proc] = []
        self.ui = Dashboard(self.name, root / "ui", log_dir=root / "logs")
        self.procs.append(self.ui)
        self.worker = agent("worker", "w1", self.name, root)
        self.procs.append(self.worker)
        self.probe = NodeProcess("probe", "--data-dir", str(root / "probe"), mesh=self.name)

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.ui.base + path, data=data, method=method,
            headers={"Authorization": f"Bearer {self.ui.token}",
                     "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def close(self) -> None:
        self.probe.stop()
        for proc in reversed(self.procs):
            proc.stop()


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    m = Mesh(tmp_path_factory.mktemp("mesh"))
    try:
        yield m
    finally:
        m.close()


@pytest.fixture
def page(browser: Any, mesh: Mesh) -> Iterator[Any]:
    p = Page(browser, mesh.ui.url)
    yield p.page
    p.close()


def expect(locator: Any) -> Any:
    from playwright.sync_api import expect as pw_expect

    return pw_expect(locator)


def rows(page: Any, **attrs: str) -> Any:
    sel = "".join(f'[data-{k}="{v}"]' for k, v in attrs.items())
    return page.get_by_test_id("timeline").locator(f'[data-testid="timeline-row"]{sel}')


def wait_roster(page: Any, *names: str) -> None:
    for name in names:
        expect(page.locator(f'[data-testid="peer-card"][data-name="{name}"]')
               ).to_have_attribute("data-state", "alive", timeout=WAIT_MS)


# -- tests ----------------------------------------------------------------------------------


def test_roster_shows_the_worker(page: Any) -> None:
    wait_roster(page, "w1", "probe")
    card = page.locator('[data-testid="peer-card"][data-name="w1"]')
    expect(card).to_contain_text("worker")
    expect(card.get_by_test_id("drain-w1")).to_be_visible()
    expect(card.get_by_test_id("halt-w1")).to_be_visible()


def test_a_task_from_the_compose_box_is_done_and_approved_on_its_card(page: Any) -> None:
    wait_roster(page, "w1")
    page.get_by_test_id("compose-target").fill("@w1")
    page.get_by_test_id("compose-type").select_option("Offer")
    page.get_by_test_id("compose-text").fill(
        "Write the release notes\nCover the dashboard and demo --ui.")
    page.get_by_test_id("compose-send").click()
    status = page.get_by_test_id("compose-status")
    expect(status).to_contain_text("sent Offer to @w1", timeout=WAIT_MS)

    # The worker's Accept is addressed to porter-ui: it lands in the inbox and the timeline.
    page.get_by_test_id("tab-inbox").click()
    accept = page.get_by_test_id("inbox").locator('[data-testid="inbox-row"][data-type="Accept"]')
    expect(accept.first).to_contain_text("Starting work on Write the release notes",
                                         timeout=WAIT_MS)
    expect(rows(page, type="Accept").first).to_contain_text("w1", timeout=WAIT_MS)

    # Its review request is the human's: approve it on the card.
    page.get_by_test_id("tab-tasks").click()
    card = page.locator('[data-testid="task-card"]').filter(has_text="Write the release notes")
    expect(card).to_have_attribute("data-state", "in-review", timeout=WAIT_MS)
    context = card.get_attribute("data-context")
    assert context and context.startswith("urn:porter:task:")
    card.get_by_test_id("review-approve").click()
    expect(card).to_have_attribute("data-state", "completed", timeout=WAIT_MS)
    # The worker acted on the approval: its closing Announce is in the timeline.
    done = rows(page, type="Announce").filter(has_text="Done: Write the release notes")
    expect(done).to_have_count(1, timeout=WAIT_MS)

    # The task chip filters the timeline to that task.
    card.locator(".ctx").click()
    shown = rows(page)
    expect(shown.first).to_be_visible()
    expect(page.locator(".context-filter")).to_contain_text(context.rsplit(":", 1)[1])
    contexts = shown.evaluate_all("rs => rs.map(r => r.querySelector('.ctx')?.dataset.context)")
    assert contexts and set(contexts) == {context}, contexts
    # ... and the type filter to one type.
    page.locator(".context-filter .clear").click()
    page.get_by_test_id("filter-type").select_option("Accept")
    expect(shown.first).to_be_visible(timeout=WAIT_MS)
    types = shown.evaluate_all("rs => rs.map(r => r.dataset.type)")
    assert types and set(types) == {"Accept"}, types


def test_sending_back_needs_a_reason(page: Any, mesh: Mesh) -> None:
    wait_roster(page, "w1")
    status, answer = mesh.api("POST", "/api/send", {
        "channel": "@w1", "type": "Offer", "text": "Tidy the changelog"})
    assert status == 200, answer
    card = page.locator(f'[data-testid="task-card"][data-context="{answer["context"]}"]')
    expect(card).to_have_attribute("data-state", "in-review", timeout=WAIT_MS)
    card.get_by_test_id("review-reject").click()
    expect(card.locator(".review-status")).to_contain_text("say what should change")
    card.get_by_test_id("review-reason").fill("Group the entries by release")
    card.get_by_test_id("review-reject").click()
    # The worker revises its brief with the reason and asks again.
    again = rows(page, type="Offer").filter(has_text="Revised after review: Tidy the changelog")
    expect(again).to_have_count(1, timeout=WAIT_MS)
    brief = (mesh.root / "workspace" / "tasks" / f"{answer['context'].rsplit(':', 1)[1]}.md")
    assert "Group the entries by release" in brief.read_text()
    expect(card).to_have_attribute("data-state", "in-review", timeout=WAIT_MS)
    card.get_by_test_id("review-approve").click()
    expect(card).to_have_attribute("data-state", "completed", timeout=WAIT_MS)


def test_recall_from_the_page_and_a_refused_query(page: Any, mesh: Mesh) -> None:
    page.get_by_test_id("tab-knowledge").click()
    page.get_by_test_id("remember-about").fill("dashboard")
    page.get_by_test_id("remember-finding").fill("reviews can be approved from task cards")
    page.get_by_test_id("remember-submit").click()
    expect(page.get_by_test_id("observations")).to_contain_text(
        "reviews can be approved from task cards", timeout=WAIT_MS)
    page.get_by_test_id("sparql-run").click()  # the profile's query, prefilled
    results = page.get_by_test_id("sparql-results")
    expect(results.locator("th")).to_have_text(["about", "finding"], timeout=WAIT_MS)
    expect(results.locator("td").filter(has_text="reviews can be approved from task cards")
           ).to_have_count(1)
    expect(page.get_by_test_id("sparql-error")).to_be_hidden()

    refused = "SELECT * WHERE { SERVICE <http://127.0.0.1:9/sparql> { ?s ?p ?o } }"
    status, answer = mesh.api("POST", "/api/recall", {"query": refused})
    assert status == 400 and answer["error"] == "query", answer
    page.get_by_test_id("sparql").fill(refused)
    page.get_by_test_id("sparql-run").click()
    error = page.get_by_test_id("sparql-error")
    expect(error).to_be_visible(timeout=WAIT_MS)
    expect(error).to_contain_text(answer["reason"])


def test_markup_from_an_agent_is_shown_as_text(page: Any, mesh: Mesh) -> None:
    wait_roster(page, "probe")
    mesh.probe.command(op="wait-subscribers", channel="log", n=2, timeout=30)
    mesh.probe.wait_for(lambda e: e["ev"] in ("subscribers", "error"), 40, "subscribers")
    mesh.probe.command(op="publish", channel="log", text=MARKUP, n=1)
    row = rows(page).filter(has_text=MARKUP)
    expect(row).to_have_count(1, timeout=WAIT_MS)
    expect(row.locator(".summary")).to_have_text(MARKUP + "0")
    assert page.get_by_test_id("timeline").locator("img").count() == 0
    assert page.evaluate("typeof window.__pwned") == "undefined"
    # The raw JSON view shows it as text too.
    row.locator(".raw-toggle").click()
    expect(row.locator(".raw")).to_contain_text('"summary": "' + MARKUP + '0"')
    assert page.evaluate("typeof window.__pwned") == "undefined"


def test_a_reload_shows_what_happened_before(page: Any) -> None:
    earlier = rows(page).filter(has_text=MARKUP)
    expect(earlier).to_have_count(1, timeout=WAIT_MS)
    ids = rows(page).evaluate_all("rs => rs.map(r => r.dataset.id)")
    page.reload()
    expect(rows(page).filter(has_text=MARKUP)).to_have_count(1, timeout=WAIT_MS)
    after = rows(page).evaluate_all("rs => rs.map(r => r.dataset.id)")
    assert set(ids) <= set(after), set(ids) - set(after)
    assert page.evaluate("typeof window.__pwned") == "undefined"


def test_the_page_and_api_refuse_without_token_or_with_a_foreign_host(
        browser: Any, mesh: Mesh) -> None:
    stranger = Page(browser)
    try:
        response = stranger.page.goto(mesh.ui.base + "/")
        assert response is not None and response.status == 401
        assert "printed" in stranger.page.inner_text("body")
        api = stranger.page.request.get(mesh.ui.base + "/api/peers")
        assert api.status == 401 and api.json()["error"]
        wrong = stranger.page.goto(mesh.ui.base + "/?token=not-the-token")
        assert wrong is not None and wrong.status == 401
    finally:
        stranger.close(check=False)
    conn = http.client.HTTPConnection("127.0.0.1", mesh.ui.port, timeout=30)
    try:
        conn.request("GET", "/api/peers", headers={
            "Host": f"attacker.example:{mesh.ui.port}",
            "Authorization": f"Bearer {mesh.ui.token}"})
        answer = conn.getresponse()
        assert answer.status == 403
        assert json.loads(answer.read())["error"] == "host"
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_thousand_activities_a_second_leave_the_page_responsive(page: Any, mesh: Mesh) -> None:
    wait_roster(page, "probe")
    mesh.probe.command(op="wait-subscribers", channel="log", n=2, timeout=30)
    mesh.probe.wait_for(lambda e: e["ev"] in ("subscribers", "error"), 40, "subscribers")
    slowest = 0.0
    started = time.monotonic()
    for second in range(5):
        mesh.probe.command(op="publish", channel="log", text=f"burst{second}-", n=1000)
        # Round trips into the page until this second is over: each must answer promptly.
        until = started + second + 1
        while time.monotonic() < until:
            t0 = time.monotonic()
            page.evaluate("() => document.querySelectorAll('[data-testid=timeline-row]').length")
            slowest = max(slowest, time.monotonic() - t0)
    newest = rows(page).first
    expect(newest.locator(".summary")).to_have_text("burst4-999", timeout=WAIT_MS)
    shown = rows(page).count()
    print(f"\nburst: 5 x 1000 activities; slowest page round trip {slowest * 1000:.0f} ms; "
          f"{shown} rows in the DOM")
    assert slowest < 2.0, f"the page took {slowest:.2f}s to answer during the burst"
    assert 1000 <= shown <= 2000
