"""The IACP 1.1 bridge through the real thing on both sides: foragers written from the
article (``iacp_forager.py``, plain sockets, each its own process) and mesh nodes (a
SyncNode in the test playing the queen's side of the mesh, or the demo's scripted
architect as a process)."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from porter_mesh.core import as2
from porter_mesh.core import constants as C
from porter_mesh.core.tasks import with_attempt
from porter_mesh.node.node import Message
from porter_mesh.node.sync import SyncNode
from tests.integration.cli_proc import COMMAND, Running, cli
from tests.integration.harness import NodeProcess
from tests.tinyfs import fill_inodes, tiny_filesystem

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]

FORAGER = Path(__file__).with_name("iacp_forager.py")
_tasks = itertools.count(1)
Event = dict[str, Any]


class Bridge(Running):
    """``porter-mesh iacp-bridge --events`` as a process; its events are JSON lines."""

    def __init__(self, mesh: str, *extra: str) -> None:
        super().__init__("iacp-bridge", "--listen", "127.0.0.1:0", "--mesh", mesh,
                         "--events", "--heartbeat", "0.5", *extra)
        self.wait_until(lambda: any(e["ev"] == "listening" for e in self.events()), 30,
                        "the bridge listening")
        self.port = int(next(e["port"] for e in self.events() if e["ev"] == "listening"))

    def events(self) -> list[Event]:
        return [json.loads(line) for line in list(self.out) if line.startswith("{")]

    def wait_event(self, pred: Callable[[Event], bool], what: str,
                   timeout: float = 30) -> Event:
        self.wait_until(lambda: any(pred(e) for e in self.events()), timeout, what)
        return next(e for e in self.events() if pred(e))


class Forager(NodeProcess):
    """One ``iacp_forager.py`` process connected to ``bridge``."""

    def __init__(self, bridge: Bridge, name: str, *extra: str) -> None:
        super().__init__(name, "--port", str(bridge.port), "--hb", "0.5", *extra,
                         script=FORAGER)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM: a forager waiting to reconnect to a bridge that has gone reads no
        ``quit`` from its standard input (its default SIGTERM ends it at once)."""
        if self.proc.poll() is None:
            self.proc.terminate()
        super().stop(timeout)

    def catch_up(self) -> None:
        """Read the events printed so far, without waiting for more."""
        while not self._queue.empty() and self._pump(0):
            pass

    def received(self, kind: str) -> list[dict[str, Any]]:
        return [e["msg"] for e in self.events if e["ev"] == "recv" and e["msg"]["kind"] == kind]

    def wait_recv(self, kind: str, timeout: float = 30, count: int = 1) -> dict[str, Any]:
        self.wait_until(lambda _: len(self.received(kind)) >= count, timeout,
                        f"{count} {kind} received")
        return self.received(kind)[count - 1]

    def sent(self, kind: str) -> list[Event]:
        return [e for e in self.events if e["ev"] == "sent" and e["kind"] == kind]

    def wait_sent(self, kind: str, count: int = 1, timeout: float = 30) -> list[Event]:
        self.wait_until(lambda _: len(self.sent(kind)) >= count, timeout,
                        f"{count} {kind} sent")
        return self.sent(kind)


@pytest.fixture
def started() -> Iterator[list[Any]]:
    """Processes and nodes a test started, stopped in reverse order afterwards."""
    items: list[Any] = []
    yield items
    for item in reversed(items):
        if isinstance(item, SyncNode):
            item.close()
        else:
            item.stop()


def bridge_for(started: list[Any], mesh: str, *extra: str) -> Bridge:
    bridge = Bridge(mesh, *extra)
    started.append(bridge)
    return bridge


def forager_for(started: list[Any], bridge: Bridge, name: str, *extra: str,
                join: bool = True) -> Forager:
    forager = Forager(bridge, name, *extra)
    started.append(forager)
    if join:
        bridge.wait_event(lambda e: e["ev"] == "registered" and e["forager"] == name,
                          f"{name} registered")
    return forager


def queen_side(started: list[Any], mesh: str, *foragers: str,
               name: str = "architect") -> SyncNode:
    """A mesh node that offers tasks and hears everything about them."""
    node = SyncNode(name=name, role="architect", mesh=mesh, heartbeat_interval=0.3,
                    evasive_after=1.5, expire_after=4.0)
    started.append(node)
    node.wait_for_peers(list(foragers), timeout=30)
    return node


