"""Skewed wall clocks, caused for real: a node process runs under libfaketime.

The skewed node's ``time.time()`` is off by the offset (checked: the process reports its
wall clock); its monotonic clock is left alone (``FAKETIME_DONT_FAKE_MONOTONIC``), as a
machine with a wrong clock still measures intervals right. An honest node on loopback and
the skewed one, joined by a static seed, exchange acknowledged direct messages both ways
and remember and recall knowledge. Within the bound (minutes, an hour) nothing may be
dropped and neither side flags the other; beyond it (two days) both flag the other as
``clock-skew``, once, in the log and in ``peers`` (the node API and ``porter-mesh
peers``), and everything still works.

The library is preloaded with ``env LD_PRELOAD=... FAKETIME=...`` rather than the
``faketime`` wrapper, which forks and waits: with it the pid the test holds would not be
the node's.
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.integration.harness import NodeProcess, peers_seen
from tests.integration.kg_proc import poll

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]

LIBFAKETIME = next(iter(sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
                               + glob.glob("/usr/lib/faketime/libfaketime.so.1"))), None)
OFFSETS = {"+300s": 300, "-300s": -300, "+1h": 3600, "-1h": -3600}
_ids = itertools.count()


def skip_reason() -> str | None:
    if shutil.which("faketime") is None or LIBFAKETIME is None:
        return "libfaketime is not installed (Debian package faketime)"
    return None


def faked(offset: str) -> list[str]:
    assert LIBFAKETIME is not None
    return ["env", f"LD_PRELOAD={LIBFAKETIME}", f"FAKETIME={offset}",
            "FAKETIME_DONT_FAKE_MONOTONIC=1"]


@pytest.fixture(autouse=True)
def faketime_installed() -> None:
    reason = skip_reason()
    if reason is not None:
        print(f"skipping clock-skew test: {reason}")
        pytest.skip(reason)


def pair(nodes: list[NodeProcess], tmp_path: Path, offset: str, mesh: str, *,
         discovery: bool = False) -> tuple[NodeProcess, NodeProcess]:
    """An honest node and one whose clock is off by ``offset``, seeded to it."""
    timings = ("--heartbeat", "0.2", "--evasive-after", "1.5", "--expire-after", "5")
    if not discovery:
        timings += ("--no-discovery",)
    honest = NodeProcess(f"honest-{mesh}", "--knowledge", str(tmp_path / "honest"),
                         *timings, mesh=mesh)
    nodes.append(honest)
    skewed = NodeProcess(f"skewed-{mesh}", "--knowledge", str(tmp_path / "skewed"),
                         "--seed", f"127.0.0.1:{honest.up['router']}", *timings, mesh=mesh,
                         prefix=faked(offset))
    nodes.append(skewed)
    for node, other in ((honest, skewed), (skewed, honest)):
        node.wait_until(lambda ev, o=other.name: o in peers_seen(ev), 20,
                        f"{node.name} sees {other.name}")
    return honest, skewed


def exchange(honest: NodeProcess, skewed: NodeProcess) -> None:
    """Direct messages both ways, acknowledged and delivered once each; knowledge
    remembered on each side and recalled on the other."""
    for sender, receiver in ((honest, skewed), (skewed, honest)):
        sender.command(op="send", to=receiver.name, start=0, n=50)
        done = sender.wait_for(lambda e, r=receiver.name: e["ev"] == "sent" and e["to"] == r,
                               30, f"{sender.name}'s sends acknowledged")
        assert done["ok"] == 50, done
        receiver.wait_until(
            lambda ev, s=sender.name: sum(e["ev"] == "msg" and e["direct"]
                                          and e["sender"] == s for e in ev) >= 50,
            20, f"50 direct messages from {sender.name}")
        got = sorted(int(e["text"][1:]) for e in receiver.messages()
                     if e["direct"] and e["sender"] == sender.name)
        assert got == list(range(50))
    for writer, reader in ((honest, skewed), (skewed, honest)):
        writer.ask("remember", "stored", n=3, prefix=f"by-{writer.name}-")
        query = ("SELECT ?f WHERE { ?o porter:discoveredBy '" + writer.name
                 + "' ; porter:finding ?f }")
        want = [f"by-{writer.name}-{i}" for i in range(3)]
        poll(lambda r=reader, q=query, w=want: sorted(
            row["f"] for row in r.ask("recall", "rows", sparql=q)["items"]) == w,
            20, f"{reader.name} recalls what {writer.name} remembered")


def mesh_name() -> str:
    return f"skew{os.getpid()}-{next(_ids)}"


def wall_offset(honest: NodeProcess, skewed: NodeProcess) -> float:
    return float(skewed.up["wall"] - honest.up["wall"])


@pytest.mark.parametrize("offset", list(OFFSETS))
def test_lab_skew_drops_nothing_and_flags_nobody(nodes: list[NodeProcess], tmp_path: Path,
                                                 offset: str) -> None:
    honest, skewed = pair(nodes, tmp_path, offset, mesh_name())
    # libfaketime really moved the child's wall clock (start-up order costs a second).
    assert abs(wall_offset(honest, skewed) - OFFSETS[offset]) < 30, wall_offset(honest, skewed)
    exchange(honest, skewed)
    for node, other in ((honest, skewed), (skewed, honest)):
        stats = node.ask("stats", "stats")["stats"]
        assert "dropped.clock" not in stats, stats
        assert "peer.clock-skew" not in stats, stats
        assert node.ask("roster", "roster")["peers"][other.name]["state"] == "alive"
        assert "clock" not in node.stderr.lower(), node.stderr[-2000:]


def test_skew_beyond_the_bound_is_flagged_once_and_still_works(
        nodes: list[NodeProcess], tmp_path: Path) -> None:
    mesh = mesh_name()
    # Discovery on loopback too, so that porter-mesh peers (which says no hello) finds them.
    honest, skewed = pair(nodes, tmp_path, "+2d", mesh, discovery=True)
    assert abs(wall_offset(honest, skewed) - 2 * 86_400) < 30
    exchange(honest, skewed)
    for node, other, sign in ((honest, skewed, 1), (skewed, honest, -1)):
        peer = node.ask("roster", "roster")["peers"][other.name]
        assert peer["state"] == "clock-skew", peer
        assert abs(peer["skew"] / 1000 - sign * 2 * 86_400) < 30, peer
        stats = node.ask("stats", "stats")["stats"]
        assert "dropped.clock" not in stats
        assert stats["peer.clock-skew"] == 1, stats
        # Heartbeats keep arriving skewed: still one line, naming the peer and the fix.
        warnings = [line for line in node.stderr.splitlines() if "max_clock_skew" in line]
        assert len(warnings) == 1, warnings
        assert other.name in warnings[0] and "NTP" in warnings[0]
    # The operator's view: porter-mesh peers (an observer on its own honest clock).
    def roster() -> dict[str, dict[str, object]] | None:
        found = subprocess.run(
            [sys.executable, "-m", "porter_mesh.cli.main", "peers", "--json", "--wait", "2",
             "--mesh", mesh], capture_output=True, text=True, timeout=60)
        assert found.returncode == 0, found.stderr
        rows = {r["name"]: r for r in map(orjson.loads, found.stdout.splitlines())}
        return rows if {honest.name, skewed.name} <= set(rows) else None

    rows = poll(roster, 40, "porter-mesh peers lists both nodes")
    assert rows[honest.name]["state"] == "alive" and rows[honest.name]["clock_skew"] is None
    assert rows[skewed.name]["state"] == "clock-skew", rows
    assert abs(float(rows[skewed.name]["clock_skew"]) - 2 * 86_400) < 30  # type: ignore[arg-type]
