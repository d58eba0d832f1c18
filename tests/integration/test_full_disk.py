"""A receiver whose data directory is on a full filesystem acknowledges nothing it could
not journal: it refuses direct messages (its senders retry), says so once, keeps
serving broadcasts, and takes every message exactly once when space returns, across a
kill -9 too. A real 2 MiB tmpfs, filled to the brim, holds the data directory."""

from __future__ import annotations

import pathlib
import signal
import time

import pytest

from porter_mesh.adapters.journal import _parse
from tests.integration.cli_proc import cli
from tests.integration.harness import NodeProcess, peers_seen
from tests.integration.test_crash_delivery import RECEIVER, wait_for_lines
from tests.integration.test_declined import declining_receiver
from tests.tinyfs import fill, tiny_filesystem

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]

COUNT = 150
SIZE = 4096
WARNING = "cannot write the delivery journal"


def journal_intact(path: pathlib.Path) -> None:
    data = path.read_bytes()
    end = _parse(data)[2]
    assert end == len(data), f"{len(data) - end} bytes of a torn record in {path}"


def stats(proc: NodeProcess) -> dict[str, int]:
    return dict(proc.ask("stats", "stats")["stats"])


def pair_on(fs: pathlib.Path, procs: list[NodeProcess],
            mesh: str) -> tuple[NodeProcess, NodeProcess]:
    """A receiver journaling on ``fs`` and a sender that found it."""
    receiver = NodeProcess("recv", "--data-dir", str(fs / "recv"), mesh=mesh)
    procs.append(receiver)
    sender = NodeProcess("send", mesh=mesh)
    procs.append(sender)
    sender.wait_until(lambda ev: "recv" in peers_seen(ev), 20, "sender finds receiver")
    return receiver, sender


def test_a_full_disk_refuses_direct_messages_until_space_returns(
        procs: list[NodeProcess], mesh: str, tmp_path: pathlib.Path) -> None:
    with tiny_filesystem(tmp_path / "fs") as fs:
        receiver, sender = pair_on(fs, procs, mesh)
        sender.command(op="wait-subscribers", channel="log", n=1)
        sender.wait_for(lambda e: e["ev"] == "subscribers", 15, "the receiver subscribes")
        filler = fill(fs)

        sender.command(op="send", to="recv", n=COUNT, size=SIZE)
        # Held for three seconds: nothing is delivered...
        receiver.watch(3, lambda e: e["ev"] == "msg" and e["direct"], "delivered while full")
        # ...while broadcasts, which need no disk, still arrive (and flush what the
        # receiver has queued to send)...
        sender.command(op="publish", channel="log", text="b", n=3)
        receiver.wait_until(lambda ev: sum(e["ev"] == "msg" and not e["direct"]
                                           for e in ev) == 3, 10, "broadcasts while full")
        # ...and nothing is acknowledged.
        sender.watch(1, lambda e: e["ev"] == "sent", "acknowledged while full")
        assert not [e for e in sender.events if e["ev"] == "sent"], "acknowledged while full"
        st = stats(receiver)
        assert st["storage.full"] == 1 and st["refused.disk"] >= COUNT
        assert st.get("received.direct", 0) == 0
        journal_intact(fs / "recv" / "inbox.journal")
        # The operator sees it where the node's own state shows.
        net = ("--mesh", mesh, "--no-discovery", "--peer", f"127.0.0.1:{receiver.up['router']}")
        human = cli("stats", "recv", *net)
        assert human.returncode == 0, human.stderr
        assert "storage    full: cannot write" in human.stdout, human.stdout
        table = cli("peers", *net, "--wait", "1")
        assert "recv: storage full" in table.stdout, table.stdout

        filler.unlink()  # space returns: the senders' retries land
        done = sender.wait_for(lambda e: e["ev"] == "sent", 40, "every send acknowledged")
        assert done["ok"] == COUNT
        receiver.wait_until(lambda ev: sum(e["ev"] == "msg" and e["direct"]
                                           for e in ev) >= COUNT, 20, "all delivered")
        texts = [e["text"] for e in receiver.events if e["ev"] == "msg" and e["direct"]]
        assert sorted(texts) == sorted(f"m{i}" for i in range(COUNT))  # exactly once
        st = stats(receiver)
        assert "storage.full" not in st
        assert st["received.direct"] == COUNT
        assert "storage    ok" in cli("stats", "recv", *net).stdout
        journal_intact(fs / "recv" / "inbox.journal")
        receiver.stop()
        sender.stop()
        err = receiver.stderr
        assert "Traceback" not in err, err[-3000:]
        assert err.count(WARNING) == 1, err[-3000:]  # once, then demoted
        assert err.count("can be written again") == 1


