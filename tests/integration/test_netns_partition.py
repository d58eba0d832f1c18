"""A network partition, caused for real, outlasting peer expiry; then the link returns.

Two hosts (network namespaces on one bridge, see :mod:`tests.integration.netns`), two
nodes on each, each node with its knowledge replica on disk, joined only by static
seeds (no mDNS)::

    host a:  a1 <--seed-- a2           host b:  b1 --seed--> a1,  b2 --seed--> b1

The bridge port of host a goes down for longer than ``expire_after``: each side expires
the other (checked), and both sides keep remembering. Nobody may cross the partition
while it lasts (watched). When the port comes back up, every node must see the three
others alive again within a deadline (the time taken is printed), the replicas' digests
must agree and hold everything written on both sides, and ``porter-mesh kg export`` of
the four shards must be identical.

Skipped, with the reason printed, where namespaces cannot be made (not root, no ``ip``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.harness import Event, NodeProcess, peers_seen
from tests.integration.kg_proc import poll
from tests.integration.netns import IP, Lab, network_lab, unavailable_reason

pytestmark = [pytest.mark.netns, pytest.mark.network, pytest.mark.slow]

#: Expiry well inside the partition; the re-contact cap is the node's default (5 s).
TIMINGS = ("--heartbeat", "0.5", "--evasive-after", "2", "--expire-after", "6")
#: How long every node may take to see the others again once the link is back: the
#: backoff cap, a catch-up, and room for a loaded machine.
HEAL_DEADLINE = 45.0


@pytest.fixture
def lab() -> Iterator[Lab]:
    reason = unavailable_reason()
    if reason is not None:
        print(f"skipping network-namespace test: {reason}")
        pytest.skip(reason)
    with network_lab(2) as built:
        yield built


def set_link(lab: Lab, state: str) -> None:
    """Bring host a's port on the bridge ``up`` or ``down`` (inside the lab only)."""
    subprocess.run([IP, "-n", lab.bridge_netns, "link", "set", "v-a", state], check=True,
                   capture_output=True, timeout=30)


def kg(node: NodeProcess) -> Event:
    return node.ask("kg", "kg")


def converged(nodes: list[NodeProcess], tops: dict[str, int]) -> bool:
    states = [kg(n) for n in nodes]
    return (len({s["digest"] for s in states}) == 1
            and all(s["vv"].get(origin, 0) >= top for s in states for origin, top in tops.items()))


def remember(node: NodeProcess, prefix: str, n: int, tops: dict[str, int]) -> None:
    node.ask("remember", "stored", n=n, prefix=prefix)
    tops[node.name] = tops.get(node.name, 0) + n


def start_groups(lab: Lab, tmp_path: Path, nodes: list[NodeProcess]
                 ) -> tuple[list[NodeProcess], list[NodeProcess]]:
    host_a, host_b = lab.hosts
    mesh = lab.tag

    def start(name: str, host_index: int, *seeds: str) -> NodeProcess:
        host = lab.hosts[host_index]
        name = f"{name}-{lab.tag}"
        extra = [arg for seed in seeds for arg in ("--seed", seed)]
        node = NodeProcess(name, "--interface", host.address, "--insecure", "--no-discovery",
                           "--knowledge", str(tmp_path / name), *TIMINGS, *extra,
                           mesh=mesh, prefix=host.command([]))
        nodes.append(node)
        return node

    a1 = start("a1", 0)
    seed_a1 = f"{host_a.address}:{a1.up['router']}"
    a2 = start("a2", 0, seed_a1)
    b1 = start("b1", 1, seed_a1)
    b2 = start("b2", 1, f"{host_b.address}:{b1.up['router']}")
    return [a1, a2], [b1, b2]


def see_all(nodes: list[NodeProcess], timeout: float, what: str) -> None:
    names = {n.name for n in nodes}
    for node in nodes:
        others = names - {node.name}
        node.wait_until(lambda ev, o=others: o <= peers_seen(ev), timeout,
                        f"{node.name} {what} {sorted(others)}")


