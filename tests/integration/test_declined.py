"""A handler that raises NotHandled does not take a message: it stays owed (journaled, or
unacknowledged without a data directory) and is offered again, in order, until taken."""

from __future__ import annotations

import itertools
import os
import pathlib
import threading

import pytest

from porter_mesh.core.as2 import Activity
from porter_mesh.errors import DeliveryTimeout, NotHandled
from porter_mesh.node.node import Message
from porter_mesh.node.sync import SyncNode
from tests.integration.harness import NodeProcess, peers_seen
from tests.integration.test_crash_delivery import RECEIVER, lines, wait_for_lines

pytestmark = [pytest.mark.network, pytest.mark.timeout(90)]
_ids = itertools.count()


class Gate:
    """A handler that declines every message until opened, counting its offers."""

    def __init__(self, declines: int | None = None) -> None:
        self.declines_left = declines  # None: decline until open() is called
        self.offers = 0
        self.taken: list[str] = []
        self.declined = threading.Event()
        self.all_taken = threading.Event()
        self.expect = 0

    def open(self) -> None:
        self.declines_left = 0

    def __call__(self, msg: Message) -> None:
        self.offers += 1
        if self.declines_left is None or self.declines_left > 0:
            if self.declines_left is not None:
                self.declines_left -= 1
            self.declined.set()
            raise NotHandled("not ready")
        self.taken.append(str(msg.activity.summary))
        if len(self.taken) >= self.expect:
            self.all_taken.set()


def note(i: int) -> Activity:
    return Activity.from_dict({"type": "Note", "actor": "tx", "content": f"m{i}",
                               "summary": f"m{i}"})


@pytest.fixture
def mesh_name() -> str:
    return f"nh{os.getpid()}-{next(_ids)}"


def pair(mesh: str, gate: Gate | None, data_dir: pathlib.Path | None,
         send_timeout: float = 10.0) -> tuple[SyncNode, SyncNode]:
    receiver = SyncNode(name="rx", mesh=mesh, discovery=False, inbox_size=0,
                        data_dir=data_dir, handlers=[gate] if gate else [],
                        redeliver_max=0.2)
    try:
        sender = SyncNode(name="tx", mesh=mesh, discovery=False, send_timeout=send_timeout,
                          retry_initial=0.05, retry_max=0.2,
                          seeds=(f"127.0.0.1:{receiver.node.router_port}",))
    except BaseException:
        receiver.close()
        raise
    receiver.wait_for_peers(["tx"], 10)
    sender.wait_for_peers(["rx"], 10)
    return receiver, sender


@pytest.mark.parametrize("journaled", [True, False], ids=["data-dir", "memory"])
def test_declined_messages_arrive_once_in_order(
        mesh_name: str, tmp_path: pathlib.Path, journaled: bool) -> None:
    gate = Gate(declines=5)
    gate.expect = 30
    receiver, sender = pair(mesh_name, gate, tmp_path / "rx" if journaled else None)
    try:
        done: list[BaseException | None] = []
        for i in range(30):
            sender.send_nowait("rx", note(i), on_done=done.append)
        assert gate.all_taken.wait(20), f"taken {gate.taken}, offers {gate.offers}"
        sender.wait_for_stats(lambda st: st.get("outbox", 1) == 0, 10)
        assert done == [None] * 30
        assert gate.taken == [f"m{i}" for i in range(30)]  # once each, in order
        assert gate.offers == 30 + 5
        stats = receiver.stats()
        assert stats["declined.direct"] == 5
        assert stats["received.direct"] == 30
    finally:
        sender.close()
        receiver.close()


def test_declined_without_data_dir_is_not_acknowledged(mesh_name: str) -> None:
    """Held in memory only, a declined message is not acknowledged, so the sender's
    deadline tells the truth; the node keeps offering it and takes it once."""
    gate = Gate()
    gate.expect = 1
    receiver, sender = pair(mesh_name, gate, None, send_timeout=1.0)
    try:
        with pytest.raises(DeliveryTimeout):
            sender.send("rx", note(0))
        offers = gate.offers
        assert offers >= 3, "offered again on a backoff while declined"
        assert receiver.stats().get("duplicate.held", 0) >= 1  # retries were not acked
        gate.open()
        receiver.redeliver()
        assert gate.all_taken.wait(10)
        assert gate.taken == ["m0"]
    finally:
        sender.close()
        receiver.close()


