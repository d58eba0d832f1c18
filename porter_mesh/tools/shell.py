"""Run one shell command for an agent, and make sure nothing of it outlives the call.

Theory of operation
-------------------
The command runs as ``bash -c <command>`` in a new session (so in a new process group
whose id is the shell's pid), with stdin closed (``/dev/null``: a command that waits for
input ends at once instead of hanging) and stdout and stderr merged into one pipe, so
the agent sees them interleaved as a terminal would show them.

One thread does everything: a selector waits on the output pipe and, where the kernel
offers it, on a pidfd of the shell, so exit is noticed at once without polling. Output
goes into a bounded tail buffer: only the last ``tail_bytes`` are kept, and the result
says how many earlier bytes were dropped (the end of a build log or a test run is where
the verdict is). A caller whose verdict comes first (``git diff``) keeps the head
instead (``keep_head``).

The command ends in one of three ways:

* it exits, and no other member of its process group is left: done;
* it exits but leaves background processes in its group (``server &``): they are
  stopped (TERM, then KILL after ``grace`` seconds) because a tool call owns everything
  it started;
* it passes ``timeout``: the whole group gets SIGTERM, then SIGKILL after ``grace``
  seconds if anything is still there.

In every case the call returns only once the group has no live member left (zombies
waiting for their parent to reap them are not live), so a runaway ``yes``, a ``sleep``
or a child that ignores SIGTERM is gone within ``timeout + grace`` (plus the short time
SIGKILL takes). A process that leaves the group on purpose (``setsid``) is out of
reach of a group kill; that is the documented limit of this runner, which is a guard
against runaway commands, not a sandbox.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from porter_mesh.errors import ToolError

__all__ = [
    "DEFAULT_GRACE",
    "DEFAULT_TAIL_BYTES",
    "CommandResult",
    "group_alive",
    "run_command",
    "stop_group",
]

#: Seconds between SIGTERM and SIGKILL.
DEFAULT_GRACE: Final = 2.0

#: Bytes of output kept (the end of it). 16 KiB is about 4,000 tokens of model context.
DEFAULT_TAIL_BYTES: Final = 16 * 1024

#: How long to wait for the pipe to close after the shell exited before treating the
#: processes still holding it as left-behind background processes.
_LINGER: Final = 0.25

#: Poll interval for group membership while waiting for it to empty (no event exists).
_GROUP_POLL: Final = 0.01

#: Extra time allowed after SIGKILL for the kernel to tear the group down.
_KILL_SETTLE: Final = 2.0

_READ_CHUNK: Final = 65536

#: Environment overrides that keep common tools non-interactive.
_QUIET_ENV: Final[Mapping[str, str]] = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "GIT_TERMINAL_PROMPT": "0",
    "TERM": "dumb",
}


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a command did.

    Attributes:
        command: the command line as given.
        exit_status: the shell's exit status; negative ``-N`` when signal ``N`` ended it.
        output: the kept tail of stdout and stderr, decoded as UTF-8 (invalid bytes are
            replaced).
        dropped_bytes: bytes of earlier output that were not kept.
        timed_out: the command passed its timeout and was stopped.
        killed: SIGKILL was needed (something ignored SIGTERM during the grace period).
        stopped_leftovers: processes the command left running in the background were
            stopped after it exited.
        duration: wall time of the call in seconds (monotonic clock).
        timeout: the timeout the command ran under, in seconds.
        pgid: the process group the command ran in (all of it is gone by now).
        kept_head: ``output`` is the beginning of the output, and ``dropped_bytes``
            came after it.
    """

    command: str
    exit_status: int
    output: str
    dropped_bytes: int
    timed_out: bool
    killed: bool
    stopped_leftovers: bool
    duration: float
    timeout: float
    pgid: int
    kept_head: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0 on its own."""
        return self.exit_status == 0 and not self.timed_out

    def status_line(self) -> str:
        """One line saying how the command ended, for the agent and the log."""
        if self.timed_out:
            how = "SIGKILL" if self.killed else "SIGTERM"
            line = f"[timed out after {self.timeout:g}s; process group stopped with {how}]"
        elif self.exit_status < 0:
            line = f"[killed by signal {_signal_name(-self.exit_status)}]"
        else:
            line = f"[exit status {self.exit_status}]"
        if self.stopped_leftovers and not self.timed_out:
            line += " [background processes it left running were stopped]"
        return line

    def render(self) -> str:
        """The result as the agent sees it: output tail, truncation mark, status line."""
        parts: list[str] = []
        if self.dropped_bytes and not self.kept_head:
            parts.append(
                f"[... {self.dropped_bytes} earlier bytes of output dropped; "
                f"the last {len(self.output.encode())} bytes follow ...]"
            )
        if self.output:
            parts.append(self.output.rstrip("\n"))
        if self.dropped_bytes and self.kept_head:
            parts.append(
                f"[... the first {len(self.output.encode())} bytes are shown; "
                f"{self.dropped_bytes} later bytes of output dropped ...]"
            )
        parts.append(self.status_line())
        return "\n".join(parts)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


class _Tail:
    """A byte buffer that keeps only the last ``limit`` bytes (or the first, ``head``)
    and counts the rest."""

    def __init__(self, limit: int, *, head: bool = False) -> None:
        self.limit = limit
        self.head = head
        self.buf = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        if self.head:
            room = max(0, self.limit - len(self.buf))
            self.buf += chunk[:room]
            self.dropped += len(chunk) - min(room, len(chunk))
            return
        self.buf += chunk
        excess = len(self.buf) - self.limit
        if excess > 0:
            del self.buf[:excess]
            self.dropped += excess


def group_alive(pgid: int) -> bool:
    """Tell whether process group ``pgid`` has a member that is not a zombie.

    Args:
        pgid: a process group id.

    Returns:
        ``False`` once no process of the group is left, or only zombies are.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        # A member exists but belongs to someone else: it is alive, and not ours to end.
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    # killpg(0) also succeeds for zombies; /proc tells them apart (state "Z").
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command name: state ppid pgrp ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(pgid: int) -> None:
    """Ask a running command's process group to stop (SIGTERM), from any thread.

    :func:`run_command` then sees the command end and returns as usual, killing what
    is left after its grace period.

    Args:
        pgid: the group id reported through ``on_start``.
    """
    _signal_group(pgid, signal.SIGTERM)


