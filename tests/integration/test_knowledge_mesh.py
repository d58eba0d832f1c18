"""The replicated knowledge graph across real node processes, on real disk.

Every node here is a ``kg_proc.py`` process (a node plus its shard); discovery runs on
127.0.0.1 with a mesh name of the test's own. Waits are on reported events or on polls
with deadlines, never on sleeps.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import peers_seen
from tests.integration.kg_proc import KgProcess

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]

_mesh_ids = itertools.count()
#: Peer timings for loaded machines: two cores run five nodes that fsync.
TIMINGS = ("--heartbeat", "0.2", "--evasive-after", "1.5", "--expire-after", "5")


@pytest.fixture
def mesh() -> str:
    """A mesh name of this test only, so concurrent runs never see each other."""
    return f"kg{os.getpid()}-{next(_mesh_ids)}"


@pytest.fixture
def procs() -> Iterator[list[KgProcess]]:
    started: list[KgProcess] = []
    yield started
    for p in started:
        p.stop()


def start(procs: list[KgProcess], name: str, data: Path, *extra: str, mesh: str) -> KgProcess:
    p = KgProcess(name, data / name, *TIMINGS, *extra, mesh=mesh)
    procs.append(p)
    return p


def see_each_other(nodes: list[KgProcess], timeout: float = 20) -> None:
    names = {n.name for n in nodes}
    for node in nodes:
        others = names - {node.name}
        node.wait_until(lambda ev, o=others: peers_seen(ev) >= o, timeout,
                        f"{node.name} finds {sorted(others)}")


def poll(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    """Call ``cond`` until it returns something true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s (last: {value!r})")


def converged(nodes: list[KgProcess], must_hold: dict[str, int]) -> Callable[[], Any]:
    """A poll condition: equal digests everywhere and every reported record held."""

    def check() -> Any:
        stats = [n.stats()["kg"] for n in nodes]
        digests = {s["digest"] for s in stats}
        covered = all(s["version_vector"].get(o, 0) >= top
                      for s in stats for o, top in must_hold.items())
        if len(digests) == 1 and covered:
            return stats
        return False

    return check


def read_to_end(node: KgProcess) -> None:
    """Collect every event a dead process printed before it died."""
    with contextlib.suppress(AssertionError):  # "exited before": the end was reached
        node.wait_until(lambda ev: False, 10, "the end of its output")


def ids_reported(node: KgProcess) -> dict[int, str]:
    """seq -> observation id hex of every Remember the process reported as stored."""
    return {e["seq"]: e["id"] for e in node.stored()}


