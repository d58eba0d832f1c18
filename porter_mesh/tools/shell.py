"""Run one shell command for an agent, and make sure nothing of it outlives the call.

Theory of operation
-------------------
The command runs as ``bash -c <command>`` in a new session, with stdin closed
(``/dev/null``: a command that waits for input ends at once instead of hanging) and
stdout and stderr merged into one pipe, so the agent sees them interleaved as a
terminal would show them.

**Containment.** A process group is not enough to find what a command started: ``set
-m`` gives background jobs groups of their own, ``setsid`` and daemons leave the session,
and a group kill misses all of them. So every command is *contained*, in one of two
ways, and the runner kills by containment, not by group:

* **cgroup** (where a cgroup v2 hierarchy is mounted and a child cgroup of this
  process's own cgroup can be created and entered): each command gets a cgroup of its
  own, ``porter-mesh-<pid>-<n>``. A small bash prologue writes its own pid into the
  cgroup's ``cgroup.procs`` and tells the runner so before it ``exec``s the command, so
  the command and everything it ever forks are in the cgroup from the first
  instruction; no fork can race past it and no session change leaves it. The members
  are ``cgroup.procs``; they are stopped with SIGTERM one by one and then killed all at
  once with ``cgroup.kill`` (or, on kernels without it, by freezing the cgroup and
  SIGKILLing each member until none is left). The cgroup is removed afterwards.
* **subreaper** (everywhere else, and when ``PORTER_MESH_CONTAINMENT=subreaper``): the
  command runs under a tiny supervisor process (:mod:`._subreaper`) that has
  ``PR_SET_CHILD_SUBREAPER`` set, so every process the command orphans is re-parented to
  the supervisor instead of init. The members are all live descendants of the
  supervisor, found by walking ``/proc``; the runner signals each of them, and the
  supervisor reaps them and exits once it has no child left, which is the event that
  says the command is entirely gone. The shell's exit status comes from the
  supervisor on a status pipe.

One thread does everything: a selector waits on the output pipe, on the shell's exit
(a pidfd, or the supervisor's status pipe) and on a wake-up pipe through which another
thread asks the command to stop (:meth:`CommandHandle.stop`). Output goes into a bounded
tail buffer: only the last ``tail_bytes`` are kept, and the result says how many
earlier bytes were dropped (the end of a build log or a test run is where the verdict
is). A caller whose verdict comes first (``git diff``) keeps the head instead
(``keep_head``).

The command ends in one of four ways:

* it exits, and nothing it started is left: done;
* it exits but leaves processes running (``server &``, a daemon): they are stopped
  (TERM, then KILL after ``grace`` seconds) because a tool call owns everything it
  started;
* it passes ``timeout``, or another thread asks it to stop: every process it started
  gets SIGTERM, then SIGKILL after ``grace`` seconds if anything is still there.

In every case the call returns only once no process of the command is alive, and the
result says how many processes were stopped, how many needed SIGKILL and how many had
left the command's process group (so had escaped a group kill). Zombies are not alive.

**Limits.** A command running as root can move itself out of its cgroup, or kill the
supervisor and so escape the subreaper; this runner is a guard against runaway
commands, not a sandbox.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from porter_mesh.errors import ConfigError, ToolError

__all__ = [
    "CONTAINMENTS",
    "CONTAINMENT_ENV",
    "DEFAULT_GRACE",
    "DEFAULT_TAIL_BYTES",
    "CommandHandle",
    "CommandResult",
    "cgroup_base",
    "run_command",
]

_log = logging.getLogger("porter_mesh.tools")

#: Seconds between SIGTERM and SIGKILL.
DEFAULT_GRACE: Final = 2.0

#: Bytes of output kept (the end of it). 16 KiB is about 4,000 tokens of model context.
DEFAULT_TAIL_BYTES: Final = 16 * 1024

#: Environment variable that picks the containment: ``auto`` (a cgroup where possible,
#: else the subreaper), ``cgroup`` (fail if none can be made) or ``subreaper``.
CONTAINMENT_ENV: Final = "PORTER_MESH_CONTAINMENT"

#: The containment settings :func:`run_command` accepts.
CONTAINMENTS: Final = ("auto", "cgroup", "subreaper")

#: How long to wait for the pipe to close after the shell exited before treating the
#: processes still holding it as left-behind background processes.
_LINGER: Final = 0.25

#: Poll interval while waiting for a command's processes to be gone (no event exists
#: for "this set of pids is empty" short of the supervisor's exit).
_MEMBER_POLL: Final = 0.01

#: Extra time allowed after SIGKILL for the kernel to tear everything down.
_KILL_SETTLE: Final = 5.0

#: How long a prologue or supervisor may take to say it is in place.
_START_TIMEOUT: Final = 10.0

_READ_CHUNK: Final = 65536

#: Environment overrides that keep common tools non-interactive.
_QUIET_ENV: Final[Mapping[str, str]] = {
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "GIT_TERMINAL_PROMPT": "0",
    "TERM": "dumb",
}

#: The cgroup prologue: enter the cgroup (``$0`` is its ``cgroup.procs``), say so on the
#: handshake pipe (fd ``$1``), close it, and become the command's shell (``$2``).
_CGROUP_PROLOGUE: Final = (
    '{ echo $$ > "$0"; } 2>/dev/null || exit 125; '
    'printf in >&"$1"; eval "exec $1>&-"; exec bash -c "$2"'
)

_SUBREAPER_SCRIPT: Final = Path(__file__).with_name("_subreaper.py")


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
        pgid: the process group the shell ran in (the shell's pid).
        containment: ``cgroup`` or ``subreaper`` (see the module docstring).
        stopped: pids of the processes the runner stopped (all gone by now).
        sigkilled: those of them still alive when SIGKILL was sent.
        outside_group: how many of the stopped processes had left the shell's process
            group (``set -m`` jobs, ``setsid``, daemons): what a group kill would miss.
        stop_reason: why another thread stopped the command (``None`` if none did).
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
    containment: str = "cgroup"
    stopped: tuple[int, ...] = ()
    sigkilled: tuple[int, ...] = ()
    outside_group: int = 0
    stop_reason: str | None = None
    kept_head: bool = False

    @property
    def ok(self) -> bool:
        """True when the command exited with status 0 on its own."""
        return self.exit_status == 0 and not self.timed_out and self.stop_reason is None

    def _stop_note(self) -> str:
        count = len(self.stopped)
        if not count:
            return "nothing was left to stop"
        how = "SIGTERM"
        if self.sigkilled:
            how += f", then SIGKILL for {len(self.sigkilled)}"
        if self.outside_group:
            how += f"; {self.outside_group} had left its process group"
        return f"{count} process{'es' if count != 1 else ''} ({how})"

    def status_line(self) -> str:
        """One line saying how the command ended, for the agent and the log."""
        if self.timed_out:
            return f"[timed out after {self.timeout:g}s; stopped {self._stop_note()}]"
        if self.exit_status < 0:
            line = f"[killed by signal {_signal_name(-self.exit_status)}]"
        else:
            line = f"[exit status {self.exit_status}]"
        if self.stop_reason is not None:
            line += f" [{self.stop_reason}; stopped {self._stop_note()}]"
        elif self.stopped_leftovers:
            line += f" [background processes it left running were stopped: " \
                    f"{self._stop_note()}]"
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


# -- /proc ---------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, ppid, pgrp)`` of a process, or ``None`` once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    # Fields after the parenthesised command name: state ppid pgrp ...
    fields = raw[raw.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1]), int(fields[2])


def _live(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def _descendants(root: int) -> list[int]:
    """Live descendants of ``root`` (not ``root`` itself), from one walk of ``/proc``."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        st = _stat(pid)
        if st is not None and st[0] not in ("Z", "X"):
            children.setdefault(st[1], []).append(pid)
    found: list[int] = []
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _signal_each(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


# -- cgroup v2 -----------------------------------------------------------------------------


@dataclass(slots=True)
class _CgroupProbe:
    base: Path | None = None
    reason: str = ""
    done: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    names: itertools.count[int] = field(default_factory=itertools.count)


_PROBE: Final = _CgroupProbe()


def _find_cgroup_base() -> tuple[Path | None, str]:
    """This process's own cgroup v2 directory, if a child cgroup can be made in it."""
    try:
        own = next(
            line[3:].strip()
            for line in Path("/proc/self/cgroup").read_text().splitlines()
            if line.startswith("0::")
        )
    except (OSError, StopIteration):
        return None, "this process is in no cgroup v2 hierarchy"
    mounts: list[tuple[str, str]] = []  # (mount root inside the hierarchy, mount point)
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            if right.split()[:1] == ["cgroup2"]:
                parts = left.split()
                mounts.append((parts[3], parts[4]))
    except OSError:
        return None, "cannot read /proc/self/mountinfo"
    if not mounts:
        return None, "no cgroup2 file system is mounted"
    mounts.sort(key=lambda m: m[1] != "/sys/fs/cgroup")  # the usual place first
    for root, point in mounts:
        if own != root and not own.startswith(root.rstrip("/") + "/"):
            continue
        base = Path(point, own[len(root.rstrip("/")) :].lstrip("/"))
        if not os.access(base / "cgroup.procs", os.W_OK):
            continue
        probe = base / f"porter-mesh-{os.getpid()}-probe"
        try:
            probe.mkdir()
            probe.rmdir()
        except OSError as exc:
            return None, f"cannot create a cgroup under {base}: {exc.strerror}"
        _remove_stale(base)
        return base, ""
    return None, f"this process's cgroup {own} is not writable in any cgroup2 mount"


def _remove_stale(base: Path) -> None:
    """Remove empty command cgroups left by agents that died mid-command."""
    with contextlib.suppress(OSError):
        for entry in base.iterdir():
            name = entry.name.split("-")
            if len(name) != 4 or name[:2] != ["porter", "mesh"] or not name[2].isdigit():
                continue
            if not Path(f"/proc/{name[2]}").exists():
                with contextlib.suppress(OSError):
                    entry.rmdir()


def cgroup_base() -> tuple[Path | None, str]:
    """Where command cgroups are made: ``(directory, "")``, or ``(None, reason)``.

    Probed once per process: cgroup v2 must be mounted, this process's own cgroup must
    be writable, and a child cgroup must be creatable there.
    """
    probe = _PROBE
    with probe.lock:
        if not probe.done:
            probe.base, probe.reason = _find_cgroup_base()
            probe.done = True
        return probe.base, probe.reason


def _cgroup_unusable(reason: str) -> None:
    with _PROBE.lock:
        _PROBE.base, _PROBE.reason, _PROBE.done = None, reason, True
    _log.warning("command cgroups disabled: %s; using the subreaper instead", reason)


# -- the contained command -------------------------------------------------------------------


class _Contained:
    """A started command and the set of processes it owns (one of two kinds)."""

    mode = ""

    def __init__(self, proc: subprocess.Popen[bytes], shell_pid: int) -> None:
        self.proc = proc
        self.shell_pid = shell_pid
        self.exit_status: int | None = None  # set once the shell has ended
        self.exit_fd: int | None = None  # readable when the shell ends

    def members(self) -> list[int]:
        """Pids of the command's live processes."""
        raise NotImplementedError

    def kill_all(self) -> None:
        """SIGKILL every member, at once where the kernel can."""
        raise NotImplementedError

    def on_exit_event(self) -> bool:
        """``exit_fd`` became readable; True when it has nothing more to say."""
        raise NotImplementedError

    def close_exit_fd(self) -> None:
        """Release ``exit_fd`` (the runner has stopped watching it)."""
        if self.exit_fd is not None:
            os.close(self.exit_fd)
            self.exit_fd = None

    def shell_exited(self) -> bool:
        """The shell has ended (its status is known)."""
        raise NotImplementedError

    def finish(self, deadline: float) -> None:
        """Everything is gone or killed: reap and release what the containment holds."""
        raise NotImplementedError


class _CgroupCommand(_Contained):
    mode = "cgroup"

    def __init__(self, proc: subprocess.Popen[bytes], path: Path) -> None:
        super().__init__(proc, proc.pid)
        self.path = path
        self.procs = path / "cgroup.procs"
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is not None:
            with contextlib.suppress(OSError):
                self.exit_fd = pidfd_open(proc.pid)

    def members(self) -> list[int]:
        try:
            listed = self.procs.read_text().split()
        except FileNotFoundError:
            return []
        return [pid for pid in map(int, listed) if _live(pid)]

    def kill_all(self) -> None:
        kill = self.path / "cgroup.kill"
        if kill.exists():
            kill.write_text("1")
            return
        freeze = self.path / "cgroup.freeze"
        with contextlib.suppress(OSError):
            freeze.write_text("1")  # no member can fork while it is being killed
        deadline = time.monotonic() + _KILL_SETTLE
        while (pids := self.members()) and time.monotonic() < deadline:
            _signal_each(pids, signal.SIGKILL)
            time.sleep(_MEMBER_POLL)
        with contextlib.suppress(OSError):
            freeze.write_text("0")

    def on_exit_event(self) -> bool:
        return self.shell_exited()

    def shell_exited(self) -> bool:
        if self.exit_status is None and self.proc.poll() is not None:
            self.exit_status = self.proc.returncode
        return self.exit_status is not None

    def finish(self, deadline: float) -> None:
        self.proc.wait()
        self.exit_status = self.proc.returncode
        self.close_exit_fd()
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if time.monotonic() >= deadline:
                    _log.warning("could not remove cgroup %s: %s", self.path, exc.strerror)
                    return
                time.sleep(_MEMBER_POLL)


class _SubreaperCommand(_Contained):
    mode = "subreaper"

    def __init__(self, proc: subprocess.Popen[bytes], shell_pid: int, status_fd: int,
                 pending: bytes) -> None:
        super().__init__(proc, shell_pid)
        self.exit_fd = status_fd
        self._buf = pending
        self._parse()

    def _parse(self) -> None:
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            if line.startswith(b"exit "):
                self.exit_status = int(line[5:])

    def members(self) -> list[int]:
        if self.proc.poll() is not None:
            return []  # the supervisor exits only when it has no child left
        return _descendants(self.proc.pid)

    def kill_all(self) -> None:
        deadline = time.monotonic() + _KILL_SETTLE
        while (pids := self.members()) and time.monotonic() < deadline:
            _signal_each(pids, signal.SIGKILL)
            time.sleep(_MEMBER_POLL)

    def on_exit_event(self) -> bool:
        assert self.exit_fd is not None
        chunk = os.read(self.exit_fd, 4096)
        if chunk:
            self._buf += chunk
            self._parse()
            return False
        if self.exit_status is None:  # the supervisor died without a word
            self.exit_status = self.proc.wait()
        return True

    def shell_exited(self) -> bool:
        return self.exit_status is not None

    def finish(self, deadline: float) -> None:
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _log.warning("the command supervisor %d outlived its command; killing it",
                         self.proc.pid)
            self.proc.kill()
            self.proc.wait()
        if self.exit_fd is not None:
            with contextlib.suppress(OSError):
                self._buf += os.read(self.exit_fd, 4096)
                self._parse()
        self.close_exit_fd()
        if self.exit_status is None:
            self.exit_status = self.proc.returncode


def _read_handshake(fd: int, want: Callable[[bytes], bool], proc: subprocess.Popen[bytes]
                    ) -> bytes:
    """Read ``fd`` until ``want(data)`` or EOF; the data read."""
    data = b""
    deadline = time.monotonic() + _START_TIMEOUT
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while not want(data):
            left = deadline - time.monotonic()
            if left <= 0:
                proc.kill()
                proc.wait()
                raise ToolError("bash: the command's shell did not start in time; try again")
            if sel.select(left):
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                data += chunk
    return data


def _popen(argv: list[str], cwd: str, env: Mapping[str, str], pass_fds: tuple[int, ...]
           ) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            pass_fds=pass_fds,
            env=env,
        )
    except OSError as exc:
        raise ToolError(f"bash: could not start the shell: {exc}") from exc


