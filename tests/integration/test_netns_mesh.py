"""Full nodes on three "hosts" (network namespaces joined by a bridge): mDNS discovery
across the bridge, broadcast and acknowledged direct delivery between hosts.

Skipped, with the reason printed, where namespaces cannot be made (not root, no ``ip``).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from tests.integration.harness import NodeProcess, peers_seen
from tests.integration.netns import Lab, network_lab, unavailable_reason

pytestmark = [pytest.mark.netns, pytest.mark.network, pytest.mark.timeout(120)]


@pytest.fixture
def lab() -> Iterator[Lab]:
    reason = unavailable_reason()
    if reason is not None:
        print(f"skipping network-namespace test: {reason}")
        pytest.skip(reason)
    with network_lab(3) as built:
        yield built


def test_nodes_on_three_hosts_talk(lab: Lab) -> None:
    mesh = f"lab-{secrets.token_hex(3)}"
    names = [f"host-{h.netns[-1]}" for h in lab.hosts]
    nodes: list[NodeProcess] = []
    try:
        for host, name in zip(lab.hosts, names, strict=True):
            # The lab's hosts exist only inside this test: an unsecured mesh there is
            # an explicit choice (protected mode refuses it otherwise).
            nodes.append(NodeProcess(name, "--interface", host.address, "--insecure",
                                     mesh=mesh, prefix=host.command([])))
        for node in nodes:
            others = set(names) - {node.name}
            node.wait_until(lambda ev, o=others: o <= peers_seen(ev), 30,
                            f"{node.name} discovers {sorted(others)} across the bridge")
        first, second, third = nodes
        first.command(op="wait-subscribers", channel="log", n=2, timeout=15)
        first.wait_for(lambda e: e["ev"] == "subscribers", 20, "subscribers across hosts")
        first.command(op="publish", channel="log", text="across-", n=50)
        for node in (second, third):
            node.wait_until(lambda ev: sum(1 for e in ev if e["ev"] == "msg"
                                           and e["sender"] == first.name) >= 50, 20,
                            "50 broadcasts from the first host")
            texts = [e["text"] for e in node.messages() if e["sender"] == first.name]
            assert texts == [f"across-{i}" for i in range(50)]
        second.command(op="send", to=third.name, start=0, n=200)
        done = second.wait_for(lambda e: e["ev"] == "sent", 30, "direct sends acknowledged")
        assert done["ok"] == 200
        third.wait_until(lambda ev: sum(1 for e in ev if e["ev"] == "msg" and e["direct"])
                         >= 200, 20, "200 direct messages")
        got = sorted(int(e["text"][1:]) for e in third.messages() if e["direct"])
        assert got == list(range(200))
        # The peers are known at their lab addresses, not loopback.
        assert all(node.up["pub"] > 0 for node in nodes)
    finally:
        for node in nodes:
            node.stop()
