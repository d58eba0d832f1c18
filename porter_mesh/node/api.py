"""What an application calls on a node: the public API of
:class:`~porter_mesh.node.node.Node`, apart from starting and closing it.

Theory of operation
-------------------
Each call here is the front of one part of the node, and says in its docstring what
that part promises: sending queues into the pure sending rules
(:mod:`porter_mesh.core.session.sending`) and one flush per loop turn carries them out
(:mod:`porter_mesh.node.outgoing`); receiving is the inbox and its handlers
(:mod:`porter_mesh.node.inbox`); channels and their subscribers are
:mod:`porter_mesh.node.subscriptions`; the roster, hellos and refusals are
:mod:`porter_mesh.node.peering`; the mesh's extension kinds (knowledge sync,
``stats``) are routed by :mod:`porter_mesh.node.arrivals`. :class:`NodeAPI` holds no
state of its own: :class:`~porter_mesh.node.node.Node`, the driver, makes the parts and
runs them (the lifecycle, the flush, the one timer).

Methods prefixed ``async_`` are plain functions that must be called from the node's
event loop; coroutine methods are awaited on it.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Iterable
from typing import Any

from porter_mesh.core import constants as C
from porter_mesh.core.as2 import Activity
from porter_mesh.core.control import NODE_KINDS, encode_control
from porter_mesh.core.peers import PeerEvent, PeerInfo, PeerTable
from porter_mesh.core.session.keys import MAX_KEY_CHARS
from porter_mesh.core.session.roster import RosterAction
from porter_mesh.core.session.sending import SendAction, Sender
from porter_mesh.core.tracecontext import TraceContext
from porter_mesh.errors import (
    ConfigError,
    NodeClosedError,
    PeerRefusedError,
    UnknownPeerError,
)
from porter_mesh.node.arrivals import Arrivals, KindHandler, count_for
from porter_mesh.node.completions import Completion, Countdown
from porter_mesh.node.config import NodeConfig
from porter_mesh.node.endpoints import Endpoints
from porter_mesh.node.inbox import Inbox, Message
from porter_mesh.node.links import PeerLink
from porter_mesh.node.outgoing import Outgoing
from porter_mesh.node.peering import Peering
from porter_mesh.node.subscriptions import Subscriptions

__all__ = ["NodeAPI"]


class NodeAPI:
    """The public API of a node (see the module docstring); :class:`Node` runs it."""

    # The node's identity and counters, and the parts each call fronts (made by Node).
    config: NodeConfig
    name: str
    incarnation: int
    #: Whether a ``drain`` control message asked this node to take no new work.
    draining: bool
    counters: collections.Counter[str]
    #: Broadcasts lost (sequence gaps) and messages dropped, per sending peer.
    lost_by: collections.Counter[str]
    dropped_by: collections.Counter[str]
    #: Extra sections of :meth:`view` (the knowledge replica adds ``knowledge``).
    view_sections: dict[str, Callable[[], dict[str, Any]]]
    _sending: Sender[Completion]
    _peers: PeerTable
    _links: dict[str, PeerLink]
    _inbox: Inbox
    _subs: Subscriptions
    _peering: Peering[Completion]
    _arrivals: Arrivals[Completion]
    _out: Outgoing
    _ends: Endpoints
    _control_listeners: list[Callable[[str, str, dict[str, Any]], None]]
    _loop: asyncio.AbstractEventLoop | None
    _halt_event: asyncio.Event | None
    _started: bool
    _closed: bool
    _started_at: float
    # The driver's: run what the rules return now; flush on the next loop turn.
    _carry_out: Callable[[Iterable[RosterAction | SendAction[Completion]]], None]
    _schedule_flush: Callable[[], None]

    # ------------------------------------------------------------------ sending

    def _check_open(self) -> None:
        if self._closed or not self._started:
            raise NodeClosedError(
                f"node {self.name} is {'closed' if self._closed else 'not started'}; "
                "start it with astart() (or use it as a context manager)"
            )

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

    def async_control(self, kind: str, *, target: str | None = None,
                      body: dict[str, Any] | None = None) -> None:
        """Broadcast a control message (``drain``, ``halt``...) to ``target`` or everyone."""
        self._check_open()
        fields = dict(body or {})
        if target is not None:
            fields["to"] = target
        self._out.publish_control(kind, encode_control(fields))

    # ------------------------------------------------------------------ receiving

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

    def redeliver(self) -> None:
        """Offer the messages handlers declined (:class:`~porter_mesh.errors.NotHandled`)
        to the handlers again now, instead of at their next backoff (loop thread only).

        Call it when whatever made a handler decline is ready again (a gateway's far
        side came back). Adding a handler does the same.
        """
        self._inbox.redeliver()

    def add_control_listener(
        self, listener: Callable[[str, str, dict[str, Any]], None]
    ) -> Callable[[], None]:
        """Call ``listener(kind, sender, body)`` for control messages addressed to us."""
        self._control_listeners.append(listener)
        return lambda: self._control_listeners.remove(listener)

    async def wait_halted(self) -> None:
        """Wait until a ``halt`` control message arrives or the node closes."""
        assert self._halt_event is not None, "node not started"
        await self._halt_event.wait()

    # ------------------------------------------------------------------ channels

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

    # ------------------------------------------------------------------ peers

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

    def add_peer_listener(self, listener: Callable[[PeerEvent], None]) -> Callable[[], None]:
        """Call ``listener`` on every roster change (joined, evasive, alive, left)."""
        listeners = self._peering.listeners
        listeners.append(listener)
        return lambda: listeners.remove(listener)

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

    # ------------------------------------------------------------------ extension kinds

    def register_kind(self, kind: str, handler: KindHandler) -> None:
        """Route the mesh's own messages of ``kind`` (e.g. knowledge sync) to ``handler``.

        The handler gets the envelope, the raw payload (it decodes and validates it) and
        a ``reply(kind, payload)`` function that answers the sender directly. It runs on
        the loop thread and must not block.
        """
        if kind in NODE_KINDS:
            raise ConfigError(f"kind {kind!r} is the node's own")
        self._arrivals.register(kind, handler)

    def expect_kind(self, kind: str) -> None:
        """Say that ``kind``'s handler comes once its state is open (a knowledge shard
        opened after the node joined, so that it beats meanwhile). Until
        :meth:`register_kind`, messages of ``kind`` wait for it (counted
        ``held.kind-starting``; past 256, dropped and counted ``dropped.kind-starting``)
        instead of being answered ``unsupported``, which would turn the asker away from
        this node; :meth:`unregister_kind` answers the waiting requests ``unsupported``.

        Raises:
            ConfigError: ``kind`` is one of the node's own.
        """
        if kind in NODE_KINDS:
            raise ConfigError(f"kind {kind!r} is the node's own")
        self._arrivals.expect(kind)

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
        self._arrivals.unregister(kind)

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
        self._out.publish_control(kind, payload)

    # ------------------------------------------------------------------ state and counters

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

    def storage(self) -> dict[str, Any] | None:
        """The delivery journal's state, or None without a data directory.

        Returns:
            ``state`` (``ok``, or ``full`` while the journal cannot be written and
            direct messages are refused), ``path``, ``free_bytes`` (when full: the space
            left at the last failure), ``refused`` (direct messages refused for it so
            far), ``size`` (the journal's bytes).
        """
        return self._inbox.storage()

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

    def endpoints(self) -> dict[str, str]:
        """``{"pub": ..., "router": ...}`` endpoints on the first interface."""
        return self._ends.endpoints()
