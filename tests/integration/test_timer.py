"""The node's one timer moves forward when a new, earlier deadline appears.

Nothing polls: the timer waits for the earliest deadline it knows. A node whose next
heartbeat is 30 s away must still resend a direct message after its retransmission
timeout and fail it at its own deadline, not at that heartbeat. The receiver is a real
process stopped with SIGSTOP, so nothing it sends wakes the sender's loop meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from porter_mesh.core.as2 import announce
from porter_mesh.errors import DeliveryTimeout
from porter_mesh.node.config import NodeConfig
from porter_mesh.node.node import Node
from porter_mesh.node.sync import SyncNode
from tests.integration.harness import NodeProcess

pytestmark = [pytest.mark.network, pytest.mark.timeout(90)]

HEARTBEAT = 30.0


@pytest.fixture
def sleepy(mesh: str) -> Iterator[SyncNode]:
    """A node with a heartbeat far longer than any deadline of the test."""
    with SyncNode(name="sleepy", mesh=mesh, heartbeat_interval=HEARTBEAT,
                  evasive_after=3 * HEARTBEAT, expire_after=4 * HEARTBEAT,
                  recontact_max=HEARTBEAT, retry_initial=0.05, retry_max=0.2) as n:
        yield n


def test_a_send_fails_at_its_deadline_not_at_the_next_heartbeat(
    mesh: str, sleepy: SyncNode
) -> None:
    peer = NodeProcess("frozen", mesh=mesh)
    try:
        sleepy.wait_for_peers(["frozen"], 20)
        # The first heartbeat went at start; the next one is HEARTBEAT seconds away.
        peer.proc.send_signal(signal.SIGSTOP)
        before = sleepy.stats().get("retries", 0)
        started = time.monotonic()
        with pytest.raises(DeliveryTimeout):
            sleepy.send("frozen", announce("sleepy", "anyone?"), timeout=0.5)
        took = time.monotonic() - started
        # Resent on its own backoff (0.05 s doubling to 0.2 s) meanwhile, several times.
        retries = sleepy.stats().get("retries", 0) - before
    finally:
        peer.proc.send_signal(signal.SIGCONT)
        peer.stop()
    assert took < 5.0, f"the send failed after {took:.1f}s, not at its 0.5 s deadline"
    assert retries >= 2, retries


async def _start_pair(mesh: str, tmp_path: Path) -> None:
    first = Node(name="first", mesh=mesh, discovery=False, data_dir=tmp_path / "first")
    async with first:
        second = Node(name="second", mesh=mesh, discovery=False, data_dir=tmp_path / "second",
                      seeds=(f"127.0.0.1:{first.router_port}",))
        async with second:
            # Many loop turns after each start: each node's first timer has run.
            await first.wait_for_peers(["second"], 20)
            await second.wait_for_peers(["first"], 20)


def test_a_starting_node_is_not_taken_for_a_paused_one(
    mesh: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The first timer must be armed from the start's own clock: armed from nothing, it
    # looks as late as the machine's uptime, and a pause that long would shift every
    # peer's silence and re-introduce the node to everyone.
    with caplog.at_level(logging.WARNING, logger="porter_mesh"):
        asyncio.run(_start_pair(mesh, tmp_path))
    paused = [r.getMessage() for r in caplog.records if "was paused" in r.getMessage()]
    assert paused == []



async def _heartbeats_while_registering(mesh: str) -> tuple[list[str], float]:
    # A watcher that knows the starting node's ROUTER port links to it while the node
    # still registers with mDNS (a second or more), and marks it evasive if its
    # heartbeats do not come.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = NodeConfig(name="finder", mesh=mesh, interfaces=("127.0.0.1",), discovery=True,
                        router_port=port, heartbeat_interval=0.1, evasive_after=0.6,
                        expire_after=5.0)
    finder = Node(config)
    watcher = Node(config.with_changes(name="watcher", discovery=False, router_port=0,
                                       seeds=(f"127.0.0.1:{port}",)))
    seen: list[str] = []
    watcher.add_peer_listener(
        lambda e: seen.append(e.kind.value) if e.peer.name == "finder" else None)
    async with watcher:
        started = time.monotonic()
        await finder.astart()
        took = time.monotonic() - started
        try:
            await watcher.wait_for_peers(["finder"], 20)
        finally:
            await finder.aclose()
    return seen, took


def test_the_first_heartbeat_does_not_wait_for_mdns(mesh: str) -> None:
    seen, took = asyncio.run(_heartbeats_while_registering(mesh))
    assert "joined" in seen, seen
    assert "evasive" not in seen, f"no heartbeat while registering ({took:.2f}s): {seen}"
