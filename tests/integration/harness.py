"""Run mesh nodes as real OS processes and wait on what they report (never on sleeps)."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from porter_mesh.node.node import Node

NODE_PROC = Path(__file__).with_name("node_proc.py")
Event = dict[str, Any]


class NodeProcess:
    """One ``node_proc.py`` process; its stdout events are collected by a reader thread."""

    _tags = 0  # the last command tag used by ask()

    def __init__(self, name: str, *extra: str, mesh: str = "test",
                 prefix: Sequence[str] = (), script: Path = NODE_PROC) -> None:
        self.name = name
        cmd = [*prefix, sys.executable, str(script), "--name", name, "--mesh", mesh, *extra]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env,
        )
        self.events: list[Event] = []
        self._queue: queue.Queue[Event | None] = queue.Queue()
        self._stderr: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()
        self._cursor = 0
        self.up = self.wait_for(lambda e: e["ev"] == "up", 20, "start-up")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self._queue.put(orjson.loads(line))
            except orjson.JSONDecodeError:
                continue
        self._queue.put(None)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    @property
    def stderr(self) -> str:
        return b"".join(self._stderr).decode(errors="replace")

    def _pump(self, timeout: float) -> bool:
        try:
            item = self._queue.get(timeout=timeout)
        except queue.Empty:
            return True
        if item is None:
            self._queue.put(None)
            return False
        self.events.append(item)
        return True

    def wait_for(self, pred: Callable[[Event], bool], timeout: float,
                 what: str = "event") -> Event:
        """The first event (from the start of this process) matching ``pred``."""
        deadline = time.monotonic() + timeout
        i = 0
        while True:
            while i < len(self.events):
                if pred(self.events[i]):
                    return self.events[i]
                i += 1
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.name}: no {what} within {timeout}s; "
                                     f"last events {self.events[-5:]}; "
                                     f"stderr: {self.stderr[-2000:]}")
            if not self._pump(min(left, 0.1)) and i >= len(self.events):
                raise AssertionError(f"{self.name} exited (rc={self.proc.poll()}) before {what}; "
                                     f"stderr: {self.stderr[-2000:]}")

    def wait_until(self, cond: Callable[[list[Event]], bool], timeout: float,
                   what: str = "condition") -> None:
        """Pump events until ``cond(all events)`` holds."""
        deadline = time.monotonic() + timeout
        while not cond(self.events):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"{self.name}: {what} not reached within {timeout}s; "
                                     f"last events {self.events[-5:]}; "
                                     f"stderr: {self.stderr[-2000:]}")
            if not self._pump(min(left, 0.1)):
                if not cond(self.events):
                    raise AssertionError(f"{self.name} exited before {what}; "
                                         f"stderr: {self.stderr[-2000:]}")
                return

    def watch(self, seconds: float, forbid: Callable[[Event], bool], what: str) -> None:
        """Read events for ``seconds`` (a fault held for that long) and fail at once if
        one matches ``forbid``."""
        deadline = time.monotonic() + seconds
        i = len(self.events)
        while (left := deadline - time.monotonic()) > 0:
            alive = self._pump(min(left, 0.1))
            for event in self.events[i:]:
                if forbid(event):
                    raise AssertionError(f"{self.name}: {what}: {event}")
            i = len(self.events)
            if not alive:
                raise AssertionError(f"{self.name} exited while {what!r} was watched; "
                                     f"stderr: {self.stderr[-2000:]}")

    def ask(self, op: str, ev: str, timeout: float = 30.0, **cmd: Any) -> Event:
        """Send a command and wait for its answer (matched by tag).

        Raises:
            AssertionError: the process reported an error, died, or did not answer.
        """
        self._tags += 1
        tag = self._tags
        self.command(op=op, tag=tag, **cmd)
        event = self.wait_for(lambda e: e["ev"] in (ev, "error") and e.get("tag") == tag,
                              timeout, f"answer to {op}")
        if event["ev"] == "error":
            raise AssertionError(f"{self.name}: {op} failed: {event}")
        return event

    def command(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(orjson.dumps(cmd) + b"\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            try:
                self.command(op="quit")
                self.proc.wait(timeout)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        self._reader.join(5)
        self._err_reader.join(5)

    def messages(self) -> list[Event]:
        return [e for e in self.events if e["ev"] == "msg"]


def peers_seen(events: list[Event]) -> set[str]:
    """Names currently on a process's roster, from its peer events."""
    current: set[str] = set()
    for e in events:
        if e["ev"] != "peer":
            continue
        if e["kind"] == "joined":
            current.add(e["peer"])
        elif e["kind"] == "left":
            current.discard(e["peer"])
    return current


@contextlib.asynccontextmanager
async def seeded_by(first: Node, name: str, **options: Any) -> AsyncIterator[Node]:
    """A node ``name`` in this process, seeded with the ROUTER of ``first`` (started
    already) on the same mesh, started and on each other's roster; closed on the way
    out. ``options``: more of the node's settings (discovery is off, no channels)."""
    second = Node(name=name, mesh=first.config.mesh, discovery=False,
                  **{"channels": (), **options},
                  seeds=(f"127.0.0.1:{first.router_port}",))
    async with second:
        await second.wait_for_peers([first.name], 30)
        await first.wait_for_peers([name], 30)
        yield second
