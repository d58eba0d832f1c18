"""Each blocking call of SyncNode raises what it promises: the node's own errors as they
are (a DeliveryTimeout naming its recipient stays a DeliveryTimeout, although it is a
TimeoutError too), OperationTimeout only when the facade itself gave up waiting."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import pytest

from porter_mesh.core.as2 import announce
from porter_mesh.errors import (
    DeliveryTimeout,
    NodeClosedError,
    OperationTimeout,
    UnknownPeerError,
)
from porter_mesh.node.sync import SyncNode
from tests.integration.harness import NodeProcess

pytestmark = [pytest.mark.network, pytest.mark.timeout(90)]




@pytest.fixture
def node(mesh: str) -> Iterator[SyncNode]:
    with SyncNode(name="facade", mesh=mesh, heartbeat_interval=0.2, evasive_after=20.0,
                  expire_after=30.0, retry_initial=0.05, retry_max=0.2) as n:
        yield n


@pytest.fixture
def stopped_peer(mesh: str, node: SyncNode) -> Iterator[str]:
    """A real peer process, found and then frozen with SIGSTOP."""
    peer = NodeProcess("frozen", mesh=mesh)
    try:
        node.wait_for_peers(["frozen"], 20)
        peer.proc.send_signal(signal.SIGSTOP)
        yield "frozen"
    finally:
        peer.proc.send_signal(signal.SIGCONT)
        peer.stop()


def test_send_to_a_stopped_peer_raises_delivery_timeout(
    node: SyncNode, stopped_peer: str
) -> None:
    with pytest.raises(DeliveryTimeout) as caught:
        node.send(stopped_peer, announce("facade", "hello"), timeout=1.0)
    assert not isinstance(caught.value, OperationTimeout)
    assert caught.value.recipient == stopped_peer


def test_send_to_channel_to_a_stopped_peer_raises_delivery_timeout(
    node: SyncNode, stopped_peer: str
) -> None:
    with pytest.raises(DeliveryTimeout) as caught:
        node.send_to_channel(f"task:{stopped_peer}", announce("facade", "hi"), timeout=1.0)
    assert not isinstance(caught.value, OperationTimeout)
    assert caught.value.recipient == stopped_peer


def test_send_to_an_unknown_agent_raises_unknown_peer(node: SyncNode) -> None:
    with pytest.raises(UnknownPeerError) as caught:
        node.send("nobody", announce("facade", "hi"), timeout=1.0)
    assert caught.value.recipient == "nobody"


def test_receive_raises_operation_timeout(node: SyncNode) -> None:
    with pytest.raises(OperationTimeout, match="no message within"):
        node.receive(0.2)


def test_wait_readable_returns_false(node: SyncNode) -> None:
    assert node.wait_readable(0.2) is False


def test_wait_for_peers_raises_operation_timeout_naming_them(node: SyncNode) -> None:
    with pytest.raises(OperationTimeout, match="nosuch"):
        node.wait_for_peers(["nosuch"], 0.3)


def test_wait_for_stats_raises_operation_timeout(node: SyncNode) -> None:
    with pytest.raises(OperationTimeout, match="stats"):
        node.wait_for_stats(lambda stats: False, 0.2)


def test_run_coroutine_that_outlives_its_timeout(node: SyncNode) -> None:
    with pytest.raises(OperationTimeout, match="did not complete within"):
        node.run_coroutine(asyncio.sleep(5), timeout=0.2)


def test_run_coroutine_raising_a_timeout_of_its_own(node: SyncNode) -> None:
    async def fails() -> None:
        raise DeliveryTimeout("late", recipient="w1")

    with pytest.raises(DeliveryTimeout) as caught:
        node.run_coroutine(fails(), timeout=5.0)
    assert caught.value.recipient == "w1"


def test_call_in_loop_raising_a_timeout_of_its_own(node: SyncNode) -> None:
    def fails() -> None:
        raise TimeoutError("the function's own")

    with pytest.raises(TimeoutError, match="the function's own") as caught:
        node.call_in_loop(fails, timeout=5.0)
    assert not isinstance(caught.value, OperationTimeout)


@pytest.mark.parametrize("call", [
    lambda n: n.publish("log", announce("facade", "x")),
    lambda n: n.send("frozen", announce("facade", "x")),
    lambda n: n.receive(0.1),
    lambda n: n.drain(),
    lambda n: n.ack(),
    lambda n: n.peers(),
    lambda n: n.stats(),
    lambda n: n.subscribe("review"),
    lambda n: n.control("drain"),
])
def test_calls_after_close_raise_node_closed(mesh: str, call: object) -> None:
    n = SyncNode(name="closed", mesh=mesh)
    n.close()
    with pytest.raises(NodeClosedError):
        call(n)  # type: ignore[operator]
