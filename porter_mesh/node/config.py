"""Node settings: one frozen value with documented defaults, checked once at creation."""

from __future__ import annotations

import ipaddress
import os
import pathlib
from dataclasses import dataclass, field, replace
from typing import Any

from porter_mesh.core import constants as C
from porter_mesh.core.advert import check_agent_name
from porter_mesh.errors import ConfigError

__all__ = ["NodeConfig", "default_data_dir"]


def default_data_dir(mesh: str, name: str) -> pathlib.Path:
    """``$PORTER_MESH_DATA/<mesh>/<name>``, else ``~/.local/share/porter-mesh/<mesh>/<name>``."""
    base = os.environ.get("PORTER_MESH_DATA")
    root = pathlib.Path(base) if base else pathlib.Path.home() / ".local/share/porter-mesh"
    return root / mesh / name


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """Everything a node needs to know. Build it with keyword arguments.

    Attributes:
        name: agent name, unique on the mesh (``[a-z0-9][a-z0-9._-]*``).
        role: free-form role advertised to others (``architect``, ``worker``...).
        mesh: mesh name; nodes only see peers of the same mesh.
        interfaces: addresses to bind and announce on. Default loopback only, so a fresh
            install never shows itself on a LAN until asked to.
        pub_port / router_port: 0 lets the OS choose.
        channels: channels to subscribe to besides ``control`` and the node's own inbox.
        discovery: announce and browse with zeroconf (mDNS).
        advertise: register this node in mDNS (short-lived tools such as ``send`` do not).
        observer: only watch: no mDNS record, no hello, no heartbeats, so the node never
            appears on anyone's roster (``tail`` and ``peers`` run this way).
        seeds: ``host:port`` ROUTER endpoints of peers to contact without mDNS.
        heartbeat_interval: seconds between heartbeats on ``control``.
        evasive_after / expire_after: silence (seconds) before a peer is EVASIVE / gone.
        send_timeout: default deadline (seconds) for a direct send to be acknowledged.
        retry_initial / retry_max: direct resend backoff (seconds).
        max_message_bytes: ZeroMQ ZMQ_MAXMSGSIZE on every receiving socket.
        sndhwm / rcvhwm: ZeroMQ high-water marks (messages) per socket pipe.
        inbox_size: most undelivered messages held for the application; broadcast beyond
            it is dropped (counted); direct beyond it is not acknowledged, so the sender
            retries later (backpressure, no loss). 0 disables the inbox: messages go
            only to handlers.
        max_pending: most unacknowledged direct messages per recipient.
        batch_max: most activities packed into one ZeroMQ message under load.
        data_dir: where durable state lives (the direct-delivery journal); ``None`` keeps
            it in memory only.
        slots: task slots advertised (workers).
        tools: tool names advertised.
    """

    name: str
    role: str = "agent"
    mesh: str = C.DEFAULT_MESH
    interfaces: tuple[str, ...] = ("127.0.0.1",)
    pub_port: int = 0
    router_port: int = 0
    channels: tuple[str, ...] = (C.CHANNEL_LOG, C.CHANNEL_TASK, C.CHANNEL_REVIEW)
    discovery: bool = True
    advertise: bool = True
    observer: bool = False
    seeds: tuple[str, ...] = ()
    heartbeat_interval: float = 1.0
    evasive_after: float = 3.0
    expire_after: float = 10.0
    send_timeout: float = 10.0
    retry_initial: float = 0.2
    retry_max: float = 2.0
    max_message_bytes: int = C.MAX_MESSAGE_BYTES
    sndhwm: int = 100_000
    rcvhwm: int = 100_000
    inbox_size: int = 100_000
    max_pending: int = 100_000
    batch_max: int = 64
    data_dir: pathlib.Path | None = None
    slots: int = 0
    tools: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_agent_name(self.name)
        if not self.mesh or len(self.mesh) > 63:
            raise ConfigError(f"mesh name {self.mesh!r} must be 1-63 characters")
        if not self.interfaces:
            raise ConfigError("interfaces is empty: give at least one address to bind")
        for host in self.interfaces:
            try:
                ipaddress.ip_address(host)
            except ValueError:
                raise ConfigError(
                    f"interface {host!r} is not an IP address; give the address to bind, "
                    "e.g. 127.0.0.1 or 192.168.1.20"
                ) from None
        for port_name in ("pub_port", "router_port"):
            port = getattr(self, port_name)
            if not 0 <= port <= 65535:
                raise ConfigError(f"{port_name}={port} is not a TCP port (0-65535)")
        for seed in self.seeds:
            host, _, port = seed.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(f"seed {seed!r} is not HOST:PORT (e.g. 127.0.0.1:5555)")
        if not 0 < self.heartbeat_interval < self.evasive_after < self.expire_after:
            raise ConfigError(
                "timings must satisfy 0 < heartbeat_interval < evasive_after < expire_after "
                f"(got {self.heartbeat_interval}, {self.evasive_after}, {self.expire_after})"
            )
        if not 1 <= self.batch_max <= C.MAX_BATCH:
            raise ConfigError(f"batch_max must be 1..{C.MAX_BATCH}")
        for value_name in ("send_timeout", "retry_initial", "retry_max"):
            if getattr(self, value_name) <= 0:
                raise ConfigError(f"{value_name} must be positive")
        if self.inbox_size < 0:
            raise ConfigError("inbox_size must be >= 0 (0: no inbox, handlers only)")
        for count_name in ("max_pending", "sndhwm", "rcvhwm", "max_message_bytes"):
            if getattr(self, count_name) <= 0:
                raise ConfigError(f"{count_name} must be positive")

    @property
    def loopback_only(self) -> bool:
        """True when every bound interface is a loopback address."""
        return all(_is_loopback(h) for h in self.interfaces)

    def with_changes(self, **changes: Any) -> NodeConfig:
        """A copy with some settings changed (checked again)."""
        return replace(self, **changes)