def offer(node: SyncNode, forager: str, summary: str = "crawl index 3", *,
          attempt: int | None = 1) -> str:
    context = f"urn:porter:task:iacp{os.getpid()}x{next(_tasks)}"
    act = as2.offer(node.name, summary, "crawl the third index shard", target=forager,
                    context=context, tag=["crawl"])
    node.send(C.DIRECT_PREFIX + forager, with_attempt(act, attempt), timeout=20)
    return context


def collect(node: SyncNode, pred: Callable[[Message], bool], what: str,
            timeout: float = 30, seen: list[Message] | None = None) -> Message:
    """The first message (already seen in ``seen``, or arriving) matching ``pred``."""
    seen = seen if seen is not None else []
    for msg in seen:
        if pred(msg):
            return msg
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            got = [(m.sender, m.activity.type, m.activity.summary) for m in seen]
            raise AssertionError(f"no {what} within {timeout}s; got {got}")
        try:
            msg = node.receive(timeout=min(left, 1.0))
        except TimeoutError:
            continue
        seen.append(msg)
        if pred(msg):
            return msg


def about(context: str, kind: str, sender: str) -> Callable[[Message], bool]:
    return lambda m: (m.activity.context == context and m.activity.type == kind
                      and m.sender == sender)


# ----------------------------------------------------------------------------- cases


def test_assign_accept_result_then_review(mesh: str, started: list[Any]) -> None:
    bridge = bridge_for(started, mesh)
    forager = forager_for(started, bridge, "forager-07", "--tools", "crawl", "index")
    node = queen_side(started, mesh, "forager-07")
    reviewer = queen_side(started, mesh, "forager-07", name="reviewer")
    advert = next(p.advert for p in node.peers() if p.name == "forager-07")
    assert (advert.role, advert.slots, advert.tools) == ("worker", 1, ("crawl", "index"))

    context = offer(node, "forager-07")
    assign = forager.wait_recv("task.assign")
    assert assign["from"] == "queen" and assign["to"] == "forager-07"
    assert re.fullmatch(r"q-[0-9a-f]{6,}", assign["id"]) and assign["v"] == "1.1"
    assert isinstance(assign["ts"], int)
    assert assign["body"]["node"] == context and assign["body"]["summary"] == "crawl index 3"
    assert assign["body"]["content"] == "crawl the third index shard"
    seen: list[Message] = []
    acc = collect(node, about(context, "Accept", "forager-07"), "Accept", seen=seen)
    assert acc.direct and acc.activity.extra.get("attempt") == 1
    created = collect(node, about(context, "Create", "forager-07"), "Create", seen=seen)
    assert created.channel == C.CHANNEL_LOG
    docs = created.activity.to_dict()["object"]["items"]
    assert docs == [{"type": "Document", "url": f"cm://forager-07/{context}/r0"}]
    request = collect(reviewer, about(context, "Offer", "forager-07"), "review request")
    assert request.channel == C.CHANNEL_REVIEW and request.activity.target == "reviewer"
    assert request.activity.extra.get("attempt") == 1
    reviewer.publish(C.CHANNEL_REVIEW, with_attempt(as2.accept(
        "reviewer", "LGTM", context=context), 1))
    done = collect(node, about(context, "Announce", "forager-07"), "the closing Announce",
                   seen=seen)
    assert done.activity.summary.startswith("Done: ")
    # The result carried the assign's id as ref, and was answered once.
    results = forager.wait_sent("task.result")
    assert [r["ref"] for r in results] == [assign["id"]]
    bridge.wait_event(lambda e: e["ev"] == "approved" and e["context"] == context, "approved")


def test_reject_carries_its_reason(mesh: str, started: list[Any]) -> None:
    bridge = bridge_for(started, mesh)
    forager = forager_for(started, bridge, "forager-r", "--mode", "reject", "--reason",
                          "no crawler for shard 3")
    node = queen_side(started, mesh, "forager-r")
    context = offer(node, "forager-r")
    rej = collect(node, about(context, "Reject", "forager-r"), "Reject")
    assert rej.direct and "no crawler for shard 3" in rej.activity.summary
    assert rej.activity.object is not None
    assert rej.activity.object.content == "no crawler for shard 3"
    assert rej.activity.extra.get("attempt") == 1
    # A reject without body.reason is a malformed line: counted, answered nothing.
    assign = forager.wait_recv("task.assign")
    forager.command(op="send", kind="task.reject", ref=assign["id"], body={})
    bridge.wait_event(lambda e: e["ev"] == "dropped" and e["reason"] == "missing-field",
                      "the reject without a reason dropped")


