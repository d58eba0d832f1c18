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

What the messages mean is not decided here: the node's handlers decode them and the pure
sessions (:mod:`porter_mesh.core.session`) say what to do.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TypeVar, cast

import zmq

from porter_mesh.adapters.security import MeshSecurity
from porter_mesh.core.addresses import url_host
from porter_mesh.core.advert import PeerAdvert
from porter_mesh.node.config import NodeConfig
from porter_mesh.node.zio import readable

__all__ = ["READ_LIMIT", "PeerLink", "Sockets", "recv_subscription", "tcp_address"]

#: Most messages read from one socket in one go before the others get their turn.
READ_LIMIT = 512

_T = TypeVar("_T")


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
        config: the node's settings (limits, interfaces).
        after_batch: called after each read that took messages (the node flushes what
            its handlers queued and re-arms its timer).
        closed: whether the node is closed (a socket closed under a read is then no
            error).
    """

    def __init__(self, config: NodeConfig, *, after_batch: Callable[[], None],
                 closed: Callable[[], bool]) -> None:
        self.config = config
        self._after_batch = after_batch
        self._closed = closed
        self.ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        #: The node's keys, once loaded (None: unsecured).
        self.security: MeshSecurity | None = None
        self._readers: dict[zmq.Socket[bytes], Callable[[], None]] = {}

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
        loop = self.loop
        for sock in list(self._readers):
            if loop is not None:
                with contextlib.suppress(Exception):
                    loop.remove_reader(_fd(sock))
        self._readers.clear()

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
