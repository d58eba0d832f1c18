"""What a node's log does not say at the default level, read from ``porter-mesh node``
processes: the knowledge commands' short-lived seats coming and going (shown with
``-v``), and the services of another mesh on the same network, however malformed."""

from __future__ import annotations

import itertools
import os
import re
import secrets
import subprocess
import sys
from collections.abc import Iterator

import pytest
from zeroconf import IPVersion, ServiceInfo, Zeroconf

from porter_mesh.adapters.discovery import mesh_tag
from porter_mesh.core.advert import PeerAdvert, encode_txt
from porter_mesh.core.constants import PROTOCOL_VERSION, SERVICE_TYPE
from tests.integration.test_cli_knowledge import PROFILE_QUERY, Daemon

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]
_ids = itertools.count()
CLI = (sys.executable, "-m", "porter_mesh.cli.main")


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=90)


@pytest.fixture
def daemons() -> Iterator[list[Daemon]]:
    started: list[Daemon] = []
    yield started
    for d in started:
        d.stop()


def node(daemons: list[Daemon], name: str, mesh: str, *extra: str, verbose: bool = False
         ) -> Daemon:
    flags = ("-v",) if verbose else ()
    d = Daemon(*flags, "node", "--name", name, "--mesh", mesh, *extra,
               ready=f"node {name} up")
    daemons.append(d)
    return d


def test_knowledge_commands_leave_no_seat_lines_unless_verbose(daemons: list[Daemon]) -> None:
    mesh = f"quiet{os.getpid()}-{next(_ids)}"
    quiet = node(daemons, "alpha", mesh)
    loud = node(daemons, "loud", mesh, verbose=True)
    done = cli("remember", "urn:porter:file:a.ts", "uses zod", "--mesh", mesh)
    assert done.returncode == 0, done.stderr
    recalled = cli("recall", PROFILE_QUERY, "--mesh", mesh)
    assert recalled.returncode == 0 and "uses zod" in recalled.stdout, recalled.stderr
    synced = cli("kgsync", "--mesh", mesh)
    assert synced.returncode == 0, synced.stderr
    # A node that starts afterwards is printed by both: what came before was read.
    node(daemons, "beta", mesh, "--no-knowledge")
    for d in (quiet, loud):
        d.wait_line(lambda line: "peer beta joined" in line, 30, "beta's join")
    assert not [line for line in quiet.lines if "porter-ui" in line], quiet.lines
    seat_lines = [line for line in loud.lines if re.search(r"peer porter-ui-\w+ (joined|left)",
                                                           line)]
    seats = {re.search(r"porter-ui-\w+", line).group() for line in seat_lines}  # type: ignore[union-attr]
    assert len(seats) == 3, seat_lines  # one seat per command, each its own name
    assert all(any(f"peer {s} joined" in line for line in seat_lines) for s in seats), seat_lines
    # Each seat is printed leaving too: by its goodbye, or, when that one best-effort
    # broadcast left before this node had subscribed to the short-lived seat, by expiry.
    for s in seats:
        loud.wait_line(lambda line, s=s: f"peer {s} left" in line, 40, f"{s} leaving")


def bogus_record(zc: Zeroconf, mesh: str) -> str:
    """Register a service of ``mesh`` whose TXT record lacks the PUB port; its name."""
    instance = f"broken-{secrets.token_hex(3)}"
    txt = encode_txt(PeerAdvert(name=instance, role="agent", mesh=mesh, pub_port=9,
                                router_port=9, version=PROTOCOL_VERSION, incarnation=1))
    del txt["pp"]
    name = f"{instance}@{mesh_tag(mesh)}.{SERVICE_TYPE}"
    zc.register_service(ServiceInfo(SERVICE_TYPE, name, port=9, properties=txt, server=name,
                                    parsed_addresses=["127.0.0.1"]),
                        cooperating_responders=True)
    return instance


def test_another_meshs_services_are_no_warnings(daemons: list[Daemon]) -> None:
    mesh_a = f"mesha{os.getpid()}-{next(_ids)}"
    mesh_b = f"meshb{os.getpid()}-{next(_ids)}"
    watcher = node(daemons, "a1", mesh_a)
    zc = Zeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
    try:
        # Mesh B on the same network: a node that starts and stops, and a broken record.
        theirs = bogus_record(zc, mesh_b)
        b1 = node(daemons, "b1", mesh_b)
        assert b1.stop() == 0
        # Mesh A's own broken record is a warning: the log is read and warnings show.
        ours = bogus_record(zc, mesh_a)
        watcher.wait_line(lambda line: "WARNING" in line and ours in line, 30,
                          "the warning about mesh A's broken record")
        node(daemons, "a2", mesh_a)
        watcher.wait_line(lambda line: "peer a2 joined" in line, 30, "a2's join")
    finally:
        zc.close()
    tag_b = mesh_tag(mesh_b)
    about_b = [line for line in watcher.lines
               if theirs in line or tag_b in line or "peer b1" in line or mesh_b in line]
    assert not about_b, about_b
    warnings = [line for line in watcher.lines if "WARNING" in line]
    assert all(ours in line for line in warnings), warnings