def test_partial_results_are_updates_then_the_final_result(mesh: str,
                                                           started: list[Any]) -> None:
    bridge = bridge_for(started, mesh)
    forager_for(started, bridge, "forager-p", "--mode", "partial")
    node = queen_side(started, mesh, "forager-p")
    context = offer(node, "forager-p")
    seen: list[Message] = []
    collect(node, about(context, "Create", "forager-p"), "the final Create", seen=seen)
    collect(node, about(context, "Accept", "forager-p"), "the Accept", seen=seen)
    # Broadcasts keep their order (the Accept travels direct, on its own stream).
    kinds = [m.activity.type for m in seen
             if m.activity.context == context and m.channel == C.CHANNEL_LOG]
    assert kinds == ["Update", "Update", "Create"], kinds
    updates = [m.activity.to_dict() for m in seen if m.activity.type == "Update"]
    assert [u["object"]["items"][0]["url"] for u in updates] == [
        f"cm://forager-p/{context}/part1", f"cm://forager-p/{context}/part2"]
    assert all(u["summary"].startswith("step ") and u["attempt"] == 1 for u in updates)


def test_slots_bound_the_assigns_outstanding(mesh: str, started: list[Any]) -> None:
    bridge = bridge_for(started, mesh)
    two = forager_for(started, bridge, "forager-two", "--slots", "2", "--mode", "hold")
    one = forager_for(started, bridge, "forager-one", "--mode", "hold")
    node = queen_side(started, mesh, "forager-two", "forager-one")
    assert {p.name: p.advert.slots for p in node.peers() if p.advert.role == "worker"} == {
        "forager-two": 2, "forager-one": 1}
    seen: list[Message] = []
    first, second, third = (offer(node, "forager-two") for _ in range(3))
    two.wait_recv("task.assign", count=2)
    busy = collect(node, about(third, "Reject", "forager-two"), "busy Reject", seen=seen)
    assert busy.activity.summary == "Busy: all 2 slot(s) taken"
    a, b = two.received("task.assign")[:2]
    assert {a["body"]["node"], b["body"]["node"]} == {first, second}
    solo = offer(node, "forager-one")
    again = offer(node, "forager-one")
    one.wait_recv("task.assign")
    collect(node, about(again, "Reject", "forager-one"), "busy Reject", seen=seen)
    # A slot frees when its assign is answered.
    one.command(op="go")
    collect(node, about(solo, "Create", "forager-one"), "result", seen=seen)
    later = offer(node, "forager-one")
    assert one.wait_recv("task.assign", count=2)["body"]["node"] == later
    assert len(two.received("task.assign")) == 2


def architect(started: list[Any], mesh: str, workers: int, *extra: str) -> Running:
    """The demo's scripted architect (``porter-mesh agent architect``) as a process."""
    proc = Running("agent", "architect", "--name", "architect", "--mesh", mesh,
                   "--workers", str(workers), "--reviewer", "reviewer", "--heartbeat", "0.3",
                   "--evasive-after", "1.5", "--expire-after", "4", "--task-timeout", "60",
                   *extra)
    started.append(proc)
    return proc


def review_until(reviewer: SyncNode, arch: Running, timeout: float,
                 each: Callable[[], None] | None = None,
                 ) -> list[tuple[str, str, int | None]]:
    """Approve every review request until the architect exits; returns (worker, context,
    attempt) of each approved request.

    Each approval waits until the architect's board has the request (its console says
    ``-> in-review``), as a person at the dashboard would see it: messages from different
    senders are not ordered, so an instant verdict could reach the board first."""
    approved: list[tuple[str, str, int | None]] = []

    def done() -> bool:
        return arch.proc.poll() is not None
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"not done within {timeout}s; approved {approved}")
        if each is not None:
            each()
        try:
            msg = reviewer.receive(timeout=0.5)
        except TimeoutError:
            continue
        act = msg.activity
        if act.type == "Offer" and msg.channel == C.CHANNEL_REVIEW and act.context:
            attempt = act.extra.get("attempt")
            approved.append((msg.sender, act.context, attempt))
            arch.wait_until(lambda: sum("-> in-review" in line for line in arch.err)
                            >= len(approved) or done(), timeout, "the board in review")
            reviewer.publish(C.CHANNEL_REVIEW, with_attempt(as2.accept(
                "reviewer", "LGTM", context=act.context), attempt))
    return approved


