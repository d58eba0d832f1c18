"""Node settings: one frozen value with documented defaults, checked once at creation."""

from __future__ import annotations

import ipaddress
import os
import pathlib
import sys
from dataclasses import dataclass, field, replace
from typing import Any

from porter_mesh.core import constants as C
from porter_mesh.core.advert import check_agent_name
from porter_mesh.errors import ConfigError, SecurityError

__all__ = ["BROADCAST_MESSAGE_BYTES", "ENV_DATA", "ENV_INSECURE", "ENV_KEY", "ENV_TRUSTED",
           "KNOWLEDGE_DIR", "SUBSCRIBER_QUEUE_BYTES", "NodeConfig", "data_root",
           "default_data_dir", "default_trusted_dir", "knowledge_dir", "split_seed"]

#: Environment variables that supply the security settings' defaults, so that every
#: ``porter-mesh`` command an operator runs (and the agents a demo starts) picks them up.
ENV_KEY = "PORTER_MESH_KEY"
ENV_TRUSTED = "PORTER_MESH_TRUSTED"
ENV_INSECURE = "PORTER_MESH_INSECURE"
#: The root of every node's default data directory (see :func:`data_root`).
ENV_DATA = "PORTER_MESH_DATA"
#: The knowledge shard's directory inside a node's data directory.
KNOWLEDGE_DIR = "knowledge"
#: Default byte budget of one subscriber's outgoing broadcast queue (see NodeConfig).
SUBSCRIBER_QUEUE_BYTES = 32 * 1024 * 1024
#: Default cap on one broadcast ZeroMQ message (a batch is split to stay under it).
BROADCAST_MESSAGE_BYTES = 64 * 1024


def data_root() -> pathlib.Path:
    """Where nodes keep their data unless told otherwise: ``$PORTER_MESH_DATA``, else the
    platform's user data directory plus ``porter-mesh`` (``$XDG_DATA_HOME`` or
    ``~/.local/share`` on Linux and other Unix, ``~/Library/Application Support`` on macOS,
    ``%LOCALAPPDATA%`` on Windows)."""
    base = os.environ.get(ENV_DATA)
    if base:
        return pathlib.Path(base).expanduser()
    home = pathlib.Path.home()
    if sys.platform == "darwin":
        return home / "Library" / "Application Support" / "porter-mesh"
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        return (pathlib.Path(local) if local else home / "AppData" / "Local") / "porter-mesh"
    xdg = os.environ.get("XDG_DATA_HOME", "")
    # The XDG spec says to ignore a relative path.
    return (pathlib.Path(xdg) if os.path.isabs(xdg) else home / ".local" / "share") / "porter-mesh"


def default_data_dir(mesh: str, name: str) -> pathlib.Path:
    """The data directory of agent ``name`` on ``mesh``: ``<data root>/<mesh>/<name>``
    (see :func:`data_root`)."""
    return data_root() / mesh / name


def knowledge_dir(data_dir: pathlib.Path) -> pathlib.Path:
    """The knowledge shard's directory inside the node data directory ``data_dir``."""
    return data_dir / KNOWLEDGE_DIR


def default_trusted_dir(mesh: str) -> pathlib.Path:
    """The trusted-key directory of ``mesh``: ``<data root>/<mesh>/trusted``."""
    return data_root() / mesh / "trusted"


def _env_path(variable: str) -> pathlib.Path | None:
    value = os.environ.get(variable)
    return pathlib.Path(value).expanduser() if value else None


def _env_key() -> pathlib.Path | None:
    return _env_path(ENV_KEY)


def _env_trusted() -> pathlib.Path | None:
    return _env_path(ENV_TRUSTED)


def _env_insecure() -> bool:
    return os.environ.get(ENV_INSECURE, "").strip().lower() in ("1", "true", "yes")