def test_five_nodes_converge_through_kill_late_join_and_loss(
        procs: list[KgProcess], mesh: str, tmp_path: Path) -> None:
    started = time.monotonic()
    # n1 and n3 lose every 7th broadcast on purpose; n2 is killed and restarted; n4 is late.
    n0 = start(procs, "n0", tmp_path, mesh=mesh)
    n1 = start(procs, "n1", tmp_path, "--drop-every", "7", mesh=mesh)
    n2 = start(procs, "n2", tmp_path, mesh=mesh)
    n3 = start(procs, "n3", tmp_path, "--drop-every", "7", mesh=mesh)
    see_each_other([n0, n1, n2, n3])
    bursts, per_burst = 4, 50
    for node in (n0, n1, n2, n3):
        for b in range(bursts):
            node.command(op="remember", n=per_burst, prefix=f"{node.name}-b{b}-")

    # Kill n2 in the middle of its bursts; what it reported stored must survive.
    n2.wait_until(lambda ev: sum(e["ev"] == "stored" for e in ev) >= 70, 30, "n2 stores 70")
    n2.kill()
    read_to_end(n2)
    before_kill = ids_reported(n2)
    assert before_kill, "n2 reported nothing before it was killed"

    # The late joiner arrives while the others are still writing.
    n0.wait_until(lambda ev: sum(e["ev"] == "stored" for e in ev) >= 120, 30, "n0 stores 120")
    n4 = start(procs, "n4", tmp_path, "--drop-every", "5", mesh=mesh)

    # n2 comes back on the same data directory and ports, with a new incarnation.
    n2b = start(procs, "n2", tmp_path, "--pub-port", str(n2.up["pub"]),
                "--router-port", str(n2.up["router"]), mesh=mesh)
    assert n2b.up["vv"].get("n2", 0) >= max(before_kill), "n2 lost records it reported stored"
    for b in range(2):
        n2b.command(op="remember", n=per_burst, prefix=f"n2-again-b{b}-")
    n4.command(op="remember", n=per_burst * 2, prefix="n4-")

    # A few retractions: n0 withdraws two of its own, n3 one of n1's once it holds it.
    n0.wait_until(lambda ev: sum(e["ev"] == "stored" for e in ev) >= 200, 30, "n0 stores 200")
    n0_ids = ids_reported(n0)
    retracted = {n0_ids[3], n0_ids[150]}
    for target in sorted(retracted):
        n0.ask("retract", "retracted", id=target)
    n1.wait_until(lambda ev: sum(e["ev"] == "stored" for e in ev) >= 10, 30, "n1 stores 10")
    n1_target = ids_reported(n1)[10]
    poll(lambda: n3.stats()["kg"]["version_vector"].get("n1", 0) >= 10, 20,
         "n3 holds n1's 10th record")
    n3.ask("retract", "retracted", id=n1_target)
    retracted.add(n1_target)

    everyone = [n0, n1, n2b, n3, n4]
    for node, batches in zip(everyone, (bursts, bursts, 2, bursts, 1), strict=True):
        node.wait_until(lambda ev, b=batches: sum(e["ev"] == "stored-batch" for e in ev) >= b,
                        40, f"{node.name} finishes its bursts")
    reported = {n.name: ids_reported(n) for n in (n0, n1, n3, n4)}
    reported["n2"] = {**before_kill, **ids_reported(n2b)}
    assert min(ids_reported(n2b)) > max(before_kill), "a restarted node reused a sequence number"
    must_hold = {origin: max(seqs) for origin, seqs in reported.items()}
    stats = poll(converged(everyone, must_hold), 40, "convergence")

    dumps = [n.ask("dump", "dump") for n in everyone]
    first = dumps[0]
    assert not first["more"] and not first["truncated"]
    records = sorted(map(tuple, first["records"]))
    for node, dump in zip(everyone, dumps, strict=True):
        assert sorted(map(tuple, dump["records"])) == records, f"{node.name} differs"
        assert sorted(map(tuple, dump["live"])) == sorted(map(tuple, first["live"]))
        assert set(dump["retracted"]) == retracted, f"{node.name} misses a retraction"
    # None duplicated: every (origin, seq) once, every record key once, no holes.
    assert len({(o, s) for o, s, _ in records}) == len(records)
    assert len({k for _, _, k in records}) == len(records)
    vv = stats[0]["version_vector"]
    for origin in vv:
        seqs = sorted(s for o, s, _ in records if o == origin)
        assert seqs == list(range(1, vv[origin] + 1)), f"holes in {origin}'s log"
    # None lost: every reported observation is live everywhere, unless retracted.
    live = {iri.rsplit(":", 1)[1] for iri, _ in first["live"]}
    for origin, seqs in reported.items():
        for seq, obs in seqs.items():
            assert obs in live or obs in retracted, f"({origin}, {seq}) lost"
            key = obs[:32]
            assert (origin, seq, key) in set(records), f"({origin}, {seq}) has other content"
    assert not live & retracted
    assert len(live) == stats[0]["observations"]
    assert all(s["retractions"] == len(retracted) for s in stats)
    # The late joiner and the restarted node caught up by chunked catch-up.
    assert any(e["ev"] == "caught-up" for e in n4.events)
    assert any(e["ev"] == "caught-up" for e in n2b.events)
    assert time.monotonic() - started < 60