def _wait_group_gone(pgid: int, deadline: float) -> bool:
    while group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_GROUP_POLL)
    return True


class _Runner:
    """State of one running command; see the module docstring for the phases."""

    def __init__(self, proc: subprocess.Popen[bytes], tail_bytes: int, *,
                 keep_head: bool = False) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.pgid = proc.pid  # a session leader's pid is its group id
        self.fd = proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.tail = _Tail(tail_bytes, head=keep_head)
        self.eof = False
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.fd, selectors.EVENT_READ, "out")
        self.pidfd: int | None = None
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is not None:
            try:
                self.pidfd = pidfd_open(proc.pid)
            except OSError:
                self.pidfd = None
        if self.pidfd is not None:
            self.sel.register(self.pidfd, selectors.EVENT_READ, "exit")

    def close(self) -> None:
        self.sel.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def _read_available(self) -> None:
        while not self.eof:
            try:
                chunk = os.read(self.fd, _READ_CHUNK)
            except BlockingIOError:
                return
            if not chunk:
                self.eof = True
                self.sel.unregister(self.fd)
                return
            self.tail.add(chunk)

    def pump(self, deadline: float, *, until_exit: bool) -> None:
        """Read output until the deadline, or until the shell exits (``until_exit``)
        or the pipe closes (otherwise)."""
        while True:
            if until_exit and self.exited():
                self._read_available()
                return
            if not until_exit and self.eof:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            wait = remaining
            if self.pidfd is None and until_exit:
                wait = min(wait, 0.02)  # no exit event from the kernel: poll for it
            if self.eof and self.pidfd is None:
                time.sleep(min(wait, 0.02))
                continue
            for key, _ in self.sel.select(wait):
                if key.data == "out":
                    self._read_available()
                elif self.pidfd is not None:
                    # The shell exited: stop watching the pidfd (it stays readable).
                    self.sel.unregister(self.pidfd)
                    os.close(self.pidfd)
                    self.pidfd = None

    def stop_group(self, grace: float) -> bool:
        """TERM the group, KILL it after ``grace``; returns True if KILL was needed."""
        _signal_group(self.pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        self.pump(deadline, until_exit=True)
        if _wait_group_gone(self.pgid, deadline):
            return False
        _signal_group(self.pgid, signal.SIGKILL)
        return True


def run_command(
    command: str,
    *,
    cwd: str | os.PathLike[str],
    timeout: float,
    grace: float = DEFAULT_GRACE,
    tail_bytes: int = DEFAULT_TAIL_BYTES,
    env: Mapping[str, str] | None = None,
    on_start: Callable[[int], None] | None = None,
    keep_head: bool = False,
) -> CommandResult:
    """Run ``command`` with ``bash -c`` in ``cwd`` and return what it did.

    Args:
        command: the shell command line.
        cwd: the directory to run in (the agent's workspace).
        timeout: seconds before the command's process group is stopped; must be > 0.
        grace: seconds between SIGTERM and SIGKILL.
        tail_bytes: how many bytes of the end of the output to keep.
        env: the environment; the current one when ``None``. Variables that keep
            pagers and prompts out of the way are added either way.
        on_start: called with the command's process group id once it runs, so that
            another thread can stop it early (see :func:`stop_group`).
        keep_head: keep the first ``tail_bytes`` of the output instead of the last.

    Returns:
        A :class:`CommandResult`. When it returns, no process of the command's group is
        alive.

    Raises:
        ToolError: the command is empty, an argument is out of range, or the shell
            cannot be started.
    """
    if not command.strip():
        raise ToolError("bash: the command is empty; pass the shell command to run")
    if "\x00" in command:
        raise ToolError("bash: the command contains a NUL byte; remove it")
    if not timeout > 0:
        raise ToolError(f"bash: timeout must be a positive number of seconds, got {timeout}")
    if grace < 0 or tail_bytes <= 0:
        raise ToolError("bash: grace must be >= 0 and tail_bytes > 0")
    full_env = dict(os.environ if env is None else env)
    full_env.update(_QUIET_ENV)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=os.fspath(cwd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env=full_env,
        )
    except OSError as exc:
        raise ToolError(f"bash: could not start the shell: {exc}") from exc
    runner = _Runner(proc, tail_bytes, keep_head=keep_head)
    timed_out = killed = leftovers = False
    try:
        if on_start is not None:
            on_start(runner.pgid)
        runner.pump(start + timeout, until_exit=True)
        if not runner.exited():
            timed_out = True
            killed = runner.stop_group(grace)
        else:
            # The shell is done; wait briefly for the pipe to close. If it stays open
            # or the group still has members, they are left-behind background jobs.
            runner.pump(min(start + timeout, time.monotonic() + _LINGER), until_exit=False)
            if group_alive(runner.pgid):
                leftovers = True
                killed = runner.stop_group(grace)
    finally:
        # Whatever happened above (including an exception), leave nothing running.
        if group_alive(runner.pgid):
            _signal_group(runner.pgid, signal.SIGKILL)
        proc.wait()
        _wait_group_gone(runner.pgid, time.monotonic() + _KILL_SETTLE)
        runner.pump(time.monotonic() + _LINGER, until_exit=False)
        runner.close()
    returncode = proc.returncode
    return CommandResult(
        command=command,
        exit_status=returncode,
        output=bytes(runner.tail.buf).decode("utf-8", errors="replace"),
        dropped_bytes=runner.tail.dropped,
        timed_out=timed_out,
        killed=killed,
        stopped_leftovers=leftovers,
        duration=time.monotonic() - start,
        timeout=timeout,
        pgid=runner.pgid,
        kept_head=keep_head,
    )
