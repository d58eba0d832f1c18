"""A command's broadcast reaches the peers that mDNS has not named to it yet.

``porter-mesh send log TEXT`` finds one peer by mDNS and would publish once that peer has
subscribed; a node the seat learns of only from that peer's welcome (peer exchange: here
a node that does not announce itself, reached by a seed) must be waited for too, or it
silently misses the message while the command says all was well.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from porter_mesh.node.node import Message
from porter_mesh.node.sync import SyncNode

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]
_ids = itertools.count()


class Announcements:
    """The summaries a node's handler took, with an event per expected one."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.changed = threading.Condition()

    def __call__(self, msg: Message) -> None:
        with self.changed:
            self.seen.add(str(msg.activity.summary))
            self.changed.notify_all()

    def wait_for(self, summary: str, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: summary in self.seen, timeout)


@pytest.fixture
def mesh() -> Iterator[tuple[str, Announcements, Announcements]]:
    name = f"seatb{os.getpid()}-{next(_ids)}"
    heard_a, heard_b = Announcements(), Announcements()
    # a: announced in mDNS. b: not announced; it knows a by a seed, so a command hears
    # of b only from a's welcome.
    a = SyncNode(name="a", mesh=name, channels=("control", "log"), handlers=[heard_a])
    try:
        b = SyncNode(name="b", mesh=name, channels=("control", "log"), handlers=[heard_b],
                     advertise=False, seeds=(f"127.0.0.1:{a.node.router_port}",))
        try:
            a.wait_for_peers(["b"], 20)
            b.wait_for_peers(["a"], 20)
            yield name, heard_a, heard_b
        finally:
            b.close()
    finally:
        a.close()


def test_a_peer_known_only_by_peer_exchange_gets_the_broadcast(
        mesh: tuple[str, Announcements, Announcements]) -> None:
    name, heard_a, heard_b = mesh
    for i in range(4):  # each command is a new seat, racing mDNS afresh
        summary = f"status {i}"
        sent = subprocess.run(
            [sys.executable, "-m", "porter_mesh.cli.main", "send", "log", summary,
             "--mesh", name, "--output", "json"], capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        assert heard_a.wait_for(summary, 20), (summary, sent.stdout, sent.stderr)
        assert heard_b.wait_for(summary, 20), (
            f"b missed {summary!r}; the command reported {sent.stdout.strip()}")