def split_seed(seed: str) -> tuple[str | None, str, int]:
    """Split a seed ``[NAME@]HOST:PORT`` into ``(name or None, host, port)``.

    Raises:
        ConfigError: the seed is not of that form.
    """
    name, at, endpoint = seed.rpartition("@")
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"seed {seed!r} is not HOST:PORT or NAME@HOST:PORT "
                          "(e.g. 127.0.0.1:5555 or worker-1@10.0.0.5:5555)")
    if at:
        check_agent_name(name)
    return (name if at else None), host, int(port)


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
        seeds: ``HOST:PORT`` ROUTER endpoints of peers to contact without mDNS; a
            secured node writes them ``NAME@HOST:PORT`` (it must know whose key to expect).
        heartbeat_interval: seconds between heartbeats on ``control``.
        evasive_after / expire_after: silence (seconds) before a peer is EVASIVE / gone.
        recontact_max: most seconds between attempts to reach a seed or an expired peer
            again (capped exponential backoff from ``heartbeat_interval``, with jitter):
            a partition of any length heals within about this long of the link coming
            back. See docs/faults.md, "Partitions".
        max_clock_skew: how far (seconds) a peer's clock may be from ours, ahead or
            behind, for this node's hybrid clock to adopt its time. Beyond it the peer's
            messages are still handled, its time is not adopted, and it shows as
            ``clock-skew`` in the roster. Default 24 hours, at most 366 days. See
            docs/faults.md, "Clock skew".
        send_timeout: default deadline (seconds) for a direct send to be acknowledged.
        retry_initial / retry_max: direct resend backoff (seconds).
        max_message_bytes: ZeroMQ ZMQ_MAXMSGSIZE on every receiving socket.
        sndhwm / rcvhwm: ZeroMQ high-water marks (messages) per socket pipe (the PUB
            socket's send side excepted: see ``subscriber_queue_bytes``).
        subscriber_queue_bytes: most bytes of broadcasts queued in this process for one
            subscriber that does not read (stopped, overloaded); beyond it that
            subscriber's broadcasts are dropped and it counts them as lost (sequence
            gaps). Default 32 MiB. libzmq counts its queue in messages, so the PUB's
            high-water mark is ``subscriber_queue_bytes // broadcast_message_bytes`` and
            no broadcast message is bigger than ``broadcast_message_bytes`` (unless one
            activity is). The kernel's TCP send buffer (a few MB, outside the process)
            comes on top.
        broadcast_message_bytes: most bytes of activities packed into one broadcast
            ZeroMQ message (default 64 KiB); a batch that would be bigger is split.
        inbox_size: most undelivered messages held for the application; broadcast beyond
            it is dropped (counted); direct beyond it is not acknowledged, so the sender
            retries later (backpressure, no loss). 0 disables the inbox: messages go
            only to handlers.
        max_pending: most unacknowledged direct messages per recipient.
        batch_max: most activities packed into one direct ZeroMQ message under load.
        broadcast_batch_max: most activities packed into one broadcast ZeroMQ message
            under load (default ``MAX_BATCH``, 256; ``broadcast_message_bytes`` bounds
            its size too). Broadcasts pack more than direct messages: a broadcast's cost
            on both sides is mostly per ZeroMQ message, and it is never resent, where a
            direct message is acknowledged and resent whole.
        data_dir: where durable state lives (the direct-delivery journal; the knowledge
            shard, in ``knowledge/``, when one is attached); ``None`` keeps it in memory
            only. The node locks it while it runs: a second process is refused, with
            the pid of the one that holds it.
        idempotency_window: seconds a receiver remembers the idempotency key of a direct
            message (``send(..., key=...)``): a message with a key seen from the same
            sender within the window is acknowledged and not delivered again.
        redeliver_initial / redeliver_max: the capped, doubling backoff (seconds)
            between offers of a message a handler declined (raised
            :class:`~porter_mesh.errors.NotHandled`) to the handlers. Adding a handler
            or calling :meth:`Node.redeliver` offers it at once.
        unread_warning: seconds that messages owed to the application may wait unread
            (in the inbox that nothing reads, or for a first handler on a node without
            an inbox) before the node says so, once, in its log and in ``stats``
            (``inbox.unread``). 0 turns the warning off.
        journal_compact_bytes: the delivery journal is rewritten without what no longer
            matters (taken messages' payloads, senders' old incarnations) when it has
            grown past this many bytes and taken records make up over half of it, at
            start-up and while the node runs, so its size stays bounded.
        busy_poll: seconds the node keeps its event loop turning, without sleeping, after
            it sends a direct message, so that the acknowledgement or the answer arriving
            meanwhile is read at once instead of after the wake-up of an idle CPU (tens of
            microseconds on a virtual machine whose guest does not poll before halting).
            Each turn yields the CPU to any other thread ready to run on it. Default 500
            microseconds; 0 turns it off (the loop sleeps as soon as it has nothing to do).
            An idle node never polls; see docs/performance.md, "Busy polling".
        slots: task slots advertised (workers).
        tools: tool names advertised.
        secret_key_file: this agent's secret certificate (``NAME.key_secret`` from
            ``porter-mesh keygen``). Setting it secures the node: CurveZMQ on every
            socket, only keys of the trusted directory let in, senders bound to their
            keys. Default ``$PORTER_MESH_KEY``.
        trusted_dir: the mesh's directory of trusted public keys. Default
            ``$PORTER_MESH_TRUSTED``, else ``<data root>/<mesh>/trusted``.
        insecure: allow binding beyond loopback without keys (protected mode is on by
            default: such a node refuses to start). Default ``$PORTER_MESH_INSECURE``.
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
    recontact_max: float = 5.0
    max_clock_skew: float = 86_400.0
    send_timeout: float = 10.0
    retry_initial: float = 0.2
    retry_max: float = 2.0
    max_message_bytes: int = C.MAX_MESSAGE_BYTES
    sndhwm: int = 100_000
    rcvhwm: int = 100_000
    subscriber_queue_bytes: int = SUBSCRIBER_QUEUE_BYTES
    broadcast_message_bytes: int = BROADCAST_MESSAGE_BYTES
    inbox_size: int = 100_000
    max_pending: int = 100_000
    batch_max: int = 64
    broadcast_batch_max: int = C.MAX_BATCH
    data_dir: pathlib.Path | None = None
    idempotency_window: float = 600.0
    redeliver_initial: float = 0.05
    redeliver_max: float = 2.0
    unread_warning: float = 30.0
    journal_compact_bytes: int = 8 * 1024 * 1024
    busy_poll: float = 0.0005
    slots: int = 0
    tools: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    secret_key_file: pathlib.Path | None = field(default_factory=_env_key)
    trusted_dir: pathlib.Path | None = field(default_factory=_env_trusted)
    insecure: bool = field(default_factory=_env_insecure)

    def __post_init__(self) -> None:
        check_agent_name(self.name)
        for path_name in ("data_dir", "secret_key_file", "trusted_dir"):
            value = getattr(self, path_name)
            if value is None or isinstance(value, pathlib.Path):
                continue
            if not isinstance(value, str | os.PathLike) or not str(value):
                raise ConfigError(f"{path_name} must be a path (str or pathlib.Path), "
                                  f"not {type(value).__name__} {value!r}")
            object.__setattr__(self, path_name, pathlib.Path(value))
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
            split_seed(seed)
        if not 0 < self.heartbeat_interval < self.evasive_after < self.expire_after:
            raise ConfigError(
                "timings must satisfy 0 < heartbeat_interval < evasive_after < expire_after "
                f"(got {self.heartbeat_interval}, {self.evasive_after}, {self.expire_after})"
            )
        if not self.recontact_max >= self.heartbeat_interval:
            raise ConfigError(
                f"recontact_max ({self.recontact_max}) must be at least heartbeat_interval "
                f"({self.heartbeat_interval}): it caps the backoff that starts there")
        if not 0 <= self.max_clock_skew <= 366 * 86_400:
            raise ConfigError(
                f"max_clock_skew must be 0..{366 * 86_400} seconds (a year), got "
                f"{self.max_clock_skew}; the default is 86400 (a day)")
        for batch_name in ("batch_max", "broadcast_batch_max"):
            if not 1 <= getattr(self, batch_name) <= C.MAX_BATCH:
                raise ConfigError(f"{batch_name} must be 1..{C.MAX_BATCH}")
        for value_name in ("send_timeout", "retry_initial", "retry_max", "idempotency_window",
                           "redeliver_initial", "redeliver_max"):
            if getattr(self, value_name) <= 0:
                raise ConfigError(f"{value_name} must be positive")
        if self.redeliver_max < self.redeliver_initial:
            raise ConfigError(f"redeliver_max ({self.redeliver_max}) must be at least "
                              f"redeliver_initial ({self.redeliver_initial})")
        if self.unread_warning < 0:
            raise ConfigError("unread_warning must be >= 0 seconds (0: no warning)")
        if not 0 <= self.busy_poll <= 0.1:
            raise ConfigError(f"busy_poll must be 0..0.1 seconds (0: off), got {self.busy_poll}; "
                              "the default is 0.0005 (500 microseconds)")
        if self.journal_compact_bytes < 4096:
            raise ConfigError("journal_compact_bytes must be at least 4096 bytes")
        if self.inbox_size < 0:
            raise ConfigError("inbox_size must be >= 0 (0: no inbox, handlers only)")
        for count_name in ("max_pending", "sndhwm", "rcvhwm", "max_message_bytes",
                           "subscriber_queue_bytes", "broadcast_message_bytes"):
            if getattr(self, count_name) <= 0:
                raise ConfigError(f"{count_name} must be positive")
        if self.subscriber_queue_bytes < self.broadcast_message_bytes:
            raise ConfigError("subscriber_queue_bytes must hold at least one broadcast "
                              f"message ({self.broadcast_message_bytes} bytes)")

    @property
    def pub_hwm(self) -> int:
        """The PUB socket's high-water mark: the subscriber byte budget in messages."""
        return self.subscriber_queue_bytes // self.broadcast_message_bytes

    @property
    def loopback_only(self) -> bool:
        """True when every bound interface is a loopback address."""
        return all(_is_loopback(h) for h in self.interfaces)

    @property
    def secured(self) -> bool:
        """True when the node runs CurveZMQ (it has a secret key)."""
        return self.secret_key_file is not None

    @property
    def trusted_path(self) -> pathlib.Path:
        """The trusted directory in use: ``trusted_dir``, else the mesh's default."""
        return self.trusted_dir if self.trusted_dir is not None else default_trusted_dir(self.mesh)

    def check_protected(self) -> None:
        """Protected mode: refuse to expose an unsecured node beyond loopback.

        Raises:
            SecurityError: an interface is not loopback, the node has no key, and the
                operator did not ask for ``insecure``.
        """
        if self.secured or self.insecure or self.loopback_only:
            return
        exposed = ", ".join(h for h in self.interfaces if not _is_loopback(h))
        raise SecurityError(
            f"refusing to bind {exposed} without keys (protected mode): anyone who can reach "
            "that address could join the mesh and read its traffic. Give the node a key "
            f"(secret_key_file=..., or ${ENV_KEY}; see docs/security.md), or accept the "
            f"risk explicitly with insecure=True (--insecure on the command line, or "
            f"{ENV_INSECURE}=1)"
        )

    def with_changes(self, **changes: Any) -> NodeConfig:
        """A copy with some settings changed (checked again)."""
        return replace(self, **changes)