def _start_in_cgroup(command: str, cwd: str, env: Mapping[str, str], base: Path
                     ) -> _CgroupCommand | None:
    """Start the command in a new cgroup; ``None`` if it could not enter one."""
    path = base / f"porter-mesh-{os.getpid()}-{next(_PROBE.names)}"
    try:
        path.mkdir()
    except OSError as exc:
        _cgroup_unusable(f"cannot create {path}: {exc.strerror}")
        return None
    read_end, write_end = os.pipe()
    try:
        proc = _popen(["bash", "-c", _CGROUP_PROLOGUE, str(path / "cgroup.procs"),
                       str(write_end), command], cwd, env, (write_end,))
    except ToolError:
        os.close(read_end)
        path.rmdir()
        raise
    finally:
        os.close(write_end)
    try:
        joined = _read_handshake(read_end, lambda d: d == b"in", proc) == b"in"
    finally:
        os.close(read_end)
    if joined:
        return _CgroupCommand(proc, path)
    proc.wait()  # the prologue exited before running the command
    with contextlib.suppress(OSError):
        path.rmdir()
    _cgroup_unusable(f"a process cannot enter {path}")
    return None


def _start_under_subreaper(command: str, cwd: str, env: Mapping[str, str]
                           ) -> _SubreaperCommand:
    read_end, write_end = os.pipe()
    try:
        proc = _popen([sys.executable, "-I", "-S", str(_SUBREAPER_SCRIPT), str(write_end),
                       command], cwd, env, (write_end,))
    except ToolError:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    try:
        data = _read_handshake(read_end, lambda d: b"\n" in d, proc)
    except ToolError:
        os.close(read_end)
        raise
    first, _, rest = data.partition(b"\n")
    if not first.startswith(b"started "):
        os.close(read_end)
        proc.wait()
        reason = first.decode(errors="replace").removeprefix("error ") or "it exited"
        raise ToolError(f"bash: could not start the command's supervisor: {reason}")
    return _SubreaperCommand(proc, int(first[8:]), read_end, rest)