def test_the_demo_architect_hands_its_task_to_a_forager(mesh: str,
                                                        started: list[Any]) -> None:
    bridge = bridge_for(started, mesh)
    forager = forager_for(started, bridge, "forager-07")
    reviewer = queen_side(started, mesh, "forager-07", name="reviewer")
    arch = architect(started, mesh, 1)
    approved = review_until(reviewer, arch, 90)
    assert arch.proc.wait(30) == 0, "\n".join(arch.err[-30:])
    assign = forager.wait_recv("task.assign")
    assert assign["body"]["summary"] == "Add GET /users endpoint"
    assert [(w, a) for w, _, a in approved] == [("forager-07", 1)]
    err = "\n".join(arch.err)
    assert "in-review -> done" in err and "the team learned" in err, err[-3000:]


def test_a_forager_killed_mid_task_is_reissued_and_done_once(mesh: str,
                                                             started: list[Any]) -> None:
    bridge = bridge_for(started, mesh)
    doomed = forager_for(started, bridge, "forager-a", "--die-after-accept")
    other = forager_for(started, bridge, "forager-b")
    reviewer = queen_side(started, mesh, "forager-a", "forager-b", name="reviewer")
    arch = architect(started, mesh, 2)
    approved = review_until(reviewer, arch, 90)
    assert arch.proc.wait(30) == 0, "\n".join(arch.err[-30:])
    doomed.wait_for(lambda e: e["ev"] == "dying", 10, "forager-a dying after its accept")
    assert doomed.proc.wait(10) == -signal.SIGKILL
    assert doomed.sent("task.accept") and not doomed.sent("task.result")
    assert [(w, a) for w, _, a in approved] == [("forager-b", 2)]
    assert len(other.wait_sent("task.result")) == 1
    bridge.wait_event(lambda e: e["ev"] == "fenced" and e["forager"] == "forager-a",
                      "forager-a's assign fenced")


def test_a_late_result_after_the_reissue_is_refused(mesh: str, started: list[Any]) -> None:
    bridge = bridge_for(started, mesh, "--assign-timeout", "3", "--evasive-after", "30",
                        "--expire-after", "60")
    slow = forager_for(started, bridge, "forager-a", "--mode", "hold", "--ignore-cancel")
    forager_for(started, bridge, "forager-b")
    reviewer = queen_side(started, mesh, "forager-a", "forager-b", name="reviewer")
    arch = architect(started, mesh, 2)
    slow.wait_sent("task.accept")
    os.kill(slow.proc.pid, signal.SIGSTOP)
    try:
        approved = review_until(reviewer, arch, 90)
    finally:
        os.kill(slow.proc.pid, signal.SIGCONT)
    assert arch.proc.wait(30) == 0, "\n".join(arch.err[-30:])
    assert [(w, a) for w, _, a in approved] == [("forager-b", 2)]
    cancel = slow.wait_recv("task.cancel")
    assign = slow.received("task.assign")[0]
    assert cancel["ref"] == assign["id"] and "assign_timeout" in cancel["body"]["reason"]
    slow.command(op="go")  # held before the cancel arrived: the late result
    slow.wait_sent("task.result")
    refused = bridge.wait_event(lambda e: e["ev"] == "refused-late", "the late result refused")
    assert refused["forager"] == "forager-a" and refused["ref"] == assign["id"]
    assert "fenced" not in arch.err[-1]
    assert not any("forager-a" in line and "in-review" in line for line in arch.err)


