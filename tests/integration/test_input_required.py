"""Input-required: a worker's question to its requester survives a kill -9 of the worker.

Real processes: a scripted worker with a data directory that asks its requester a
question on every task (``--ask``); the human's commands as the user runs them. The
worker is killed (SIGKILL) while it waits for the answer and started again on the same
data directory; the answer sent afterwards reaches it and the task completes.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from tests.integration.cli_proc import Running, cli

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]
_ids = itertools.count()
QUESTION = "Which database should I use?"


def _worker(mesh: str, tmp: Path) -> Running:
    return Running("agent", "worker", "--name", "w1", "--mesh", mesh, "--workspace",
                   str(tmp / "ws"), "--data-dir", str(tmp / "data"), "--ask", QUESTION)


def _tasks(mesh: str) -> dict[str, dict[str, object]]:
    out = cli("tasks", "--all", "--json", "--mesh", mesh)
    assert out.returncode == 0, out.stderr
    return {r["context"]: r for r in map(json.loads, out.stdout.splitlines())}


@pytest.mark.slow  # a kill -9 and a restart: a long fault run
def test_the_question_survives_a_kill_and_the_answer_completes_the_task(tmp_path: Path
                                                                       ) -> None:
    mesh = f"ir{os.getpid()}-{next(_ids)}"
    ctx = "urn:porter:task:q1"
    worker = _worker(mesh, tmp_path)
    try:
        assert cli("peers", "--mesh", mesh, "--wait", "3").returncode == 0
        out = cli("request", "task:w1", "Set up storage", "--type", "Offer", "--context",
                  ctx, "--mesh", mesh, "--timeout", "60", "--wait", "20")
        assert out.returncode == 1, out.stderr
        last = out.stderr.splitlines()[-1]
        assert f"task {ctx} is input-required: w1 asks: {QUESTION}" in last, last
        assert f"porter-mesh send task:w1 TEXT --type Note --context {ctx}" in last
        before = _tasks(mesh)[ctx]
        assert (before["state"], before["question"]) == ("input-required", QUESTION)

        worker.proc.kill()  # SIGKILL: nothing is saved on the way out
        worker.proc.wait(10)
        worker.stop()
        worker = _worker(mesh, tmp_path)
        worker.wait_until(lambda: any(f"resumed task {ctx} (input-required)" in e
                                      for e in worker.err), 30, "the restarted worker")
        after = _tasks(mesh)[ctx]
        assert (after["state"], after["question"]) == ("input-required", QUESTION)

        answer = cli("send", "task:w1", "Use Postgres", "--type", "Note", "--context", ctx,
                     "--mesh", mesh, "--wait", "20")
        assert answer.returncode == 0, answer.stderr
        worker.wait_until(lambda: any(f"review of {ctx} asked from porter-ui" in e
                                      for e in worker.err), 30, "the review request")
        brief = (tmp_path / "ws" / "tasks" / "q1.md").read_text()
        assert "Use Postgres" in brief, brief
        approve = cli("send", "review", "Fine", "--type", "Accept", "--context", ctx,
                      "--mesh", mesh, "--wait", "20")
        assert approve.returncode == 0, approve.stderr
        worker.wait_until(lambda: any("Announce" in e or "send_message: Sent Announce" in e
                                      for e in worker.err), 30, "the closing announce")
        assert _tasks(mesh)[ctx]["state"] == "completed"
    finally:
        worker.stop()