def test_a_new_handler_takes_what_another_declined(mesh_name: str,
                                                   tmp_path: pathlib.Path) -> None:
    gate = Gate()
    receiver, sender = pair(mesh_name, None, tmp_path / "rx")
    try:
        remove = receiver.add_handler(gate)
        sender.send("rx", note(0))  # journaled, so acknowledged while declined
        assert gate.declined.wait(10)
        remove()
        got: list[str] = []
        arrived = threading.Event()

        def take(msg: Message) -> None:
            got.append(str(msg.activity.summary))
            arrived.set()

        receiver.add_handler(take)  # offered at once, not at the next backoff
        assert arrived.wait(5)
        assert got == ["m0"]
    finally:
        sender.close()
        receiver.close()


def declining_receiver(procs: list[NodeProcess], mesh: str, data: pathlib.Path,
                       out: pathlib.Path) -> tuple[NodeProcess, NodeProcess, tuple[str, ...]]:
    """A ``crash_receiver.py`` that declines everything (journaled in ``data``, handled
    messages recorded in ``out``) and a sender that found it; and the receiver's
    arguments but ``--decline``, to start it again."""
    common = ("--data-dir", str(data), "--out", str(out), "--mode", "handler")
    first = NodeProcess("recv", *common, "--decline", mesh=mesh, script=RECEIVER)
    procs.append(first)
    sender = NodeProcess("send", mesh=mesh)
    procs.append(sender)
    sender.wait_until(lambda ev: "recv" in peers_seen(ev), 20, "sender finds the receiver")
    return first, sender, common


def test_declined_messages_survive_kill_9(procs: list[NodeProcess], mesh: str,
                                          tmp_path: pathlib.Path) -> None:
    data, out = tmp_path / "recv", tmp_path / "handled.txt"
    first, sender, common = declining_receiver(procs, mesh, data, out)
    sender.command(op="send", to="recv", start=0, n=40)
    done = sender.wait_for(lambda e: e["ev"] == "sent", 30, "the burst acknowledged")
    assert done["ok"] == 40  # journaled: acknowledged although declined
    first.wait_for(lambda e: e["ev"] == "declined" and e["n"] >= 3, 20,
                   "offered again while declined")
    first.kill()
    assert lines(out) == []

    second = NodeProcess("recv", *common, "--pub-port", str(first.up["pub"]),
                         "--router-port", str(first.up["router"]), mesh=mesh,
                         script=RECEIVER)
    procs.append(second)
    handled = wait_for_lines(out, 40, second, 30)
    assert handled == [f"m{i}" for i in range(40)]


def test_the_taken_mark_stays_below_a_declined_message(mesh_name: str,
                                                       tmp_path: pathlib.Path) -> None:
    """On a node with an inbox and a journal, another sender's messages are read and
    acknowledged while one is declined: the mark on disk must not pass the declined
    one (a crash then would lose it), and moves on once it is taken."""
    from porter_mesh.adapters.journal import read_taken

    ready = threading.Event()

    def picky(msg: Message) -> None:
        if msg.sender == "tx" and not ready.is_set():
            raise NotHandled("tx's side is not ready")

    data = tmp_path / "rx"
    receiver = SyncNode(name="rx", mesh=mesh_name, discovery=False, data_dir=data,
                        handlers=[picky])
    seed = (f"127.0.0.1:{receiver.node.router_port}",)
    senders = [SyncNode(name=name, mesh=mesh_name, discovery=False, seeds=seed,
                        retry_initial=0.05, retry_max=0.2) for name in ("tx", "tx2")]
    try:
        receiver.wait_for_peers(["tx", "tx2"], 10)
        for sender in senders:
            sender.wait_for_peers(["rx"], 10)
        senders[0].send("rx", note(0))  # journaled at position 0, declined
        receiver.wait_for_stats(lambda st: st.get("declined.direct", 0) >= 1, 10)
        for i in range(5):
            senders[1].send("rx", note(100 + i))
        got = [receiver.receive(10).activity.summary for _ in range(5)]
        assert got == [f"m{100 + i}" for i in range(5)]
        receiver.ack()
        journal = data / "inbox.journal"
        assert read_taken(journal) == 0
        ready.set()
        receiver.redeliver()
        assert receiver.receive(10).activity.summary == "m0"
        receiver.ack()
        assert read_taken(journal) == 6
    finally:
        for sender in senders:
            sender.close()
        receiver.close()
