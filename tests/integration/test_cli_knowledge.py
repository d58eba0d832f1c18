"""Knowledge on every node, and the node's own view, from the command line as people run
it: ``porter-mesh node`` and ``porter-mesh agent`` processes, then ``remember``,
``recall``, ``kg stats``, ``stats`` and ``peers`` as processes. Every test runs on a
brand-new mesh and data root (``PORTER_MESH_DATA``, set for every test by conftest).
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]
_ids = itertools.count()
CLI = (sys.executable, "-m", "porter_mesh.cli.main")
PROFILE_QUERY = ("SELECT ?about ?finding WHERE { ?o a porter:Observation ; porter:about ?about ;"
                 " porter:finding ?finding }")


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def timed(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    out = cli(*args)
    return out, time.monotonic() - started


class Daemon:
    """A long-running ``porter-mesh`` process whose stderr lines are collected."""

    def __init__(self, *args: str, ready: str) -> None:
        self.proc = subprocess.Popen([*CLI, *args], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.first = self.wait_line(lambda line: ready in line, 30, ready)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._queue.put(line)
        self._queue.put(None)

    def wait_line(self, pred: Callable[[str], bool], timeout: float, what: str) -> str:
        deadline = time.monotonic() + timeout
        for line in self.lines:
            if pred(line):
                return line
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {what!r} within {timeout}s: {self.lines[-10:]}")
            try:
                line = self._queue.get(timeout=min(left, 0.2))
            except queue.Empty:
                continue
            if line is None:
                self._queue.put(None)
                raise AssertionError(f"exited ({self.proc.poll()}) before {what!r}: "
                                     f"{self.lines[-10:]}")
            self.lines.append(line)
            if pred(line):
                return line

    @property
    def router_port(self) -> int:
        match = re.search(r"router (\d+)", self.first)
        assert match, self.first
        return int(match.group(1))

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        self._reader.join(5)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return code


@pytest.fixture
def mesh() -> str:
    return f"k{os.getpid()}-{next(_ids)}"


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for d in started:
        d.stop()


def start_node(daemons: list[Daemon], name: str, mesh: str, *extra: str) -> Daemon:
    d = Daemon("node", "--name", name, "--mesh", mesh, *extra, ready=f"node {name} up")
    daemons.append(d)
    return d


def test_a_fresh_mesh_remembers_and_recalls_on_bare_nodes_and_agents(
        daemons: list[Daemon], mesh: str, data_root: Path, tmp_path: Path) -> None:
    alpha = start_node(daemons, "alpha", mesh)
    # The very first command on the new mesh.
    done, took = timed("remember", "urn:porter:file:server.ts", "uses express", "--mesh", mesh)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("urn:porter:obs:") and "alpha holds it" in done.stderr
    assert took < 30, f"remember took {took:.1f}s"
    recalled, took = timed("recall", PROFILE_QUERY, "--json", "--mesh", mesh)
    assert recalled.returncode == 0, recalled.stderr
    assert json.loads(recalled.stdout)["items"] == [
        {"about": "urn:porter:file:server.ts", "finding": "uses express"}]
    assert took < 30, f"recall took {took:.1f}s"
    assert (data_root / mesh / "alpha" / "knowledge" / "shard.json").exists()
    # The seat's visits left no lines in the node's output: a later join is printed, and
    # nothing about porter-ui before it.
    beta = start_node(daemons, "beta", mesh, "--no-knowledge")
    alpha.wait_line(lambda line: "peer beta joined" in line, 30, "beta's join")
    assert not [line for line in alpha.lines if "porter-ui" in line], alpha.lines
    beta.stop()

    # An agent started without --data-dir keeps a shard too: with alpha gone, it serves.
    assert alpha.stop() == 0
    worker = Daemon("agent", "worker", "--name", "w1", "--mesh", mesh, "--workspace",
                    str(tmp_path / "ws"), ready="worker up")
    daemons.append(worker)
    done = cli("remember", "urn:porter:file:db.ts", "uses pg", "--mesh", mesh)
    assert done.returncode == 0 and "w1 holds it" in done.stderr, done.stderr
    recalled = cli("recall", "SELECT ?f WHERE { ?o porter:finding ?f }", "--mesh", mesh)
    assert recalled.returncode == 0 and "uses pg" in recalled.stdout, recalled.stderr
    assert (data_root / mesh / "w1" / "knowledge" / "shard.json").exists()

    # --data-dir is the node's data directory: kg stats finds the shard under it.
    stats = cli("kg", "stats", "--data-dir", str(data_root / mesh / "alpha"), "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["observations"] == 1


def test_without_a_replica_the_commands_say_what_to_start_within_their_wait(
        daemons: list[Daemon], mesh: str) -> None:
    start_node(daemons, "bare", mesh, "--no-knowledge")
    for args in (("remember", "urn:porter:file:x", "a fact"), ("recall", PROFILE_QUERY)):
        out, took = timed(*args, "--mesh", mesh, "--wait", "5")
        assert out.returncode == 1, out.stderr
        lines = out.stderr.splitlines()
        assert len(lines) == 1 and "keeps a knowledge replica" in lines[0], lines
        assert "porter-mesh node --name" in lines[0] and "bare" in lines[0]
        assert took < 5 + 15, f"{args[0]} took {took:.1f}s"
        assert out.stdout == ""


def test_a_bad_query_fails_at_once_before_joining(mesh: str) -> None:
    # Nobody is on this mesh: a command that joined would wait the whole --wait.
    for query, words in (("SELECT ?a WHERE { ?o porter:about ?a ", "syntax error"),
                         ("LOAD <http://example.com/x>", "LOAD is refused"),
                         ("SELECT ?a WHERE { ?o nope:about ?a }", "unknown prefix nope: declare")):
        out, took = timed("recall", query, "--mesh", mesh, "--wait", "60")
        assert out.returncode == 2 and words in out.stderr, out.stderr
        assert took < 15, f"took {took:.1f}s"
    out = cli("recall", PROFILE_QUERY, "--mesh", mesh, "--wait", "-1")
    assert out.returncode == 2 and "--wait" in out.stderr


def test_a_data_directory_in_use_is_refused_naming_its_holder(
        daemons: list[Daemon], mesh: str, data_root: Path, tmp_path: Path) -> None:
    alpha = start_node(daemons, "alpha", mesh)
    pid = alpha.proc.pid
    again = cli("node", "--name", "alpha", "--mesh", mesh, timeout=30)
    assert again.returncode != 0
    assert f"pid {pid}" in again.stderr and "Traceback" not in again.stderr, again.stderr
    agent = cli("agent", "worker", "--name", "w2", "--mesh", mesh, "--data-dir",
                str(data_root / mesh / "alpha"), "--workspace", str(tmp_path / "ws"),
                timeout=30)
    assert agent.returncode != 0 and f"pid {pid}" in agent.stderr, agent.stderr
    busy = cli("kg", "stats", "--data-dir", str(data_root / mesh / "alpha"))
    assert busy.returncode == 1 and f"pid {pid}" in busy.stderr, busy.stderr
    # The lock dies with its holder, however it dies.
    alpha.stop(signal.SIGKILL)
    start_node(daemons, "alpha", mesh)


def test_stats_and_peers_from_a_seed_without_discovery(daemons: list[Daemon], mesh: str) -> None:
    alpha = start_node(daemons, "alpha", mesh, "--no-discovery")
    seed = f"127.0.0.1:{alpha.router_port}"
    start_node(daemons, "beta", mesh, "--no-discovery", "--peer", seed)
    alpha.wait_line(lambda line: "peer beta joined" in line, 30, "beta's join")
    net = ("--mesh", mesh, "--no-discovery", "--peer", seed)

    rows = cli("peers", *net, "--json", "--wait", "2")
    assert rows.returncode == 0, rows.stderr
    by_name = {r["name"]: r for r in map(json.loads, rows.stdout.splitlines())}
    assert set(by_name) == {"alpha", "beta"}, rows.stdout
    assert all(r["lost"] == 0 and r["dropped"] == 0 and r["draining"] is False
               for r in by_name.values())
    table = cli("peers", *net, "--wait", "2")
    assert "DRAIN" in table.stdout and "LOST" in table.stdout and "beta" in table.stdout

    view_out = cli("stats", "alpha", *net, "--json")
    assert view_out.returncode == 0, view_out.stderr
    view = json.loads(view_out.stdout)
    assert view["name"] == "alpha" and view["lost"] == 0 and view["dropped"] == 0
    assert [(p["name"], p["state"]) for p in view["peers"]] == [("beta", "alive")]
    assert view["knowledge"]["observations"] == 0 and view["uptime"] > 0
    human = cli("stats", "alpha", *net)
    assert human.returncode == 0 and "PEER" in human.stdout and "beta" in human.stdout

    assert cli("peers", *net, "--wait", "-1").returncode == 2
    missing = cli("stats", "nobody", *net, "--wait", "1")
    assert missing.returncode == 1 and "no agent 'nobody'" in missing.stderr
