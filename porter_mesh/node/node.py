"""The asyncio mesh node every agent process embeds: the driver of the mesh's rules.

Theory of operation
-------------------
The protocol's rules are pure and live in :mod:`porter_mesh.core.session`: sending
(queues, batching, numbering, the outbox), the roster (adverts, peer states, what each
change asks) and receiving (authenticity, sequencing, de-duplication, idempotency keys,
inbox admission). Each takes an explicit time and returns actions. :class:`Node` makes
the parts that carry those actions out, runs them on one event loop, and owns the
lifecycle and the clock:

* :mod:`~porter_mesh.node.api`: what an application calls (sending, receiving, channels,
  peers, extension kinds, counters), each call the front of one part below;
* :mod:`~porter_mesh.node.outgoing`: every action of the rules carried out, in order:
  frames onto sockets (acknowledgements riding on direct messages), completions
  settled or failed, links opened and closed, roster changes told;
* :mod:`~porter_mesh.node.arrivals`: every message read, decoded, checked and handed to
  the rule it is for (journal, deliver, acknowledge, in that order);
* :mod:`~porter_mesh.node.inbox`: what the application is owed: handlers, the inbox,
  declined messages, the delivery journal and its replay after a restart;
* :mod:`~porter_mesh.node.peering`: adverts, hellos, re-contact of seeds and lost peers,
  refusals, revoked keys;
* :mod:`~porter_mesh.node.endpoints`: this node's PUB, ROUTER and shared SUB, and on a
  secured node (CurveZMQ) the keys, ZAP and the trusted directory's watch;
* :mod:`~porter_mesh.node.links` (the sockets, the one read loop, the links to peers)
  and :mod:`~porter_mesh.node.subscriptions` (the channels received, and who receives
  this node's).

Sending is batched under load: a publish or a send only queues; one flush per loop turn
(:meth:`Node._flush`) packs what accumulated into messages of up to ``batch_max``
direct activities or ``broadcast_batch_max`` broadcast ones, so a lone message goes out
on the next turn and a burst in a few large messages. A read's after-batch work flushes
at once when a handler queued a direct message (a request's reply does not wait a turn),
so its acknowledgement rides on it.

Timers. Nothing polls: the node has one timer (:class:`~porter_mesh.node.timer.DeadlineTimer`)
armed at the earliest deadline of all that waits on the clock (the next heartbeat, which
also checks peer silence, the trusted directory and unread messages; the outbox's next
resend or send deadline; the next re-contact attempt; the next offer of a declined
message), and moved earlier whenever a read, a flush or a discovery adds an earlier one.
Heartbeats go out on the wall clock's grid of ``heartbeat_interval``
(:func:`~porter_mesh.node.timer.next_on_grid`), shared by every node whose clock is set:
a node's peers beat at about the same moment, so it reads their heartbeats in a few
wake-ups instead of one per peer, which is most of what an idle mesh costs. Silence is
judged half an interval after each beat, when this round's heartbeats have had time to
arrive (judged at the beat itself, a peer's heartbeat of the same moment would not yet
be read). An idle node wakes twice a heartbeat. A wake-up far later than asked means this process
was stopped (SIGSTOP, a suspended VM): the peers' silence over that time is forgiven and
the node says hello to everyone again.

Clocks. The hybrid timestamp of every broadcast, direct message and acknowledgement is
merged into this node's clock within ``max_clock_skew`` (:mod:`porter_mesh.core.hlc`); a
peer beyond it is still heard and its messages handled, but its time is not adopted and
its roster state is CLOCK_SKEW (one WARNING per peer). Nothing is dropped for its clock.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import secrets
import time
from collections.abc import Callable, Iterable
from typing import Any

from porter_mesh.adapters.dirlock import DirLock
from porter_mesh.adapters.security import MeshSecurity, check_libzmq
from porter_mesh.core import constants as C
from porter_mesh.core.advert import PeerAdvert
from porter_mesh.core.control import (
    KIND_BYE,
    KIND_DRAIN,
    KIND_HALT,
    KIND_HEARTBEAT,
    KIND_STATS,
    KIND_STATS_REPLY,
    Heartbeat,
    StatsReply,
    encode_bye,
    encode_heartbeat,
    encode_stats_reply,
)
from porter_mesh.core.envelope import Envelope
from porter_mesh.core.hlc import HybridClock
from porter_mesh.core.session.acks import PendingAcks
from porter_mesh.core.session.receiving import Receiving
from porter_mesh.core.session.roster import Roster
from porter_mesh.core.session.sending import Sender
from porter_mesh.errors import ConfigError, StorageError
from porter_mesh.node.api import NodeAPI
from porter_mesh.node.arrivals import Arrivals, KindHandler, OnceLog, Reply
from porter_mesh.node.completions import Completion
from porter_mesh.node.config import NodeConfig
from porter_mesh.node.endpoints import Endpoints, load_security
from porter_mesh.node.inbox import Inbox, Message
from porter_mesh.node.links import Links, Sockets
from porter_mesh.node.outgoing import Outgoing
from porter_mesh.node.peering import Peering
from porter_mesh.node.subscriptions import Subscriptions
from porter_mesh.node.timer import DeadlineTimer, next_on_grid

__all__ = ["KindHandler", "Message", "Node", "Reply"]

log = logging.getLogger("porter_mesh.node")

#: A wake-up this much later than its timer asked for means the process was stopped
#: (SIGSTOP, a debugger, a suspended VM) rather than busy, at the least (see _on_timer).
_PAUSE_MIN = 1.0


#: The lock file that keeps a data directory to one node process.
DATA_DIR_LOCK = "node.lock"


class Node(NodeAPI):
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
        self.counters = collections.Counter()
        self.lost_by = collections.Counter()
        self.dropped_by = collections.Counter()
        self._drop = OnceLog(self.count_drop)
        self.view_sections = {}
        self._dir_lock: DirLock | None = None
        self._started_at = time.monotonic()
        self._started = False
        self._closed = False
        self.draining = False
        # The sending rules (queues, batching, numbering, the outbox): pure; the node
        # carries out what they return (_carry_out).
        self._sending = Sender(
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
        self._control_listeners = []
        # The sockets, how they are made and watched, and the one read loop.
        self._sockets = Sockets(config, self.counters, after_batch=self._after_batch,
                                closed=lambda: self._closed)
        self._net = Links(self._sockets, routing_id=f"{self.name}/{self.incarnation:x}",
                          read_sub=lambda sock, peer: self._arrivals.read_sub(sock, peer),
                          read_dealer=lambda *where: self._arrivals.read_dealer(*where),
                          on_handshake=lambda sock: self._peering.on_handshake(sock))
        self._links = self._net.links
        # The channels this node receives, and the subscriptions that reached its PUB.
        self._subs = Subscriptions(self.name, lambda: self._ends.sub_sockets())
        # This node's PUB, ROUTER and shared SUB, and the keys that guard them.
        self._ends = Endpoints(config, self.counters, sockets=self._sockets, net=self._net,
                               subs=self._subs,
                               revalidate=lambda: self._peering.revalidate(),
                               closed=lambda: self._closed)
        # Every action of the rules carried out onto the sockets, in order.
        self._out = Outgoing(
            self.name, self.incarnation, max_pending=config.max_pending,
            counters=self.counters, clock=self._clock, sending=self._sending,
            receiving=self._receiving, peers=self._peers, sockets=self._sockets,
            links=self._links, acks=self._acks, ends=self._ends,
            peering=lambda: self._peering, drop=self._drop, refuse=self._refuse)
        self._carry_out = self._out.carry_out
        # What the application is owed: handlers, the inbox, declined messages, the
        # delivery journal and its replay.
        self._inbox = Inbox(config, self.counters, receiving=self._receiving,
                            drop=self._drop, refuse=self._refuse, queue_ack=self._acks.add,
                            wake_by=self._wake_by, after_batch=self._after_batch,
                            closed=lambda: self._closed, handlers=handlers,
                            batch_handlers=batch_handlers)
        # The flush queued for the next loop turn, if any (a flush run earlier cancels it).
        self._flush_handle: asyncio.Handle | None = None
        self._loop = None
        # Reaching peers: adverts, hellos, re-contact, refusals, revoked keys.
        self._peering = Peering(
            config, self.counters, roster=self._roster, sending=self._sending,
            net=self._net, ends=self._ends, carry_out=self._carry_out,
            send_control=self._out.send_control,
            advert=self.advert, topics=self._subs.topics, drop=self._drop, refuse=self._refuse,
            closed=lambda: self._closed)
        # Reading the mesh: every arrival checked and handed to the rule it is for.
        self._arrivals = Arrivals(
            config, self.counters, lost_by=self.lost_by, sockets=self._sockets,
            links=self._links, acks=self._acks, clock=self._clock, roster=self._roster,
            receiving=self._receiving, sending=self._sending, inbox=self._inbox,
            peering=self._peering, subs=self._subs, carry_out=self._carry_out,
            envelope=self._out.envelope, send_frames=self._out.send_frames,
            send_control=self._out.send_control, ends=self._ends,
            drop=self._drop, refuse=self._refuse, app_control=self._on_app_control,
            incarnation=self.incarnation)
        self._arrivals.kind_handlers[KIND_STATS] = self._on_stats_request
        self._discovery: Any = None
        # The one timer of the node, armed at the earliest deadline of everything that
        # waits on time (see _rearm), and when it is due (monotonic; inf: not armed).
        self._timer: DeadlineTimer | None = None
        self._beat_due = 0.0
        self._check_due = math.inf  # the silence check, half a beat after each beat
        self._halt_event = None

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
        security = load_security(cfg, self.counters) if cfg.secured else None
        if cfg.data_dir is not None:
            # Refused here, before any socket is bound, when another node runs on it.
            self._dir_lock = DirLock(cfg.data_dir, filename=DATA_DIR_LOCK)
        if cfg.discovery:
            # zeroconf's import is CPU work: done before the first heartbeat's timer is
            # armed, or on a busy machine its lateness would look like a pause.
            from porter_mesh.adapters.discovery import Discovery
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
        self._sockets.open(self._loop)
        try:
            self._ends.open(security)
        except ConfigError:
            self._release_data_dir()
            raise
        if security is not None:
            self._inbox.bind_actors = True
            self._peering.security = self._arrivals.security = security
        for channel in (C.CHANNEL_CONTROL, *cfg.channels):
            self.subscribe(channel)
        if cfg.data_dir is not None:
            try:
                self._inbox.open_journal(cfg.data_dir / "inbox.journal")
            except StorageError:
                self._ends.close()
                self._release_data_dir()
                raise
        self._ends.watch(self._arrivals.read_sub, self._arrivals.read_router)
        # The first heartbeat is due now: arm for it before anything awaits (registering
        # with mDNS takes a second or more), or its lateness would look like a pause.
        self._wake_by(self._next_deadline())
        if cfg.discovery:
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

    @property
    def pub_port(self) -> int:
        """The port this node's PUB is bound at (0 before start)."""
        return self._ends.pub_port

    @property
    def router_port(self) -> int:
        """The port this node's ROUTER is bound at (0 before start)."""
        return self._ends.router_port

    @property
    def secured(self) -> bool:
        """True when this node runs CurveZMQ."""
        return self._ends.security is not None

    @property
    def security(self) -> MeshSecurity | None:
        """The running node's keys, trusted directory and audit log (None if unsecured)."""
        return self._ends.security

    async def aclose(self) -> None:
        """Leave gracefully: say goodbye, unregister from mDNS, fail pending sends,
        close every socket. Idempotent."""
        if self._closed or not self._started:
            self._closed = True
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._flush()
            self._out.publish_control(KIND_BYE, encode_bye())
        if self._timer is not None:
            self._timer.close()
        if self._discovery is not None:
            with contextlib.suppress(Exception):
                await self._discovery.aclose()
        self._carry_out(self._sending.close())
        self._ends.close()
        self._inbox.close()
        self._release_data_dir()
        if self._halt_event is not None:
            self._halt_event.set()

    def _release_data_dir(self) -> None:
        if self._dir_lock is not None:
            self._dir_lock.release()
            self._dir_lock = None

    # ------------------------------------------------------------------ adverts

    def advert(self) -> PeerAdvert:
        """This node's discovery record."""
        security = self._ends.security
        return PeerAdvert(
            name=self.name, role=self.config.role, mesh=self.config.mesh,
            pub_port=self.pub_port, router_port=self.router_port,
            version=C.PROTOCOL_VERSION, incarnation=self.incarnation,
            addresses=tuple(self.config.interfaces), slots=self.config.slots,
            tools=tuple(self.config.tools),
            public_key=security.identity.public_key if security else None,
            signing_key=security.identity.signing_key_z85 if security else None,
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
        if self._ends.security is not None:
            self._ends.security.audit.record(event, detail, peer=peer, key=key)

    # ------------------------------------------------------------------ sending

    def _schedule_flush(self) -> None:
        if self._flush_handle is None:
            assert self._loop is not None
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        handle = self._flush_handle
        if handle is not None:
            # Run early (a read's after-batch work sends a handler's reply at once): the
            # queued run would find nothing to do.
            handle.cancel()
            self._flush_handle = None
        if self._closed and self._ends.pub is None:
            return
        sending = self._sending
        if sending.broadcasts_queued or sending.direct_queued:
            self._carry_out(sending.flush(time.monotonic(), self._links))
        if self._acks:
            self._arrivals.flush_acks()
        self._rearm()

    # ------------------------------------------------------------------ receiving

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

    # ------------------------------------------------------------------ timers

    def _next_deadline(self) -> float:
        """The earliest monotonic time at which something waits on the clock: the next
        heartbeat (which also checks peer silence, the trusted directory and unread
        messages), a resend or a send's deadline, a re-contact attempt, the next offer
        of a declined message."""
        due = min(self._beat_due, self._check_due, self._sending.next_due,
                  self._peering.next_due)
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
        interval = self.config.heartbeat_interval
        beat = now >= self._beat_due
        if beat:
            self._beat_due = next_on_grid(now, interval, time.time())
            self._check_due = min(self._check_due, now + interval / 2)
        self._carry_out(self._sending.timer(now, self._links))
        if beat and not self.config.observer:
            self._out.publish_control(KIND_HEARTBEAT, encode_heartbeat(Heartbeat(
                self._sending.broadcast_positions(), self.draining)))
        if now >= self._check_due:
            self._check_due = math.inf  # set again by the next beat
            self._ends.check_trust(now)
            self._carry_out(self._roster.tick(now))
            if self.config.unread_warning:
                self._inbox.check_unread(now)
        if now >= self._peering.next_due:
            self._peering.run_recontacts(now)

    # ------------------------------------------------------------------ application

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

    def _on_stats_request(self, env: Envelope, payload: bytes, reply: Reply) -> None:
        """Answer ``stats`` with :meth:`view` (any sender may ask, as for a ping)."""
        reply(KIND_STATS_REPLY, encode_stats_reply(StatsReply(self.view())))