def test_owed_messages_kept_after_a_full_disk_survive_kill_9(
        procs: list[NodeProcess], mesh: str, tmp_path: pathlib.Path) -> None:
    """The messages journaled once space returned are owed (the handler declines them)
    when the receiver is killed; a restart delivers every one of them once."""
    with tiny_filesystem(tmp_path / "fs") as fs:
        data, out = fs / "recv", tmp_path / "handled.txt"
        first, sender, common = declining_receiver(procs, mesh, data, out)
        filler = fill(fs)
        sender.command(op="send", to="recv", n=COUNT, size=SIZE)
        sender.watch(2, lambda e: e["ev"] == "sent", "acknowledged while full")
        filler.unlink()
        done = sender.wait_for(lambda e: e["ev"] == "sent", 40, "every send acknowledged")
        assert done["ok"] == COUNT
        first.kill()
        journal_intact(data / "inbox.journal")
        assert "Traceback" not in first.stderr, first.stderr[-3000:]

        second = NodeProcess("recv", *common, "--pub-port", str(first.up["pub"]),
                             "--router-port", str(first.up["router"]), mesh=mesh,
                             script=RECEIVER)
        procs.append(second)
        handled = wait_for_lines(out, COUNT, second, 30)
        assert sorted(handled) == sorted(f"m{i}" for i in range(COUNT))
        assert len(handled) == len(set(handled))


def test_a_resend_read_with_its_original_is_not_acknowledged_when_the_disk_is_full(
        procs: list[NodeProcess], mesh: str, tmp_path: pathlib.Path) -> None:
    """A receiver stopped for a moment reads a message and its resends in one go: the
    resends are repeats of a message the journal has not kept yet, so they must not be
    acknowledged when the journal then refuses the original (a full disk)."""
    with tiny_filesystem(tmp_path / "fs") as fs:
        receiver, sender = pair_on(fs, procs, mesh)
        filler = fill(fs)
        receiver.proc.send_signal(signal.SIGSTOP)
        try:
            sender.command(op="send", to="recv", n=5, size=SIZE)
            # The sender resends every 0.1-0.5 s: wait until the stopped receiver has
            # the message and three resends of it waiting.
            deadline = time.monotonic() + 30
            while stats(sender).get("retries", 0) < 3:
                assert time.monotonic() < deadline, stats(sender)
        finally:
            receiver.proc.send_signal(signal.SIGCONT)
        sender.watch(3, lambda e: e["ev"] == "sent", "acknowledged while full")
        assert stats(receiver)["refused.disk"] >= 1
        filler.unlink()  # space returns: a later resend lands, once
        done = sender.wait_for(lambda e: e["ev"] == "sent", 40, "every send acknowledged")
        assert done["ok"] == 5
        receiver.wait_until(lambda ev: sum(e["ev"] == "msg" and e["direct"]
                                           for e in ev) >= 5, 20, "all delivered")
        texts = [e["text"] for e in receiver.events if e["ev"] == "msg" and e["direct"]]
        assert sorted(texts) == [f"m{i}" for i in range(5)]
