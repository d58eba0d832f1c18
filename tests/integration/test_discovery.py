"""Discovery over real zeroconf on 127.0.0.1, with one process per node.

Every test uses a fresh random mesh name and random agent names: other tests on this
host announce the same service type on loopback at the same time, and a name clash on
one mesh ends a node's start.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Iterator

import pytest
from zeroconf import IPVersion, ServiceInfo
from zeroconf.asyncio import AsyncZeroconf

from porter_mesh.adapters.discovery import (
    Discovery,
    agent_from_service_name,
    mesh_tag,
    service_name,
)
from porter_mesh.core.advert import PeerAdvert, encode_txt
from porter_mesh.core.constants import PROTOCOL_VERSION, SERVICE_TYPE
from porter_mesh.errors import ConfigError, NodeClosedError
from tests.integration.discovery_probe import ProbeProcess

pytestmark = pytest.mark.network

#: Generous: the host has two cores shared with other test runs; the measured figures
#: are printed and are far below this.
DEADLINE = 20.0

Spawn = Callable[..., ProbeProcess]


def unique(label: str) -> str:
    return f"{label}-{secrets.token_hex(3)}"


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start probe processes; every one is reaped at the end, whatever happened."""
    started: list[ProbeProcess] = []

    def start(**kwargs: object) -> ProbeProcess:
        probe = ProbeProcess(**kwargs)  # type: ignore[arg-type]
        started.append(probe)
        return probe

    yield start
    for probe in started:
        probe.kill()
        probe.cleanup()


def advert(name: str, mesh: str, incarnation: int = 1, **changes: object) -> PeerAdvert:
    fields: dict[str, object] = {
        "name": name, "role": "worker", "mesh": mesh, "pub_port": 41001,
        "router_port": 41002, "version": PROTOCOL_VERSION, "incarnation": incarnation,
        **changes,
    }
    return PeerAdvert(**fields)  # type: ignore[arg-type]


def wait_incarnation(observer: ProbeProcess, peer: str, incarnation: int) -> None:
    """Wait until ``observer`` reports ``peer`` found with ``incarnation``."""
    observer.wait_for(
        lambda e: e["event"] == "found" and e["peer"] == peer and e["incarnation"] == incarnation,
        DEADLINE,
        f"found {peer} with incarnation {incarnation}",
    )


def wait_stat(probe: ProbeProcess, key: str, at_least: int) -> None:
    """Poll a probe's counter until it reaches ``at_least`` (deadline: DEADLINE)."""
    deadline = time.monotonic() + DEADLINE
    while (value := probe.stats()[key]) < at_least:
        assert time.monotonic() < deadline, f"{probe.name}: {key}={value} < {at_least}"
        probe.drain(0.1)  # waits for output with a timeout between polls


# -- several processes ------------------------------------------------------------------


def test_two_processes_find_each_other(spawn: Spawn) -> None:
    mesh = unique("m")
    a, b = spawn(mesh=mesh, name=unique("a")), spawn(mesh=mesh, name=unique("b"))
    seen_a = a.wait_found([b.name], DEADLINE)[b.name]
    seen_b = b.wait_found([a.name], DEADLINE)[a.name]
    assert seen_a["incarnation"] == b.incarnation
    assert seen_b["incarnation"] == a.incarnation
    assert seen_a["addresses"] == ["127.0.0.1"]
    assert seen_a["pub"] == "tcp://127.0.0.1:40001"
    spread = max(seen_a["t"], seen_b["t"]) - min(a.started_at, b.started_at)
    print(f"2 processes: spawn to mutual discovery {spread:.2f}s")
    assert a.close()["stats"]["bad_advert"] == 0


def test_five_processes_see_their_mesh_only(spawn: Spawn) -> None:
    mesh = unique("m")
    probes = [spawn(mesh=mesh, name=unique(f"n{i}")) for i in range(5)]
    stranger = spawn(mesh=unique("other"), name=unique("stranger"))
    names = {p.name for p in probes}
    last = 0.0
    for probe in probes:
        events = probe.wait_found(names - {probe.name}, DEADLINE)
        last = max([last, *(e["t"] for e in events.values())])
    print(f"5 processes: spawn to full discovery {last - probes[0].started_at:.2f}s")
    # The stranger saw the five and filtered them out, and they filtered it out: the
    # records did reach both sides, so "not found" means "ignored", not "not heard".
    for probe in probes:
        wait_stat(probe, "other_mesh", 1)
        assert stranger.name not in probe.found_peers()
    wait_stat(stranger, "other_mesh", 5)
    assert not (stranger.found_peers() & names)


