"""This node's own endpoints: the PUB its broadcasts leave by, the ROUTER that direct
messages reach and the shared SUB, and on a secured node the keys that guard them.

Theory of operation
-------------------
:meth:`Endpoints.open` binds the PUB (an XPUB, so that subscriptions can be read and
waited for) and the ROUTER on every configured interface, at the configured ports or at
one the OS picks (the same on each interface), and makes the shared SUB of an unsecured
node (a secured node has one SUB per peer: libzmq sets the CURVE server key per socket).
A port that cannot be bound is a :class:`~porter_mesh.errors.ConfigError` saying what to
choose instead, raised with every socket already closed.

A secured node (one with a secret key, ``NodeConfig.secret_key_file``; the keys, the
trusted directory and ZAP are explained in :mod:`porter_mesh.adapters.security`) runs
CurveZMQ on every socket, and its sockets differ in three ways: one SUB per peer instead
of the shared one; DEALERs that carry no chosen routing id (the ROUTER makes one up, so
that a trusted peer cannot claim another's id and take its replies); and the ROUTER read
with ``copy=False`` for each message's ZAP User-Id, the agent name bound to the sender's
key. Every message must then come from the name it claims and every activity's ``actor``
must be that name (:mod:`porter_mesh.node.arrivals`; anything else is dropped and
audited), and an advert must carry a key the trusted directory binds to its name
(:mod:`porter_mesh.node.peering`). An unsecured node pays for none of this; one bound
beyond loopback without a key refuses to start unless ``insecure`` is set.

Security while running (:class:`Endpoints` with a
:class:`~porter_mesh.adapters.security.MeshSecurity`): the keys are loaded before any
socket is bound (:func:`load_security`; a seed without an agent name is refused, since a
secured node must know whose key to expect there); the ZAP authenticator is answered on
the loop; and on every heartbeat the trusted directory is looked at
(:meth:`Endpoints.check_trust`, one ``stat``). A changed directory has the peering
revalidate its peers (a peer whose key went is disconnected); a removed key also cuts
every subscriber off the PUB (:meth:`Endpoints.reopen_pub`), since ZeroMQ's PUB has no way
to drop one subscriber and a connection authenticated before the removal would go on
receiving.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

import zmq

from porter_mesh.adapters.security import AUDIT_FILE, MeshSecurity
from porter_mesh.core.addresses import url_host
from porter_mesh.errors import ConfigError, SecurityError
from porter_mesh.node.config import NodeConfig, split_seed
from porter_mesh.node.links import Links, Sockets, recv_subscription
from porter_mesh.node.subscriptions import Subscriptions
from porter_mesh.node.zio import readable

__all__ = ["Endpoints", "load_security"]

log = logging.getLogger("porter_mesh.node")


def load_security(config: NodeConfig, counters: collections.Counter[str]) -> MeshSecurity:
    """The keys, trusted directory and audit log of a secured node.

    Raises:
        SecurityError: a seed has no agent name, or the key or the trusted directory
            cannot be used.
    """
    assert config.secret_key_file is not None
    for seed in config.seeds:
        if split_seed(seed)[0] is None:
            raise SecurityError(
                f"seed {seed!r} has no agent name: a secured node must know whose key "
                "to expect there; write it NAME@HOST:PORT with NAME trusted on the mesh"
            )
    return MeshSecurity.load(
        name=config.name, mesh=config.mesh, key_file=config.secret_key_file,
        trusted_dir=config.trusted_path,
        audit_path=config.data_dir / AUDIT_FILE if config.data_dir is not None else None,
        counters=counters, observer=config.observer,
    )


class Endpoints:
    """A node's PUB, ROUTER and shared SUB, and its keys (see the module docstring).

    Args:
        config: the node's settings (interfaces, ports).
        counters: the node's counters, added to here.
        sockets: the node's sockets and read loop.
        net: the links to peers (handshake watches).
        subs: the channels and the subscriptions read off the PUB.
        revalidate: called when the trusted directory changed (the peers are checked
            against it again).
        closed: whether the node has closed (nothing is bound again then).
    """

    def __init__(self, config: NodeConfig, counters: collections.Counter[str], *,
                 sockets: Sockets, net: Links, subs: Subscriptions,
                 revalidate: Callable[[], None], closed: Callable[[], bool]) -> None:
        self._config = config
        self._counters = counters
        self._sockets = sockets
        self._net = net
        self._subs = subs
        self._revalidate = revalidate
        self._closed = closed
        self.pub: zmq.Socket[bytes] | None = None
        self.router: zmq.Socket[bytes] | None = None
        #: The SUB shared by every link of an unsecured node (None when secured).
        self.sub: zmq.Socket[bytes] | None = None
        self.pub_port = 0
        self.router_port = 0
        self.security: MeshSecurity | None = None
        self._trust_generation = 0
        self._trust_removals = 0

    def open(self, security: MeshSecurity | None) -> None:
        """Start the authenticator (when secured), then make and bind the sockets.

        Raises:
            ConfigError: a port is taken or an interface cannot be bound (every socket
                is closed by then).
        """
        sockets = self._sockets
        assert sockets.ctx is not None and sockets.loop is not None
        if security is not None:
            # The authenticator must answer before the first client can knock.
            sockets.watch(security.start(sockets.ctx), self._answer_zap)
            self.security = sockets.security = security
            self._trust_generation = security.store.generation
            self._trust_removals = security.store.removals
        cfg = self._config
        try:
            self.pub = sockets.new_pub()
            self.pub_port = sockets.bind(self.pub, cfg.pub_port)
            self.router = sockets.server(zmq.ROUTER)
            self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)
            self.router_port = sockets.bind(self.router, cfg.router_port)
            self.sub = sockets.socket(zmq.SUB) if security is None else None
        except zmq.ZMQError as exc:
            self.close()
            raise ConfigError(
                f"cannot bind on {', '.join(cfg.interfaces)}: {exc.strerror}; choose other "
                "ports (0 lets the OS pick) or another interface"
            ) from None
        if security is not None:
            # A client without keys is refused before ZAP hears of it: watch for it.
            self._net.watch_handshake(self.pub, None)
            self._net.watch_handshake(self.router, None)

    def watch(self, read_sub: Callable[[], None], read_router: Callable[[], None]) -> None:
        """Start reading the sockets: the shared SUB, the ROUTER, the PUB's
        subscriptions."""
        assert self.pub is not None and self.router is not None
        if self.sub is not None:
            self._sockets.watch(self.sub, read_sub)
        self._sockets.watch(self.router, read_router)
        self._sockets.watch(self.pub, self._read_xpub)

    def close(self) -> None:
        """Close every socket of the node (links included), then the authenticator and
        the context."""
        self._sockets.unwatch_all()  # before any socket closes: its descriptor goes with it
        self._net.close_all()
        if self.pub is not None:
            # Give queued broadcasts (the goodbye among them) a moment to leave.
            self.pub.close(linger=500)
            self.pub = None
        for other in (self.sub, self.router):
            if other is not None:
                other.close(linger=0)
        self.sub = self.router = None
        if self.security is not None:
            # After the server sockets: none of them may outlive the authenticator.
            self.security.stop()
        self._sockets.term()

    def sub_sockets(self) -> list[zmq.Socket[bytes]]:
        """Every SUB of the node: the shared one and each link's own."""
        subs = [link.sub for link in self._net.links.values() if link.sub is not None]
        return subs if self.sub is None else [self.sub, *subs]

    def endpoints(self) -> dict[str, str]:
        """``{"pub": ..., "router": ...}`` endpoints on the first interface."""
        addr = url_host(self._config.interfaces[0])
        return {"pub": f"tcp://{addr}:{self.pub_port}",
                "router": f"tcp://{addr}:{self.router_port}"}

    def _read_xpub(self) -> None:
        """Read the (un)subscriptions that reach the PUB."""
        sock = self.pub
        if sock is None:
            return
        self._sockets.read_done(self._take_subscriptions(sock), self._read_xpub)

    def _take_subscriptions(self, sock: zmq.Socket[bytes]) -> bool | None:
        """Read the (un)subscriptions waiting at the PUB (see :meth:`Sockets.read`)."""
        more = self._sockets.read(sock, recv_subscription, self._subs.on_subscription)
        self._subs.read_done()
        return more

    def direct_watched(self) -> bool:
        """Whether an observer watches the copies of direct messages, counting the
        subscriptions that reached the PUB but that the loop has not read yet (the
        ROUTER's descriptor may be handled first in a turn where both fired: an observer
        that joined just before a direct message would otherwise miss its copy)."""
        sock = self.pub
        if self._subs.direct_watched or sock is None or not readable(sock):
            return self._subs.direct_watched
        if self._take_subscriptions(sock) and self._sockets.loop is not None:
            self._sockets.loop.call_soon(self._read_xpub)
        return self._subs.direct_watched

    # -- security while running ------------------------------------------------------

    def _answer_zap(self) -> None:
        authenticator = self.security.authenticator if self.security else None
        if authenticator is not None and authenticator.answer_pending():
            assert self._sockets.loop is not None
            self._sockets.loop.call_soon(self._answer_zap)

    def check_trust(self, now: float) -> None:
        """Look at the trusted directory (one ``stat``); act on what changed."""
        if self.security is None:
            return
        # The ZAP callback may have re-read the directory already: compare generations.
        store = self.security.store
        store.refresh_if_changed(now)
        if store.generation != self._trust_generation:
            self._trust_generation = store.generation
            self._revalidate()
        if store.removals != self._trust_removals:
            self._trust_removals = store.removals
            self.reopen_pub()

    def reopen_pub(self) -> None:
        """A key left the trusted directory: cut every subscriber off the PUB.

        The XPUB is closed and a new one bound on the same port: honest subscribers
        reconnect through ZAP within their reconnect interval (what was published
        meanwhile is a sequence gap they count, and knowledge is repaired by
        anti-entropy, as for any loss), while the revoked key is refused.
        """
        old = self.pub
        if old is None or self._closed():
            return
        self._sockets.unwatch(old)
        self._net.end_handshake_watch(old)
        old.close(linger=0)
        self._subs.reset()
        sock = self.pub = self._sockets.new_pub()
        self._counters["security.pub-reopened"] += 1
        log.info("node %s: a key left the trusted directory; every subscriber of this "
                 "node's PUB was cut and must reconnect", self._config.name)
        # Until the bind succeeds broadcasts reach nobody (and are counted as gaps by
        # the subscribers, like any other loss).
        self._sockets.bind_again(sock, self.pub_port, wanted=lambda: sock is self.pub,
                                 bound=lambda: self._pub_bound(sock),
                                 failed=self._pub_unbound)

    def _pub_bound(self, sock: zmq.Socket[bytes]) -> None:
        if self.security is not None:
            self._net.watch_handshake(sock, None)
        self._sockets.watch(sock, self._read_xpub)

    def _pub_unbound(self, host: str, exc: zmq.ZMQError) -> None:
        self._counters["error.pub-rebind"] += 1
        log.error("node %s cannot bind its PUB socket again on %s:%d (%s): its broadcasts "
                  "reach nobody; restart the node", self._config.name, host, self.pub_port,
                  exc.strerror)
