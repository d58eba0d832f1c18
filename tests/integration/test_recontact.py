"""A seed that goes away and comes back is contacted again, however it went away.

``b`` knows ``a`` only as its static seed (no mDNS), and ``a`` knows nothing of ``b``.
``a`` leaves (a goodbye, or ``kill -9`` and expiry), stays away past ``expire_after``,
and a new ``a`` process starts on the same ports: ``b`` must find it by itself. Real
processes on 127.0.0.1; waits are on reported events with deadlines.
"""

from __future__ import annotations

import itertools
import os

import pytest

from tests.integration.harness import NodeProcess, peers_seen

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]

TIMINGS = ("--heartbeat", "0.2", "--evasive-after", "1", "--expire-after", "3",
           "--recontact-max", "1")
_ids = itertools.count()


@pytest.mark.parametrize("how", ["goodbye", "killed"])
def test_seed_that_comes_back_is_found_again(nodes: list[NodeProcess], how: str) -> None:
    mesh = f"rc{os.getpid()}-{next(_ids)}"
    a = NodeProcess("a", "--no-discovery", *TIMINGS, mesh=mesh)
    nodes.append(a)
    b = NodeProcess("b", "--no-discovery", "--seed", f"127.0.0.1:{a.up['router']}", *TIMINGS,
                    mesh=mesh)
    nodes.append(b)
    b.wait_until(lambda ev: "a" in peers_seen(ev), 20, "b finds its seed")
    if how == "goodbye":
        a.stop()
    else:
        a.kill()
    # A goodbye is best effort (one broadcast on the way out; a loaded machine can close
    # the socket first): then b expires a instead.
    reasons = {"goodbye", "expired"} if how == "goodbye" else {"expired"}
    left = b.wait_for(lambda e: e["ev"] == "peer" and e["kind"] == "left", 20, "a leaves")
    assert left["reason"] in reasons
    # Away for longer than expiry, while b keeps knocking on a closed port.
    b.watch(4.0, lambda e: e["ev"] == "peer" and e["kind"] == "joined" and e["peer"] == "a",
            "a was found while it was not running")
    again = NodeProcess("a", "--no-discovery", "--router-port", str(a.up["router"]),
                        "--pub-port", str(a.up["pub"]), *TIMINGS, mesh=mesh)
    nodes.append(again)
    joined = b.wait_for(lambda e: e["ev"] == "peer" and e["kind"] == "joined"
                        and e["inc"] == again.up["inc"], 20, "b finds the new a")
    assert joined["peer"] == "a"
    again.wait_until(lambda ev: "b" in peers_seen(ev), 20, "the new a learns of b")
    b.command(op="send", to="a", start=0, n=20)
    assert b.wait_for(lambda e: e["ev"] == "sent", 30, "sends to the new a")["ok"] == 20
    assert sum("trying it again" in line for line in b.stderr.splitlines()) == 1
