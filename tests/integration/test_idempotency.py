"""A retry with the same idempotency key is handled once: after a DeliveryTimeout during
a SIGSTOP (the first attempt was delivered on SIGCONT all the same), and across a kill -9
and restart of the receiver on the same data directory."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from porter_mesh.core.as2 import announce
from porter_mesh.errors import DeliveryTimeout
from porter_mesh.node.sync import SyncNode
from tests.integration.harness import NodeProcess

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]
RECEIVER = Path(__file__).with_name("crash_receiver.py")


def handled(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def wait_handled(path: Path, want: list[str], proc: NodeProcess, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while handled(path) != want:
        if time.monotonic() > deadline:
            raise AssertionError(f"handled {handled(path)}, wanted {want}; "
                                 f"stderr: {proc.stderr[-1500:]}")
        proc._pump(0.05)


def receiver(procs: list[NodeProcess], mesh: str, tmp_path: Path, *ports: str) -> NodeProcess:
    p = NodeProcess("recv", "--data-dir", str(tmp_path / "recv"), "--out",
                    str(tmp_path / "out.txt"), "--mode", "handler", *ports, mesh=mesh,
                    script=RECEIVER)
    procs.append(p)
    return p


def test_a_retried_key_is_handled_once_after_a_pause(
    procs: list[NodeProcess], mesh: str, tmp_path: Path
) -> None:
    recv = receiver(procs, mesh, tmp_path)
    out = tmp_path / "out.txt"
    with SyncNode(name="client", mesh=mesh, retry_initial=0.05, retry_max=0.2,
                  evasive_after=30.0, expire_after=60.0) as node:
        node.wait_for_peers(["recv"], 20)
        recv.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(DeliveryTimeout):
                node.send("recv", announce("client", "order-1"), key="order-1", timeout=1.0)
        finally:
            recv.proc.send_signal(signal.SIGCONT)
        # The first attempt was in the receiver's socket: it is handled on SIGCONT.
        wait_handled(out, ["order-1"], recv)
        # The application retries, as a DeliveryTimeout invites: acknowledged, not
        # handled again; an unkeyed message is handled as usual.
        node.send("recv", announce("client", "order-1"), key="order-1", timeout=10.0)
        node.send("recv", announce("client", "plain"), timeout=10.0)
        wait_handled(out, ["order-1", "plain"], recv)
        node.send("recv", announce("client", "plain"), timeout=10.0)
        wait_handled(out, ["order-1", "plain", "plain"], recv)


def test_a_retried_key_is_handled_once_across_a_receiver_restart(
    procs: list[NodeProcess], mesh: str, tmp_path: Path
) -> None:
    first = receiver(procs, mesh, tmp_path)
    out = tmp_path / "out.txt"
    with SyncNode(name="client", mesh=mesh, retry_initial=0.05, retry_max=0.2) as node:
        node.wait_for_peers(["recv"], 20)
        node.send("recv", announce("client", "order-7"), key="order-7", timeout=10.0)
        wait_handled(out, ["order-7"], first)
        first.kill()
        second = receiver(procs, mesh, tmp_path, "--pub-port", str(first.up["pub"]),
                          "--router-port", str(first.up["router"]))
        node.send("recv", announce("client", "order-7"), key="order-7", timeout=20.0)
        node.send("recv", announce("client", "order-8"), key="order-8", timeout=20.0)
        wait_handled(out, ["order-7", "order-8"], second)