def hold_partition(nodes: list[NodeProcess], side: dict[str, str], until: float) -> None:
    """Keep watching every node until ``until``: nobody may be heard across the cut."""

    while time.monotonic() < until:
        for node in nodes:
            mine = side[node.name]
            node.watch(min(0.25, max(0.0, until - time.monotonic())),
                       lambda e, m=mine: e["ev"] == "peer" and e["kind"] in ("joined", "alive")
                       and side.get(e["peer"]) != m,
                       "a peer across the partition was heard")


def exported(node: NodeProcess, data: Path) -> list[str]:
    """``porter-mesh kg export`` of a stopped node's shard, as sorted N-Triples lines."""
    done = subprocess.run(
        [sys.executable, "-m", "porter_mesh.cli.main", "kg", "export", "--format", "nt",
         "--data-dir", str(data)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return sorted(line for line in done.stdout.splitlines() if line.strip())


def run_partition(lab: Lab, tmp_path: Path, nodes: list[NodeProcess], seconds: float) -> None:
    group_a, group_b = start_groups(lab, tmp_path, nodes)
    everyone = group_a + group_b
    side = {n.name: "a" for n in group_a} | {n.name: "b" for n in group_b}
    see_all(everyone, 30, "finds")
    tops: dict[str, int] = {}
    for node in everyone:
        remember(node, f"before-{node.name}-", 3, tops)
    poll(lambda: converged(everyone, tops), 30, "convergence before the partition")

    set_link(lab, "down")
    cut = time.monotonic()
    for node in everyone:
        across = {n.name for n in everyone if side[n.name] != side[node.name]}
        node.wait_until(lambda ev, o=across: not (o & peers_seen(ev)), 30,
                        f"{node.name} expires {sorted(across)}")
        left = [e for e in node.events if e["ev"] == "peer" and e["kind"] == "left"]
        assert {e["reason"] for e in left} == {"expired"}, left
    # Both sides keep working, each on its own.
    remember(group_a[0], "during-a-", 4, tops)
    remember(group_b[1], "during-b-", 4, tops)
    hold_partition(everyone, side, cut + seconds)

    set_link(lab, "up")
    back = time.monotonic()
    see_all(everyone, HEAL_DEADLINE, "sees again")
    healed = time.monotonic() - back
    print(f"partition of {seconds:.0f}s: every node saw the others again {healed:.1f}s "
          "after the link came back")
    poll(lambda: converged(everyone, tops), 30, "convergence after the partition")
    for node in everyone:
        roster = node.ask("roster", "roster")["peers"]
        assert {p["state"] for p in roster.values()} == {"alive"}, roster
        assert "dropped.clock" not in node.ask("stats", "stats")["stats"]
        # Lost once and back once per peer, never a line per attempt.
        lines = node.stderr.splitlines()
        for other in everyone:
            if side[other.name] != side[node.name]:
                assert sum(other.name in ln and "trying it again" in ln for ln in lines) == 1
                assert sum(other.name in ln and "back after" in ln for ln in lines) == 1
    for node in everyone:
        node.stop()
    exports = {node.name: exported(node, tmp_path / node.name) for node in everyone}
    first = exports[group_a[0].name]
    for name, lines in exports.items():
        assert lines == first, f"{name}'s export differs"
    text = "\n".join(first)
    for i in range(4):
        assert f'"during-a-{i}"' in text and f'"during-b-{i}"' in text


@pytest.mark.timeout(240)
def test_partition_of_20s_heals_and_converges(lab: Lab, tmp_path: Path,
                                              nodes: list[NodeProcess]) -> None:
    run_partition(lab, tmp_path, nodes, 20)


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_partition_of_120s_heals_and_converges(lab: Lab, tmp_path: Path,
                                               nodes: list[NodeProcess]) -> None:
    run_partition(lab, tmp_path, nodes, 120)