def _start(command: str, cwd: str, env: Mapping[str, str], containment: str) -> _Contained:
    if containment in ("auto", "cgroup"):
        base, reason = cgroup_base()
        if base is not None:
            started = _start_in_cgroup(command, cwd, env, base)
            if started is not None:
                return started
            reason = _PROBE.reason
        if containment == "cgroup":
            raise ToolError(f"bash: no cgroup for the command: {reason}")
    return _start_under_subreaper(command, cwd, env)


# -- the runner ------------------------------------------------------------------------------


class CommandHandle:
    """A running command, as another thread sees it: its process group and a way to
    stop it (see ``on_start`` of :func:`run_command`)."""

    def __init__(self, pgid: int, containment: str) -> None:
        self.pgid = pgid
        self.containment = containment
        self.reason: str | None = None
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)

    def stop(self, reason: str = "stopped on request") -> None:
        """Ask the command to stop now (SIGTERM to all of it, SIGKILL after the grace
        period). Safe from any thread, and after the command has ended.

        Args:
            reason: shown in the command's result.
        """
        with self._lock:
            if self._wake_w < 0:
                return
            if self.reason is None:
                self.reason = reason
            with contextlib.suppress(BlockingIOError):
                os.write(self._wake_w, b"x")

    def _close(self) -> None:
        with self._lock:
            os.close(self._wake_w)
            os.close(self._wake_r)
            self._wake_w = self._wake_r = -1


