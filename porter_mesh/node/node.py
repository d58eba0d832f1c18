"""The asyncio mesh node every agent process embeds: the driver of the mesh's rules.

Theory of operation
-------------------
The protocol's rules are pure and live in :mod:`porter_mesh.core.session`: sending
(queues, batching, numbering, the outbox), the roster (adverts, peer states, what each
change asks) and receiving (authenticity, sequencing, de-duplication, idempotency keys,
inbox admission). Each takes an explicit time and returns actions. The node owns the
sockets and the clock and carries those actions out, in their order; its parts:

* :mod:`~porter_mesh.node.links`: the sockets, how each is made, bound and watched, the
  one read loop, and the links to peers (a DEALER to each peer's ROUTER, the SUB side);
* :mod:`~porter_mesh.node.arrivals`: every message read, decoded, checked and handed to
  the rule it is for (journal, deliver, acknowledge, in that order);
* :mod:`~porter_mesh.node.inbox`: what the application is owed: handlers, the inbox,
  declined messages, the delivery journal and its replay after a restart;
* :mod:`~porter_mesh.node.peering`: adverts, hellos, re-contact of seeds and lost peers,
  refusals, revoked keys;
* :mod:`~porter_mesh.node.subscriptions`: the channels this node receives and who
  receives its own;
* this module: the lifecycle, the public API, sending (:meth:`Node._carry_out` is where
  every frame, settlement, failure and roster change the rules return is carried out),
  and the one timer.

Sending is batched under load: ``async_publish`` and ``async_send_nowait`` only queue;
one flush per loop iteration packs what accumulated into messages of up to
``batch_max`` activities. A lone message therefore goes out on the next iteration and a
burst goes out in a few large messages.

Broadcast is best effort and ordered per sender (one PUB socket, one TCP stream). Each
message carries a per-(sender, channel) sequence number; heartbeats carry the last one
per channel, so loss (even of the last message) is detected and counted, never silent.

Direct delivery is at-least-once on the wire and once to the application: the sender
keeps each message in its outbox and resends it with backoff until acknowledged or its
deadline passes (then the caller's future fails with ``DeliveryTimeout``). The receiver
de-duplicates by (sender, incarnation, sequence), records accepted messages in its
journal (when it has a data directory) before acknowledging, and acknowledges duplicates
again without delivering them. An acknowledgement owed to a peer that this node sends a
direct message in the same flush (a handler's reply to a request, the next request after
a reply) rides on that message instead of going alone (:meth:`Node._carry_acks`,
:mod:`porter_mesh.core.session.acks`), so a request and its reply are two ZeroMQ
messages, not four.

Timers. Nothing polls: the node has one timer (:class:`~porter_mesh.node.timer.DeadlineTimer`)
armed at the earliest deadline of all that waits on the clock (the next heartbeat, which
also checks peer silence, the trusted directory and unread messages; the outbox's next
resend or send deadline; the next re-contact attempt; the next offer of a declined
message), and moved earlier whenever a read, a flush or a discovery adds an earlier one.
An idle node wakes once a heartbeat. A wake-up far later than asked means this process
was stopped (SIGSTOP, a suspended VM): the peers' silence over that time is forgiven and
the node says hello to everyone again.

Clocks. The hybrid timestamp of every broadcast, direct message and acknowledgement is
merged into this node's clock within ``max_clock_skew`` (:mod:`porter_mesh.core.hlc`); a
peer beyond it is still heard and its messages handled, but its time is not adopted and
its roster state is CLOCK_SKEW (one WARNING per peer). Nothing is dropped for its clock.

Security. A node with a secret key (``NodeConfig.secret_key_file``) runs CurveZMQ on
every socket (:mod:`porter_mesh.adapters.security` explains keys, the trusted directory
and ZAP). Its sockets then differ in three ways: there is one SUB per peer instead of
one shared SUB (libzmq sets the CURVE server key per socket); DEALERs carry no chosen
routing id (the ROUTER makes up one, so a trusted peer cannot claim another's id and
take over its replies); and the ROUTER is read with ``copy=False`` to get each message's
ZAP User-Id, the agent name bound to the sender's key. Every message must then come
from the name it claims, and every activity's ``actor`` must be that name too; anything
else is dropped and written to the audit log. Adverts must carry a key that the trusted
directory binds to the advertised name, and an advert that would move a live peer is
believed only first-hand. The trusted directory is looked at on every heartbeat (one
``stat``; see :meth:`~porter_mesh.adapters.security.TrustStore.refresh_if_changed`): a
peer whose key was removed is disconnected, and the PUB is bound afresh so that its
subscription ends too. An unsecured node pays for none of this. A node bound beyond
loopback without a key refuses to start unless ``insecure`` is set (protected mode).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Any

import zmq

from porter_mesh.adapters.dirlock import DirLock
from porter_mesh.adapters.security import AUDIT_FILE, MeshSecurity, check_libzmq
from porter_mesh.core import constants as C
from porter_mesh.core.addresses import url_host
from porter_mesh.core.advert import PeerAdvert
from porter_mesh.core.as2 import Activity
from porter_mesh.core.control import (
    KIND_BYE,
    KIND_DRAIN,
    KIND_HALT,
    KIND_HEARTBEAT,
    KIND_STATS,
    KIND_STATS_REPLY,
    NODE_KINDS,
    Ack,
    Heartbeat,
    StatsReply,
    encode_ack,
    encode_bye,
    encode_control,
    encode_heartbeat,
    encode_stats_reply,
)
from porter_mesh.core.envelope import (
    Envelope,
    encode_broadcast,
    encode_direct,
    make_msg_id,
)
from porter_mesh.core.hlc import HybridClock
from porter_mesh.core.peers import PeerEvent, PeerInfo
from porter_mesh.core.session.acks import PendingAcks
from porter_mesh.core.session.frames import (
    BroadcastFrame,
    Count,
    DirectFrame,
    Fail,
    SendFrame,
    Settle,
)
from porter_mesh.core.session.keys import MAX_KEY_CHARS
from porter_mesh.core.session.receiving import Receiving
from porter_mesh.core.session.roster import (
    Connect,
    Disconnect,
    Drop,
    Forget,
    PeerChanged,
    Reconnect,
    Roster,
    RosterAction,
)
from porter_mesh.core.session.sending import SendAction, Sender
from porter_mesh.core.tracecontext import TraceContext
from porter_mesh.errors import (
    ConfigError,
    NodeClosedError,
    PeerRefusedError,
    SecurityError,
    StorageError,
    UnknownPeerError,
)
from porter_mesh.node.arrivals import Arrivals, KindHandler, OnceLog, Reply, count_for
from porter_mesh.node.completions import Completion, Countdown, fail_all, send_error, settle
from porter_mesh.node.config import NodeConfig, split_seed
from porter_mesh.node.inbox import Inbox, Message, wall_ms
from porter_mesh.node.links import Links, Sockets, recv_subscription
from porter_mesh.node.peering import Peering
from porter_mesh.node.subscriptions import Subscriptions
from porter_mesh.node.timer import DeadlineTimer
from porter_mesh.node.zio import send_frames

__all__ = ["KindHandler", "Message", "Node", "Reply"]

log = logging.getLogger("porter_mesh.node")

#: A wake-up this much later than its timer asked for means the process was stopped
#: (SIGSTOP, a debugger, a suspended VM) rather than busy, at the least (see _on_timer).
_PAUSE_MIN = 1.0


#: The lock file that keeps a data directory to one node process.
DATA_DIR_LOCK = "node.lock"


class Node:
    """A mesh node. Use ``async with Node(name=...) as node:`` or ``astart``/``aclose``.

    Args:
        config: a :class:`NodeConfig`; or pass its fields as keyword arguments.
        handlers: message handlers installed before anything can arrive, as by
            :meth:`add_handler`: they see the messages a restart delivers again, whether
            the node has an inbox or not.
        batch_handlers: batch handlers installed the same way (:meth:`add_batch_handler`).

    Methods prefixed ``async_`` are plain functions that must be called from the node's
    event loop; coroutine methods are awaited on it.
    """

    def __init__(self, config: NodeConfig | None = None, *,
                 handlers: Iterable[Callable[[Message], None]] = (),
                 batch_handlers: Iterable[Callable[[list[Message]], None]] = (),
                 **settings: Any) -> None:
        if config is None:
            config = NodeConfig(**settings)
        elif settings:
            config = config.with_changes(**settings)
        self.config = config
        self.name = config.name
        self.incarnation = secrets.randbits(63) or 1
        self.counters: collections.Counter[str] = collections.Counter()
        #: Broadcasts lost (sequence gaps) and messages dropped, per sending peer.
        self.lost_by: collections.Counter[str] = collections.Counter()
        self.dropped_by: collections.Counter[str] = collections.Counter()
        self._drop = OnceLog(self.count_drop)
        #: Extra sections of :meth:`view` (the knowledge replica adds ``knowledge``).
        self.view_sections: dict[str, Callable[[], dict[str, Any]]] = {}
        self._dir_lock: DirLock | None = None
        self._started_at = time.monotonic()
        # The sending rules (queues, batching, numbering, the outbox): pure; the node
        # carries out what they return (_carry_out).
        self._sending: Sender[Completion] = Sender(
            self.name, self.incarnation, retry_initial=config.retry_initial,
            retry_max=config.retry_max, max_pending=config.max_pending,
            batch_max=config.batch_max, broadcast_batch_max=config.broadcast_batch_max,
            broadcast_bytes=config.broadcast_message_bytes,
        )
        # The roster's rules (adverts vetted, what each change asks of the node): pure.
        self._roster: Roster[Completion] = Roster(
            self.name, config.mesh, self._sending, evasive_after=config.evasive_after,
            expire_after=config.expire_after)
        self._peers = self._roster.peers
        # The receiving rules (direct and broadcast; what to do with each arrival): pure.
        self._receiving = Receiving(key_window=config.idempotency_window)
        self._clock = HybridClock(max_skew_ms=round(config.max_clock_skew * 1000))
        # Acknowledgements owed until the next flush (a direct message to their sender
        # may carry them).
        self._acks = PendingAcks()
        self._control_listeners: list[Callable[[str, str, dict[str, Any]], None]] = []
        # What the application is owed: handlers, the inbox, declined messages, the
        # delivery journal and its replay.
        self._inbox = Inbox(config, self.counters, receiving=self._receiving,
                            drop=self._drop, refuse=self._refuse, queue_ack=self._acks.add,
                            wake_by=self._wake_by, after_batch=self._after_batch,
                            closed=lambda: self._closed, handlers=handlers,
                            batch_handlers=batch_handlers)
        # The channels this node receives, and the subscriptions that reached its PUB.
        self._subs = Subscriptions(self.name, self._sub_sockets)
        # The flush queued for the next loop turn, if any (a flush run earlier cancels it).
        self._flush_handle: asyncio.Handle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # The sockets, how they are made and watched, and the one read loop.
        self._sockets = Sockets(config, after_batch=self._after_batch,
                                closed=lambda: self._closed)
        # The links to peers, the probes and every handshake watch (socket work only;
        # the roster and the re-contact schedule decide when).
        self._net = Links(self._sockets, routing_id=f"{self.name}/{self.incarnation:x}",
                          read_sub=lambda sock, peer: self._arrivals.read_sub(sock, peer),
                          read_dealer=lambda *where: self._arrivals.read_dealer(*where),
                          on_handshake=lambda sock: self._peering.on_handshake(sock))
        self._links = self._net.links
        # Reaching peers: adverts, hellos, re-contact, refusals, revoked keys.
        self._peering: Peering[Completion] = Peering(
            config, self.counters, roster=self._roster, sending=self._sending,
            net=self._net, carry_out=self._carry_out, send_control=self._send_control_direct,
            advert=self.advert, topics=self._subs.topics, drop=self._drop, refuse=self._refuse,
            closed=lambda: self._closed)
        # Reading the mesh: every arrival checked and handed to the rule it is for.
        self._arrivals: Arrivals[Completion] = Arrivals(
            config, self.counters, lost_by=self.lost_by, sockets=self._sockets,
            links=self._links, acks=self._acks, clock=self._clock, roster=self._roster,
            receiving=self._receiving, sending=self._sending, inbox=self._inbox,
            peering=self._peering, subs=self._subs, carry_out=self._carry_out,
            envelope=self._envelope, send_frames=self._send_frames,
            send_control=self._send_control_direct, pub=lambda: self._pub,
            drop=self._drop, refuse=self._refuse, app_control=self._on_app_control,
            incarnation=self.incarnation)
        self._arrivals.kind_handlers[KIND_STATS] = self._on_stats_request
        self._pub: zmq.Socket[bytes] | None = None
        self._sub: zmq.Socket[bytes] | None = None
        self._router: zmq.Socket[bytes] | None = None
        self._security: MeshSecurity | None = None
        self._trust_generation = 0
        self._trust_removals = 0
        self._discovery: Any = None
        # The one timer of the node, armed at the earliest deadline of everything that
        # waits on time (see _rearm), and when it is due (monotonic; inf: not armed).
        self._timer: DeadlineTimer | None = None
        self._beat_due = 0.0
        self._started = False
        self._closed = False
        self.draining = False
        self._halt_event: asyncio.Event | None = None
        self.pub_port = 0
        self.router_port = 0

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Node:
        await self.astart()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def astart(self) -> None:
        """Bind sockets, replay the journal, start heartbeats and discovery.

        Raises:
            ConfigError: a port is taken or an interface cannot be bound.
            StorageError: the delivery journal cannot be created (a full disk).
            SecurityError: libzmq is too old; the node would bind beyond loopback without
                keys and without ``insecure``; or its key or trusted directory cannot be
                used. Raised before any socket is bound.
        """
        if self._started:
            return
        cfg = self.config
        check_libzmq()
        cfg.check_protected()
        security = self._load_security() if cfg.secured else None
        if cfg.data_dir is not None:
            # Refused here, before any socket is bound, when another node runs on it.
            self._dir_lock = DirLock(cfg.data_dir, filename=DATA_DIR_LOCK)
        self._started = True
        self._started_at = time.monotonic()
        # The first heartbeat goes at once. Set before anything can arm the timer (a
        # subscription, the journal's redelivery): a deadline of 0 would make the first
        # timer run look as late as the machine's uptime, that is, a long pause.
        self._beat_due = self._started_at
        self._loop = asyncio.get_running_loop()
        self._timer = DeadlineTimer(self._loop, self._on_timer)
        self._inbox.start(self._loop)
        self._halt_event = asyncio.Event()
        ctx = self._sockets.open(self._loop)
        if security is not None:
            # The authenticator must answer before the first client can knock.
            self._sockets.watch(security.start(ctx), self._answer_zap)
            self._security = self._sockets.security = security
            self._inbox.bind_actors = True
            self._trust_generation = security.store.generation
            self._peering.security = self._arrivals.security = security
            self._trust_removals = security.store.removals
        try:
            self._pub = self._sockets.new_pub()
            self.pub_port = self._sockets.bind(self._pub, cfg.pub_port)
            self._router = self._sockets.server(zmq.ROUTER)
            self._router.setsockopt(zmq.ROUTER_HANDOVER, 1)
            self.router_port = self._sockets.bind(self._router, cfg.router_port)
            # A secured node keeps one SUB per peer instead (see the module docstring).
            self._sub = self._sockets.socket(zmq.SUB) if security is None else None
            self._peering.shared_sub = self._arrivals.sub = self._sub
            self._arrivals.router = self._router
        except zmq.ZMQError as exc:
            self._close_sockets()
            self._release_data_dir()
            raise ConfigError(
                f"cannot bind on {', '.join(cfg.interfaces)}: {exc.strerror}; choose other "
                "ports (0 lets the OS pick) or another interface"
            ) from None
        for channel in (C.CHANNEL_CONTROL, *cfg.channels):
            self.subscribe(channel)
        if security is not None:
            # A client without keys is refused before ZAP hears of it: watch for it.
            self._net.watch_handshake(self._pub, None)
            self._net.watch_handshake(self._router, None)
        if cfg.data_dir is not None:
            try:
                self._inbox.open_journal(cfg.data_dir / "inbox.journal")
            except StorageError:
                self._close_sockets()
                self._release_data_dir()
                raise
        if self._sub is not None:
            self._sockets.watch(self._sub, self._arrivals.read_sub)
        self._sockets.watch(self._router, self._arrivals.read_router)
        self._sockets.watch(self._pub, self._read_xpub)
        # The first heartbeat is due now: arm for it before anything awaits (registering
        # with mDNS takes a second or more), or its lateness would look like a pause.
        self._wake_by(self._next_deadline())
        if cfg.discovery:
            from porter_mesh.adapters.discovery import Discovery

            self._discovery = Discovery(
                mesh=cfg.mesh, interfaces=cfg.interfaces,
                on_found=self._on_discovered, on_lost=self._on_discovery_lost,
            )
            announce = cfg.advertise and not cfg.observer
            await self._discovery.astart(self.advert() if announce else None)
        self._peering.start(time.monotonic())
        self._wake_by(self._next_deadline())
        log.info("node %s up: pub %d router %d incarnation %x%s", self.name, self.pub_port,
                 self.router_port, self.incarnation, " (CurveZMQ)" if security else "")

    def _load_security(self) -> MeshSecurity:
        cfg = self.config
        assert cfg.secret_key_file is not None
        for seed in cfg.seeds:
            if split_seed(seed)[0] is None:
                raise SecurityError(
                    f"seed {seed!r} has no agent name: a secured node must know whose key "
                    "to expect there; write it NAME@HOST:PORT with NAME trusted on the mesh"
                )
        return MeshSecurity.load(
            name=self.name, mesh=cfg.mesh, key_file=cfg.secret_key_file,
            trusted_dir=cfg.trusted_path,
            audit_path=cfg.data_dir / AUDIT_FILE if cfg.data_dir is not None else None,
            counters=self.counters, observer=cfg.observer,
        )

    def _answer_zap(self) -> None:
        authenticator = self._security.authenticator if self._security else None
        if authenticator is not None and authenticator.answer_pending():
            assert self._loop is not None
            self._loop.call_soon(self._answer_zap)

    @property
    def secured(self) -> bool:
        """True when this node runs CurveZMQ."""
        return self._security is not None

    @property
    def security(self) -> MeshSecurity | None:
        """The running node's keys, trusted directory and audit log (None if unsecured)."""
        return self._security

    async def aclose(self) -> None:
        """Leave gracefully: say goodbye, unregister from mDNS, fail pending sends,
        close every socket. Idempotent."""
        if self._closed or not self._started:
            self._closed = True
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._flush()
            self._publish_control(KIND_BYE, encode_bye())
        if self._timer is not None:
            self._timer.close()
        if self._discovery is not None:
            with contextlib.suppress(Exception):
                await self._discovery.aclose()
        self._carry_out(self._sending.close())
        self._close_sockets()
        self._inbox.close()
        self._release_data_dir()
        if self._halt_event is not None:
            self._halt_event.set()

    def _release_data_dir(self) -> None:
        if self._dir_lock is not None:
            self._dir_lock.release()
            self._dir_lock = None

    def _close_sockets(self) -> None:
        self._sockets.unwatch_all()  # before any socket closes: its descriptor goes with it
        self._net.close_all()
        if self._pub is not None:
            # Give queued broadcasts (the goodbye among them) a moment to leave.
            self._pub.close(linger=500)
            self._pub = None
        for other in (self._sub, self._router):
            if other is not None:
                other.close(linger=0)
        self._sub = self._router = None
        self._peering.shared_sub = self._arrivals.sub = self._arrivals.router = None
        if self._security is not None:
            # After the server sockets: none of them may outlive the authenticator.
            self._security.stop()
        self._sockets.term()

    # ------------------------------------------------------------------ adverts

    def advert(self) -> PeerAdvert:
        """This node's discovery record."""
        return PeerAdvert(
            name=self.name, role=self.config.role, mesh=self.config.mesh,
            pub_port=self.pub_port, router_port=self.router_port,
            version=C.PROTOCOL_VERSION, incarnation=self.incarnation,
            addresses=tuple(self.config.interfaces), slots=self.config.slots,
            tools=tuple(self.config.tools),
            public_key=self._security.identity.public_key if self._security else None,
            signing_key=self._security.identity.signing_key_z85 if self._security else None,
            carried_acks=True,
        )

    def _on_discovered(self, advert: PeerAdvert) -> None:
        if advert.name == self.name or self._closed:
            return
        self._peering.found(advert)
        self._rearm()  # a new link may resend what waited for it

    def _on_discovery_lost(self, name: str) -> None:
        # mDNS removal is only a hint; liveness is decided by heartbeats and goodbyes.
        log.debug("mDNS says %s is gone", name)

    def _refuse(self, event: str, peer: str | None, detail: str, *,
                key: str | None = None) -> None:
        """Drop something a secured node must not accept: count it and audit it."""
        self.count_drop(event, peer)
        if self._security is not None:
            self._security.audit.record(event, detail, peer=peer, key=key)

    def _reopen_pub(self) -> None:
        """A key left the trusted directory: cut every subscriber off this node's PUB.

        ZeroMQ's PUB has no way to drop one subscriber, and a connection authenticated
        before the key was removed would otherwise keep receiving every broadcast until it
        reconnects. So the XPUB is closed and a new one bound on the same port: honest
        subscribers reconnect through ZAP within their reconnect interval (what was
        published meanwhile is a sequence gap they count, and knowledge is repaired by
        anti-entropy, as for any loss), while the revoked key is refused.
        """
        old = self._pub
        if old is None or self._closed:
            return
        self._sockets.unwatch(old)
        self._net.end_handshake_watch(old)
        old.close(linger=0)
        self._subs.reset()
        sock = self._pub = self._sockets.new_pub()
        self.counters["security.pub-reopened"] += 1
        log.info("node %s: a key left the trusted directory; every subscriber of this "
                 "node's PUB was cut and must reconnect", self.name)
        # Until the bind succeeds broadcasts reach nobody (and are counted as gaps by
        # the subscribers, like any other loss).
        self._sockets.bind_again(sock, self.pub_port, wanted=lambda: sock is self._pub,
                                 bound=lambda: self._pub_bound(sock),
                                 failed=self._pub_unbound)

    def _pub_bound(self, sock: zmq.Socket[bytes]) -> None:
        if self._security is not None:
            self._net.watch_handshake(sock, None)
        self._sockets.watch(sock, self._read_xpub)

    def _pub_unbound(self, host: str, exc: zmq.ZMQError) -> None:
        self.counters["error.pub-rebind"] += 1
        log.error("node %s cannot bind its PUB socket again on %s:%d (%s): its broadcasts "
                  "reach nobody; restart the node", self.name, host, self.pub_port,
                  exc.strerror)

    # ------------------------------------------------------------------ handshakes

    def refusals(self) -> dict[str, PeerRefusedError]:
        """The peers that refused this node's connection for a reason keys explain, by
        name (or by seed, ``HOST:PORT``, when the seed gave no name), with the error a
        send to them raises. A peer leaves this map when a later handshake succeeds."""
        return self._peering.refusals()

    def introduced(self) -> frozenset[str]:
        """The linked peers whose hello or welcome has arrived on their current link: the
        peers they know are on this node's roster too. A command that broadcasts once
        waits for these (and their subscriptions) so that nobody a peer knows is missed
        because mDNS had not answered yet."""
        return self._peering.introduced_peers()

    # ------------------------------------------------------------------ subscribe

    def _sub_sockets(self) -> list[zmq.Socket[bytes]]:
        subs = [link.sub for link in self._links.values() if link.sub is not None]
        return subs if self._sub is None else [self._sub, *subs]

    def subscribe(self, channel: str) -> None:
        """Receive broadcasts on ``channel`` from now on (idempotent)."""
        self._subs.subscribe(channel)

    def unsubscribe(self, channel: str) -> None:
        """Stop receiving ``channel`` (``control`` cannot be dropped)."""
        self._subs.unsubscribe(channel)

    def observe_direct(self) -> None:
        """Also receive copies of direct messages delivered anywhere on the mesh
        (for observers such as ``porter-mesh tail``). On a secured mesh a copy is
        vouched for by the node that relays it, which checked the original sender."""
        self._subs.observe_direct()

    @property
    def channels(self) -> frozenset[str]:
        """Channels this node receives."""
        return self._subs.channels

    # ------------------------------------------------------------------ sending

    def _check_open(self) -> None:
        if self._closed or not self._started:
            raise NodeClosedError(
                f"node {self.name} is {'closed' if self._closed else 'not started'}; "
                "start it with astart() (or use it as a context manager)"
            )

    def _schedule_flush(self) -> None:
        if self._flush_handle is None:
            assert self._loop is not None
            self._flush_handle = self._loop.call_soon(self._flush)

    def async_publish(self, channel: str, activity: Activity, *,
                      trace: TraceContext | None = None) -> None:
        """Queue ``activity`` for broadcast on ``channel`` (loop thread only).

        Args:
            channel: the channel.
            activity: the activity.
            trace: W3C trace context for the envelope (a traced message travels alone).

        Raises:
            NodeClosedError: the node is not running.
            ConfigError: ``channel`` is a direct inbox (use ``send``).
        """
        if trace is not None:
            self._publish_traced(channel, activity, trace)
            return
        if self._sending.publish_more(channel, activity):
            # Checked when the queue began; it lives until the flush already scheduled
            # (closing flushes, so a closed node never has one).
            return
        self._check_open()
        if channel.startswith(C.DIRECT_PREFIX):
            raise ConfigError(f"{channel!r} is a direct inbox; use send() to reach one agent")
        self._sending.publish(channel, activity)
        self._schedule_flush()

    async def publish(self, channel: str, activity: Activity, *,
                      trace: TraceContext | None = None) -> None:
        """Broadcast ``activity`` on ``channel`` (best effort, ordered per sender)."""
        self.async_publish(channel, activity, trace=trace)

    def _publish_traced(self, channel: str, activity: Activity, trace: TraceContext) -> None:
        """Send a traced broadcast now, in its own message, after what is queued before
        it on the channel (so that the channel's order holds)."""
        self._check_open()
        if channel.startswith(C.DIRECT_PREFIX):
            raise ConfigError(f"{channel!r} is a direct inbox; use send() to reach one agent")
        self._carry_out(self._sending.publish_now(channel, activity, trace))

    def _direct_queue(
        self, recipient: str, timeout: float | None
    ) -> tuple[str, asyncio.Future[None], float]:
        """The agent name of ``recipient``, a new future and the deadline of a send."""
        self._check_open()
        if recipient.startswith(C.DIRECT_PREFIX):
            recipient = recipient[len(C.DIRECT_PREFIX):]
        refused = self._peering.refusal(recipient)
        if refused is not None:
            raise PeerRefusedError(str(refused), recipient=recipient, reason=refused.reason)
        if recipient not in self._links:
            known = ", ".join(sorted(self._links)) or "none yet"
            raise UnknownPeerError(
                f"no agent named {recipient!r} on mesh {self.config.mesh!r} (known: {known}); "
                "check the name, or wait for discovery with wait_for_peer()",
                recipient=recipient,
            )
        self._schedule_flush()
        assert self._loop is not None
        deadline = time.monotonic() + (timeout if timeout is not None
                                       else self.config.send_timeout)
        return recipient, self._loop.create_future(), deadline

    def async_send_nowait(
        self, recipient: str, activity: Activity, *, timeout: float | None = None,
        key: str | None = None, trace: TraceContext | None = None,
    ) -> asyncio.Future[None]:
        """Queue a direct message; the future completes when the recipient acknowledges.

        Args:
            recipient: agent name (or ``task:<name>``).
            timeout: seconds until the send fails (default ``send_timeout``).
            key: an idempotency key (see :meth:`send`).
            trace: W3C trace context for the envelope (a traced message travels alone).

        Raises:
            UnknownPeerError: the recipient is not on the mesh.
            ConfigError: ``key`` is empty or longer than 256 characters.
        """
        name, fut, deadline = self._direct_queue(recipient, timeout)
        if key is not None and not 0 < len(key) <= MAX_KEY_CHARS:
            raise ConfigError(f"an idempotency key must be 1-{MAX_KEY_CHARS} "
                              f"characters, got {len(key)}")
        self._sending.queue(name, activity, fut, deadline, key=key, trace=trace)
        return fut

    def async_send_many(
        self, recipient: str, activities: Iterable[Activity], *, timeout: float | None = None
    ) -> asyncio.Future[None]:
        """Queue a burst of direct messages with one future for all of them.

        Each activity is still its own message on the stream (sequenced, acknowledged,
        de-duplicated and delivered once); only the caller's bookkeeping is shared. The
        future completes when every one is acknowledged, and fails with the first
        failure.

        Raises:
            UnknownPeerError: the recipient is not on the mesh.
        """
        name, fut, deadline = self._direct_queue(recipient, timeout)
        items = list(activities)
        if not items:
            fut.set_result(None)
            return fut
        countdown = Countdown(fut, len(items))
        queue = self._sending.queue
        for activity in items:
            queue(name, activity, countdown, deadline)
        return fut

    async def send(self, recipient: str, activity: Activity, *,
                   timeout: float | None = None, key: str | None = None,
                   trace: TraceContext | None = None) -> None:
        """Deliver ``activity`` to one agent and wait for its acknowledgement.

        A :class:`DeliveryTimeout` means no acknowledgement came back in time, not that
        the message was lost: a paused receiver may still handle it when it resumes, and
        an acknowledgement can be lost on the way back. To retry safely, send with a
        ``key`` (an idempotency key, like NATS's ``Nats-Msg-Id``) and retry with the same
        key: the receiver acknowledges a message whose key it has seen from this sender
        within ``idempotency_window`` seconds (default 10 minutes; across its restarts
        too, with a data directory) and does not hand it to the application again.

        Raises:
            UnknownPeerError: no such agent.
            DeliveryTimeout: not acknowledged before the deadline.
            DeliveryError: too many messages to this agent are in flight.
        """
        await self.async_send_nowait(recipient, activity, timeout=timeout, key=key,
                                     trace=trace)

    async def send_to_channel(self, channel: str, activity: Activity, *,
                              timeout: float | None = None, key: str | None = None,
                              trace: TraceContext | None = None) -> None:
        """``task:<agent>`` goes direct (acknowledged); any other channel is broadcast."""
        if channel.startswith(C.DIRECT_PREFIX):
            await self.send(channel, activity, timeout=timeout, key=key, trace=trace)
        else:
            self.async_publish(channel, activity, trace=trace)

    def _flush(self) -> None:
        handle = self._flush_handle
        if handle is not None:
            # Run early (a read's after-batch work sends a handler's reply at once): the
            # queued run would find nothing to do.
            handle.cancel()
            self._flush_handle = None
        if self._closed and self._pub is None:
            return
        sending = self._sending
        if sending.broadcasts_queued or sending.direct_queued:
            self._carry_out(sending.flush(time.monotonic(), self._links))
        if self._acks:
            self._arrivals.flush_acks()
        self._rearm()

    def _envelope(self, channel: str, seq: int, count: int, *, recipient: str | None = None,
                  kind: str | None = None, ref: str | None = None,
                  msg_id: str | None = None, trace: TraceContext | None = None) -> Envelope:
        return Envelope(
            C.PROTOCOL_VERSION, msg_id or make_msg_id(self.incarnation, channel, seq),
            self.name, channel, seq, self.incarnation, self._clock.now(wall_ms()), recipient,
            ref, count, kind, *(trace or (None, None)),
        )

    def _carry_out(self, actions: Iterable[RosterAction | SendAction[Completion]]) -> None:
        """Carry out what the sending side and the roster ask, in order: frames onto
        sockets (a direct frame only over a link; once a DEALER refuses one, the
        recipient's later frames of the list wait for their resend so the stream stays
        in order), completions settled or failed, links opened and closed, the roster's
        changes told, counters."""
        blocked: set[str] | None = None
        published = False
        for action in actions:
            if isinstance(action, SendFrame):
                frame = action.frame
                if isinstance(frame, DirectFrame):
                    recipient = frame.recipient
                    link = self._links.get(recipient)
                    if link is None or (blocked is not None and recipient in blocked):
                        continue
                    env = self._envelope(C.DIRECT_PREFIX + recipient, frame.seq, frame.count,
                                         recipient=recipient, msg_id=frame.msg_id,
                                         trace=frame.trace)
                    frames = encode_direct(env, frame.payload)
                    carried = self._carry_acks(recipient, frames) if self._acks else None
                    if not self._send_frames(link.dealer, frames):
                        blocked = blocked or set()
                        blocked.add(recipient)
                        if carried is not None:
                            for seq in carried[1]:  # they go alone, with the flush
                                self._acks.add(carried[0], seq)
                elif isinstance(frame, BroadcastFrame) and self._pub is not None:
                    env = self._envelope(frame.channel, frame.seq, frame.count,
                                         kind=frame.kind, trace=frame.trace)
                    try:
                        send_frames(self._pub, encode_broadcast(env, frame.payload))
                    except zmq.Again:
                        self.counters["dropped.pub-hwm"] += frame.count
                    published = True
            elif isinstance(action, Settle):
                for done in action.tokens:
                    settle(done)
            elif isinstance(action, Fail):
                fail_all(action.tokens, send_error(
                    action, me=self.name, max_pending=self.config.max_pending,
                    refusal=self._peering.refusal(action.recipient)))
            elif isinstance(action, Count):
                self.counters[action.name] += action.n
            elif isinstance(action, PeerChanged):
                self._peering.changed(action.event)
            elif isinstance(action, Connect):
                self._peering.connect(action.advert)
            elif isinstance(action, Disconnect):
                self._peering.disconnect(action.name)
            elif isinstance(action, Reconnect):
                self._peering.disconnect(action.advert.name)
                self._peering.connect(action.advert)
            elif isinstance(action, Forget):
                self._receiving.forget(action.name)
            elif isinstance(action, Drop):
                self._drop(action.reason, action.peer, "%s", action.detail)
            else:
                self._refuse(action.event, action.peer, action.detail, key=action.key)
        if published and self._pub is not None:
            self._sockets.after_send(self._pub)

    def _carry_acks(self, recipient: str,
                    frames: list[bytes]) -> tuple[bytes, list[int]] | None:
        """Add to a direct message's ``frames`` the acknowledgements owed to its
        ``recipient``, if it reads them there (:mod:`porter_mesh.core.session.acks`).
        Returns what was taken, to give back if the message cannot be sent."""
        info = self._peers.get(recipient)
        if info is None or not info.advert.carried_acks:
            return None
        carried = self._acks.carry(recipient, info.incarnation)
        if carried is not None:
            frames.append(encode_ack(Ack(tuple(carried[1]), info.incarnation)))
        return carried

    def _send_frames(self, sock: zmq.Socket[bytes], frames: list[bytes]) -> bool:
        try:
            send_frames(sock, frames)
        except zmq.Again:
            self.counters["backpressure.dealer"] += 1
            return False
        finally:
            self._sockets.after_send(sock)
        return True

    def _send_control_direct(self, sock: zmq.Socket[bytes], kind: str,
                             payload: bytes, *, ident: bytes | None = None) -> None:
        env = self._envelope(C.CHANNEL_CONTROL, 0, 1, kind=kind)
        frames = encode_direct(env, payload)
        if ident is not None:
            frames = [ident, *frames]
        self._send_frames(sock, frames)

    def _publish_control(self, kind: str, payload: bytes) -> None:
        """Broadcast one control message on ``control``, next in its sequence."""
        if self._pub is None:
            return
        self._carry_out([self._sending.broadcast(C.CHANNEL_CONTROL, payload, kind=kind)])

    def async_control(self, kind: str, *, target: str | None = None,
                      body: dict[str, Any] | None = None) -> None:
        """Broadcast a control message (``drain``, ``halt``...) to ``target`` or everyone."""
        self._check_open()
        fields = dict(body or {})
        if target is not None:
            fields["to"] = target
        self._publish_control(kind, encode_control(fields))

    # ------------------------------------------------------------------ receiving

    def _read_xpub(self) -> None:
        """Read the (un)subscriptions that reach this node's PUB."""
        sock = self._pub
        if sock is None:
            return
        more = self._sockets.read(sock, recv_subscription, self._subs.on_subscription)
        self._subs.read_done()
        self._sockets.read_done(more, self._read_xpub)

    def subscribers(self, channel: str) -> frozenset[str]:
        """The names of the nodes whose subscription to ``channel`` reached this node's
        PUB: a broadcast on ``channel`` published now reaches them.

        Each node subscribes, after every channel's topic, to a second topic that names
        it and the channel and that nothing is ever published on; this node's XPUB reads
        those. A name is the subscriber's claim, not authenticated: it serves waiting and
        reporting, not access control.
        """
        return self._subs.subscribers(channel)

    def subscriber_count(self, channel: str) -> int:
        """How many subscriber sockets currently receive ``channel`` from this node."""
        return self._subs.count(channel)

    async def wait_for_subscribers(self, channel: str, count: int, timeout: float) -> None:
        """Wait until ``count`` subscribers receive ``channel`` from this node.

        Raises:
            TimeoutError: fewer subscribed within ``timeout`` seconds.
        """
        await self._subs.wait_for(channel, count, timeout)

    def _after_batch(self) -> None:
        # Direct messages queued by handlers during this read (replies, mostly) leave
        # now, with the acknowledgements: a request's answer should not wait a loop turn.
        # Otherwise the flush waits for the next turn, so that waiters run first and
        # acknowledgements of several reads share one message.
        if self._sending.direct_queued:
            self._flush()  # which re-arms the timer
            return
        if self._acks or self._sending.broadcasts_queued:
            self._schedule_flush()
        self._rearm()

    def redeliver(self) -> None:
        """Offer the messages handlers declined (:class:`~porter_mesh.errors.NotHandled`)
        to the handlers again now, instead of at their next backoff (loop thread only).

        Call it when whatever made a handler decline is ready again (a gateway's far
        side came back). Adding a handler does the same.
        """
        self._inbox.redeliver()

    # ------------------------------------------------------------------ extension kinds

    def register_kind(self, kind: str, handler: KindHandler) -> None:
        """Route the mesh's own messages of ``kind`` (e.g. knowledge sync) to ``handler``.

        The handler gets the envelope, the raw payload (it decodes and validates it) and
        a ``reply(kind, payload)`` function that answers the sender directly. It runs on
        the loop thread and must not block.
        """
        if kind in NODE_KINDS:
            raise ConfigError(f"kind {kind!r} is the node's own")
        self._arrivals.kind_handlers[kind] = handler

    def unregister_kind(self, kind: str) -> None:
        """Stop routing ``kind`` (idempotent): its handler and its ``unsupported``
        handler (:meth:`register_unsupported`) go. From then on this node answers a
        request of ``kind`` with ``unsupported``, as a node that never ran that
        protocol does, so that the asker turns elsewhere (a knowledge replica closed
        while its node runs on).

        Raises:
            ConfigError: ``kind`` is one of the node's own.
        """
        if kind in NODE_KINDS:
            raise ConfigError(f"kind {kind!r} is the node's own")
        self._arrivals.kind_handlers.pop(kind, None)
        self._arrivals.unsupported_handlers.pop(kind, None)

    def register_unsupported(self, kind: str, handler: KindHandler) -> None:
        """Route the ``unsupported`` answers to this node's requests of ``kind`` to
        ``handler`` (same arguments as for :meth:`register_kind`; the payload is
        ``{"k": kind}``). Each protocol on top (knowledge sync, ``stats``) learns this
        way which peers do not run it, without taking the answers meant for another.
        """
        self._arrivals.unsupported_handlers[kind] = handler

    def async_send_kind(self, peer: str, kind: str, payload: bytes) -> None:
        """Send a message of a registered ``kind`` to one peer (unacknowledged; the
        protocol on top retries as it needs).

        Raises:
            UnknownPeerError: ``peer`` is not connected.
        """
        self._check_open()
        if peer not in self._links:
            raise UnknownPeerError(f"no connected peer {peer!r}", recipient=peer)
        self._arrivals.send_kind(peer, kind, payload)

    def async_publish_kind(self, kind: str, payload: bytes) -> None:
        """Broadcast a message of a registered ``kind`` on ``control``."""
        self._check_open()
        self._publish_control(kind, payload)

    # ------------------------------------------------------------------ timers

    def _next_deadline(self) -> float:
        """The earliest monotonic time at which something waits on the clock: the next
        heartbeat (which also checks peer silence, the trusted directory and unread
        messages), a resend or a send's deadline, a re-contact attempt, the next offer
        of a declined message."""
        due = min(self._beat_due, self._sending.next_due, self._peering.next_due)
        return min(due, self._inbox.next_due)

    def _rearm(self) -> None:
        """Move the node's one timer earlier if a read or a flush brought an earlier
        deadline: a first send's resend, a re-contact started by a lost peer.

        Called after every read batch and flush, so it looks only at what those can
        move (the heartbeat's time changes only when the timer runs, and a declined
        message's offer arms the timer where it is scheduled). A deadline that went away
        (a settled send) leaves the timer where it is: that wake-up finds nothing due
        and arms for what remains (:meth:`_next_deadline`), which costs less than moving
        the timer on every acknowledgement.
        """
        timer = self._timer
        if timer is None:
            return
        due = self._sending.next_due
        recontact = self._peering.next_due
        if recontact < due:
            due = recontact
        if due < timer.at:
            timer.wake_by(due)

    def _wake_by(self, due: float) -> None:
        """Make the timer fire no later than ``due`` (monotonic seconds)."""
        if self._timer is not None:
            self._timer.wake_by(due)

    def _on_timer(self, now: float) -> None:
        """The timer fired: do whatever is due, then arm it for the next deadline."""
        assert self._timer is not None
        late = self._timer.late
        try:
            if late > max(_PAUSE_MIN,
                          self.config.evasive_after - self.config.heartbeat_interval):
                # This process was stopped (SIGSTOP, a debugger, a suspended VM): nobody
                # could be heard meanwhile. Forgive that silence and re-introduce ourselves
                # to everyone. The stop began at most one timer interval before the timer
                # was due, so the lateness is the pause within a heartbeat.
                log.warning("node %s was paused for %.1fs; re-announcing", self.name, late)
                self._peers.shift_clock(late)
                self._peering.hello_again()
            self._tick(now)
            self._inbox.offer_due(now)
        except Exception:
            log.exception("node timer failed")
        # Always armed again: reads and flushes only move it for sends and re-contacts.
        self._wake_by(self._next_deadline())

    def _tick(self, now: float) -> None:
        force_beat = now >= self._beat_due
        if force_beat:
            self._beat_due = now + self.config.heartbeat_interval
        self._carry_out(self._sending.timer(now, self._links))
        if force_beat and not self.config.observer:
            self._publish_control(KIND_HEARTBEAT, encode_heartbeat(Heartbeat(
                self._sending.broadcast_positions(), self.draining)))
        if force_beat and self._security is not None:
            # The ZAP callback may have re-read the directory already: compare generations.
            store = self._security.store
            store.refresh_if_changed(now)
            if store.generation != self._trust_generation:
                self._trust_generation = store.generation
                self._peering.revalidate()
            if store.removals != self._trust_removals:
                self._trust_removals = store.removals
                self._reopen_pub()
        if force_beat:
            self._carry_out(self._roster.tick(now))
            if self.config.unread_warning:
                self._inbox.check_unread(now)
        if now >= self._peering.next_due:
            self._peering.run_recontacts(now)

    # ------------------------------------------------------------------ application

    def add_handler(self, handler: Callable[[Message], None]) -> Callable[[], None]:
        """Call ``handler`` for every delivered message (on the loop thread, in order).

        On a node without an inbox (``inbox_size=0``) the handlers are the application:
        a direct message is taken (see :meth:`ack`) when every handler has returned for
        it, and until the first handler is added no direct message is acknowledged, so
        none is lost to an application still starting. Pass handlers to the constructor
        (or add them before :meth:`astart`) to see, on a node with an inbox, the
        messages a restart delivers again; without an inbox they wait for the first
        handler.

        A handler that cannot act on a message yet raises
        :class:`~porter_mesh.errors.NotHandled`: the message is not taken. It stays
        owed (in the journal, or unacknowledged without a data directory, so that the
        sender retries), it does not reach the inbox or the later handlers, and it is
        offered again, to the handlers that have not returned for it, after a capped
        backoff (``redeliver_initial`` .. ``redeliver_max``), at once when a handler is
        added or :meth:`redeliver` is called. Later messages of the same sender wait
        behind it, so order per sender holds. Any other exception is logged and counts
        as returning (the message is taken).

        Returns a function that removes the handler.
        """
        return self._inbox.add_handler(handler)

    def add_batch_handler(self, handler: Callable[[list[Message]], None]) -> Callable[[], None]:
        """Call ``handler`` with the messages of each ZeroMQ message as one list.

        The same messages, order and thread as :meth:`add_handler`, one call per batch:
        the cheaper choice for an application that counts, filters or forwards many
        messages. The list is the handler's to keep. A batch handler that raises
        :class:`~porter_mesh.errors.NotHandled` declines the whole batch (as
        :meth:`add_handler` says). Returns a function that removes it.
        """
        return self._inbox.add_batch_handler(handler)

    def add_peer_listener(self, listener: Callable[[PeerEvent], None]) -> Callable[[], None]:
        """Call ``listener`` on every roster change (joined, evasive, alive, left)."""
        listeners = self._peering.listeners
        listeners.append(listener)
        return lambda: listeners.remove(listener)

    def add_control_listener(
        self, listener: Callable[[str, str, dict[str, Any]], None]
    ) -> Callable[[], None]:
        """Call ``listener(kind, sender, body)`` for control messages addressed to us."""
        self._control_listeners.append(listener)
        return lambda: self._control_listeners.remove(listener)

    def _on_app_control(self, kind: str, sender: str, body: dict[str, Any]) -> None:
        """``drain``, ``halt`` or a kind of the application's, addressed to this node:
        its listeners decide."""
        if kind == KIND_DRAIN:
            self.draining = True
        for listener in list(self._control_listeners):
            try:
                listener(kind, sender, body)
            except Exception:
                log.exception("control listener failed")
        if kind == KIND_HALT and self._halt_event is not None:
            self._halt_event.set()

    def drain(self, *, limit: int | None = None, ack: bool = True) -> list[Message]:
        """Take up to ``limit`` messages from the inbox without waiting.

        With ``ack`` (the default), the messages handed out by earlier calls of
        :meth:`drain` and :meth:`receive` are taken first (see :meth:`ack`).
        """
        return self._inbox.drain(limit=limit, ack=ack)

    async def receive(self, timeout: float | None = None, *, ack: bool = True) -> Message:
        """The next message from the inbox, waiting up to ``timeout`` seconds.

        With ``ack`` (the default), the messages handed out by earlier calls of
        :meth:`receive` and :meth:`drain` are taken first (see :meth:`ack`).

        Raises:
            TimeoutError: nothing arrived in time.
            NodeClosedError: the node closed while waiting.
        """
        return await self._inbox.receive(timeout, ack=ack)

    def ack(self, message: Message | None = None) -> None:
        """Say that the application has taken messages from the inbox.

        A direct message on a node with a data directory stays owed until it is taken:
        if the process ends before that (``kill -9`` included), the next node started on
        the same data directory delivers it again (``redelivered`` set), before anything
        new. ``ack(message)`` takes ``message`` and every message handed out before it;
        ``ack()`` takes everything :meth:`receive` and :meth:`drain` have handed out.
        Both calls also take the earlier ones by default, so an application that handles
        each message before asking for the next needs no ``ack`` at all; one that keeps
        messages to handle later passes ``ack=False`` and calls this when it is done.
        Handlers need none of this (see :meth:`add_handler`). Without a data directory
        it does nothing.
        """
        self._inbox.ack(message)

    async def wait_readable(self) -> None:
        """Wait until the inbox holds at least one message (or the node closes)."""
        await self._inbox.wait_readable()

    def peers(self) -> list[PeerInfo]:
        """A snapshot of the roster."""
        return self._peers.snapshot()

    def peer(self, name: str) -> PeerInfo | None:
        """The roster entry of ``name``, if any."""
        info = self._peers.get(name)
        return info.copy() if info is not None else None

    async def wait_for_peers(self, names: Iterable[str] | int, timeout: float) -> list[PeerInfo]:
        """Wait until every named agent (or this many agents) is on the roster.

        Raises:
            TimeoutError: not all arrived within ``timeout`` seconds (the message says who).
        """
        deadline = time.monotonic() + timeout
        want = set() if isinstance(names, int) else set(names)
        count = names if isinstance(names, int) else len(want)
        while True:
            have = {p.name for p in self._peers if p.name in self._links}
            if (want and want <= have) or (not want and len(have) >= count):
                return self.peers()
            if time.monotonic() >= deadline:
                missing = (", ".join(sorted(want - have)) if want
                           else f"{count - len(have)} more")
                raise TimeoutError(f"node {self.name}: peers not found within {timeout}s: "
                                   f"{missing} (connected: {', '.join(sorted(have)) or 'none'})")
            await asyncio.sleep(0.02)

    async def wait_halted(self) -> None:
        """Wait until a ``halt`` control message arrives or the node closes."""
        assert self._halt_event is not None, "node not started"
        await self._halt_event.wait()

    async def wait_for_stats(self, predicate: Callable[[dict[str, int]], bool],
                             timeout: float) -> dict[str, int]:
        """Wait until ``predicate(stats())`` holds; returns those stats.

        Raises:
            TimeoutError: it did not hold within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            stats = self.stats()
            if predicate(stats):
                return stats
            if time.monotonic() >= deadline:
                raise TimeoutError(f"node {self.name}: condition on stats not met within "
                                   f"{timeout}s; stats {stats}")
            await asyncio.sleep(0.01)

    def stats(self) -> dict[str, int]:
        """Counters: sent, received, dropped (by reason), lost, duplicates, retries..."""
        out = dict(self.counters)
        out["inbox"] = len(self._inbox)
        out["outbox"] = len(self._sending.outbox)
        out["retries"] = self._sending.outbox.resent
        out["peers"] = len(self._peers)
        if self._inbox.storage_error is not None:
            out["storage.full"] = 1
        if self._inbox.unread_warned:
            out["inbox.unread"] = 1
        return out

    def storage(self) -> dict[str, Any] | None:
        """The delivery journal's state, or None without a data directory.

        Returns:
            ``state`` (``ok``, or ``full`` while the journal cannot be written and
            direct messages are refused), ``path``, ``free_bytes`` (when full: the space
            left at the last failure), ``refused`` (direct messages refused for it so
            far), ``size`` (the journal's bytes).
        """
        return self._inbox.storage()

    # ------------------------------------------------------------------ the node's view

    def view(self) -> dict[str, Any]:
        """This node's own view of the mesh, as ``porter-mesh stats`` shows it.

        Returns:
            Plain values: ``name``, ``role``, ``mesh``, ``version``, ``protocol``,
            ``incarnation`` (hex), ``uptime`` (seconds), ``draining``; ``peers`` (one map
            per roster entry: ``name``, ``role``, ``state``, ``draining``, ``last_heard``
            (seconds ago), ``lost``, ``dropped``); ``lost`` and ``dropped`` in total;
            ``queues`` (``inbox``, ``outbox``, ``subscribers``); ``counters``;
            ``storage`` (:meth:`storage`, with a data directory); plus the sections of
            :attr:`view_sections` (``knowledge``, when a replica runs).
        """
        from porter_mesh.node.views import node_view

        return node_view(self)

    @property
    def uptime(self) -> float:
        """Seconds since the node started (or was made)."""
        return time.monotonic() - self._started_at

    def count_drop(self, reason: str, peer: str | None) -> None:
        """Count one message from ``peer`` (None: unknown) dropped for ``reason``
        (protocols on top of the node, such as knowledge sync, count their refusals
        here)."""
        self.counters["dropped." + reason] += 1
        if peer is not None:
            count_for(self.dropped_by, peer)

    def _on_stats_request(self, env: Envelope, payload: bytes, reply: Reply) -> None:
        """Answer ``stats`` with :meth:`view` (any sender may ask, as for a ping)."""
        reply(KIND_STATS_REPLY, encode_stats_reply(StatsReply(self.view())))

    def endpoints(self) -> dict[str, str]:
        """``{"pub": ..., "router": ...}`` endpoints on the first interface."""
        addr = url_host(self.config.interfaces[0])
        return {"pub": f"tcp://{addr}:{self.pub_port}", "router": f"tcp://{addr}:{self.router_port}"}

