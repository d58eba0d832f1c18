"""The node's sockets: how each is made, bound and watched, the links to peers, and the
one read loop every socket is read through.

Theory of operation
-------------------
Every socket of a node is a ZeroMQ socket on one context, made with the node's limits
(high-water marks, the largest message) and, on a secured node, its CurveZMQ role
(server for the PUB and ROUTER, client towards a peer's key). The event loop watches
each socket's descriptor; when it fires, :meth:`Sockets.read` takes what waits, one
message at a time, up to a fairness limit, and hands each to the protocol handler the
watch named. ZeroMQ's descriptor is edge-triggered and a send can consume the edge, so
after a send the socket is checked again (:meth:`Sockets.after_send`), and a new watch
reads once at once (input may have arrived before it).

The sockets that reach peers are :class:`Links`: a link per peer on the roster (a
DEALER to its ROUTER, and on a secured node a SUB of its own to its PUB, since each
CurveZMQ client socket holds one server key), a probe per seed or lost peer being tried
again (a fresh DEALER that says hello), and the handshake watches of both (and of the
node's secured server sockets). Opening and closing them is all this module does: when
to open or close one is decided by the roster (:class:`~porter_mesh.core.session.roster.Roster`)
and the re-contact schedule (:class:`~porter_mesh.core.peers.Recontact`), and what a
handshake's outcome means by the node.

What the messages mean is not decided here: the node's handlers decode them and the pure
sessions (:mod:`porter_mesh.core.session`) say what to do.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import os
import time
from collections.abc import Callable
from typing import TypeVar, cast

import zmq

from porter_mesh.adapters.handshake import HandshakeWatch
from porter_mesh.adapters.security import MeshSecurity
from porter_mesh.core.addresses import url_host
from porter_mesh.core.advert import PeerAdvert
from porter_mesh.node.config import NodeConfig
from porter_mesh.node.zio import readable

__all__ = [
    "READ_LIMIT", "Links", "PeerLink", "Sockets", "Target", "recv_subscription", "tcp_address",
]

#: Most messages read from one socket in one go before the others get their turn.
READ_LIMIT = 512

_T = TypeVar("_T")

#: Binding a port again that a closed socket still holds (see Sockets.bind_again):
#: first retry after this many seconds, doubling up to the cap, for at most the deadline.
_REBIND_FIRST_DELAY = 0.002
_REBIND_MAX_DELAY = 0.1
_REBIND_DEADLINE = 10.0
#: Gives the CPU to another thread ready to run on it (no-op where the OS has no such call).
_yield_cpu: Callable[[], None] = getattr(os, "sched_yield", lambda: None)
#: What a probe tries to reach: ``("seed", "HOST:PORT")`` or ``("peer", name)``.
Target = tuple[str, str]
#: Reads a link's SUB (the socket, the peer's name).
ReadSub = Callable[[zmq.Socket[bytes], str], None]
#: Reads a DEALER (the socket; the linked peer's name, or None for a probe; the name a
#: probe expects to answer, if known; the probe's target).
ReadDealer = Callable[[zmq.Socket[bytes], "str | None", "str | None", "Target | None"], None]


def tcp_address(sock: zmq.Socket[bytes], host: str) -> str:
    """``tcp://HOST`` for binding ``sock`` on ``host`` (without the port); an IPv6 host
    is bracketed and turns IPv6 on for the socket."""
    if ":" in host:
        sock.setsockopt(zmq.IPV6, 1)
    return f"tcp://{url_host(host)}"


def recv_subscription(sock: zmq.Socket[bytes]) -> bytes:
    """One (un)subscription frame from an XPUB (``zmq.Again`` when none waits)."""
    return sock.recv(zmq.NOBLOCK)


def _fd(sock: zmq.Socket[bytes]) -> int:
    return cast(int, sock.getsockopt(zmq.FD))


class PeerLink:
    """Sockets and endpoints used to reach one peer (``sub``: its own SUB, secured only;
    ``introduced``: its hello or welcome, and so its roster, has arrived on this link)."""

    __slots__ = ("advert", "dealer", "introduced", "pub_endpoint", "sub")

    def __init__(self, advert: PeerAdvert, dealer: zmq.Socket[bytes], pub_endpoint: str,
                 sub: zmq.Socket[bytes] | None = None) -> None:
        self.advert = advert
        self.dealer = dealer
        self.pub_endpoint = pub_endpoint
        self.sub = sub
        self.introduced = False


class Sockets:
    """One node's ZeroMQ context, its socket factory and its watched sockets.

    Args:
        config: the node's settings (limits, interfaces, busy polling).
        counters: the node's counters (``busy_poll.windows``: times the loop started
            polling after a direct send; ``busy_poll.turns``: its turns while it did).
        after_batch: called after each read that took messages (the node flushes what
            its handlers queued and re-arms its timer).
        closed: whether the node is closed (a socket closed under a read is then no
            error).
    """

    def __init__(self, config: NodeConfig, counters: collections.Counter[str], *,
                 after_batch: Callable[[], None], closed: Callable[[], bool]) -> None:
        self.config = config
        self._counters = counters
        self._after_batch = after_batch
        self._closed = closed
        self.ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        #: The node's keys, once loaded (None: unsecured).
        self.security: MeshSecurity | None = None
        self._readers: dict[zmq.Socket[bytes], Callable[[], None]] = {}
        self._busy_poll = config.busy_poll
        self._busy_until = 0.0
        self._polling: asyncio.Handle | None = None

    def open(self, loop: asyncio.AbstractEventLoop) -> zmq.Context[zmq.Socket[bytes]]:
        """Make the context, on ``loop``; returns it."""
        self.loop = loop
        self.ctx = zmq.Context()
        return self.ctx

    # -- making sockets -------------------------------------------------------------

    def socket(self, kind: int) -> zmq.Socket[bytes]:
        """A socket of ``kind`` with the node's limits."""
        assert self.ctx is not None
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, self.config.sndhwm)
        sock.setsockopt(zmq.RCVHWM, self.config.rcvhwm)
        sock.setsockopt(zmq.MAXMSGSIZE, self.config.max_message_bytes)
        return sock

    def server(self, kind: int) -> zmq.Socket[bytes]:
        """A socket others connect to (a CurveZMQ server when secured)."""
        sock = self.socket(kind)
        if self.security is not None:
            self.security.serve(sock)
        return sock

    def client(self, kind: int, server_key: str | None) -> zmq.Socket[bytes]:
        """A socket that connects to a peer holding ``server_key`` (when secured)."""
        sock = self.socket(kind)
        if self.security is not None:
            assert server_key is not None
            self.security.client(sock, server_key)
        return sock

    def new_pub(self) -> zmq.Socket[bytes]:
        """The node's PUB: an XPUB, bounded in messages of at most
        ``broadcast_message_bytes``."""
        # XPUB rather than PUB: it tells us who subscribed to what, so callers can wait
        # for subscribers instead of guessing (the "slow joiner" problem).
        sock = self.server(zmq.XPUB)
        sock.setsockopt(zmq.XPUB_VERBOSER, 1)
        sock.setsockopt(zmq.SNDHWM, self.config.pub_hwm)
        return sock

    def bind(self, sock: zmq.Socket[bytes], port: int) -> int:
        """Bind ``sock`` on every interface at ``port`` (0: one the OS picks, the same
        on each); returns the port."""
        chosen = port
        for host in self.config.interfaces:
            if chosen == 0:
                chosen = sock.bind_to_random_port(tcp_address(sock, host))
            else:
                sock.bind(f"{tcp_address(sock, host)}:{chosen}")
        return chosen

    def bind_again(self, sock: zmq.Socket[bytes], port: int, *,
                   wanted: Callable[[], bool], bound: Callable[[], None],
                   failed: Callable[[str, zmq.ZMQError], None]) -> None:
        """Bind ``sock`` on every interface at ``port``, which a socket just closed still
        holds: libzmq frees a closed listener's port on its I/O thread within a few
        milliseconds, so a refused bind is tried again (first after 2 ms, doubling up to
        100 ms, for at most 10 s), without blocking the loop.

        Args:
            wanted: asked before each try: False gives up quietly (the node closed, or
                replaced ``sock`` meanwhile).
            bound: called once ``sock`` is bound everywhere.
            failed: called with the interface and the error when a bind fails otherwise
                or for longer than the deadline.
        """
        self._bind_again(sock, port, list(self.config.interfaces),
                         time.monotonic() + _REBIND_DEADLINE, _REBIND_FIRST_DELAY,
                         wanted, bound, failed)

    def _bind_again(self, sock: zmq.Socket[bytes], port: int, hosts: list[str],
                    deadline: float, delay: float, wanted: Callable[[], bool],
                    bound: Callable[[], None],
                    failed: Callable[[str, zmq.ZMQError], None]) -> None:
        if not wanted() or sock.closed:
            return
        while hosts:
            host = hosts[0]
            try:
                sock.bind(f"{tcp_address(sock, host)}:{port}")
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EADDRINUSE and time.monotonic() < deadline:
                    assert self.loop is not None
                    self.loop.call_later(delay, self._bind_again, sock, port, hosts, deadline,
                                         min(delay * 2, _REBIND_MAX_DELAY), wanted, bound,
                                         failed)
                    return
                failed(host, exc)
                return
            hosts.pop(0)
        bound()

    # -- watching and reading ---------------------------------------------------------

    def watch(self, sock: zmq.Socket[bytes], read: Callable[[], None]) -> None:
        """Call ``read`` whenever ``sock`` may have input."""
        assert self.loop is not None
        self._readers[sock] = read
        self.loop.add_reader(_fd(sock), read)
        # Input may already be waiting: the edge may have fired before we watched.
        self.loop.call_soon(read)

    def unwatch(self, sock: zmq.Socket[bytes]) -> None:
        """Stop watching ``sock`` (idempotent)."""
        if self._readers.pop(sock, None) is not None and self.loop is not None:
            with contextlib.suppress(Exception):
                self.loop.remove_reader(_fd(sock))

    def unwatch_all(self) -> None:
        """Stop watching every socket (the node is closing)."""
        self._stop_polling()
        loop = self.loop
        for sock in list(self._readers):
            if loop is not None:
                with contextlib.suppress(Exception):
                    loop.remove_reader(_fd(sock))
        self._readers.clear()

    def busy(self) -> None:
        """A direct message has just left: keep the loop turning for ``busy_poll``
        seconds from now, so what answers it is read without a sleep and a wake-up.

        Each turn of the loop polls every watched descriptor without waiting, then
        yields the CPU to any other thread ready to run on it (ZeroMQ's I/O thread among
        them); the turns end once the window passes with nothing more, and an idle node
        never starts them."""
        window = self._busy_poll
        if not window:
            return
        self._busy_until = time.monotonic() + window
        if self._polling is None and self.loop is not None:
            self._counters["busy_poll.windows"] += 1
            self._polling = self.loop.call_soon(self._poll_turn)

    def _poll_turn(self) -> None:
        loop = self.loop
        if loop is None or self._closed() or time.monotonic() >= self._busy_until:
            self._polling = None
            return
        self._counters["busy_poll.turns"] += 1
        _yield_cpu()
        self._polling = loop.call_soon(self._poll_turn)

    def _stop_polling(self) -> None:
        if self._polling is not None:
            self._polling.cancel()
            self._polling = None

    def after_send(self, sock: zmq.Socket[bytes]) -> None:
        """A send can consume the edge of ZeroMQ's descriptor: re-check for input."""
        read = self._readers.get(sock)
        if read is not None and readable(sock):
            assert self.loop is not None
            self.loop.call_soon(read)

    def read(self, sock: zmq.Socket[bytes], recv: Callable[[zmq.Socket[bytes]], _T | None],
             handle: Callable[[_T], None]) -> bool | None:
        """The one read loop: ``handle(recv(sock))`` per waiting message, without
        blocking, up to a fairness limit.

        Args:
            sock: the socket whose descriptor fired.
            recv: reads one message, None (or ``zmq.Again``) when none waits.
            handle: takes one message.

        Returns:
            True when the limit was reached (more may wait: the caller reads again on
            the next loop turn), False when the socket is empty, None when it was
            closed under the read (a peer's goodbye can close its own socket).
        """
        if sock.closed:
            return None
        n = 0
        try:
            while n < READ_LIMIT:
                item = recv(sock)
                if item is None:
                    return False
                n += 1
                handle(item)
        except zmq.Again:
            return False  # a handler's send found a full queue: the rest waits for next time
        except zmq.ZMQError:
            if not self._closed() and not sock.closed:
                raise
            return None
        return True

    def read_done(self, more: bool | None, again: Callable[[], None]) -> None:
        """After a read: read again next turn if ``more``; then the node's after-batch
        work (flush, re-arm)."""
        if more is None:
            return
        if more and self.loop is not None:
            self.loop.call_soon(again)
        self._after_batch()

    def term(self) -> None:
        """End the context (every socket is closed by then)."""
        if self.ctx is not None:
            self.ctx.term()
            self.ctx = None