class _Runner:
    """State of one running command; see the module docstring for the phases."""

    def __init__(self, tree: _Contained, handle: CommandHandle, tail_bytes: int, *,
                 keep_head: bool = False) -> None:
        assert tree.proc.stdout is not None
        self.tree = tree
        self.handle = handle
        self.fd = tree.proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.tail = _Tail(tail_bytes, head=keep_head)
        self.eof = False
        self.stop_requested = False
        self.stopped: dict[int, None] = {}
        self.sigkilled: dict[int, None] = {}
        self.outside_group = 0
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.fd, selectors.EVENT_READ, "out")
        self.sel.register(handle._wake_r, selectors.EVENT_READ, "wake")
        if tree.exit_fd is not None:
            self.sel.register(tree.exit_fd, selectors.EVENT_READ, "exit")

    def close(self) -> None:
        self.sel.close()
        assert self.tree.proc.stdout is not None
        self.tree.proc.stdout.close()

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

    def pump(self, deadline: float, done: Callable[[], bool], poll: float | None = None
             ) -> bool:
        """Read output and follow events until ``done()`` (True) or the deadline
        (False). ``poll``: how often ``done`` needs checking without an event."""
        tree = self.tree
        if tree.exit_fd is None and not tree.shell_exited():
            poll = min(poll or 0.02, 0.02)  # no exit event from the kernel: poll for it
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            for key, _ in self.sel.select(min(remaining, poll or remaining)):
                if key.data == "out":
                    self._read_available()
                elif key.data == "wake":
                    os.read(self.handle._wake_r, 64)
                    self.stop_requested = True
                elif tree.on_exit_event():
                    # A pidfd stays readable once the shell exited; a status pipe at
                    # its end has nothing more to say.
                    self.sel.unregister(key.fd)
                    tree.close_exit_fd()
        return True

    def _note(self, pids: Iterable[int]) -> list[int]:
        fresh = [pid for pid in pids if pid not in self.stopped]
        for pid in fresh:
            self.stopped[pid] = None
            st = _stat(pid)
            if st is not None and st[2] != self.tree.shell_pid:
                self.outside_group += 1
        return fresh

    def stop_all(self, grace: float) -> None:
        """TERM every member, KILL what is left after ``grace``."""
        tree = self.tree
        deadline = time.monotonic() + grace
        while True:
            pids = tree.members()
            if not pids:
                return
            _signal_each(self._note(pids), signal.SIGTERM)
            # Processes forked after the TERM get it too, until the grace period ends.
            if self.pump(min(deadline, time.monotonic() + 0.1), lambda: not tree.members(),
                         _MEMBER_POLL):
                return
            if time.monotonic() >= deadline:
                break
        self.kill_rest()

    def kill_rest(self) -> None:
        tree = self.tree
        pids = tree.members()
        if not pids:
            return
        self._note(pids)
        self.sigkilled.update(dict.fromkeys(pids))
        tree.kill_all()


