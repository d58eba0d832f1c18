"""The bash tool's runner: output, exit status, timeouts and runaway processes.

Real processes, real signals. Every runaway case checks that no member of the command's
process group is left (zombies excepted: they are reaped by their parent or by init);
the escapes from the group (job control, setsid, a double-forked daemon) are run under
both containments (a cgroup, and the subreaper fallback forced by the environment) and
checked by pid and by an environment marker that every process of the command inherits.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from porter_mesh.errors import ConfigError, ToolError
from porter_mesh.tools.shell import CONTAINMENT_ENV, CommandResult, cgroup_base, run_command

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
    handle = box._running
    assert handle is not None
    pgid = handle.pgid
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


# -- escapes from the process group: every containment must catch them -------------------

MODES = ["cgroup", "subreaper"]

#: Commands that start processes a process-group kill misses. Each process the command
#: starts appends its pid to ``pids``; the last one writes a line to the FIFO ``ready``
#: once everything is running, and the shell waits for that line before it goes on, so
#: that the timeout or halt always finds the whole tree started.
ESCAPES = {
    # The case: job control gives the background sleep and the foreground yes
    # process groups of their own.
    "job-control": (
        "set -m; sleep 1000 & echo $! >> pids; "
        "(echo $BASHPID >> pids; echo > ready; exec yes) > /dev/null & "
        "echo $$ >> pids; read -r _ < ready; wait",
        3,  # the shell, sleep, yes
        2,  # sleep and yes left the shell's group
    ),
    # setsid: a new session, out of reach of any group signal.
    "setsid": (
        "setsid sh -c 'echo $$ >> pids; echo > ready; exec sleep 1000' & "
        "echo $$ >> pids; read -r _ < ready; wait",
        2,
        1,
    ),
    # A double-forked daemon: its parent exits at once, so it is orphaned as well.
    "double-fork": (
        "(setsid sh -c 'echo $$ >> pids; echo > ready; exec sleep 1000' &); "
        "echo $$ >> pids; read -r _ < ready; sleep 1000",
        2,
        1,
    ),
}

MARK = "PORTER_MESH_TEST_MARK"


def contained_env(tmp_path: Path) -> dict[str, str]:
    """The environment with a marker every process of the command inherits."""
    return dict(os.environ, **{MARK: str(tmp_path)})


def marked_alive(tmp_path: Path) -> list[int]:
    """Live processes carrying this test's marker: whatever the command left running."""
    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if (proc.info["status"] != psutil.STATUS_ZOMBIE
                    and proc.environ().get(MARK) == str(tmp_path)):
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def recorded(tmp_path: Path) -> list[int]:
    return [int(line) for line in (tmp_path / "pids").read_text().split()]


def assert_all_gone(pids: list[int]) -> None:
    for pid in pids:
        try:
            status = psutil.Process(pid).status()
        except psutil.NoSuchProcess:
            continue
        assert status == psutil.STATUS_ZOMBIE, f"pid {pid} is still {status}"