def test_graceful_close_is_reported_lost(spawn: Spawn) -> None:
    mesh = unique("m")
    probes = [spawn(mesh=mesh, name=unique(f"n{i}")) for i in range(3)]
    names = {p.name for p in probes}
    for probe in probes:
        probe.wait_found(names - {probe.name}, DEADLINE)
    leaving, *staying = probes
    leaving.close()
    for probe in staying:
        probe.wait_for(
            lambda e: e["event"] == "lost" and e["peer"] == leaving.name, DEADLINE, "lost"
        )
        assert probe.stats()["lost"] == 1


def test_killed_and_restarted_process_is_found_with_new_incarnation(spawn: Spawn) -> None:
    mesh = unique("m")
    name = unique("w")
    observer = spawn(mesh=mesh, name=unique("obs"))
    first = spawn(mesh=mesh, name=name, incarnation=1001)
    observer.wait_found([name], DEADLINE)
    first.kill()  # no goodbye: the observer's cache still holds the old records
    second = spawn(mesh=mesh, name=name, incarnation=2002)
    second.wait_for(lambda e: e["event"] == "ready", DEADLINE, "ready")
    wait_incarnation(observer, name, 2002)
    # Nobody answers for a dead process, so the name was free at once.
    assert second.stats()["conflicts"] == 0
    assert observer.stats()["updated"] == 1


def test_update_announces_new_incarnation(spawn: Spawn) -> None:
    mesh = unique("m")
    observer = spawn(mesh=mesh, name=unique("obs"))
    node = spawn(mesh=mesh, name=unique("w"), incarnation=5)
    observer.wait_found([node.name], DEADLINE)
    node.send("update 6")
    wait_incarnation(observer, node.name, 6)


def test_duplicate_live_name_is_a_config_error(spawn: Spawn) -> None:
    mesh = unique("m")
    name = unique("dup")
    # A bystander on another mesh shares port 5353 too, as other nodes on a host would.
    spawn(mesh=unique("other"), name=unique("bystander"))
    holder = spawn(mesh=mesh, name=name)
    holder.wait_for(lambda e: e["event"] == "ready", DEADLINE, "ready")
    clash = spawn(mesh=mesh, name=name, extra=["--conflict-grace", "0.5"])
    error = clash.wait_for(lambda e: e["event"] in ("error", "ready"), DEADLINE, "error")
    assert error["event"] == "error", "a second live node took the same agent name"
    assert error["type"] == "ConfigError"
    assert f"duplicate agent name {name!r}" in error["message"]
    assert f"incarnation {holder.incarnation:x}" in error["message"]  # hex, as peers shows
    assert f"unique per mesh (here {mesh!r})" in error["message"]
    assert clash.proc.wait(DEADLINE) == 2
    assert holder.stats()["conflicts"] == 0


def test_overlapping_restart_waits_for_the_old_incarnation(spawn: Spawn) -> None:
    mesh = unique("m")
    name = unique("w")
    observer = spawn(mesh=mesh, name=unique("obs"))
    old = spawn(mesh=mesh, name=name, incarnation=1)
    observer.wait_found([name], DEADLINE)
    new = spawn(mesh=mesh, name=name, incarnation=2, extra=["--conflict-grace", "30"])
    new.wait_for(
        lambda e: e["event"] == "log" and "held by a live node" in e["message"],
        DEADLINE,
        "a name conflict",
    )
    old.close()  # the old incarnation finishes shutting down and says goodbye
    new.wait_for(lambda e: e["event"] == "ready", DEADLINE, "ready after the goodbye")
    wait_incarnation(observer, name, 2)


# -- in-process: bogus records, configuration ---------------------------------------------


