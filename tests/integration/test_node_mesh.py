"""Nodes as separate OS processes on 127.0.0.1: discovery, broadcast, direct, liveness."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from porter_mesh import eventloop
from porter_mesh.adapters.journal import read_journal
from porter_mesh.core import speedups
from tests.integration.harness import NodeProcess, peers_seen

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]


def start(procs: list[NodeProcess], name: str, *extra: str, mesh: str) -> NodeProcess:
    p = NodeProcess(name, *extra, mesh=mesh)
    procs.append(p)
    return p


@pytest.mark.parametrize("path", ["default", "pure", "asyncio-loop"])
def test_discovery_and_ordered_broadcast(procs: list[NodeProcess], mesh: str, path: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Also on the pure Python path (``PORTER_MESH_PURE=1``), which an install without a
    C compiler runs; the default is the compiled one where it is built. And on asyncio's
    own loop (``PORTER_MESH_LOOP=asyncio``), which runs where uvloop is not installed;
    the default is uvloop's."""
    if path == "pure":
        monkeypatch.setenv(speedups.PURE_ENV, "1")
    if path == "asyncio-loop":
        monkeypatch.setenv(eventloop.LOOP_ENV, "asyncio")
    names = [f"n{i}" for i in range(4)]
    nodes = [start(procs, n, mesh=mesh) for n in names]
    if path == "pure" or not speedups.available():
        assert not any(node.up["compiled"] for node in nodes)
    else:
        assert all(node.up["compiled"] for node in nodes)
    assert {node.up["loop"] for node in nodes} == {
        "asyncio" if path == "asyncio-loop" else eventloop.loop_name()}
    for node in nodes:
        others = set(names) - {node.name}
        node.wait_until(lambda ev, o=others: peers_seen(ev) >= o, 20,
                        f"{node.name} discovers {sorted(others)}")
    sender = nodes[0]
    sender.command(op="wait-subscribers", channel="log", n=3, timeout=10)
    sender.wait_for(lambda e: e["ev"] == "subscribers", 15, "3 subscribers on log")
    sender.command(op="publish", channel="log", text="b", n=300)
    for node in nodes[1:]:
        node.wait_until(
            lambda ev: sum(1 for e in ev if e["ev"] == "msg" and e["sender"] == "n0") >= 300,
            20, "300 broadcasts from n0")
        got = [e for e in node.messages() if e["sender"] == "n0"]
        assert [e["text"] for e in got] == [f"b{i}" for i in range(300)]
        assert [e["seq"] for e in got] == sorted(e["seq"] for e in got)
        assert all(e["ch"] == "log" and not e["direct"] for e in got)


@pytest.mark.parametrize("loop", ["default", "asyncio"])
def test_direct_exactly_once_across_receiver_kill(
    procs: list[NodeProcess], mesh: str, tmp_path: Path, loop: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if loop == "asyncio":
        monkeypatch.setenv(eventloop.LOOP_ENV, "asyncio")
    data = tmp_path / "receiver"
    receiver = start(procs, "recv", "--data-dir", str(data), "--quiet-messages", mesh=mesh)
    pub, router = receiver.up["pub"], receiver.up["router"]
    sender = start(procs, "send", mesh=mesh)
    sender.wait_until(lambda ev: "recv" in peers_seen(ev), 20, "sender finds receiver")
    total = 3000
    sender.command(op="send", to="recv", start=0, n=total)
    journal = data / "inbox.journal"
    # Mid-stream: some messages are in (and journaled: the count is reported after).
    receiver.wait_for(lambda e: e["ev"] == "count" and e["n"] >= 300, 20, "300 delivered")
    receiver.kill()
    assert len(read_journal(journal)) > 0
    # Same ports, same data directory, new incarnation.
    receiver2 = start(procs, "recv", "--data-dir", str(data), "--pub-port", str(pub),
                      "--router-port", str(router), "--quiet-messages", mesh=mesh)
    assert receiver2.up["inc"] != receiver.up["inc"]
    done = sender.wait_for(lambda e: e["ev"] == "sent", 60, "all sends acknowledged")
    assert done["ok"] == total
    # Each of the sender's sequence numbers is on record once (a restart compacts the
    # journal, dropping the payloads of what was handled, but never the record).
    seqs: list[int] = []
    for record in read_journal(journal):
        seqs.extend(range(record.first_seq, record.first_seq + record.count))
    assert len(seqs) == len(set(seqs)), "a message was recorded twice"
    assert set(seqs) == set(range(1, total + 1))


def test_killed_peer_goes_evasive_then_expires(procs: list[NodeProcess], mesh: str) -> None:
    a = start(procs, "a", mesh=mesh)
    b = start(procs, "b", mesh=mesh)
    a.wait_until(lambda ev: "b" in peers_seen(ev), 20, "a finds b")
    killed_at = time.monotonic()
    b.kill()
    ev1 = a.wait_for(lambda e: e["ev"] == "peer" and e["peer"] == "b"
                     and e["kind"] == "evasive", 10, "b evasive")
    evasive_at = time.monotonic()
    ev2 = a.wait_for(lambda e: e["ev"] == "peer" and e["peer"] == "b" and e["kind"] == "left",
                     10, "b expired")
    expired_at = time.monotonic()
    assert ev2["reason"] == "expired"
    assert a.events.index(ev1) < a.events.index(ev2)
    # Configured: evasive after 0.8 s, expired after 2.0 s of silence (plus tick slack).
    assert evasive_at - killed_at < 0.8 + 1.5
    assert expired_at - killed_at < 2.0 + 1.5


def test_paused_peer_comes_back(procs: list[NodeProcess], mesh: str) -> None:
    a = start(procs, "a", mesh=mesh)
    b = start(procs, "b", mesh=mesh)
    a.wait_until(lambda ev: "b" in peers_seen(ev), 20, "a finds b")
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        a.wait_for(lambda e: e["ev"] == "peer" and e["peer"] == "b" and e["kind"] == "evasive",
                   10, "b evasive while stopped")
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    n = len(a.events)
    a.wait_for(lambda e: a.events.index(e) >= n and e["ev"] == "peer" and e["peer"] == "b"
               and e["kind"] in ("alive", "joined"), 10, "b alive again")
    assert "b" in peers_seen(a.events)
    # And it is really usable again: a broadcast from b reaches a.
    b.command(op="wait-subscribers", channel="log", n=1, timeout=10)
    b.wait_for(lambda e: e["ev"] == "subscribers", 15)
    b.command(op="publish", channel="log", text="back", n=1)
    a.wait_for(lambda e: e["ev"] == "msg" and e["text"] == "back0", 10, "message after resume")
