"""A paused worker that resumes after its task was re-offered stops its stale attempt.

Real processes: the demo team (architect, two workers, reviewer) on loopback. worker-1
accepts the task and runs a long command (with a ``setsid`` child); the test pauses
worker-1 (SIGSTOP) until the architect has expired it and offered the task to worker-2,
then resumes it (SIGCONT). The architect withdraws the old claim as soon as worker-1 is
back on its roster; worker-1 must stop the command at once and report nothing, and the
task is done once, by worker-2.

Every wait is for an event with a deadline: the commands signal through FIFOs the test
holds open, and the demo's live timeline (a stream the test reads) says when the task is
re-offered. worker-2's first command waits on a gate FIFO until worker-1 has stopped, so
that the architect is still running when worker-1 comes back.
"""

from __future__ import annotations

import asyncio
import io
import os
import selectors
import signal
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest

from agents.demo import run_demo, summary_of
from tests.integration.test_tools_bash import assert_all_gone

pytestmark = [pytest.mark.network, pytest.mark.slow, pytest.mark.timeout(180)]


class Timeline(io.StringIO):
    """The demo's console, with an event for the re-offer to worker-2."""

    def __init__(self) -> None:
        super().__init__()
        self.reoffered = threading.Event()

    def write(self, text: str) -> int:
        if "architect -> worker-2" in text and " Offer " in text:
            self.reoffered.set()
        return super().write(text)


def wait_line(fd: int, timeout: float, what: str) -> None:
    """Block until something is written to the FIFO ``fd`` (the event), or fail."""
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"{what}: nothing within {timeout}s")
    assert os.read(fd, 64), what


def test_resumed_worker_stops_its_withdrawn_attempt(tmp_path: Path) -> None:
    fifos = {name: tmp_path / name for name in ("running", "stopped", "gate")}
    for path in fifos.values():
        os.mkfifo(path)
    pids_file = tmp_path / "w1.pids"
    # Opened before the agents start, so the commands' writes never block on opening.
    running = os.open(fifos["running"], os.O_RDONLY | os.O_NONBLOCK)
    stopped = os.open(fifos["stopped"], os.O_RDONLY | os.O_NONBLOCK)
    gate = os.open(fifos["gate"], os.O_RDWR)  # a reader opening it never blocks
    long_command = (
        f"trap 'echo stopped > {fifos['stopped']}; exit 143' TERM; "
        f"setsid sleep 3011 & echo $! >> {pids_file}; echo $$ >> {pids_file}; "
        f"echo running > {fifos['running']}; wait"
    )
    timeline = Timeline()
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []
    log: dict[str, Any] = {}

    def choreography(pids: dict[str, int]) -> None:
        w1 = pids["worker-1"]
        paused = False
        try:
            wait_line(running, 60, "worker-1's long command starts")
            os.kill(w1, signal.SIGSTOP)
            paused = True
            assert timeline.reoffered.wait(60), "the task was not re-offered to worker-2"
            log["reoffered_while_paused"] = psutil.Process(w1).status()
            os.kill(w1, signal.SIGCONT)
            paused = False
            wait_line(stopped, 60, "worker-1's command is stopped after it resumes")
        except BaseException as exc:  # reported by the test body
            errors.append(exc)
        finally:
            if paused:
                os.kill(w1, signal.SIGCONT)
            os.write(gate, b"go\n")  # worker-2 may finish the task now

    def on_start(pids: dict[str, int]) -> None:
        thread = threading.Thread(target=choreography, args=(pids,))
        threads.append(thread)
        thread.start()

    out = tmp_path / "demo"
    try:
        status = asyncio.run(run_demo(
            out, timeout=120, stream=timeline, on_start=on_start,
            extra={"worker-1": ["--work-command", long_command],
                   "worker-2": ["--work-command", f"read -r _ < {fifos['gate']}"]},
        ))
    finally:
        for thread in threads:
            thread.join(timeout=30)
        for fd in (running, stopped, gate):
            os.close(fd)
    console = timeline.getvalue()
    if errors:
        raise AssertionError(f"{errors[0]}\n{console[-4000:]}") from errors[0]
    assert status == 0, console[-4000:]
    assert log["reoffered_while_paused"] == psutil.STATUS_STOPPED

    # worker-1's command, and the setsid child it started, are gone.
    assert_all_gone([int(pid) for pid in pids_file.read_text().split()])
    w1_log = (out / "agents" / "worker-1.log").read_text(errors="replace")
    assert "withdrawn by architect" in w1_log, w1_log[-3000:]
    assert "stopped attempt 1 of task" in w1_log, w1_log[-3000:]
    architect_log = (out / "agents" / "architect.log").read_text(errors="replace")
    # Nothing stale reached the board (it logs each refused report as "refused ...").
    assert "[architect] refused " not in architect_log, architect_log[-3000:]

    messages = summary_of(out / "messages.jsonl")
    task = [m for m in messages
            if m["activity"].get("context", "").startswith("urn:porter:task:")]
    offers = [(m["channel"], m["activity"].get("attempt")) for m in task
              if m["sender"] == "architect" and m["activity"]["type"] == "Offer"]
    assert offers[:2] == [("task:worker-1", 1), ("task:worker-2", 2)], offers
    withdrawals = [m for m in task if m["activity"]["type"] == "Delete"
                   and m["sender"] == "architect"]
    assert [(m["channel"], m["activity"].get("attempt")) for m in withdrawals] == [
        ("task:worker-1", 1)]
    # Nothing of worker-1's attempt but its Accept reached the mesh.
    assert [m["activity"]["type"] for m in task if m["sender"] == "worker-1"] == ["Accept"]
    acts = [(m["sender"], m["activity"]["type"]) for m in task]
    assert acts.count(("worker-2", "Remember")) == 1
    assert acts.count(("worker-2", "Announce")) == 1
    assert acts.count(("reviewer", "Accept")) == 1
