"""Discovery across a bridge between three network namespaces (three "hosts").

Each host runs one probe bound to its lab address only; mDNS multicast crosses the
lab's bridge and nothing else. Skipped, with the reason, where namespaces cannot be made.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator

import pytest

from tests.integration.discovery_probe import ProbeProcess
from tests.integration.netns import (
    IP,
    SUBNET_PREFIX,
    Lab,
    lab_namespaces_left,
    network_lab,
    spawn_on_hosts,
    unavailable_reason,
)

pytestmark = [pytest.mark.netns, pytest.mark.network]

DEADLINE = 20.0


def _root_addresses() -> str:
    return subprocess.run(
        [IP, "-br", "addr"], capture_output=True, text=True, check=True, timeout=10
    ).stdout


@pytest.fixture
def lab() -> Iterator[Lab]:
    reason = unavailable_reason()
    if reason is not None:
        print(f"skipping network-namespace test: {reason}")
        pytest.skip(reason)
    root_before = _root_addresses()
    with network_lab(3) as built:
        yield built
    assert not [n for n in lab_namespaces_left() if n.startswith(built.tag)]
    assert _root_addresses() == root_before, "the lab changed the root namespace"


def test_three_hosts_discover_each_other_across_the_bridge(lab: Lab) -> None:
    assert SUBNET_PREFIX not in _root_addresses()
    mesh = f"lab-{secrets.token_hex(3)}"
    probes = [
        ProbeProcess(
            mesh=mesh,
            name=f"host-{host.netns[-1]}",
            interface=host.address,
            prefix=host.command([]),
        )
        for host in lab.hosts
    ]
    try:
        address_of = {p.name: h.address for p, h in zip(probes, lab.hosts, strict=True)}
        last = 0.0
        for probe in probes:
            seen = probe.wait_found(set(address_of) - {probe.name}, DEADLINE)
            for peer, event in seen.items():
                # Reached at the peer's lab address: the records crossed the bridge.
                assert event["addresses"] == [address_of[peer]]
                last = max(last, event["t"])
        print(f"3 namespaces: spawn to full discovery {last - probes[0].started_at:.2f}s")
        leaving = probes[0]
        leaving.close()
        for probe in probes[1:]:
            probe.wait_for(
                lambda e: e["event"] == "lost" and e["peer"] == leaving.name, DEADLINE, "lost"
            )
    finally:
        for probe in probes:
            probe.kill()
            probe.cleanup()


def test_each_host_sees_only_its_own_interfaces(lab: Lab) -> None:
    procs = spawn_on_hosts(lab, lambda host: [IP, "-4", "-o", "addr"], stdout=subprocess.PIPE)
    for host, proc in zip(lab.hosts, procs, strict=True):
        out, _ = proc.communicate(timeout=10)
        assert proc.returncode == 0
        assigned = {(line.split()[1], line.split()[3]) for line in out.decode().splitlines()}
        assert assigned == {("lo", "127.0.0.1/8"), ("eth0", f"{host.address}/24")}
