"""The bash tool's runner: output, exit status, timeouts and runaway process groups.

Real processes, real signals. Every runaway case checks that no member of the command's
process group is left (zombies excepted: they are reaped by their parent or by init).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from porter_mesh.errors import ToolError
from porter_mesh.tools.shell import CommandResult, run_command

GRACE = 0.5
# Slack for a loaded two-core machine on top of timeout + grace.
SLACK = 2.0


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess, PermissionError):
            continue
    return members


def run(cmd: str, tmp_path: Path, timeout: float = 10.0, **kw: object) -> CommandResult:
    result = run_command(cmd, cwd=tmp_path, timeout=timeout, grace=GRACE, **kw)  # type: ignore[arg-type]
    assert group_members(result.pgid) == [], f"survivors in group {result.pgid}"
    return result


def test_output_and_exit_status(tmp_path: Path) -> None:
    result = run("echo out; echo err >&2; exit 3", tmp_path)
    assert result.exit_status == 3
    assert not result.timed_out and not result.ok
    assert "out" in result.output and "err" in result.output
    assert result.render().endswith("[exit status 3]")


def test_runs_in_workspace(tmp_path: Path) -> None:
    result = run("pwd", tmp_path)
    assert result.ok
    assert Path(result.output.strip()).resolve() == tmp_path.resolve()


def test_stdin_is_closed(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run("cat; echo done", tmp_path)
    assert result.ok and "done" in result.output
    assert time.monotonic() - started < 5


def test_sleep_is_stopped_at_timeout(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run("sleep 60", tmp_path, timeout=0.5)
    elapsed = time.monotonic() - started
    assert result.timed_out and not result.ok
    assert not result.killed  # sleep dies on SIGTERM
    assert elapsed < 0.5 + GRACE + SLACK
    assert "timed out after 0.5s" in result.render()


def test_child_ignoring_sigterm_is_killed(tmp_path: Path) -> None:
    # The trap is set before the child starts, so there is no window in which SIGTERM
    # could still end it; the child inherits the ignored disposition.
    script = f"trap '' TERM; {sys.executable} -c 'import time; time.sleep(60)' & wait"
    started = time.monotonic()
    result = run(script, tmp_path, timeout=1.0)
    elapsed = time.monotonic() - started
    assert result.timed_out and result.killed
    assert elapsed < 1.0 + GRACE + SLACK
    assert "SIGKILL" in result.render()


def test_yes_keeps_only_the_tail(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run("yes porter", tmp_path, timeout=0.5, tail_bytes=4096)
    assert time.monotonic() - started < 0.5 + GRACE + SLACK
    assert result.timed_out
    assert len(result.output.encode()) <= 4096
    assert result.dropped_bytes > 0
    assert "earlier bytes of output dropped" in result.render()
    lines = result.output.split("\n")
    # The first line may be cut by the tail; every full line is intact.
    assert lines[1:-1] and all(line == "porter" for line in lines[1:-1])


def test_nested_shells_are_all_stopped(tmp_path: Path) -> None:
    result = run("bash -c 'bash -c \"sleep 60\" & sleep 60' & sleep 60", tmp_path, timeout=0.5)
    assert result.timed_out


def test_background_leftovers_are_stopped(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run("sleep 60 > /dev/null 2>&1 & echo started", tmp_path, timeout=30)
    assert time.monotonic() - started < GRACE + SLACK
    assert not result.timed_out and result.exit_status == 0
    assert result.stopped_leftovers
    assert "started" in result.output
    assert "background processes" in result.render()


def test_background_holding_the_pipe_is_stopped(tmp_path: Path) -> None:
    started = time.monotonic()
    result = run("sleep 60 & echo started", tmp_path, timeout=30)
    assert time.monotonic() - started < GRACE + SLACK
    assert result.stopped_leftovers and not result.timed_out


def test_closed_stdout_still_times_out(tmp_path: Path) -> None:
    result = run("exec >/dev/null 2>&1; sleep 60", tmp_path, timeout=0.5)
    assert result.timed_out


def test_killed_by_signal_is_reported(tmp_path: Path) -> None:
    result = run("kill -KILL $$", tmp_path)
    assert result.exit_status == -9
    assert "killed by signal SIGKILL" in result.render()


def test_invalid_utf8_is_replaced(tmp_path: Path) -> None:
    result = run("printf 'a\\377b'", tmp_path)
    assert result.output == "a\ufffdb"


@pytest.mark.parametrize("bad", ["", "   ", "echo \x00"])
def test_bad_commands_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ToolError):
        run_command(bad, cwd=tmp_path, timeout=1)


def test_bad_timeout_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="timeout"):
        run_command("true", cwd=tmp_path, timeout=0)


def test_halt_stops_the_running_command_from_another_thread(tmp_path: Path) -> None:
    import threading

    from porter_mesh.tools import Toolbox
    from tests.integration.test_tools_messaging import MemoryPort

    box = Toolbox(MemoryPort("w1"), tmp_path, grace=GRACE)
    results: list[str] = []
    runner = threading.Thread(
        target=lambda: results.append(box.call("bash", {"command": "sleep 60", "timeout": 60}))
    )
    started = time.monotonic()
    runner.start()
    deadline = time.monotonic() + 10
    while box._running is None and time.monotonic() < deadline:
        time.sleep(0.005)  # polling for the command to start, with a deadline
    pgid = box._running
    assert pgid is not None
    box.halt("operator said stop")
    runner.join(timeout=10)
    assert not runner.is_alive()
    assert time.monotonic() - started < GRACE + SLACK + 1
    assert results and "killed by signal SIGTERM" in results[0]
    assert group_members(pgid) == []
    with pytest.raises(ToolError, match="halted \\(operator said stop\\)"):
        box.call("bash", {"command": "true"})
    box.resume()
    assert "exit status 0" in box.call("bash", {"command": "true"})
