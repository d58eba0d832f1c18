"""The mesh commands as a user runs them: node, peers, tail, send, control."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from porter_mesh.core.advert import is_human
from tests.integration.cli_proc import Running
from tests.integration.harness import NodeProcess, peers_seen

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]
_ids = itertools.count()


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "porter_mesh.cli.main", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def mesh() -> str:
    return f"c{os.getpid()}-{next(_ids)}"


@pytest.fixture
def team(mesh: str) -> Iterator[list[NodeProcess]]:
    nodes = [NodeProcess("alpha", mesh=mesh), NodeProcess("beta", mesh=mesh)]
    try:
        for node in nodes:
            other = {"alpha", "beta"} - {node.name}
            node.wait_until(lambda ev, o=other: o <= peers_seen(ev), 20, f"{node.name} peers")
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def test_peers_lists_the_roster(team: list[NodeProcess], mesh: str) -> None:
    out = cli("peers", "--mesh", mesh, "--json", "--wait", "3")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    by_name = {r["name"]: r for r in rows}
    assert set(by_name) == {"alpha", "beta"}
    assert all(r["state"] == "alive" for r in rows)
    assert by_name["alpha"]["incarnation"] == f"{team[0].up['inc']:x}"
    table = cli("peers", "--mesh", mesh, "--wait", "3")
    assert "alpha" in table.stdout and "NAME" in table.stdout


def test_send_direct_and_broadcast_and_tail(team: list[NodeProcess], mesh: str) -> None:
    tail = subprocess.Popen(
        [sys.executable, "-m", "porter_mesh.cli.main", "tail", "--mesh", mesh, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(x) for x in tail.stdout or ()],
                              daemon=True)
    got: list[dict[str, Any]] = []

    def shown(summary: str, timeout: float) -> bool:
        """Whether the tail prints an activity with ``summary`` within ``timeout``."""
        deadline = time.monotonic() + timeout
        while not any(g["activity"]["summary"] == summary for g in got):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(queue.Empty):
                got.append(json.loads(lines.get(timeout=min(left, 0.5))))
        return True

    try:
        assert tail.stderr is not None and tail.stdout is not None
        watching: set[str] = set()
        while watching != {"alpha", "beta"}:  # the tail reports each peer it connects to
            line = tail.stderr.readline()
            assert line, "tail exited before connecting"
            if line.startswith("watching "):
                watching.add(line.split()[1])
        reader.start()
        alpha, beta = team
        # "watching" says the tail knows a node, not that the node has its subscription to
        # direct copies yet: a direct message between the two, shown once, says that.
        for attempt in range(20):
            beta.command(op="send", to="alpha", n=1, start=900 + attempt)
            if shown(f"m{900 + attempt}", 2.0):
                break
        else:
            raise AssertionError(f"the tail never showed a direct message to alpha: {got}")
        direct = cli("send", "task:alpha", "Add GET /users endpoint", "--mesh", mesh,
                     "--context", "urn:porter:task:cli1")
        assert direct.returncode == 0, direct.stderr
        msg = alpha.wait_for(lambda e: e["ev"] == "msg" and e["direct"]
                             and e["text"] == "Add GET /users endpoint", 20, "direct from cli")
        # The command's seat is one of the human's names, never the dashboard's own.
        assert is_human(msg["sender"]) and msg["sender"] != "porter-ui", msg
        bcast = cli("send", "log", "hello mesh", "--mesh", mesh)
        assert bcast.returncode == 0, bcast.stderr
        beta.wait_for(lambda e: e["ev"] == "msg" and e["text"] == "hello mesh", 20,
                      "broadcast from cli")
        alpha.command(op="publish", channel="log", text="from alpha ", n=1)
        for summary in ("Add GET /users endpoint", "hello mesh", "from alpha 0"):
            # The tail sees the CLI's own broadcast too: send waited for it to subscribe.
            assert shown(summary, 30), (summary, got, direct.stderr, bcast.stderr)
    finally:
        tail.kill()
        tail.wait(10)
        reader.join(10)
        for stream in (tail.stdout, tail.stderr):
            if stream is not None:
                stream.close()
    offer = next(g for g in got if g["direct"] and g["channel"] == "task:alpha"
                 and g["activity"]["summary"] == "Add GET /users endpoint")
    assert offer["activity"]["type"] == "Offer"
    assert is_human(offer["sender"]) and offer["activity"]["actor"] == offer["sender"]
    assert offer["activity"]["context"] == "urn:porter:task:cli1"


def test_send_to_unknown_agent_fails_clearly(team: list[NodeProcess], mesh: str) -> None:
    out = cli("send", "task:nobody", "hello", "--mesh", mesh, "--wait", "2")
    assert out.returncode == 1
    assert "no agent 'nobody'" in out.stderr


def test_node_command_runs_and_halts(mesh: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "porter_mesh.cli.main", "node", "--name", "gamma",
         "--role", "worker", "--mesh", mesh], stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert "node gamma up" in first
        out = cli("control", "halt", "--to", "gamma", "--mesh", mesh)
        assert out.returncode == 0, out.stderr
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        if proc.stderr:
            proc.stderr.close()



def _quiet_node(mesh: str, name: str, role: str) -> Running:
    """``porter-mesh node`` that keeps a silent peer listed for the whole test."""
    return Running("-v", "node", "--mesh", mesh, "--evasive-after", "60",
                   "--expire-after", "120", "--name", name, "--role", role)


def _seen_by(node: Running, name: str) -> None:
    node.wait_until(lambda: any(f"peer {name}" in line for line in node.err), 30,
                    f"{name} seen")


def _end(*nodes: Running) -> None:
    for node in nodes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(node.proc.pid, signal.SIGCONT)  # a stopped one, so SIGTERM ends it
        node.stop()


@pytest.mark.parametrize("to", [["--to", "gamma"], []], ids=["to-one", "to-every-agent"])
def test_control_does_not_wait_for_a_seat_that_cannot_answer(mesh: str,
                                                             to: list[str]) -> None:
    """A command's seat still on the roster but gone quiet (here stopped; in life, one
    that has just left) is not waited for: control reaches the agents and succeeds."""
    gamma = _quiet_node(mesh, "gamma", "worker")
    seat = _quiet_node(mesh, "porter-ui-0badcafe", "cli")
    try:
        _seen_by(gamma, "porter-ui-0badcafe")
        os.kill(seat.proc.pid, signal.SIGSTOP)
        out = cli("control", "halt", *to, "--mesh", mesh, "--json")
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        assert "gamma" in report["reached"] and report["missed"] == [], report
        assert gamma.proc.wait(30) == 0
    finally:
        _end(gamma, seat)


def test_control_names_an_agent_it_could_not_reach(mesh: str) -> None:
    """An agent listed but silent (stopped) is waited for, then named: to it alone,
    nothing is sent; to every agent, the others get it and the command exits 1."""
    gamma = _quiet_node(mesh, "gamma", "worker")
    delta = _quiet_node(mesh, "delta", "worker")
    try:
        _seen_by(gamma, "delta")
        os.kill(delta.proc.pid, signal.SIGSTOP)
        alone = cli("control", "halt", "--to", "delta", "--mesh", mesh, "--wait", "2")
        assert alone.returncode == 1
        assert "delta has not connected to this command within 2s; nothing sent" \
            in alone.stderr, alone.stderr
        assert gamma.proc.poll() is None
        every = cli("control", "halt", "--mesh", mesh, "--wait", "2", "--json")
        assert every.returncode == 1, every.stderr
        report = json.loads(every.stdout)
        assert "gamma" in report["reached"] and report["missed"] == ["delta"], report
        assert "not reached within 2s: delta" in every.stderr
        assert gamma.proc.wait(30) == 0
    finally:
        _end(gamma, delta)


def test_control_on_an_empty_mesh_says_who_it_looked_for(mesh: str) -> None:
    every = cli("control", "halt", "--mesh", mesh, "--wait", "1")
    assert every.returncode == 1
    assert f"nobody on mesh {mesh!r} within 1s; nothing sent" in every.stderr, every.stderr
    one = cli("control", "drain", "--to", "nobody", "--mesh", mesh, "--wait", "1")
    assert one.returncode == 1
    assert "no agent 'nobody' found" in one.stderr and "check the name and mesh" \
        in one.stderr, one.stderr
