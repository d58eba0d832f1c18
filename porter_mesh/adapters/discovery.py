"""zeroconf (mDNS / DNS-SD) discovery of the nodes of one mesh.

Theory of operation
-------------------
One :class:`Discovery` belongs to one node. :meth:`Discovery.astart` opens an
``AsyncZeroconf`` bound to the configured interface addresses only (the default is
loopback, so nothing is announced on a LAN until asked), starts browsing
``_porter-mesh._tcp.local.``, then registers the node's own service
``<agent>._porter-mesh._tcp.local.`` whose TXT record is the node's
:class:`~porter_mesh.core.advert.PeerAdvert`.

Other meshes. Every instance name carries a tag of its mesh (:func:`service_name`), so
a service of another mesh is told apart by its name alone: it is counted
(``other_mesh``) and never resolved, so that its records, however malformed, cost a
node nothing and put no warning in its log. Only a record that claims this mesh's tag
and then fails to decode is a warning (once per name).

The browser's callbacks run on the event loop and must not block, so each "added" or
"updated" event only schedules a resolve task for that service name (one task per name;
an event arriving while it runs makes it resolve again). A resolve reads the SRV, TXT and
address records (from the cache when the announcement carried them, else by asking),
decodes the TXT record and drops it when it is malformed (logged once per service name,
counted), belongs to another mesh, speaks another protocol version, or has no address.
Otherwise, if the advert differs from the last one reported under that agent name,
``on_found(advert)`` runs: a restarted node (new incarnation, same name) is reported
again. "removed" (an mDNS goodbye or an expired record) calls ``on_lost(name)`` for
agents that were reported found. mDNS goodbyes are lost when a process is killed, so
liveness belongs to the node's heartbeats; discovery only says who exists.

Every question is asked as "QM" (answer by multicast). Several mDNS responders on one
host (one per node process) share UDP port 5353 through ``SO_REUSEPORT``, and the kernel
hands a unicast datagram to only one of them, so unicast answers are often lost there.

Name conflicts. zeroconf's own probe is not used: it asks with the unicast-response
bit, and on a shared host the defending node's unicast answer is often delivered to
another process (see above), so duplicates slipped through in tests. Instead the node
sends its own probes before announcing: three multicast ("QM") queries 250 ms apart for
its name's SRV and TXT records, with the proposed pointer record in the authority section,
which makes them probes that a holder answers at once by multicast; then it listens
until 1 s after the first. Only records received after probing began count, plus the
browser's pointer answers, because the cache keeps a killed node's records for their
whole TTL; a name nobody answers for is free and its stale cached records are dropped.
If a live node answers, the name is probed again until ``conflict_grace`` seconds have
passed (a previous incarnation of this node that is still shutting down says goodbye
within that time), then :class:`~porter_mesh.errors.ConfigError` names the holder. A
process that was killed and restarted registers at once: nobody answers for a dead
process. Two nodes that start with the same name within the same second are not told
apart (zeroconf's probe has no tie-break either).
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import secrets
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

# DNSOutgoing, DNSQuestion and DNSRecord are part of zeroconf's top-level surface (kept
# there for compatibility, used by its own benchmarks) but missing from its __all__;
# pyproject.toml lets mypy accept them from there (implicit_reexport for zeroconf).
from zeroconf import (
    DNSOutgoing,
    DNSQuestion,
    DNSQuestionType,
    DNSRecord,
    IPVersion,
    ServiceInfo,
    ServiceStateChange,
    Zeroconf,
    current_time_millis,
)
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from porter_mesh.core.advert import PeerAdvert, check_mesh_name, decode_txt, encode_txt
from porter_mesh.core.constants import PROTOCOL_VERSION, SERVICE_TYPE
from porter_mesh.errors import ConfigError, FrameError, NodeClosedError

__all__ = [
    "STAT_KEYS",
    "Discovery",
    "agent_from_service_name",
    "mesh_tag",
    "service_name",
]

_log = logging.getLogger(__name__)

# DNS record types and class (RFC 1035, RFC 2782), and the flags of a query.
_TYPE_PTR: Final = 12
_TYPE_TXT: Final = 16
_TYPE_SRV: Final = 33
_CLASS_IN: Final = 1
_FLAGS_QR_QUERY: Final = 0
# Our name probe (see _name_is_held): three probes 250 ms apart as in RFC 6762, then
# listen until 1 s after the first (the RFC's 250 ms after the last, plus room for a
# busy host); look at the cache every 25 ms.
_PROBE_COUNT: Final = 3
_PROBE_INTERVAL_MS: Final = 250.0
_PROBE_WAIT_MS: Final = 1000.0
_PROBE_POLL_S: Final = 0.025
_PROBE_PAUSE_S: Final = 1.0
_SUFFIX: Final = "." + SERVICE_TYPE

#: Counter names in :attr:`Discovery.stats`.
STAT_KEYS: Final = (
    "found",  # on_found calls for a new agent name
    "updated",  # on_found calls for a known name with a changed advert (restart, new ports)
    "lost",  # on_lost calls
    "bad_advert",  # records dropped because the TXT record or the name is malformed
    "other_mesh",  # records of another mesh (ignored)
    "other_version",  # records of another protocol version (ignored)
    "unresolved",  # services that did not answer with SRV, TXT and an address in time
    "conflicts",  # name conflicts met while registering
    "callback_errors",  # exceptions raised by on_found / on_lost
)


def mesh_tag(mesh: str) -> str:
    """A short, stable tag of a mesh name for service instance labels (6 hex digits)."""
    return hashlib.sha256(mesh.encode()).hexdigest()[:6]


def service_name(agent: str, mesh: str) -> str:
    """Return the zeroconf service instance name of an agent on a mesh.

    The label carries a tag of the mesh so that meshes sharing a network can each have
    an ``architect``; names are unique per mesh, not per network. The tag keeps the
    label within DNS's 63 bytes (agent names are at most 56 characters).

    Args:
        agent: a valid agent name.
        mesh: a valid mesh name.

    Returns:
        ``"<agent>@<mesh tag>._porter-mesh._tcp.local."``.
    """
    return f"{agent}@{mesh_tag(mesh)}{_SUFFIX}"


def agent_from_service_name(name: str) -> str | None:
    """Return the agent part of a service instance name, or None if it is not one of ours.

    Args:
        name: a fully qualified service instance name.

    Returns:
        The agent label (not validated), or None when the type does not match or the
        label has no mesh tag.
    """
    if len(name) <= len(_SUFFIX) or not name.lower().endswith(_SUFFIX.lower()):
        return None
    label = name[: -len(_SUFFIX)]
    agent, at, _tag = label.rpartition("@")
    return agent if at else None


def _check_interfaces(interfaces: Sequence[str]) -> tuple[str, ...]:
    if isinstance(interfaces, str) or not interfaces:
        raise ConfigError(
            "interfaces must be a non-empty sequence of IP addresses, e.g. ('127.0.0.1',)"
        )
    checked: list[str] = []
    for item in interfaces:
        try:
            address = ipaddress.ip_address(item)
        except ValueError:
            raise ConfigError(
                f"interface {item!r} is not an IP address; give the address of each "
                "interface to announce on, e.g. 127.0.0.1 or 192.168.1.20"
            ) from None
        if address.is_unspecified or address.is_multicast:
            raise ConfigError(
                f"interface {item!r} is not the address of one interface; list the "
                "interfaces to announce on explicitly"
            )
        if address.version == 6 and address.is_loopback:
            raise ConfigError(
                "mDNS does not work on the IPv6 loopback (::1); use 127.0.0.1 for "
                "loopback discovery"
            )
        checked.append(str(address))
    return tuple(dict.fromkeys(checked))


def _check_assigned(interfaces: Sequence[str]) -> None:
    """Fail early when an interface address does not exist on this host.

    zeroconf only logs a warning and announces nowhere in that case, which would leave a
    node silently alone on its mesh.
    """
    for item in interfaces:
        family = socket.AF_INET6 if ":" in item else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            try:
                probe.bind((item, 0))
            except OSError as exc:
                raise ConfigError(
                    f"interface address {item} is not assigned on this host ({exc.strerror}); "
                    "list addresses shown by `ip addr`"
                ) from None


class Discovery:
    """Announce one node and report the other nodes of its mesh.

    Runs on the asyncio loop that calls :meth:`astart`; every method must be called from
    that loop. Callbacks run on the loop too and must not block.

    Args:
        mesh: mesh name; records of other meshes are ignored.
        interfaces: IP addresses of the interfaces to announce and browse on. The
            default is loopback only.
        on_found: called with a peer's advert when it appears or its advert changes
            (a restart shows as a new incarnation under the same name). May run before
            :meth:`astart` returns.
        on_lost: called with the agent name when a reported peer says goodbye or its
            record expires.
        resolve_timeout: seconds to wait for a peer's SRV/TXT/address records.
        conflict_grace: seconds, from the first name conflict, during which a name held
            by another live node is re-checked before giving up (covers a previous
            incarnation of this node that is still shutting down).

    Raises:
        ConfigError: an invalid mesh name, interface list or timing.
    """

    def __init__(
        self,
        *,
        mesh: str,
        interfaces: Sequence[str] = ("127.0.0.1",),
        on_found: Callable[[PeerAdvert], None],
        on_lost: Callable[[str], None],
        resolve_timeout: float = 3.0,
        conflict_grace: float = 3.0,
    ) -> None:
        self._mesh = check_mesh_name(mesh)
        self._tag = mesh_tag(self._mesh)
        self._interfaces = _check_interfaces(interfaces)
        if not resolve_timeout > 0 or not conflict_grace >= 0:
            raise ConfigError("resolve_timeout must be positive and conflict_grace >= 0")
        self._on_found = on_found
        self._on_lost = on_lost
        self._resolve_ms = resolve_timeout * 1000.0
        self._conflict_grace = conflict_grace
        self._aiozc: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._info: ServiceInfo | None = None
        self._own_key = ""
        self._peers: dict[str, PeerAdvert] = {}
        self._resolving: dict[str, asyncio.Task[None]] = {}
        self._again: set[str] = set()
        self._background: set[asyncio.Future[Any]] = set()
        self._warned: set[str] = set()
        self._stats = dict.fromkeys(STAT_KEYS, 0)
        self._started = False
        self._closed = False

    @property
    def stats(self) -> dict[str, int]:
        """A copy of the counters (keys in :data:`STAT_KEYS`)."""
        return dict(self._stats)

    @property
    def peers(self) -> Mapping[str, PeerAdvert]:
        """The adverts currently reported found, by agent name (a copy)."""
        return dict(self._peers)

    @property
    def interfaces(self) -> tuple[str, ...]:
        """The interface addresses zeroconf is bound to."""
        return self._interfaces

    async def astart(self, advert: PeerAdvert | None) -> None:
        """Start browsing, then register this node's service.

        Args:
            advert: this node's advert. When its ``addresses`` are empty, the interface
                addresses are announced. None only browses: an observer (a tail
                command, a dashboard) that sees the mesh without being announced.

        Raises:
            ConfigError: the advert is for another mesh, an interface address is not on
                this host, or another live node already announces this agent name.
            NodeClosedError: the discovery was started before, or closed meanwhile.
        """
        if self._closed or self._started:
            raise NodeClosedError("this Discovery was already started; create a new one")
        if advert is not None:
            self._check_advert(advert)
        _check_assigned(self._interfaces)
        self._started = True
        info = self._service_info(advert) if advert is not None else None
        self._own_key = info.name.lower() if info is not None else ""
        versions = {ipaddress.ip_address(i).version for i in self._interfaces}
        ip_version = (
            IPVersion.All
            if len(versions) == 2
            else IPVersion.V6Only
            if versions == {6}
            else IPVersion.V4Only
        )
        self._aiozc = AsyncZeroconf(interfaces=list(self._interfaces), ip_version=ip_version)
        try:
            # Browse first: the answers to the browser's query are what reveals a live
            # holder of our name during the probe (see the module docstring).
            self._browser = AsyncServiceBrowser(
                self._aiozc.zeroconf,
                SERVICE_TYPE,
                handlers=[self._on_state_change],
                question_type=DNSQuestionType.QM,
            )
            if info is not None:
                await self._register(info)
            if self._closed:
                raise NodeClosedError("discovery was closed while it was starting")
        except BaseException as exc:
            closed_meanwhile = self._closed
            await self.aclose()
            if closed_meanwhile and isinstance(exc, Exception) and not isinstance(
                exc, ConfigError | NodeClosedError
            ):
                raise NodeClosedError("discovery was closed while it was starting") from exc
            raise
        self._info = info

    async def aupdate(self, advert: PeerAdvert) -> None:
        """Announce a changed advert (new incarnation, ports, capabilities).

        Args:
            advert: the new advert; same agent name and mesh as the registered one.

        Raises:
            ConfigError: the name or mesh differs from the registered advert, or this
                Discovery only browses.
            NodeClosedError: not started, or closed.
        """
        if self._closed or not self._started or self._aiozc is None:
            raise NodeClosedError("discovery is not running; call astart() first")
        if self._info is None:
            raise ConfigError(
                "this Discovery only browses (started with astart(None)); start a new one "
                "with an advert to announce the node"
            )
        self._check_advert(advert)
        info = self._service_info(advert)
        if info.name.lower() != self._own_key:
            raise ConfigError(
                f"aupdate() cannot rename the node to {advert.name!r}; close this "
                "Discovery and start a new one under the new name"
            )
        self._info = info
        self._keep(await self._aiozc.async_update_service(info))

    async def aclose(self) -> None:
        """Say goodbye (unregister), stop browsing and close zeroconf. Idempotent."""
        if self._closed:
            return
        self._closed = True
        pending: list[asyncio.Future[Any]] = [*self._resolving.values(), *self._background]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._resolving.clear()
        self._background.clear()
        aiozc, self._aiozc = self._aiozc, None
        browser, self._browser = self._browser, None
        if aiozc is None:
            return
        try:
            if browser is not None:
                await browser.async_cancel()
            if self._info is not None:
                # Await the goodbyes so that peers hear them before the sockets close.
                await (await aiozc.async_unregister_service(self._info))
        finally:
            self._info = None
            await aiozc.async_close()

    # -- registration ---------------------------------------------------------------

    def _check_advert(self, advert: PeerAdvert) -> None:
        if not isinstance(advert, PeerAdvert):
            raise ConfigError(f"advert must be a PeerAdvert, not {type(advert).__name__}")
        if advert.mesh != self._mesh:
            raise ConfigError(
                f"advert is for mesh {advert.mesh!r} but this Discovery browses mesh "
                f"{self._mesh!r}; use the same mesh name for both"
            )

    def _service_info(self, advert: PeerAdvert) -> ServiceInfo:
        name = service_name(advert.name, advert.mesh)
        return ServiceInfo(
            SERVICE_TYPE,
            name,
            port=advert.router_port,
            properties=encode_txt(advert),
            server=name,
            parsed_addresses=list(advert.addresses or self._interfaces),
        )

    async def _register(self, info: ServiceInfo) -> None:
        """Claim the name by our own multicast probe, then announce (module docstring)."""
        assert self._aiozc is not None
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        # Each round lasts until an answer arrives (at most _PROBE_WAIT_MS), so the
        # deadline bounds the loop.
        while await self._name_is_held(info):
            self._stats["conflicts"] += 1
            now = loop.time()
            deadline = now + self._conflict_grace if deadline is None else deadline
            if now >= deadline:
                raise self._conflict_error(info.name)
            _log.debug("name conflict: %s is held by a live node; re-checking", info.name)
            # Receivers ignore a byte-identical packet for 0.8 s, and the holder answers
            # every round alike: probing again at once would make its answers look
            # like silence.
            await asyncio.sleep(_PROBE_PAUSE_S)
        # Our probe has run; zeroconf's own (see the module docstring) is skipped.
        announced = await self._aiozc.async_register_service(
            info, allow_name_change=False, cooperating_responders=True
        )
        self._keep(announced)

    async def _name_is_held(self, info: ServiceInfo) -> bool:
        """Probe the network: does a live node hold ``info.name`` now?

        Three probes, 250 ms apart (RFC 6762 section 8.1), ask by multicast for the
        name's SRV and TXT records and carry our proposed pointer record in the authority
        section. A query with an authority section is a probe, which responders answer
        at once by multicast, without the usual aggregation or once-a-second limit.
        Only records received after the first probe count (the cache keeps a killed
        node's records for their whole TTL), as do the browser's pointer answers for
        the name. A name nobody answers for is free; what the cache still remembers
        about it is stale and dropped.
        """
        assert self._aiozc is not None
        zc: Zeroconf = self._aiozc.zeroconf
        name = info.name
        key = name.lower()
        asked = current_time_millis()
        deadline = asked + _PROBE_WAIT_MS
        sent = 0
        while (now := current_time_millis()) < deadline:
            if sent < _PROBE_COUNT and now >= asked + sent * _PROBE_INTERVAL_MS:
                # A random id makes each probe a distinct packet: responders ignore a
                # byte-identical packet seen in the last 0.8 s, which would silence
                # all but the first of our probes (and any probe another process
                # sent for the same name just before).
                probe = DNSOutgoing(_FLAGS_QR_QUERY, True, secrets.randbits(16))
                probe.add_question(DNSQuestion(name, _TYPE_SRV, _CLASS_IN))
                probe.add_question(DNSQuestion(name, _TYPE_TXT, _CLASS_IN))
                probe.add_authorative_answer(info.dns_pointer())
                zc.async_send(probe)
                sent += 1
            fresh = [
                r for r in [*zc.cache.async_entries_with_name(name), *self._pointers_to(key)]
                # ttl <= 1: a goodbye, or a record that a newer one has superseded.
                if r.created >= asked and r.ttl > 1 and not r.is_expired(now)
            ]
            if fresh:
                return True
            await asyncio.sleep(_PROBE_POLL_S)
        zc.cache.async_remove_records(
            [*self._pointers_to(key), *zc.cache.async_entries_with_name(name)]
        )
        return False

    def _pointers_to(self, key: str) -> list[DNSRecord]:
        assert self._aiozc is not None
        return [
            r for r in self._aiozc.zeroconf.cache.async_all_by_details(
                SERVICE_TYPE, _TYPE_PTR, _CLASS_IN
            )
            if getattr(r, "alias", "").lower() == key
        ]

    def _conflict_error(self, name: str) -> ConfigError:
        assert self._aiozc is not None
        holder = AsyncServiceInfo(SERVICE_TYPE, name)
        holder.load_from_cache(self._aiozc.zeroconf)
        where = ", ".join(holder.parsed_addresses()) or "an unknown address"
        try:
            other = decode_txt(holder.properties)
            # In hex, as ``porter-mesh peers`` shows it, so the two can be matched.
            detail = (
                f"mesh {other.mesh!r}, role {other.role!r}, incarnation "
                f"{other.incarnation:x}, at {where}"
            )
        except FrameError:
            detail = f"at {where}; its TXT record was not received or is not an advert"
        agent = agent_from_service_name(name)
        return ConfigError(
            f"duplicate agent name {agent!r}: another live node already announces it "
            f"({detail}). Agent names are unique per mesh (here {self._mesh!r}); choose "
            "another name, stop the other process, or use another --mesh"
        )

    def _keep(self, future: Awaitable[Any]) -> None:
        """Hold a background announcement so it is not collected, and cancel it on close."""
        fut = asyncio.ensure_future(future)
        self._background.add(fut)
        fut.add_done_callback(self._background.discard)

    # -- browsing ---------------------------------------------------------------------

    def _on_state_change(
        self,
        zeroconf: Zeroconf,
        service_type: str,
        name: str,
        state_change: ServiceStateChange,
    ) -> None:
        """Browser callback, on the loop: never blocks, only schedules or reports."""
        if self._closed or name.lower() == self._own_key:
            return
        if not self._ours(name):
            if state_change is not ServiceStateChange.Removed:
                self._stats["other_mesh"] += 1
            return
        if state_change is ServiceStateChange.Removed:
            task = self._resolving.pop(name, None)
            if task is not None:
                task.cancel()
            self._again.discard(name)
            agent = agent_from_service_name(name)
            if agent is not None:
                self._lose(agent)
            return
        task = self._resolving.get(name)
        if task is not None and not task.done():
            self._again.add(name)
            return
        task = asyncio.create_task(self._resolve(name), name=f"porter-resolve {name}")
        self._resolving[name] = task
        task.add_done_callback(lambda done: self._resolve_done(name, done))

    def _ours(self, name: str) -> bool:
        """Whether a service instance name carries this mesh's tag (see the module
        docstring); names without a tag are not this version's either."""
        label = name[: -len(_SUFFIX)] if name.lower().endswith(_SUFFIX.lower()) else ""
        return label.rpartition("@")[2].lower() == self._tag

    def _resolve_done(self, name: str, task: asyncio.Task[None]) -> None:
        if self._resolving.get(name) is task:
            del self._resolving[name]
        if not task.cancelled() and task.exception() is not None:
            _log.error("resolving %s failed", name, exc_info=task.exception())

    async def _resolve(self, name: str) -> None:
        aiozc = self._aiozc
        assert aiozc is not None
        while True:
            self._again.discard(name)
            info = AsyncServiceInfo(SERVICE_TYPE, name)
            if await info.async_request(
                aiozc.zeroconf, self._resolve_ms, question_type=DNSQuestionType.QM
            ):
                self._accept(name, info)
            else:
                self._stats["unresolved"] += 1
                _log.debug("%s did not answer with SRV, TXT and address in time", name)
            if name not in self._again or self._closed:
                return

    def _accept(self, name: str, info: AsyncServiceInfo) -> None:
        agent = agent_from_service_name(name)
        addresses = [
            *info.parsed_addresses(IPVersion.V4Only),
            *info.parsed_scoped_addresses(IPVersion.V6Only),
        ]
        try:
            advert = decode_txt(info.properties, addresses=addresses)
            if advert.name != agent:
                raise FrameError(
                    f"TXT name {advert.name!r} does not match service name {name!r}",
                    reason="bad-advert",
                )
        except FrameError as exc:
            self._stats["bad_advert"] += 1
            self._warn_once(name, "ignoring %r: %s", name, exc)
            if agent is not None:
                self._lose(agent)
            return
        if advert.mesh != self._mesh:
            self._stats["other_mesh"] += 1
            self._lose(advert.name)  # a node that moved to another mesh has left ours
            return
        if advert.version != PROTOCOL_VERSION:
            self._stats["other_version"] += 1
            self._warn_once(
                name, "ignoring %r: it speaks protocol version %d, this node %d",
                name, advert.version, PROTOCOL_VERSION,
            )
            self._lose(advert.name)
            return
        if not addresses:
            self._stats["unresolved"] += 1
            return
        previous = self._peers.get(advert.name)
        if previous == advert:
            return
        self._peers[advert.name] = advert
        self._stats["found" if previous is None else "updated"] += 1
        self._call(self._on_found, advert)

    def _lose(self, agent: str) -> None:
        if self._peers.pop(agent, None) is not None:
            self._stats["lost"] += 1
            self._call(self._on_lost, agent)

    def _call(self, callback: Callable[[Any], None], arg: object) -> None:
        try:
            callback(arg)
        except Exception:
            self._stats["callback_errors"] += 1
            _log.exception("discovery callback %r failed", callback)

    def _warn_once(self, name: str, message: str, *args: object) -> None:
        # A misbehaving peer re-announces often; say it once, then only at debug level.
        level = logging.DEBUG if name in self._warned else logging.WARNING
        self._warned.add(name)
        _log.log(level, message, *args)