async def _poll(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        await asyncio.sleep(0.02)


def raw_info(
    instance: str, properties: dict[bytes | str, bytes | str | None], mesh: str
) -> ServiceInfo:
    name = f"{instance}@{mesh_tag(mesh)}.{SERVICE_TYPE}"
    return ServiceInfo(
        SERVICE_TYPE, name, port=41002, properties=properties, server=name,
        parsed_addresses=["127.0.0.1"],
    )


async def _malformed_records_are_ignored() -> None:
    mesh = unique("m")
    good_name = unique("good")
    good = encode_txt(advert(good_name, mesh))
    bogus = {
        unique("noport"): {k: v for k, v in good.items() if k != "pp"},
        unique("badport"): {**good, "pp": "http"},
        unique("hugeport"): {**good, "rp": "99999"},
        unique("mismatch"): good,  # the TXT record names another agent
        unique("latin1"): {**{k: v for k, v in good.items() if k != "ro"}, b"ro": b"\xe9t\xe9"},
        "Bad_Upper-" + secrets.token_hex(3): {**good, "n": "bad"},
        unique("future"): {**good, "v": str(PROTOCOL_VERSION + 1)},
    }
    for instance, txt in bogus.items():
        if txt is not good and "n" in txt and txt["n"] == good_name:
            txt["n"] = instance.lower()
    found: list[PeerAdvert] = []
    lost: list[str] = []
    discovery = Discovery(mesh=mesh, on_found=found.append, on_lost=lost.append)
    watched: list[PeerAdvert] = []  # an observer: browses, is not announced
    watcher = Discovery(mesh=mesh, on_found=watched.append, on_lost=print)
    raw = AsyncZeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
    try:
        for instance, txt in bogus.items():
            await raw.async_register_service(
                raw_info(instance, txt, mesh), cooperating_responders=True  # type: ignore[arg-type]
            )
        good_info = raw_info(good_name, good, mesh)  # type: ignore[arg-type]
        await raw.async_register_service(good_info, cooperating_responders=True)
        await watcher.astart(None)
        me = unique("me")
        await discovery.astart(advert(me, mesh))
        await _poll(lambda: bool(found), DEADLINE, "good advert")
        await _poll(lambda: {a.name for a in watched} == {good_name, me}, DEADLINE, "both")
        await _poll(
            lambda: discovery.stats["bad_advert"] + discovery.stats["other_version"]
            >= len(bogus),
            DEADLINE,
            "all bogus records counted",
        )
        stats = discovery.stats
        assert stats["bad_advert"] == len(bogus) - 1
        assert stats["other_version"] == 1
        assert [a.name for a in found] == [good_name]
        assert found[0].addresses == ("127.0.0.1",)
        assert found[0].endpoint_router() == "tcp://127.0.0.1:41002"
        assert set(discovery.peers) == {good_name}
        await (await raw.async_unregister_service(good_info))
        await _poll(lambda: bool(lost), DEADLINE, "goodbye of the good record")
        assert lost == [good_name]
    finally:
        await discovery.aclose()
        await discovery.aclose()  # idempotent
        await watcher.aclose()
        await raw.async_close()


def test_malformed_records_are_ignored_and_counted() -> None:
    asyncio.run(_malformed_records_are_ignored())


async def _misuse() -> None:
    mesh = unique("m")
    discovery = Discovery(mesh=mesh, on_found=print, on_lost=print)
    with pytest.raises(ConfigError, match="mesh"):
        await discovery.astart(advert(unique("me"), unique("other")))
    with pytest.raises(NodeClosedError):
        await discovery.aupdate(advert(unique("me"), mesh))
    unassigned = Discovery(mesh=mesh, interfaces=["192.0.2.77"], on_found=print, on_lost=print)
    with pytest.raises(ConfigError, match=r"192\.0\.2\.77 is not assigned"):
        await unassigned.astart(advert(unique("me"), mesh))
    await unassigned.aclose()
    started = Discovery(mesh=mesh, on_found=print, on_lost=print)
    me = unique("me")
    await started.astart(advert(me, mesh))
    try:
        with pytest.raises(ConfigError, match="rename"):
            await started.aupdate(advert(unique("other"), mesh))
        with pytest.raises(NodeClosedError):
            await started.astart(advert(me, mesh))
    finally:
        await started.aclose()
    with pytest.raises(NodeClosedError):
        await started.aupdate(advert(me, mesh))
    observer = Discovery(mesh=mesh, on_found=print, on_lost=print)
    await observer.astart(None)
    try:
        with pytest.raises(ConfigError, match="only browses"):
            await observer.aupdate(advert(me, mesh))
    finally:
        await observer.aclose()
    # Closed while registering: astart() must not report success.
    racing = Discovery(mesh=mesh, on_found=print, on_lost=print)
    starting = asyncio.create_task(racing.astart(advert(unique("me"), mesh)))
    await asyncio.sleep(0)  # let astart() begin; this is a yield, not a wait
    await racing.aclose()
    with pytest.raises(NodeClosedError, match="closed while it was starting"):
        await starting


def test_misuse_is_reported_clearly() -> None:
    asyncio.run(_misuse())


@pytest.mark.parametrize(
    ("interfaces", "match"),
    [
        ((), "non-empty"),
        ("127.0.0.1", "non-empty sequence"),
        (("localhost",), "not an IP address"),
        (("0.0.0.0",), "explicitly"),
        (("224.0.0.251",), "explicitly"),
        (("::1",), "IPv6 loopback"),
    ],
)
def test_bad_interfaces(interfaces: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Discovery(mesh="m", interfaces=interfaces, on_found=print, on_lost=print)  # type: ignore[arg-type]


def test_bad_mesh_name() -> None:
    with pytest.raises(ConfigError, match="mesh name"):
        Discovery(mesh="Not Valid", on_found=print, on_lost=print)


def test_service_name() -> None:
    name = service_name("worker-1", "lab")
    assert name.startswith("worker-1@") and name.endswith("._porter-mesh._tcp.local.")
    assert service_name("worker-1", "other") != name  # same agent, another mesh
    assert agent_from_service_name(name) == "worker-1"
    assert agent_from_service_name("worker-1._porter-mesh._tcp.local.") is None
    assert len(service_name("a" * 56, "m" * 63).split(".")[0]) <= 63
