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


def test_an_offer_prints_the_accept_and_ends_on_the_result(worker: Running, mesh: str) -> None:
    out = cli("request", "task:w1", "do X", "--type", "Offer", "--mesh", mesh,
              "--timeout", "60", "--wait", "20")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "w1" in lines[0] and "Accept" in lines[0], lines
    assert "Invoke" in lines[-1] and "[exit status 0]" in lines[-1], lines
    assert out.stderr.startswith("context urn:porter:task:"), out.stderr
    context = out.stderr.split()[1]
    assert all(context in line for line in lines)


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
