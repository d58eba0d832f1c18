"""Cancel that cascades down sub-tasks, and a cancel from a stranger refused.

Real processes: scripted workers (``porter-mesh agent worker``) that delegate a sub-task
to the next one (``--delegate-to``) and then run a long command whose processes write
their pids and signal through a FIFO the test holds open; the human's commands
(``request``, ``tasks``, ``cancel``) as the user runs them; a bare node as the stranger.
"""

from __future__ import annotations

import itertools
import json
import os
import selectors
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.integration.cli_proc import Running, cli
from tests.integration.harness import NodeProcess
from tests.integration.test_tools_bash import assert_all_gone

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]
_ids = itertools.count()


class Team:
    """Workers ``names[0] -> names[1] -> ...``, each delegating to the next, each running
    a long command that reports on the FIFO ``running``."""

    def __init__(self, tmp: Path, names: list[str], *, architect: str | None = None
                 ) -> None:
        self.mesh = f"cx{os.getpid()}-{next(_ids)}"
        self.tmp = tmp
        self.fifo = tmp / "running"
        os.mkfifo(self.fifo)
        # Opened before the agents start, so the commands' writes never block.
        self.reader = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
        self.keep = os.open(self.fifo, os.O_WRONLY)
        self.agents: dict[str, Running] = {}
        self.workers = list(names)
        self.pids = tmp / "pids"
        for i, name in enumerate(names):
            pids = f"{self.pids}.{name}"
            long_command = (f"setsid sleep 3011 & echo $! >> {pids}; "
                            f"echo $$ >> {pids}; echo {name} > {self.fifo}; wait")
            extra = ["--delegate-to", names[i + 1]] if i + 1 < len(names) else []
            self.agents[name] = Running(
                "agent", "worker", "--name", name, "--mesh", self.mesh,
                "--workspace", str(tmp / name), "--data-dir", str(tmp / f"{name}.data"),
                "--work-command", long_command, *extra)
        if architect is not None:
            # It delegates each task the human offers to a worker (the first, here).
            self.agents[architect] = Running(
                "agent", "architect", "--name", architect, "--serve", "--mesh", self.mesh,
                "--workspace", str(tmp / architect),
                "--data-dir", str(tmp / f"{architect}.data"))
        self.wait_for_roster([*names, *([architect] if architect else [])])

    def wait_for_roster(self, names: list[str]) -> None:
        deadline = time.monotonic() + 30
        while True:
            out = cli("peers", "--mesh", self.mesh, "--json", "--wait", "2")
            seen = {json.loads(line)["name"] for line in out.stdout.splitlines() if line}
            if set(names) <= seen:
                return
            assert time.monotonic() < deadline, f"roster {seen}, want {names}"

    def wait_running(self, names: set[str], timeout: float = 60) -> None:
        """Block until each of ``names`` reported its long command running."""
        seen: set[str] = set()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.reader, selectors.EVENT_READ)
            while not names <= seen:
                left = deadline - time.monotonic()
                assert left > 0, f"running: only {seen} of {names} within {timeout}s"
                if sel.select(left):
                    seen |= set(os.read(self.reader, 4096).decode().split())

    def command_pids(self, *names: str) -> list[int]:
        """The pids of the long commands of ``names`` (default: every worker)."""
        return [int(x) for name in names or tuple(self.workers)
                for x in Path(f"{self.pids}.{name}").read_text().split()]

    def tasks(self, *extra: str) -> dict[str, dict[str, object]]:
        out = cli("tasks", "--json", "--mesh", self.mesh, *extra)
        assert out.returncode == 0, out.stderr
        records = [json.loads(line) for line in out.stdout.splitlines() if line]
        return {r["context"]: r for r in records}

    def close(self) -> None:
        for proc in self.agents.values():
            proc.stop()
        os.close(self.reader)
        os.close(self.keep)


@pytest.fixture
def team3(tmp_path: Path) -> Iterator[Team]:
    team = Team(tmp_path, ["wa", "wb", "wc"])
    try:
        yield team
    finally:
        team.close()