def test_drain_then_halt(mesh: str, started: list[Any]) -> None:
    bridge = bridge_for(started, mesh)
    forager = forager_for(started, bridge, "forager-d")
    node = queen_side(started, mesh, "forager-d")
    out = cli("control", "drain", "--to", "forager-d", "--mesh", mesh, "--wait", "20")
    assert out.returncode == 0, out.stderr
    drain = forager.wait_recv("ctl.drain")
    assert drain["to"] == "forager-d" and "drain" in drain["body"]["reason"]
    deadline = time.monotonic() + 20
    while not any(p.name == "forager-d" and p.draining for p in node.peers()):
        assert time.monotonic() < deadline, "forager-d never shown draining"
        time.sleep(0.05)
    context = offer(node, "forager-d")
    rej = collect(node, about(context, "Reject", "forager-d"), "draining Reject")
    assert rej.activity.summary.startswith("Draining")
    assert not forager.received("task.assign")
    out = cli("control", "halt", "--to", "forager-d", "--mesh", mesh, "--wait", "20")
    assert out.returncode == 0, out.stderr
    halt = forager.wait_recv("ctl.halt")
    assert "halted by" in halt["body"]["reason"]
    forager.wait_for(lambda e: e["ev"] == "closed", 20, "the forager stopping")
    deadline = time.monotonic() + 20
    while any(p.name == "forager-d" for p in node.peers()):
        assert time.monotonic() < deadline, "forager-d still on the mesh after halt"
        time.sleep(0.05)


def test_garbage_lines_are_counted_and_the_connection_kept(mesh: str,
                                                           started: list[Any]) -> None:
    bridge = bridge_for(started, mesh, "--max-line-bytes", "1024", "--bad-line-limit", "50")
    forager = forager_for(started, bridge, "forager-g")
    flooder = forager_for(started, bridge, "forager-f")
    node = queen_side(started, mesh, "forager-g")
    for text in ("this is not json", "[1, 2, 3]", '{"v": "1.1", "kind": "hb"}',
                 "x" * 5000, '{"v":"1.1","id":"m-1","from":"forager-g","to":"queen",'
                 '"kind":"task.result","ts":1}'):
        forager.command(op="raw", text=text)
    reasons = ["bad-json", "not-object", "missing-field", "too-long"]
    for reason in reasons:
        bridge.wait_event(lambda e, r=reason: e["ev"] == "dropped" and e["reason"] == r
                          and e["forager"] == "forager-g", f"a {reason} line dropped")
    # Unknown fields are ignored, not rejected; the connection is still served.
    context = offer(node, "forager-g")
    collect(node, about(context, "Create", "forager-g"), "the result after the garbage")
    assert not [e for e in forager.received("ctl.halt")]
    # A flood closes that connection only.
    flooder.command(op="raw", text="garbage", n=200)
    flooder.wait_for(lambda e: e["ev"] == "closed", 30, "the flooder's connection closed")
    bridge.wait_event(lambda e: e["ev"] == "closed" and e["forager"] == "forager-f",
                      "the flood noticed")
    again = offer(node, "forager-g")
    collect(node, about(again, "Create", "forager-g"), "a result after the flood")
    stats = json.loads(cli("stats", "iacp-bridge", "--json", "--mesh", mesh).stdout)
    counters = stats["counters"]
    for reason in reasons:
        assert counters.get(f"dropped.iacp.{reason}", 0) >= 1, counters
    assert counters["dropped.iacp.bad-json"] == 1 + 51  # forager-g's, then the flood's
    assert stats["iacp"]["counters"]["event.closed"] == 1


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_versions_other_than_1_1_are_refused(mesh: str, started: list[Any],
                                             version: str) -> None:
    bridge = bridge_for(started, mesh)
    old = forager_for(started, bridge, "forager-old", "--version", version, join=False)
    halt = old.wait_recv("ctl.halt")
    assert f"IACP {version}" in halt["body"]["reason"] and halt["v"] == "1.1"
    old.wait_for(lambda e: e["ev"] == "closed", 20, "the connection closed")
    refused = bridge.wait_event(lambda e: e["ev"] == "refused", "the refusal")
    assert refused["version"] == version
    assert not any(e["ev"] == "registered" for e in bridge.events())


