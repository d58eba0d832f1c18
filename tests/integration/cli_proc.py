"""Run ``porter-mesh`` commands as processes and read their output with deadlines."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

COMMAND = [sys.executable, "-m", "porter_mesh.cli.main"]


def cli(*args: str, timeout: float = 60, stdin: str | None = None,
        ) -> subprocess.CompletedProcess[str]:
    """Run one command to its end."""
    return subprocess.run([*COMMAND, *args], capture_output=True, text=True, timeout=timeout,
                          input=stdin, env=dict(os.environ, PYTHONUNBUFFERED="1"))


class Running:
    """A long-running command (``tail``, ``node``, ``agent``); its stdout and stderr lines
    are collected by reader threads."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([*COMMAND, *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.out: list[str] = []
        self.err: list[str] = []
        self._new = threading.Condition()
        self._threads = [threading.Thread(target=self._read, args=(s, into), daemon=True)
                         for s, into in ((self.proc.stdout, self.out),
                                         (self.proc.stderr, self.err))]
        for thread in self._threads:
            thread.start()

    def _read(self, stream: object, into: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            with self._new:
                into.append(line.rstrip("\n"))
                self._new.notify_all()
        with self._new:
            self._new.notify_all()

    def wait_until(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait until ``cond()`` holds (it reads ``out``/``err``), or fail saying ``what``."""
        deadline = time.monotonic() + timeout
        with self._new:
            while not cond():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{what}: not within {timeout}s; stdout {self.out!r}"
                                         f" stderr {self.err[-20:]!r}")
                self._new.wait(min(left, 0.5))

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers; join the readers."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for thread in self._threads:
            thread.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