def _gone_within(pids: list[int], timeout: float) -> float:
    started = time.monotonic()
    while True:
        alive = [p for p in pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, f"still running: {alive}"
        psutil.wait_procs([psutil.Process(p) for p in alive], timeout=0.2)


def test_a_cancel_at_the_top_stops_every_level(team3: Team) -> None:
    top = "urn:porter:task:top1"
    request = Running("request", "task:wa", "build the thing", "--type", "Offer",
                      "--context", top, "--mesh", team3.mesh, "--timeout", "120",
                      "--wait", "20")
    try:
        team3.wait_running({"wa", "wb", "wc"})
        pids = team3.command_pids()
        assert len(pids) == 6
        tasks = team3.tasks()
        sub = next(c for c, r in tasks.items() if r["parent"] == top)
        subsub = next(c for c, r in tasks.items() if r["parent"] == sub)
        assert (tasks[top]["holder"], tasks[sub]["holder"], tasks[subsub]["holder"]) == (
            "wa", "wb", "wc")
        assert all(tasks[c]["state"] == "working" for c in (top, sub, subsub)), tasks

        started = time.monotonic()
        out = cli("cancel", "top1", "--reason", "not needed", "--mesh", team3.mesh,
                  "--timeout", "20")
        took = time.monotonic() - started
        assert out.returncode == 0, (out.stdout, out.stderr)
        lines = out.stdout.splitlines()
        assert len(lines) == 3, lines
        for line, ctx, holder in zip(lines, (top, sub, subsub), ("wa", "wb", "wc"),
                                     strict=True):
            assert ctx in line and f"{holder} stopped, confirmed" in line, lines
        assert lines[1].startswith("└─ ") and lines[2].startswith("   └─ "), lines
        gone_after = _gone_within(pids, 10)
        assert_all_gone(pids)
        print(f"cancel of 3 levels confirmed in {took:.2f}s; commands gone "
              f"{gone_after:.2f}s after")
        after = team3.tasks("--all")
        assert all(after[c]["state"] == "cancelled" for c in (top, sub, subsub)), after
        # The requester's own view follows it to its end: cancelled is not success.
        request.proc.wait(30)
        assert request.proc.returncode == 1
        assert any("cancelled" in line for line in request.err), request.err
        # Nothing more is reported for the tree: each attempt stopped where it was.
        for name in ("wa", "wb", "wc"):
            agent = team3.agents[name]
            agent.wait_until(lambda a=agent: any("reporting nothing" in e for e in a.err),
                             10, f"{name} dropped its attempt")
    finally:
        request.stop()


@pytest.fixture
def team1(tmp_path: Path) -> Iterator[Team]:
    team = Team(tmp_path, ["wc"])
    try:
        yield team
    finally:
        team.close()


def test_a_cancel_from_a_third_agent_is_refused(team1: Team) -> None:
    ctx = "urn:porter:task:mine1"
    request = Running("request", "task:wc", "work long", "--type", "Offer", "--context", ctx,
                      "--mesh", team1.mesh, "--timeout", "120", "--wait", "20")
    stranger = NodeProcess("stranger", mesh=team1.mesh, script=Path(__file__).with_name(
        "node_proc.py"))
    try:
        team1.wait_running({"wc"})
        pids = team1.command_pids()
        stranger.wait_for(lambda e: e["ev"] == "peer" and e["peer"] == "wc"
                          and e["kind"] == "joined", 30, "wc on the roster")
        cancel = {"type": "Delete", "actor": "stranger", "summary": "stop it",
                  "object": ctx, "context": ctx, "tag": ["cancel"]}
        stranger.ask("send-activity", "sent-activity", to="wc", activity=cancel)
        refusal = stranger.wait_for(lambda e: e["ev"] == "msg" and e["sender"] == "wc"
                                    and "Cancel refused" in e["text"], 20, "the refusal")
        assert "only porter-ui-" in refusal["text"] and "may cancel" in refusal["text"]
        assert all(psutil.pid_exists(p) for p in pids), "a refused cancel stopped the work"
        stats = cli("stats", "wc", "--json", "--mesh", team1.mesh)
        assert json.loads(stats.stdout)["counters"].get("dropped.cancel-refused") == 1
        assert team1.tasks()[ctx]["state"] == "working"
        # The human may: the work stops.
        out = cli("cancel", ctx, "--mesh", team1.mesh, "--timeout", "20")
        assert out.returncode == 0, (out.stdout, out.stderr)
        _gone_within(pids, 10)
    finally:
        stranger.stop()
        request.stop()


@pytest.mark.slow
def test_a_paused_holder_is_named_and_stops_when_it_resumes(team3: Team) -> None:
    top = "urn:porter:task:top2"
    request = Running("request", "task:wa", "build it again", "--type", "Offer",
                      "--context", top, "--mesh", team3.mesh, "--timeout", "120",
                      "--wait", "20")
    wc = psutil.Process(team3.agents["wc"].proc.pid)
    try:
        team3.wait_running({"wa", "wb", "wc"})
        pids = team3.command_pids()
        tasks = team3.tasks()
        subsub = next(c for c, r in tasks.items() if r["holder"] == "wc")
        wc.suspend()  # SIGSTOP: on the mesh, but deaf
        out = cli("cancel", "top2", "--mesh", team3.mesh, "--timeout", "5")
        assert out.returncode == 1, (out.stdout, out.stderr)
        lines = out.stdout.splitlines()
        assert "wa stopped, confirmed" in lines[0] and "wb stopped, confirmed" in lines[1]
        assert subsub in lines[2] and "wc did NOT confirm within 5s" in lines[2], lines
        # wc's own command still runs: nobody could tell it yet.
        assert all(psutil.pid_exists(p) for p in team3.command_pids("wc"))
        wc.resume()  # the cancel wb sent is still in flight: wc hears it now
        _gone_within(pids, 30)
        team3.agents["wc"].wait_until(
            lambda: any(f"task {subsub} cancelled by wb" in e for e in team3.agents["wc"].err),
            10, "wc obeying wb's cancel")
        after = team3.tasks("--all")
        assert after[subsub]["state"] == "cancelled", after
    finally:
        if wc.status() == psutil.STATUS_STOPPED:
            wc.resume()
        request.stop()


@pytest.fixture
def team_arch(tmp_path: Path) -> Iterator[Team]:
    team = Team(tmp_path, ["wa", "wb"], architect="arch")
    try:
        yield team
    finally:
        team.close()


@pytest.mark.slow
def test_the_human_architect_worker_worker_tree_is_cancelled_at_the_top(team_arch: Team
                                                                         ) -> None:
    top = "urn:porter:task:arch1"
    request = Running("request", "task:arch", "ship the release", "--type", "Offer",
                      "--context", top, "--mesh", team_arch.mesh, "--timeout", "120",
                      "--wait", "20")
    try:
        team_arch.wait_running({"wa", "wb"})
        pids = team_arch.command_pids()
        tasks = team_arch.tasks()
        sub = next(c for c, r in tasks.items() if r["parent"] == top)
        subsub = next(c for c, r in tasks.items() if r["parent"] == sub)
        assert (tasks[top]["holder"], tasks[sub]["holder"], tasks[subsub]["holder"]) == (
            "arch", "wa", "wb"), tasks
        assert tasks[sub]["requester"] == "arch" and tasks[sub]["attempt"] == 1
        out = cli("cancel", "arch1", "--mesh", team_arch.mesh, "--timeout", "20")
        assert out.returncode == 0, (out.stdout, out.stderr)
        lines = out.stdout.splitlines()
        for line, holder in zip(lines, ("arch", "wa", "wb"), strict=True):
            assert f"{holder} stopped, confirmed" in line, lines
        _gone_within(pids, 10)
        after = team_arch.tasks("--all")
        assert all(after[c]["state"] == "cancelled" for c in (top, sub, subsub)), after
        request.proc.wait(30)
        assert request.proc.returncode == 1
    finally:
        request.stop()
