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
