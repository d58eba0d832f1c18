"""Every direct message the sender saw acknowledged is handled once, whatever point the
receiver is killed at (kill -9 of a real process, restarted on the same data directory).

The receiving application (``crash_receiver.py``) records each message it handles and
kills itself at a chosen message: before handling it, or after recording it but before
the node learned it was taken; in a handler, in a batch handler (so mid-way through a
ZeroMQ message of many activities), or reading a backlog from the inbox with receive().
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.harness import NodeProcess, peers_seen

pytestmark = [pytest.mark.network, pytest.mark.timeout(150)]

RECEIVER = Path(__file__).with_name("crash_receiver.py")
TOTAL = 300






def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def wait_for_lines(path: Path, n: int, proc: NodeProcess, timeout: float) -> list[str]:
    """Wait (on the process's events, with a deadline) until ``path`` has ``n`` lines."""
    deadline = time.monotonic() + timeout
    while len(got := lines(path)) < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(got)} of {n} messages handled within {timeout}s; "
                                 f"stderr: {proc.stderr[-2000:]}")
        proc._pump(0.1)
    return got


@pytest.mark.parametrize(("mode", "kill_at", "point"), [
    ("handler", "m0", "before"),      # right after the journal write, before any handler
    ("handler", "m37", "before"),     # inside a handler, mid-way through a batch
    ("handler", "m37", "after"),      # after the handler's own record, before the take
    ("batch", "m37", "before"),       # inside a batch handler
    ("batch", "m37", "after"),
    ("receive", "m100", "before"),    # a backlog of 300 in the inbox, read slowly
    ("receive", "m100", "after"),
])
def test_acknowledged_messages_are_handled_once_across_kill(
    procs: list[NodeProcess], mesh: str, tmp_path: Path, mode: str, kill_at: str, point: str
) -> None:
    data, out = tmp_path / "recv", tmp_path / "handled.txt"
    common = ("--data-dir", str(data), "--out", str(out), "--mode", mode)
    first = NodeProcess("recv", *common, "--kill-at", kill_at, "--kill-point", point,
                        mesh=mesh, script=RECEIVER)
    procs.append(first)
    sender = NodeProcess("send", mesh=mesh)
    procs.append(sender)
    sender.wait_until(lambda ev: "recv" in peers_seen(ev), 20, "sender finds the receiver")
    sender.command(op="send", to="recv", start=0, n=TOTAL)
    if mode == "receive":
        # The whole burst is acknowledged into the inbox before the application reads.
        done = sender.wait_for(lambda e: e["ev"] == "sent", 60, "the burst acknowledged")
        assert done["ok"] == TOTAL
        first.command(op="go")
    assert first.proc.wait(60) == -9, first.stderr[-2000:]
    before = lines(out)
    assert kill_at not in before if point == "before" else kill_at in before
    assert len(before) < TOTAL

    second = NodeProcess("recv", *common, "--pub-port", str(first.up["pub"]),
                         "--router-port", str(first.up["router"]), mesh=mesh, script=RECEIVER)
    procs.append(second)
    if mode == "receive":
        second.command(op="go")
    done = sender.wait_for(lambda e: e["ev"] == "sent", 90, "every send acknowledged")
    assert done["ok"] == TOTAL, f"the sender was told of a failure: {sender.events[-8:]}"
    handled = wait_for_lines(out, TOTAL, second, 60)
    assert len(handled) == len(set(handled)), "a message was handled twice"
    assert set(handled) == {f"m{i}" for i in range(TOTAL)}


def test_handler_given_to_sync_node_sees_what_a_restart_owes(
        procs: list[NodeProcess], mesh: str, tmp_path: Path) -> None:
    """SyncNode starts its node in its constructor; a handler passed to it is installed
    before that, so it sees the messages a restart delivers again (a handler added
    afterwards would leave them in an inbox nothing reads). Such an inbox is reported
    once, in the log and in stats."""
    data, out = tmp_path / "recv", tmp_path / "handled.txt"
    common = ("--data-dir", str(data), "--out", str(out), "--mode", "sync")
    first = NodeProcess("recv", *common, "--kill-at", "m37", mesh=mesh, script=RECEIVER)
    procs.append(first)
    sender = NodeProcess("send", mesh=mesh)
    procs.append(sender)
    sender.wait_until(lambda ev: "recv" in peers_seen(ev), 20, "sender finds the receiver")
    sender.command(op="send", to="recv", start=0, n=TOTAL)
    assert first.proc.wait(60) == -9, first.stderr[-2000:]
    assert "m37" not in lines(out)

    second = NodeProcess("recv", *common, "--unread-warning", "1", "--pub-port",
                         str(first.up["pub"]), "--router-port", str(first.up["router"]),
                         mesh=mesh, script=RECEIVER)
    procs.append(second)
    done = sender.wait_for(lambda e: e["ev"] == "sent", 90, "every send acknowledged")
    assert done["ok"] == TOTAL
    handled = wait_for_lines(out, TOTAL, second, 60)
    assert len(handled) == len(set(handled)), "a message was handled twice"
    assert set(handled) == {f"m{i}" for i in range(TOTAL)}
    deadline = time.monotonic() + 20
    while not second.ask("stats", "stats")["stats"].get("inbox.unread"):
        assert time.monotonic() < deadline, "the unread inbox was not reported"
        second.watch(0.3, lambda e: False, "waiting for the unread report")
    second.stop()
    assert second.stderr.count("nothing reads it") == 1, second.stderr[-2000:]