def test_a_name_already_on_the_mesh_is_refused(mesh: str, started: list[Any],
                                               procs: list[NodeProcess]) -> None:
    bridge = bridge_for(started, mesh)
    first = forager_for(started, bridge, "twin")
    second = forager_for(started, bridge, "twin", join=False)
    halt = second.wait_recv("ctl.halt")
    assert "already on mesh" in halt["body"]["reason"]
    second.wait_for(lambda e: e["ev"] == "closed", 20, "the second twin's connection closed")
    procs.append(NodeProcess("taken", mesh=mesh))
    node = queen_side(started, mesh, "twin", "taken", "iacp-bridge")
    assert next(p for p in node.peers() if p.name == "iacp-bridge").advert.role == "gateway"
    bridge.wait_event(lambda e: e["ev"] == "peer" and e["peer"] == "taken"
                      and e["kind"] == "joined", "the bridge seeing the node named taken")
    clash = forager_for(started, bridge, "taken", join=False)
    reason = clash.wait_recv("ctl.halt")["body"]["reason"]
    assert "taken is already on mesh" in reason and "(role agent)" in reason
    # The first twin is still served.
    context = offer(node, "twin")
    collect(node, about(context, "Create", "twin"), "twin's result")
    assert not first.received("ctl.halt")


def test_silence_makes_a_forager_evasive_then_expired(mesh: str, started: list[Any]) -> None:
    bridge = bridge_for(started, mesh, "--evasive-after", "1.5", "--expire-after", "3")
    forager = forager_for(started, bridge, "forager-q", "--mode", "hold", "--ignore-cancel")
    node = queen_side(started, mesh, "forager-q")
    context = offer(node, "forager-q")
    forager.wait_sent("task.accept")
    forager.command(op="hb-stop")
    bridge.wait_event(lambda e: e["ev"] == "evasive", "evasive")
    bridge.wait_event(lambda e: e["ev"] == "expired", "expired")
    cancel = forager.wait_recv("task.cancel")
    assert cancel["body"]["node"] == context and "expired" in cancel["body"]["reason"]
    deadline = time.monotonic() + 20
    while any(p.name == "forager-q" for p in node.peers()):
        assert time.monotonic() < deadline, "forager-q still on the mesh"
        time.sleep(0.05)
    forager.command(op="go")  # its late result
    bridge.wait_event(lambda e: e["ev"] == "refused-late", "the late result refused")
    forager.command(op="hb-start")
    bridge.wait_until(lambda: sum(e["ev"] == "registered" for e in bridge.events()) == 2, 30,
                      "forager-q back on the mesh")
    node.wait_for_peers(["forager-q"], timeout=30)


def test_tool_query_and_mem_sync(mesh: str, started: list[Any]) -> None:
    bridge = bridge_for(started, mesh)
    forager = forager_for(started, bridge, "forager-m", "--tools", "crawl", "--remember",
                          "shard 3 has 40k pages")
    forager_for(started, bridge, "forager-n", "--tools", "crawl", "index")
    node = queen_side(started, mesh, "forager-m", "forager-n")
    forager.command(op="send", kind="tool.query", body={"tool": "index"})
    reply = forager.wait_recv("tool.reply")
    assert reply["ref"] == forager.sent("tool.query")[0]["id"]
    assert reply["body"] == {"tool": "index", "agents": ["forager-n"]}
    context = offer(node, "forager-m")
    seen: list[Message] = []
    remembered = collect(node, about(context, "Remember", "forager-m"), "Remember", seen=seen)
    assert remembered.activity.object is not None
    assert remembered.activity.object.content == "shard 3 has 40k pages"
    assert remembered.activity.object.about == context
    query = ("SELECT ?finding WHERE { ?o <https://porter.chapeaux.io/vocab#finding> ?finding ;"
             " <https://porter.chapeaux.io/vocab#discoveredBy> ?by }")
    out = cli("recall", query, "--mesh", mesh, "--json")
    assert out.returncode == 0, out.stderr
    assert "shard 3 has 40k pages" in out.stdout