def run_command(
    command: str,
    *,
    cwd: str | os.PathLike[str],
    timeout: float,
    grace: float = DEFAULT_GRACE,
    tail_bytes: int = DEFAULT_TAIL_BYTES,
    env: Mapping[str, str] | None = None,
    on_start: Callable[[CommandHandle], None] | None = None,
    containment: str | None = None,
    keep_head: bool = False,
) -> CommandResult:
    """Run ``command`` with ``bash -c`` in ``cwd`` and return what it did.

    Args:
        command: the shell command line.
        cwd: the directory to run in (the agent's workspace).
        timeout: seconds before everything the command started is stopped; must be > 0.
        grace: seconds between SIGTERM and SIGKILL.
        tail_bytes: how many bytes of the end of the output to keep.
        env: the environment; the current one when ``None``. Variables that keep
            pagers and prompts out of the way are added either way.
        on_start: called with a :class:`CommandHandle` once the command runs, so that
            another thread can stop it early.
        containment: ``auto``, ``cgroup`` or ``subreaper`` (see the module docstring);
            by default from ``$PORTER_MESH_CONTAINMENT``, else ``auto``.
        keep_head: keep the first ``tail_bytes`` of the output instead of the last.

    Returns:
        A :class:`CommandResult`. When it returns, no process the command started is
        alive.

    Raises:
        ToolError: the command is empty, an argument is out of range, or the shell
            cannot be started.
        ConfigError: an unknown containment.
    """
    if not command.strip():
        raise ToolError("bash: the command is empty; pass the shell command to run")
    if "\x00" in command:
        raise ToolError("bash: the command contains a NUL byte; remove it")
    if not timeout > 0:
        raise ToolError(f"bash: timeout must be a positive number of seconds, got {timeout}")
    if grace < 0 or tail_bytes <= 0:
        raise ToolError("bash: grace must be >= 0 and tail_bytes > 0")
    mode = containment or os.environ.get(CONTAINMENT_ENV) or "auto"
    if mode not in CONTAINMENTS:
        raise ConfigError(
            f"containment {mode!r} is unknown; use one of {', '.join(CONTAINMENTS)} "
            f"(or unset {CONTAINMENT_ENV})"
        )
    full_env = dict(os.environ if env is None else env)
    full_env.update(_QUIET_ENV)
    start = time.monotonic()
    tree = _start(command, os.fspath(cwd), full_env, mode)
    handle = CommandHandle(tree.shell_pid, tree.mode)
    runner = _Runner(tree, handle, tail_bytes, keep_head=keep_head)
    timed_out = leftovers = False
    try:
        if on_start is not None:
            on_start(handle)
        runner.pump(start + timeout, lambda: tree.shell_exited() or runner.stop_requested)
        if runner.stop_requested or not tree.shell_exited():
            timed_out = not runner.stop_requested
            runner.stop_all(grace)
        else:
            # The shell is done; wait briefly for the pipe to close. If it stays open
            # or processes are left, they are left-behind background jobs.
            linger = min(start + timeout, time.monotonic() + _LINGER)
            runner.pump(linger, lambda: runner.eof or runner.stop_requested)
            if tree.members():
                leftovers = True
                runner.stop_all(grace)
    finally:
        # Whatever happened above (including an exception), leave nothing running.
        runner.kill_rest()
        settle = time.monotonic() + _KILL_SETTLE
        if not runner.pump(settle, lambda: not tree.members(), _MEMBER_POLL):
            _log.warning("processes of command %r outlived SIGKILL: %s", command[:80],
                         tree.members())
        tree.finish(settle)
        runner.pump(time.monotonic() + _LINGER, lambda: runner.eof)
        runner.close()
        handle._close()
    assert tree.exit_status is not None
    return CommandResult(
        command=command,
        exit_status=tree.exit_status,
        output=bytes(runner.tail.buf).decode("utf-8", errors="replace"),
        dropped_bytes=runner.tail.dropped,
        timed_out=timed_out,
        killed=bool(runner.sigkilled),
        stopped_leftovers=leftovers,
        duration=time.monotonic() - start,
        timeout=timeout,
        pgid=tree.shell_pid,
        containment=tree.mode,
        stopped=tuple(runner.stopped),
        sigkilled=tuple(runner.sigkilled),
        outside_group=runner.outside_group,
        stop_reason=handle.reason if runner.stop_requested else None,
        kept_head=keep_head,
    )