class Links:
    """The sockets that reach peers: links (:class:`PeerLink`), probes, handshake watches.

    Socket work only: the node decides when a link or probe opens and closes, and what a
    handshake's outcome means (``on_handshake`` is called when a watched socket's
    monitor has news; :meth:`handshake` gives the watch).

    Args:
        sockets: the node's socket factory and watcher.
        routing_id: the node's readable DEALER identity on an unsecured mesh
            (``name/incarnation``; a secured ROUTER makes up its own).
        read_sub, read_dealer: the node's readers for a link's SUB and for a DEALER.
        on_handshake: called with a watched socket when its handshake monitor fires.
    """

    def __init__(self, sockets: Sockets, *, routing_id: str, read_sub: ReadSub,
                 read_dealer: ReadDealer,
                 on_handshake: Callable[[zmq.Socket[bytes]], None]) -> None:
        self._sockets = sockets
        self._routing_id = routing_id
        self._read_sub = read_sub
        self._read_dealer = read_dealer
        self._on_handshake = on_handshake
        #: The link to each peer on the roster, by name.
        self.links: dict[str, PeerLink] = {}
        #: The DEALER of each target being tried again.
        self.probes: dict[Target, zmq.Socket[bytes]] = {}
        # Sockets whose handshakes are watched, with the peer a client socket connects to
        # (None: a server socket).
        self._handshakes: dict[zmq.Socket[bytes], tuple[HandshakeWatch, str | None]] = {}

    @property
    def _secured(self) -> bool:
        return self._sockets.security is not None

    # -- links ------------------------------------------------------------------------

    def open(self, advert: PeerAdvert, *, shared_sub: zmq.Socket[bytes] | None,
             topics: list[bytes]) -> PeerLink:
        """Link to ``advert``'s peer: its PUB subscribed to (through ``shared_sub``, or
        on a secured node a SUB of its own subscribed to ``topics``), a DEALER to its
        ROUTER with its handshake watched. The caller says hello on ``link.dealer``."""
        pub = advert.endpoint_pub()
        sub = None
        if not self._secured:
            assert shared_sub is not None
            shared_sub.connect(pub)
        else:
            sub = self._sockets.client(zmq.SUB, advert.public_key)
            for topic in topics:
                sub.setsockopt(zmq.SUBSCRIBE, topic)
            sub.connect(pub)
            self._sockets.watch(sub, functools.partial(self._read_sub, sub, advert.name))
        dealer = self._sockets.client(zmq.DEALER, advert.public_key)
        if not self._secured:
            # A readable id helps debugging; a secured ROUTER makes up its own.
            dealer.setsockopt(zmq.ROUTING_ID, self._routing_id.encode())
        dealer.setsockopt(zmq.IMMEDIATE, 0)
        self.watch_handshake(dealer, advert.name)
        dealer.connect(advert.endpoint_router())
        link = self.links[advert.name] = PeerLink(advert, dealer, pub, sub)
        self._sockets.watch(dealer, functools.partial(self._read_dealer, dealer, advert.name,
                                                      None, None))
        return link

    def close(self, name: str, *, shared_sub: zmq.Socket[bytes] | None) -> PeerLink | None:
        """Close the link to ``name`` (its SUB, or its PUB left by ``shared_sub``; its
        DEALER and handshake watch). Returns the link, None when there was none."""
        link = self.links.pop(name, None)
        if link is None:
            return None
        if link.sub is not None:
            self._sockets.unwatch(link.sub)
            link.sub.close(linger=0)
        elif shared_sub is not None:
            with contextlib.suppress(zmq.ZMQError):
                shared_sub.disconnect(link.pub_endpoint)
        self._close_dealer(link.dealer)
        return link

    def _close_dealer(self, dealer: zmq.Socket[bytes]) -> None:
        self._sockets.unwatch(dealer)
        self.end_handshake_watch(dealer)
        dealer.close(linger=0)

    # -- probes -----------------------------------------------------------------------

    def open_probe(self, key: Target, endpoint: str, server_key: str | None, *,
                   name: str | None) -> zmq.Socket[bytes]:
        """A fresh DEALER to ``endpoint`` trying to reach ``key`` (``name``: the agent
        expected there, if known), replacing an earlier probe of ``key``. The caller
        says hello on it.

        Raises:
            zmq.ZMQError: ``endpoint`` cannot be connected to (no probe is left open).
        """
        self.close_probe(key)
        dealer = self._sockets.client(zmq.DEALER, server_key)
        if not self._secured:
            dealer.setsockopt(zmq.ROUTING_ID, f"{self._routing_id}/{key[0][0]}".encode())
        if "[" in endpoint:
            dealer.setsockopt(zmq.IPV6, 1)
        # Within one attempt, libzmq's own reconnects back off too (a closed port is
        # knocked on about once per attempt, not ten times a second).
        cfg = self._sockets.config
        dealer.setsockopt(zmq.RECONNECT_IVL, round(cfg.heartbeat_interval * 1000))
        dealer.setsockopt(zmq.RECONNECT_IVL_MAX, round(cfg.recontact_max * 1000))
        self.watch_handshake(dealer, name or key[1])
        try:
            dealer.connect(endpoint)
        except zmq.ZMQError:
            self.end_handshake_watch(dealer)
            dealer.close(linger=0)
            raise
        self.probes[key] = dealer
        self._sockets.watch(dealer, functools.partial(self._read_dealer, dealer, None, name,
                                                      key))
        return dealer

    def close_probe(self, key: Target) -> None:
        """Close the probe of ``key``, if any."""
        dealer = self.probes.pop(key, None)
        if dealer is not None:
            self._close_dealer(dealer)

    def is_probe(self, sock: zmq.Socket[bytes], kind: str | None = None) -> bool:
        """Whether ``sock`` is a probe (of a target of ``kind``, when given)."""
        return any(sock is probe for key, probe in self.probes.items()
                   if kind is None or key[0] == kind)

    def probes_of(self, sock: zmq.Socket[bytes]) -> list[Target]:
        """The targets ``sock`` probes."""
        return [key for key, probe in self.probes.items() if probe is sock]

    # -- handshakes -------------------------------------------------------------------

    def watch_handshake(self, sock: zmq.Socket[bytes], peer: str | None) -> None:
        """Watch the handshake outcomes of ``sock``: a client's (``peer``: whom it
        connects to) until the node ends the watch, a secured server's (None) for its
        life."""
        watch = HandshakeWatch(sock, secured=self._secured)
        self._handshakes[sock] = (watch, peer)
        self._sockets.watch(watch.monitor, functools.partial(self._on_handshake, sock))

    def handshake(self, sock: zmq.Socket[bytes]) -> tuple[HandshakeWatch, str | None] | None:
        """The watch of ``sock`` and the peer it connects to, None when not watched."""
        return self._handshakes.get(sock)

    def end_handshake_watch(self, sock: zmq.Socket[bytes]) -> None:
        """Stop watching ``sock``'s handshakes (idempotent)."""
        entry = self._handshakes.pop(sock, None)
        if entry is not None:
            self._sockets.unwatch(entry[0].monitor)
            entry[0].close()

    # -- the end ----------------------------------------------------------------------

    def close_all(self) -> None:
        """Close every link, probe and handshake watch (the node is closing, and has
        stopped watching every socket: a closed socket's descriptor cannot be unwatched)."""
        for watched in list(self._handshakes):
            self.end_handshake_watch(watched)
        for link in self.links.values():
            link.dealer.close(linger=0)
            if link.sub is not None:
                link.sub.close(linger=0)
        for dealer in self.probes.values():
            dealer.close(linger=0)
        self.links.clear()
        self.probes.clear()