def test_bad_listen_address_is_a_one_line_error() -> None:
    out = subprocess.run([*COMMAND, "iacp-bridge", "--listen", "127.0.0.1:99999"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "HOST:PORT" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([*COMMAND, "iacp-bridge", "--listen", "10.1.2.3:7421"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--insecure" in out.stderr, out.stderr
    assert sys.executable


# ----------------------------------------------------------------------------- restarts


def kill_bridge(bridge: Bridge) -> None:
    """SIGKILL the bridge: its foragers' nodes vanish without a goodbye."""
    os.kill(bridge.proc.pid, signal.SIGKILL)
    assert bridge.proc.wait(10) == -signal.SIGKILL


def restart_bridge(started: list[Any], old: Bridge, mesh: str, *extra: str) -> Bridge:
    """A new bridge process on the old one's port and data root."""
    return bridge_for(started, mesh, "--listen", f"127.0.0.1:{old.port}", *extra)


def holding(forager: Forager) -> list[str]:
    """Ids of the assigns the forager holds unanswered (neither cancelled nor answered)."""
    forager.catch_up()
    ended = {m["ref"] for m in forager.received("task.cancel")}
    ended |= {e["ref"] for e in forager.sent("task.result")}
    return [m["id"] for m in forager.received("task.assign") if m["id"] not in ended]


@pytest.mark.slow  # a kill -9 and a restart: a long fault run
@pytest.mark.parametrize("board_notices", [False, True], ids=["given-back", "re-offered"])
def test_a_bridge_killed_and_restarted_takes_its_forager_back(
        mesh: str, started: list[Any], board_notices: bool) -> None:
    bridge = bridge_for(started, mesh)
    forager = forager_for(started, bridge, "forager-a", "--mode", "hold", "--reconnect", "60")
    reviewer = queen_side(started, mesh, "forager-a", name="reviewer")
    # given-back: the architect's roster notices a silent worker only after 30 s, so the
    # board still has the task held by forager-a when it comes back through the
    # restarted bridge. re-offered: it expires forager-a's dead node (4 s) and fences
    # the claim before the bridge is back.
    timings = () if board_notices else ("--expire-after", "30", "--evasive-after", "20")
    arch = architect(started, mesh, 1, *timings)
    first = forager.wait_recv("task.assign", timeout=60)
    forager.wait_sent("task.accept")
    arch.wait_until(lambda: any("-> accepted" in line for line in arch.err), 30,
                    "the board seeing the Accept")
    kill_bridge(bridge)
    restarted = time.monotonic()
    if board_notices:
        arch.wait_until(lambda: any("fenced forager-a attempt 1" in line for line in arch.err),
                        30, "the board fencing the dead node's claim")
    again = restart_bridge(started, bridge, mesh)
    again.wait_event(lambda e: e["ev"] == "registered" and e["forager"] == "forager-a",
                     "forager-a back on the mesh through the new bridge")
    forager.wait_for(lambda e: e["ev"] == "reconnected", 10, "the forager reconnected")
    # Its own dead node on the roster is not a name clash: the forager is not halted.
    assert not forager.received("ctl.halt")
    restored = again.wait_event(lambda e: e["ev"] == "restored", "the held assign carried over")
    assert restored["ref"] == first["id"] and restored["state"] == "accepted"

    def work() -> None:
        # The forager works whatever it holds (the restored assign, or a new attempt's).
        held = holding(forager)
        if held and not any(e["ev"] == "sent" and e["kind"] == "task.result"
                            and e["ref"] == held[0] for e in forager.events):
            forager.command(op="go")
            forager.wait_until(lambda _: held[0] not in holding(forager), 10,
                               f"the result for {held[0]}")

    approved = review_until(reviewer, arch, 90, each=work)
    assert arch.proc.wait(30) == 0, "\n".join(arch.err[-30:])
    took = time.monotonic() - restarted
    assert [(w, a) for w, _, a in approved] == [("forager-a", 2 if board_notices else 1)]
    if board_notices:
        # The board's withdrawal of the fenced attempt reached the forager as a cancel of
        # the assign it held from before the restart.
        assert first["id"] in [m["ref"] for m in forager.received("task.cancel")]
    print(f"task done {took:.1f}s after the bridge was killed "
          f"({'re-offered' if board_notices else 'given back'})")
    assert took < 60, f"the task finished {took:.0f}s after the restart"
    assert not forager.received("ctl.halt")
    assert not [e for e in again.events() if e["ev"] == "refused"]
    err = "\n".join(arch.err)
    assert "in-review -> done" in err, err[-3000:]


@pytest.mark.slow  # a kill -9 and a restart: a long fault run
def test_an_offer_in_flight_across_a_bridge_restart_reaches_the_forager_once(
        mesh: str, started: list[Any]) -> None:
    bridge = bridge_for(started, mesh)
    forager = forager_for(started, bridge, "forager-n", "--mode", "hold", "--reconnect", "60")
    node = queen_side(started, mesh, "forager-n")
    kill_bridge(bridge)
    # The Offer leaves while forager-n's node is dead: the architect's node keeps it in
    # flight and resends it to the node the restarted bridge starts for forager-n.
    context = f"urn:porter:task:iacp{os.getpid()}x{next(_tasks)}"
    settled: list[BaseException | None] = []
    acknowledged = threading.Event()

    def on_done(error: BaseException | None) -> None:
        settled.append(error)
        acknowledged.set()
    node.send_nowait(C.DIRECT_PREFIX + "forager-n", with_attempt(as2.offer(
        node.name, "crawl index 9", "crawl the ninth shard", target="forager-n",
        context=context), 1), timeout=60, on_done=on_done)
    again = restart_bridge(started, bridge, mesh)
    again.wait_event(lambda e: e["ev"] == "registered" and e["forager"] == "forager-n",
                     "forager-n back on the mesh through the new bridge")
    assign = forager.wait_recv("task.assign", timeout=30)
    assert assign["body"]["node"] == context
    accept = collect(node, about(context, "Accept", "forager-n"), "the Accept")
    assert accept.activity.extra.get("attempt") == 1
    assert acknowledged.wait(30), "the Offer was never settled"
    assert settled == [None]
    # Once: one assign of that task, and no repeat of it.
    assert [m["body"]["node"] for m in forager.received("task.assign")] == [context]
    assert not [e for e in forager.events if e["ev"] == "repeat"]
    assert not forager.received("ctl.halt")


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs of few inodes for this test (it outlives the processes in ``started``)."""
    with tiny_filesystem(tmp_path / "disk", size="16m", inodes=200) as disk:
        yield disk


@pytest.mark.slow  # a kill -9 and a restart: a long fault run
def test_an_offer_the_bridge_cannot_record_is_declined_not_lost(
        mesh: str, tiny_disk: Path, started: list[Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORTER_MESH_DATA", str(tiny_disk))
    bridge = bridge_for(started, mesh, "--no-knowledge")
    forager = forager_for(started, bridge, "forager-s", "--mode", "hold", "--reconnect", "60")
    node = queen_side(started, mesh, "forager-s")
    assert (tiny_disk / mesh / "forager-s" / "iacp-forager.json").exists()
    fillers = fill_inodes(tiny_disk)
    # The node's journal (an open file) still takes the Offer and acknowledges it; the
    # bridge cannot write the forager's record, so it declines the Offer, never sends it.
    context = offer(node, "forager-s")
    def declines() -> list[Event]:
        return [e for e in bridge.events() if e["ev"] == "dropped"
                and e["reason"] == "storage" and "declined" in e["detail"]]
    # Offered again after a backoff, and declined again: it is still owed.
    bridge.wait_until(lambda: len(declines()) >= 2, 30, "the Offer declined twice")
    assert "cannot write" in declines()[0]["detail"]
    assert "free space" in declines()[0]["detail"]
    assert not forager.received("task.assign")
    # Killed while the disk is full, restarted once there is room again: the Offer was
    # owed in the journal, and reaches the forager once.
    kill_bridge(bridge)
    for path in fillers:
        path.unlink()
    again = restart_bridge(started, bridge, mesh, "--no-knowledge")
    again.wait_event(lambda e: e["ev"] == "registered" and e["forager"] == "forager-s",
                     "forager-s back on the mesh")
    assign = forager.wait_recv("task.assign", timeout=30)
    assert assign["body"]["node"] == context
    seen: list[Message] = []
    accept = collect(node, about(context, "Accept", "forager-s"), "the Accept", seen=seen)
    assert accept.activity.extra.get("attempt") == 1
    forager.command(op="go")
    collect(node, about(context, "Create", "forager-s"), "the result", seen=seen)
    assert [m["body"]["node"] for m in forager.received("task.assign")] == [context]
    assert not forager.received("ctl.halt")


def test_an_offer_to_the_bridge_itself_is_answered_not_swallowed(mesh: str,
                                                                  started: list[Any]) -> None:
    """The bridge's own node holds no task: an Offer sent to it gets a Reject that says
    where work goes, rather than an acknowledgement and nothing."""
    bridge = bridge_for(started, mesh)
    forager_for(started, bridge, "forager-o")
    node = queen_side(started, mesh, "forager-o", "iacp-bridge")
    context = offer(node, "iacp-bridge")
    rej = collect(node, about(context, "Reject", "iacp-bridge"), "the bridge's Reject")
    assert "forager by name" in rej.activity.summary