@pytest.fixture(params=MODES)
def containment(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each containment in turn; the fallback is forced through the environment."""
    mode = str(request.param)
    if mode == "cgroup":
        base, reason = cgroup_base()
        if base is None:
            pytest.skip(f"no writable cgroup v2 here: {reason}")
        monkeypatch.setenv(CONTAINMENT_ENV, "cgroup")
    else:
        monkeypatch.setenv(CONTAINMENT_ENV, "subreaper")
    return mode


def start_escape(tmp_path: Path, name: str) -> tuple[str, int, int]:
    os.mkfifo(tmp_path / "ready")
    return ESCAPES[name]


@pytest.mark.parametrize("name", list(ESCAPES))
def test_escapes_are_stopped_at_timeout(tmp_path: Path, containment: str, name: str) -> None:
    command, count, outside = start_escape(tmp_path, name)
    started = time.monotonic()
    result = run_command(command, cwd=tmp_path, timeout=1.5, grace=GRACE,
                         env=contained_env(tmp_path))
    assert time.monotonic() - started < 1.5 + GRACE + SLACK
    assert result.containment == containment
    pids = recorded(tmp_path)
    assert len(pids) == count, pids
    assert_all_gone(pids)
    assert marked_alive(tmp_path) == []
    assert result.timed_out
    # The report is true: it names what it stopped, and how many had escaped the group.
    assert set(pids) <= set(result.stopped), (pids, result.stopped)
    assert result.outside_group == outside
    assert f"{outside} had left its process group" in result.render()


@pytest.mark.parametrize("name", list(ESCAPES))
def test_escapes_are_stopped_on_halt(tmp_path: Path, containment: str, name: str) -> None:
    import threading

    from porter_mesh.tools import Toolbox
    from tests.integration.test_tools_messaging import MemoryPort

    command, count, outside = start_escape(tmp_path, name)
    # Once the whole tree runs, the shell says so on a second FIFO the test reads.
    os.mkfifo(tmp_path / "running")
    command = command.replace("read -r _ < ready;", "read -r _ < ready; echo > running;")
    box = Toolbox(MemoryPort("w1"), tmp_path, grace=GRACE)
    results: list[str] = []
    runner = threading.Thread(
        target=lambda: results.append(box.call("bash", {"command": command, "timeout": 60}))
    )
    os.environ[MARK] = str(tmp_path)  # the toolbox runs commands in this environment
    try:
        runner.start()
        wait_for_line(tmp_path / "running", 20.0)
        box.halt("operator said stop")
        runner.join(timeout=20)
    finally:
        del os.environ[MARK]
        box.halt("test over")
        runner.join(timeout=20)
    assert not runner.is_alive()
    pids = recorded(tmp_path)
    assert len(pids) == count, pids
    assert_all_gone(pids)
    assert marked_alive(tmp_path) == []
    text = results[0]
    assert "halted: operator said stop" in text
    assert f"{outside} had left its process group" in text


def wait_for_line(fifo: Path, timeout: float) -> None:
    """Block until a line is written to ``fifo`` (the event), at most ``timeout`` s."""
    import selectors

    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            assert sel.select(timeout), f"nothing written to {fifo} within {timeout}s"
            assert os.read(fd, 64)
    finally:
        os.close(fd)


def test_background_escapes_are_stopped_after_exit(tmp_path: Path, containment: str) -> None:
    os.mkfifo(tmp_path / "ready")
    command = ("(setsid sh -c 'echo $$ >> pids; echo > ready; exec sleep 1000' &); "
               "set -m; sleep 1000 & echo $! >> pids; read -r _ < ready; echo started")
    result = run_command(command, cwd=tmp_path, timeout=30, grace=GRACE,
                         env=contained_env(tmp_path))
    pids = recorded(tmp_path)
    assert len(pids) == 2
    assert_all_gone(pids)
    assert marked_alive(tmp_path) == []
    assert result.exit_status == 0 and not result.timed_out and result.stopped_leftovers
    assert set(pids) <= set(result.stopped)
    assert "background processes it left running were stopped: 2 processes" in \
        result.render()


def test_command_cgroup_is_removed(tmp_path: Path) -> None:
    base, reason = cgroup_base()
    if base is None:
        pytest.skip(f"no writable cgroup v2 here: {reason}")
    result = run_command("setsid sleep 1000 & echo $$", cwd=tmp_path, timeout=10,
                         grace=GRACE, containment="cgroup")
    assert result.containment == "cgroup" and result.stopped_leftovers
    assert not list(base.glob(f"porter-mesh-{os.getpid()}-*"))


def test_unknown_containment_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="containment 'jail' is unknown"):
        run_command("true", cwd=tmp_path, timeout=1, containment="jail")


def test_withdrawal_stops_the_running_command(tmp_path: Path, containment: str) -> None:
    """A withdrawal seen while the task's command runs stops all of it at once, and the
    call reports nothing of the attempt."""
    import threading

    from porter_mesh.core import as2
    from porter_mesh.core.tasks import ATTEMPT_FIELD, cancel_activity
    from porter_mesh.errors import TaskWithdrawn
    from porter_mesh.tools import Toolbox
    from tests.integration.test_tools_messaging import MemoryPort

    ctx = "urn:porter:task:t1"
    port = MemoryPort("w1")
    box = Toolbox(port, tmp_path, grace=GRACE)
    port.deliver("task:w1", as2.offer("architect", "Build it", target="w1", context=ctx,
                                      extra={ATTEMPT_FIELD: 1}))
    box.read_messages()
    os.mkfifo(tmp_path / "running")
    command = ("echo $$ >> pids; "
               "setsid sh -c 'echo $$ >> pids; echo > running; exec sleep 1000' & wait")
    errors: list[BaseException] = []

    def work() -> None:
        try:
            box.call("bash", {"command": command, "timeout": 60})
        except BaseException as exc:
            errors.append(exc)

    runner = threading.Thread(target=work)
    started = time.monotonic()
    runner.start()
    try:
        wait_for_line(tmp_path / "running", 20.0)
        withdrawn = cancel_activity("architect", ctx, "Withdrawn: holder w1 expired",
                                    attempt=1)
        assert box.observe("task:w1", "architect", withdrawn)
        runner.join(timeout=20)
    finally:
        box.halt("test over")
        runner.join(timeout=20)
    assert time.monotonic() - started < GRACE + SLACK + 2
    pids = recorded(tmp_path)
    assert len(pids) == 2
    assert_all_gone(pids)
    (error,) = errors
    assert isinstance(error, TaskWithdrawn) and error.context == ctx and error.attempt == 1
    assert "Its command was stopped" in str(error) and "had left its process group" in str(error)
    assert port.sent == []  # no Invoke record of the void attempt
