"""The human's seats: the dashboard (``porter-ui``) and command-line commands at the same
time, as processes. Every command joins under a name of its own (``porter-ui-<hex>``), so
the dashboard stays the only ``porter-ui`` on every roster, the commands get their own
replies, and the tasks they offer are still the human's on the dashboard."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from porter_mesh.core.advert import is_human
from tests.integration.test_ui_api import (
    UI,
    LineProcess,
    cli,
    get,
    post,
    run,
    until,
)

pytestmark = [pytest.mark.network, pytest.mark.timeout(240)]
_ids = itertools.count()


@pytest.fixture
def mesh() -> str:
    return f"seat{os.getpid()}-{next(_ids)}"


@pytest.fixture
def worker(mesh: str, tmp_path: Path, ui: UI) -> Iterator[LineProcess]:
    proc = LineProcess(cli("agent", "worker", "--name", "w1", "--mesh", mesh, "--slots", "5",
                           "--workspace", str(tmp_path / "ws"), "--data-dir",
                           str(tmp_path / "w1")), "w1")
    try:
        yield proc
    finally:
        proc.stop()


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(cli(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=10)
    return proc.returncode, out, err


def worker_view(mesh: str) -> dict[str, Any]:
    out = subprocess.run(cli("stats", "w1", "--mesh", mesh, "--json", "--wait", "20"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    view: dict[str, Any] = json.loads(out.stdout)
    return view


def humans_on(view: dict[str, Any]) -> dict[str, str]:
    return {p["name"]: p["state"] for p in view["peers"] if is_human(p["name"])}


def test_commands_beside_the_dashboard_and_each_other(ui: UI, worker: LineProcess,
                                                      mesh: str) -> None:
    async def dashboard_sees_w1(session: aiohttp.ClientSession) -> None:
        async def alive() -> bool:
            peers = await get(session, ui, "/api/peers")
            return any(p["name"] == "w1" and p["state"] == "alive" for p in peers["peers"])
        await until(alive, 60, "w1 alive on the dashboard")

    run(dashboard_sees_w1)
    before = worker_view(mesh)
    assert humans_on(before).get("porter-ui") == "alive", before["peers"]

    # Two requests and a broadcast side by side, while the dashboard runs.
    requests = [start("request", "task:w1", f"task {i}", "--type", "Offer", "--context",
                      f"urn:porter:task:seat{i}", "--mesh", mesh, "--timeout", "90",
                      "--wait", "30") for i in range(2)]
    note = start("send", "log", "hello from the terminal", "--mesh", mesh, "--wait", "30")
    results = [finish(p) for p in requests]
    note_rc, _, note_err = finish(note)
    assert note_rc == 0, note_err
    for i, (rc, out, err) in enumerate(results):
        # request follows each task until it waits on the requester (its review): that is
        # no completed task, so the status is 1, and the command says what it waits for.
        assert rc == 1 and "waiting for your review" in err, (i, out, err)
        lines = out.splitlines()
        assert "Accept" in lines[0] and "w1" in lines[0], lines
        assert any("Invoke" in line for line in lines), lines
        assert all(f"urn:porter:task:seat{i}" in line for line in lines), lines

    # The worker still sees one porter-ui, the dashboard, that never left or restarted;
    # the commands came and went under names of their own.
    after = worker_view(mesh)
    assert humans_on(after).get("porter-ui") == "alive", after["peers"]
    counters = after["counters"]
    assert counters.get("peer.restarted", 0) == before["counters"].get("peer.restarted", 0)
    seats = counters.get("peer.joined", 0) - before["counters"].get("peer.joined", 0)
    assert seats >= 3, counters  # two requests, one send, the stats command's seats aside

    async def dashboard_after(session: aiohttp.ClientSession) -> None:
        # Nothing was lost on the dashboard's side: its link to w1 works, and it saw the
        # terminal's tasks as the human's: the worker asks porter-ui to review them.
        sent = await post(session, ui, "/api/send", {"channel": "@w1", "text": "still here?",
                                                     "type": "Question"})
        assert sent["ok"], sent

        async def reviews() -> list[dict[str, Any]] | None:
            tasks = (await get(session, ui, "/api/tasks"))["tasks"]
            mine = [t for t in tasks if t["context"].startswith("urn:porter:task:seat")]
            ready = [t for t in mine if t["review"] is not None]
            return ready if len(ready) == 2 else None

        cards = await until(reviews, 60, "both terminal tasks awaiting the human's review")
        for card in cards:
            assert card["offered_by"] != "porter-ui" and is_human(card["offered_by"]), card
            assert card["review"]["to"] == "porter-ui" and card["review"]["from"] == "w1"
        # The human approves from the dashboard a task offered from the terminal.
        context = cards[0]["context"]
        await post(session, ui, "/api/review", {"context": context, "decision": "approve"})

        async def announced() -> bool:
            page = await get(session, ui, f"/api/messages?context={context}&type=Announce")
            return any(m["sender"] == "w1" for m in page["messages"])
        await until(announced, 60, "w1's closing Announce after the dashboard's approval")

    run(dashboard_after)
