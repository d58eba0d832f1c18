"""Many real ``porter-mesh node`` processes for the scale benchmark, watched through
their own words.

A bare node prints its roster changes on stderr (``peer X joined``, ``peer X evasive``,
``peer X left (expired)``...). One reader thread reads every node's stderr through a
selector and stamps each line with ``time.monotonic()`` as it arrives, so each node's
own roster, and the time it changed, is known without asking: :meth:`Fleet.wait`
waits (with a deadline) until a condition over those rosters holds.

Processes are ended by their pid only: SIGTERM (a node leaves with a goodbye), then
SIGKILL for one that has not ended within the grace period.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_UP = re.compile(r"^node (\S+) up: pub (\d+) router (\d+)")
_PEER = re.compile(r"^peer (\S+) (joined|evasive|alive|left|clock-skew|updated)(?: \((.*)\))?$")
#: Roster changes that mean a peer was thought silent (flapping, when it was healthy).
FLAP_KINDS = frozenset({"evasive", "left"})


@dataclass
class PeerChange:
    """One roster change a node reported: when (monotonic), what, about whom."""

    t: float
    kind: str
    peer: str
    reason: str


@dataclass
class NodeProc:
    """One node process and what it said about itself and its roster."""

    name: str
    host: str
    address: str
    router_port: int
    proc: subprocess.Popen[bytes]
    spawned_at: float
    up_at: float | None = None
    roster: set[str] = field(default_factory=set)
    changes: list[PeerChange] = field(default_factory=list)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=20))
    _partial: bytes = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def seed(self) -> str:
        return f"{self.address}:{self.router_port}"


class Fleet:
    """Node processes started with :meth:`spawn`, their stderr read by one thread."""

    def __init__(self) -> None:
        self.nodes: list[NodeProc] = []
        self._by_fd: dict[int, NodeProc] = {}
        self._selector = selectors.DefaultSelector()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._read, name="fleet-reader", daemon=True)
        self._thread.start()

    def spawn(self, name: str, argv: Sequence[str], *, host: str, address: str,
              router_port: int, env: dict[str, str] | None = None) -> NodeProc:
        """Start ``argv`` (a node command, possibly behind ``ip netns exec``)."""
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=env, cwd=Path(__file__).resolve().parents[1])
        assert proc.stderr is not None
        os.set_blocking(proc.stderr.fileno(), False)
        node = NodeProc(name, host, address, router_port, proc, time.monotonic())
        with self._cond:
            self.nodes.append(node)
            self._by_fd[proc.stderr.fileno()] = node
            self._selector.register(proc.stderr, selectors.EVENT_READ)
        return node

    def _read(self) -> None:
        while not self._closed:
            with self._cond:
                have = bool(self._by_fd)
            if not have:
                time.sleep(0.05)  # nothing to read yet; the reader only idles here
                continue
            for key, _ in self._selector.select(timeout=0.2):
                fd = key.fd
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                now = time.monotonic()
                with self._cond:
                    node = self._by_fd.get(fd)
                    if node is None:
                        continue
                    if not chunk:
                        self._selector.unregister(key.fileobj)
                        del self._by_fd[fd]
                    else:
                        self._lines(node, chunk, now)
                    self._cond.notify_all()

    def _lines(self, node: NodeProc, chunk: bytes, now: float) -> None:
        data = node._partial + chunk
        *lines, node._partial = data.split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace").rstrip()
            up = _UP.match(line)
            if up is not None:
                node.up_at = now
                continue
            peer = _PEER.match(line)
            if peer is None:
                node.tail.append(line)
                continue
            name, kind, reason = peer.group(1), peer.group(2), peer.group(3) or ""
            node.changes.append(PeerChange(now, kind, name, reason))
            if kind == "joined":
                node.roster.add(name)
            elif kind == "left":
                node.roster.discard(name)

    def wait(self, done: Callable[[], bool], timeout: float, what: str) -> float:
        """Wait until ``done()`` holds (checked on every line read); return the time
        (monotonic) of the line that made it hold.

        Raises:
            TimeoutError: not within ``timeout`` seconds; the message says what and
                shows what the nodes said last.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if done():
                    return time.monotonic()
                dead = [n for n in self.nodes if n.proc.poll() is not None]
                if dead:
                    raise RuntimeError(f"{what}: node {dead[0].name} ended with status "
                                       f"{dead[0].proc.returncode}: {list(dead[0].tail)[-5:]}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{what}: not within {timeout:.0f}s; "
                                       + self.describe())
                self._cond.wait(min(left, 0.5))

    def last_change(self) -> float:
        """The time of the latest roster change of any node (or its start)."""
        with self._cond:
            return max([c.t for n in self.nodes for c in n.changes]
                       + [n.up_at or n.spawned_at for n in self.nodes])

    def full(self, nodes: Sequence[NodeProc] | None = None) -> bool:
        """Every node is up and its own roster holds every other node of the fleet."""
        names = {n.name for n in self.nodes}
        return all(n.up_at is not None and n.roster >= names - {n.name}
                   for n in (self.nodes if nodes is None else nodes))

    def describe(self) -> str:
        """Who is missing what (for error messages)."""
        names = {n.name for n in self.nodes}
        short = [(n.name, len(names - {n.name} - n.roster)) for n in self.nodes
                 if names - {n.name} - n.roster or n.up_at is None]
        down = sum(1 for n in self.nodes if n.up_at is None)
        return (f"{down} node(s) not up; {len(short)} node(s) short of peers, e.g. "
                f"{short[:5]}")

    def flaps(self, since: float, until: float) -> list[tuple[str, PeerChange]]:
        """Evasive and left events reported between ``since`` and ``until``."""
        with self._cond:
            return [(n.name, c) for n in self.nodes for c in n.changes
                    if since <= c.t <= until and c.kind in FLAP_KINDS]

    def stop(self, grace: float = 15.0) -> list[str]:
        """End every process by its pid: SIGTERM, then SIGKILL after ``grace`` seconds.

        Returns:
            Problems (a process that needed SIGKILL, or would not end).
        """
        problems = []
        for node in self.nodes:
            if node.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(node.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for node in self.nodes:
            try:
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                problems.append(f"{node.name} (pid {node.pid}) ignored SIGTERM; killed")
                node.proc.kill()
                try:
                    node.proc.wait(10)
                except subprocess.TimeoutExpired:
                    problems.append(f"{node.name} (pid {node.pid}) did not end")
        return problems

    def close(self) -> None:
        """Stop reading (after :meth:`stop`)."""
        self._closed = True
        self._thread.join(5)
        for node in self.nodes:
            if node.proc.stderr is not None:
                node.proc.stderr.close()
        self._selector.close()


# -- what a process costs, read from /proc ---------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def memory(pid: int) -> dict[str, float]:
    """Resident (RSS), proportional (PSS: shared pages split among their users) and
    private (USS) memory of a process, in MB."""
    values: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[-1] == "kB":
                values[key] = int(parts[0])
    mb = 1024.0
    return {"rss": values.get("Rss", 0) / mb, "pss": values.get("Pss", 0) / mb,
            "uss": (values.get("Private_Clean", 0) + values.get("Private_Dirty", 0)) / mb}


def net_counters(pid: int) -> dict[str, int]:
    """IP and transport counters of the network namespace ``pid`` runs in:
    ``OutOctets``, ``OutMcastOctets`` (IpExt), ``OutSegs`` (Tcp), ``OutDatagrams`` (Udp).
    Each namespace has its own counters, so a lab host's traffic is counted apart."""
    out: dict[str, int] = {}
    for table, prefix, keys in (("netstat", "IpExt", ("OutOctets", "OutMcastOctets")),
                                ("snmp", "Tcp", ("OutSegs",)),
                                ("snmp", "Udp", ("OutDatagrams",))):
        with open(f"/proc/{pid}/net/{table}") as f:
            rows = [line.split() for line in f if line.startswith(prefix + ":")]
        header, values = rows[0], rows[1]
        for key in keys:
            out[key] = int(values[header.index(key)])
    return out


def python_command(module: str, *args: str) -> list[str]:
    """``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def counters_delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}


def total(values: Sequence[dict[str, Any]], key: str) -> float:
    return float(sum(v[key] for v in values))
