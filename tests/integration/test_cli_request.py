"""``porter-mesh request`` against a real scripted worker process."""

from __future__ import annotations

import itertools
import json
import os
import pathlib
from collections.abc import Iterator

import pytest

from tests.integration.cli_proc import Running, cli

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]
_ids = itertools.count()


@pytest.fixture
def mesh() -> str:
    return f"r{os.getpid()}-{next(_ids)}"


@pytest.fixture
def worker(mesh: str, tmp_path: pathlib.Path) -> Iterator[Running]:
    proc = Running("agent", "worker", "--name", "w1", "--mesh", mesh, "--slots", "20",
                   "--workspace", str(tmp_path), "--data-dir", str(tmp_path / "data"))
    try:
        found = cli("peers", "--mesh", mesh, "--json", "--wait", "3")
        assert found.returncode == 0, found.stderr
        yield proc
    finally:
        proc.stop()


def test_an_offer_is_followed_until_it_waits_on_the_requester(worker: Running,
                                                              mesh: str) -> None:
    out = cli("request", "task:w1", "do X", "--type", "Offer", "--mesh", mesh,
              "--timeout", "60", "--wait", "20")
    # The worker asks the human for review: the task waits on the requester, which is
    # not success (only completed is).
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    assert "w1" in lines[0] and "Accept" in lines[0], lines
    assert any("Invoke" in line and "[exit status 0]" in line for line in lines), lines
    assert "Offer" in lines[-1] and "review" in lines[-1], lines
    assert out.stderr.startswith("context urn:porter:task:"), out.stderr
    context = out.stderr.split()[1]
    assert all(context in line for line in lines)
    said = out.stderr.splitlines()
    assert f"task {context}: working" in said, said
    assert said[-1].startswith(f"porter-mesh request: task {context} is in-review, "
                               "waiting for your review"), said


def test_an_approved_task_is_completed(worker: Running, mesh: str) -> None:
    ctx = "urn:porter:task:ok1"
    request = Running("request", "task:w1", "do W", "--type", "Offer", "--context", ctx,
                      "--mesh", mesh, "--timeout", "60", "--wait", "20")
    try:
        request.wait_until(lambda: any("in-review" in line for line in request.err), 60,
                           "the review request")
        request.proc.wait(30)
        assert request.proc.returncode == 1
        approve = cli("send", "review", "Looks good", "--type", "Accept", "--context", ctx,
                      "--mesh", mesh, "--wait", "20")
        assert approve.returncode == 0, approve.stderr
    finally:
        request.stop()
    # The human's approval completes it, as its holder tells 'tasks'.
    out = cli("tasks", "--all", "--json", "--mesh", mesh)
    records = {r["context"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert records[ctx]["state"] == "completed", records


def test_count_and_json(worker: Running, mesh: str) -> None:
    out = cli("request", "task:w1", "do Y", "--context", "urn:porter:task:cnt1", "--count",
              "2", "--json", "--mesh", mesh, "--timeout", "60", "--wait", "20")
    assert out.returncode == 0, out.stderr
    replies = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(replies) == 2
    assert replies[0]["activity"]["type"] == "Accept"
    assert all(r["activity"]["context"] == "urn:porter:task:cnt1" for r in replies)
    assert all(r["sender"] == "w1" for r in replies)


def test_a_message_the_worker_cannot_act_on_is_rejected(worker: Running, mesh: str) -> None:
    out = cli("request", "task:w1", "what now?", "--type", "Question", "--context", "q1",
              "--mesh", mesh, "--timeout", "60", "--wait", "20")
    assert out.returncode == 1, out.stderr
    assert "Reject" in out.stdout and "cannot act on a Question" in out.stdout


def test_too_few_replies_time_out(worker: Running, mesh: str) -> None:
    out = cli("request", "task:w1", "do Z", "--count", "50", "--timeout", "3", "--mesh",
              mesh, "--wait", "20")
    assert out.returncode == 1
    assert "within 3s" in out.stderr.splitlines()[-1]
