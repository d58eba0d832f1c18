"""The supervisor a command runs under where no cgroup can hold it (see :mod:`.shell`).

Run as ``python -I -S _subreaper.py STATUS_FD COMMAND`` (standard library only, so that
it starts in a few milliseconds). It marks itself a child subreaper
(``prctl(PR_SET_CHILD_SUBREAPER)``), so every process the command orphans, however it
detaches (``setsid``, a double fork), is re-parented to this supervisor instead of init
and stays a descendant of it. It starts ``bash -c COMMAND`` in a process group of its
own and then only reaps children until none is left, so that it exits exactly when
nothing the command started is alive.

It writes lines on ``STATUS_FD``: ``started <pid>`` once the shell runs (or ``error
<reason>``), then ``exit <status>`` when the shell ends (``waitstatus_to_exitcode``:
negative for a signal). The runner in the agent's process finds the command's processes
by walking ``/proc`` down from this supervisor and signals them itself; the
supervisor survives SIGTERM, SIGINT and SIGHUP (they are handled, and handlers are not
inherited across ``exec``) so that a signal to the whole session does not take the
subreaper away before its orphans are gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

PR_SET_CHILD_SUBREAPER = 36


def _say(fd: int, line: str) -> None:
    # If the runner went away, keep reaping all the same.
    with contextlib.suppress(OSError):
        os.write(fd, line.encode() + b"\n")


def main(argv: list[str]) -> int:
    """Supervise one command; returns the supervisor's exit status."""
    status_fd, command = int(argv[1]), argv[2]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        _say(status_fd, f"error prctl(PR_SET_CHILD_SUBREAPER) failed: "
                        f"{os.strerror(ctypes.get_errno())}")
        return 125
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: None)
    try:
        shell = os.fork()
    except OSError as exc:
        _say(status_fd, f"error fork failed: {exc.strerror}")
        return 125
    if shell == 0:
        try:
            os.close(status_fd)
            os.setpgid(0, 0)
            os.execvp("bash", ["bash", "-c", command])
        finally:
            os._exit(127)
    _say(status_fd, f"started {shell}")
    # Hold neither end of the output pipe: it must close when the command's processes
    # close it, not when the supervisor does.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 0
        if pid == shell:
            _say(status_fd, f"exit {os.waitstatus_to_exitcode(status)}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
