"""Reaching peers: adverts, links, hellos, re-contact, refusals, revoked keys.

Theory of operation
-------------------
Peers are found three ways: zeroconf (mDNS) adverts, a ``hello`` to each static seed,
and peer exchange (every ``hello`` and ``welcome`` carries the adverts its sender knows).
Each advert goes through the roster's rules (:class:`~porter_mesh.core.session.roster.Roster`),
which say what to do: connect, reconnect, disconnect, tell a roster change. This module
carries those out on the sockets of :class:`~porter_mesh.node.links.Links` and keeps what
the rules leave to the node: the re-contact schedule, the refusals and the log lines.
Liveness comes from heartbeats, not mDNS (a killed process sends no goodbye); see
:mod:`porter_mesh.core.peers`.

Re-contact. Seeds and expired peers are tried again on the capped backoff of
:class:`~porter_mesh.core.peers.Recontact`, for as long as it takes: a seed whose peer is
not linked (not yet answered, or lost since), and the last advert of every peer that
expired (the other side of a partition, most often; a bounded number of them). Each
attempt is a fresh DEALER to the target's ROUTER carrying one ``hello``: a connect left
over from an attempt made while the link was down could sit in the kernel's SYN retries
for a minute after it is back, and a socket that queued hellos for a minute would
deliver them all at once. A ``welcome`` (or any other way back onto the roster) ends
the attempts; the peer rejoins as usual, the knowledge replica catches up. Losing and
regaining a peer is logged once each.

Refusals. Each DEALER's handshake is watched on libzmq's monitor until it first succeeds
(:mod:`porter_mesh.adapters.handshake`). A peer that refuses the connection for a reason
keys explain (this node has no key and the peer runs CurveZMQ; the peer does not trust
this node's key; the peer has none) is remembered in :meth:`Peering.refusals`: sends to
it fail at once with :class:`~porter_mesh.errors.PeerRefusedError`, whose message names
the keys to make or trust, instead of retrying until their deadline. A secured node
watches its own PUB and ROUTER too and audits each client that came without keys
(``no-key``), which no ZAP handler hears of.

Revoked keys. A secured node compares its trusted directory on every heartbeat; when it
changed, every link whose key is no longer trusted is cut (:meth:`Peering.revalidate`)
and every seed is tried afresh (one refused for want of a key may be trusted now).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

import zmq

from porter_mesh.adapters.handshake import Refusal
from porter_mesh.adapters.security import MeshSecurity
from porter_mesh.core import constants as C
from porter_mesh.core.advert import PeerAdvert, key_name
from porter_mesh.core.control import KIND_HELLO, Introduction, ObserverHello, encode_hello
from porter_mesh.core.envelope import Envelope
from porter_mesh.core.peers import PeerEvent, PeerEventKind, PeerInfo, Recontact
from porter_mesh.core.session.roster import Roster, RosterAction
from porter_mesh.core.session.sending import SendAction, Sender
from porter_mesh.errors import PeerRefusedError
from porter_mesh.node.config import NodeConfig, split_seed
from porter_mesh.node.endpoints import Endpoints
from porter_mesh.node.links import Links, Target

__all__ = ["Peering"]

log = logging.getLogger("porter_mesh.node")

#: Most refusing peers remembered (see Peering.refusals).
_MAX_REFUSALS = 1024
#: Re-contact targets: ``(_SEED, "[NAME@]HOST:PORT")`` or ``(_PEER, agent name)``.
_SEED = "seed"
_PEER = "peer"
#: Peers left for these reasons are not tried again (a newer incarnation is already
#: here; an untrusted key is retried when the trusted directory changes).
_NO_RECONTACT = frozenset({"restarted", "untrusted"})

#: The completion token of a send (the node's futures).
_Token = TypeVar("_Token")


class Peering(Generic[_Token]):
    """How a node reaches its peers (see the module docstring).

    Args:
        config: the node's configuration (seeds, observer, re-contact cap).
        counters: the node's counters, added to here.
        roster: the roster's rules.
        sending: the sending rules (told when a peer refused us).
        net: the node's links, probes and handshake watches.
        ends: this node's own sockets (a new link of an unsecured node subscribes
            through its shared SUB).
        carry_out: carries out the actions the roster returns.
        send_control: sends a control message on a DEALER: ``send_control(sock, kind,
            payload)``.
        advert: this node's advert.
        topics: the SUB topics a new link subscribes to.
        drop: counts and logs (once) a dropped message.
        refuse: counts and audits something a secured node must not accept.
        closed: whether the node has closed.
    """

    def __init__(self, config: NodeConfig, counters: collections.Counter[str], *,
                 roster: Roster[_Token], sending: Sender[_Token], net: Links,
                 ends: Endpoints,
                 carry_out: Callable[[Iterable[RosterAction | SendAction[_Token]]], None],
                 send_control: Callable[[zmq.Socket[bytes], str, bytes], None],
                 advert: Callable[[], PeerAdvert], topics: Callable[[], list[bytes]],
                 drop: Callable[..., None], refuse: Callable[..., None],
                 closed: Callable[[], bool]) -> None:
        self._config = config
        self._name = config.name
        self._counters = counters
        self._roster = roster
        self._sending = sending
        self._net = net
        self._ends = ends
        self._links = net.links
        self._carry_out = carry_out
        self._send_control = send_control
        self._advert = advert
        self._topics = topics
        self._drop = drop
        self._refuse = refuse
        self._closed = closed
        #: The node's keys and trusted directory (set when a secured node starts).
        self.security: MeshSecurity | None = None
        self.listeners: list[Callable[[PeerEvent], None]] = []
        # Re-contact: the schedule, the agent behind each seed (from its name or its
        # first welcome), when each lost peer was lost.
        self._recontact: Recontact[Target, PeerAdvert | None] = Recontact(
            initial=config.heartbeat_interval, cap=config.recontact_max)
        self._seed_names: dict[str, str] = {}
        self._lost_at: dict[str, float] = {}
        self._refusals: dict[str, PeerRefusedError] = {}
        self._skew_warned: set[str] = set()

    @property
    def next_due(self) -> float:
        """When the next re-contact attempt is due (monotonic; inf: none)."""
        return self._recontact.next_due

    def start(self, now: float) -> None:
        """Knock on every seed at once."""
        for seed in self._config.seeds:
            name = split_seed(seed)[0]
            if name is not None:
                self._seed_names[seed] = name
            self._recontact.start((_SEED, seed), None, now, delay=0, pinned=True)
        self.run_recontacts(now)

    # -------------------------------------------------------------- adverts and links

    def found(self, advert: PeerAdvert, *, verified: bool = False) -> None:
        """An advert arrived; ``verified``: first-hand from that peer over an
        authenticated connection (only a secured node tells the difference)."""
        trust = self.security.store if self.security is not None else None
        self._carry_out(self._roster.found(advert, time.monotonic(), verified=verified,
                                           trust=trust))

    def changed(self, event: PeerEvent) -> None:
        """A change of the roster, carried out: re-contact started or stopped, counted,
        logged, told to the listeners."""
        peer = event.peer
        note = f" ({event.reason})" if event.reason else ""
        if event.kind is PeerEventKind.JOINED:
            note = self._reached(peer.advert)
        elif event.kind is PeerEventKind.LEFT:
            note += self._lost(peer, event.reason)
        self._counters["peer." + event.kind.value] += 1
        if event.kind is PeerEventKind.CLOCK_SKEW:
            self._warn_skew(peer)
        else:
            # A command line's seat comes and goes with every command: not news.
            level = logging.DEBUG if peer.advert.role == C.ROLE_SEAT else logging.INFO
            log.log(level, "peer %s %s%s", peer.name, event.kind.value, note)
        for listener in list(self.listeners):
            try:
                listener(event)
            except Exception:
                log.exception("peer listener failed")

    def connect(self, advert: PeerAdvert) -> None:
        """Open a link to ``advert``'s peer and say hello."""
        self._refusals.pop(advert.name, None)  # a new connection: ask again
        link = self._net.open(advert, shared_sub=self._ends.sub, topics=self._topics())
        self.send_hello(link.dealer)

    def disconnect(self, name: str) -> None:
        """Close the link to ``name``."""
        self._roster.unlinked(name)
        self._net.close(name, shared_sub=self._ends.sub)

    def revalidate(self) -> None:
        """The trusted keys changed: cut off peers whose key is no longer trusted."""
        assert self.security is not None
        store = self.security.store
        now = time.monotonic()
        for name, link in list(self._links.items()):
            key = link.advert.public_key
            if key is None or store.name_for(key) != key_name(name):
                self._refuse("revoked-key", name, f"the key of {name!r} is no longer trusted; "
                             "disconnected", key=key)
                info = self._roster.peers.get(name)
                if info is not None:
                    self._carry_out(self._roster.left(name, info.incarnation, now, "untrusted"))
                self.disconnect(name)
        # A seed refused for want of a key may be trusted now: try every target afresh.
        for seed in self._config.seeds:
            if self._seed_names.get(seed) not in self._links:
                self._recontact.start((_SEED, seed), None, now, delay=0, pinned=True)
        self._recontact.restart(now)

    # -------------------------------------------------------------- handshakes

    def on_handshake(self, sock: zmq.Socket[bytes]) -> None:
        """What a handshake outcome on ``sock`` means: a server's refusal of a client
        without keys audited; a client's success ends its watch, its refusal fails what
        waits for that peer (:meth:`_refused_by`)."""
        entry = self._net.handshake(sock)
        if entry is None:
            return
        watch, peer = entry
        for outcome in watch.read():
            if peer is None:
                if outcome.refusal is Refusal.NOT_SECURED:
                    self._refuse("no-key", None, f"refused a connection on {outcome.endpoint} "
                                 "from a client without keys (it offered no CurveZMQ key; its "
                                 "address is not reported before ZAP)")
            elif outcome.succeeded:
                self._refusals.pop(peer, None)
                self._net.end_handshake_watch(sock)
                return
            elif outcome.refusal is not None and peer not in self._refusals:
                self._refused_by(peer, outcome.refusal, sock)
                return

    def _refused_by(self, peer: str, refusal: Refusal, sock: zmq.Socket[bytes]) -> None:
        """``peer`` refused our connection: fail what waits for it, with what to do.

        Without keys on one side the answer cannot change until a node restarts, so the
        connection is dropped (libzmq would knock again every 100 ms, and each knock is
        a line in the peer's audit log); a key that is not trusted may be trusted later,
        so that connection keeps trying."""
        me = self._name
        owner, mesh = key_name(me), self._config.mesh
        trust = f"'porter-mesh trust {owner}.key --mesh {mesh}'"
        if refusal is Refusal.NEEDS_KEYS:
            text = (f"{peer} is secured (CurveZMQ) and refused {me}, which has no key: "
                    f"make one with 'porter-mesh keygen {owner}', have it trusted on the mesh "
                    f"({trust}) and set PORTER_MESH_KEY to its secret file; see "
                    "docs/security.md")
        elif refusal is Refusal.KEY_REFUSED:
            text = (f"{peer} refused the key of {me}: it is not trusted there; trust "
                    f"it on that side ({trust}); see docs/security.md")
        else:
            text = (f"{peer} has no key and {me} is secured: a secured node does not "
                    f"talk to an unsecured one; give {peer} a key ('porter-mesh keygen "
                    f"{peer}'); see docs/security.md")
        if len(self._refusals) >= _MAX_REFUSALS:
            del self._refusals[next(iter(self._refusals))]
        self._refusals[peer] = PeerRefusedError(text, recipient=peer, reason=refusal.value)
        self._counters["refused." + refusal.value] += 1
        log.info("node %s: %s", me, text)
        self._carry_out(self._sending.refused(peer))
        if refusal is Refusal.KEY_REFUSED:
            return
        link = self._links.get(peer)
        if link is not None and link.dealer is sock:
            self.disconnect(peer)
        for key in self._net.probes_of(sock):
            self._end_probe(key)  # tried again when the trusted directory changes

    def refusals(self) -> dict[str, PeerRefusedError]:
        """The peers that refused this node's connection (see :meth:`Node.refusals`)."""
        return dict(self._refusals)

    def refusal(self, name: str) -> PeerRefusedError | None:
        """The refusal of ``name``, if it refused this node."""
        return self._refusals.get(name)

    # -------------------------------------------------------------- hellos and seeds

    def introduction(self) -> Introduction:
        """The body of our hello and welcome: our advert and the peers we know."""
        return Introduction(self._advert(), tuple(p.advert for p in self._roster.peers))

    def send_hello(self, dealer: zmq.Socket[bytes]) -> None:
        """Say hello on ``dealer`` (a link or a probe)."""
        if self._config.observer:
            # An observer stays off every roster, but a seed must still tell it who is
            # there: its hello carries no advert, only the wish for a welcome.
            if self._net.is_probe(dealer, _SEED):
                self._send_control(dealer, KIND_HELLO, encode_hello(ObserverHello()))
            return
        self._send_control(dealer, KIND_HELLO, encode_hello(self.introduction()))

    def hello_again(self) -> None:
        """Say hello to every linked peer again (after this process was paused)."""
        for link in list(self._links.values()):
            self.send_hello(link.dealer)

    def run_recontacts(self, now: float) -> None:
        """Make the re-contact attempts that are due."""
        observer = self._config.observer
        for key, advert in self._recontact.due(now):
            if observer and key[0] != _SEED:
                # An observer is on no roster: it knocks only on its seeds, which tell
                # it who is there (see send_hello), not on peers it lost.
                self._recontact.stop(key)
                continue
            self._probe(key, advert)

    def _probe(self, key: Target, advert: PeerAdvert | None) -> None:
        """One attempt to reach a seed (``advert`` None) or a lost peer: a fresh DEALER
        to its ROUTER and a hello (see "Re-contact" in the module docstring)."""
        if advert is None:
            seed = key[1]
            named, host, port = split_seed(seed)
            name = named or self._seed_names.get(seed)
            endpoint = f"tcp://{host}:{port}"
            server_key = None
        else:
            name, endpoint, server_key = advert.name, advert.endpoint_router(), advert.public_key
        if name is not None and name in self._links:
            self._end_probe(key)  # linked: the regular connection already reaches it
            return
        if self.security is not None and advert is None:
            server_key = self.security.store.key_for(name or "")
            if server_key is None:
                # Tried again when the trusted directory changes (revalidate).
                self._drop("untrusted-seed", key[1], "seed %s: no trusted key for %r",
                           key[1], name)
                self._end_probe(key)
                return
        try:
            dealer = self._net.open_probe(key, endpoint, server_key, name=name)
        except zmq.ZMQError as exc:
            self._drop("bad-endpoint", key[1], "cannot connect to %s (%s): %s", key[1],
                       endpoint, exc)
            self._recontact.stop(key)
            return
        self.send_hello(dealer)

    def _end_probe(self, key: Target) -> tuple[float, int] | None:
        self._net.close_probe(key)
        return self._recontact.stop(key)

    def introduced(self, env: Envelope, intro: Introduction, probe: Target | None) -> None:
        """A hello or welcome from ``env.sender`` (``probe``: the re-contact target whose
        DEALER it came back on): its own advert is first-hand, the peers it knows are
        hearsay."""
        sender = env.sender
        for advert in (intro.advert, *intro.peers):
            self.found(advert, verified=advert.name == sender)
        link = self._links.get(sender)
        if link is not None:
            link.introduced = True
        if probe is None:
            return
        if probe[0] == _SEED:
            self._seed_names[probe[1]] = sender
            if sender == self._name:
                log.info("seed %s is this node itself; not contacted again", probe[1])
                self._end_probe(probe)
                return
        if sender in self._links or (probe[0] == _PEER and sender != probe[1]):
            # Reached; or the lost peer's address now belongs to someone else.
            self._end_probe(probe)

    def introduced_peers(self) -> frozenset[str]:
        """The linked peers whose hello or welcome has arrived on their current link."""
        return frozenset(name for name, link in self._links.items() if link.introduced)

    def _reached(self, advert: PeerAdvert) -> str:
        """The peer of ``advert`` joined: stop trying to reach it. Returns a note for the
        log line."""
        name = advert.name
        self._end_probe((_PEER, name))
        self._name_seeds(advert)
        for seed, seed_name in self._seed_names.items():
            if seed_name == name:
                self._end_probe((_SEED, seed))
        lost_at = self._lost_at.pop(name, None)
        if lost_at is None:
            return ""
        return f" (back after {time.monotonic() - lost_at:.1f}s)"

    def _name_seeds(self, advert: PeerAdvert) -> None:
        """Name the unnamed seeds at the address ``advert`` gives for its ROUTER.

        A seed is usually named by the welcome that comes back on its probe, but the
        peer's own hello can make it join first, and that welcome is lost when the probe
        is replaced before it arrives: without a name, the seed would not be tried
        again when its agent leaves.
        """
        for seed in self._config.seeds:
            if seed in self._seed_names:
                continue
            _, host, port = split_seed(seed)
            if port == advert.router_port and host.strip("[]") in advert.addresses:
                self._seed_names[seed] = advert.name

    def _lost(self, peer: PeerInfo, reason: str) -> str:
        """``peer`` left for ``reason``: try its seeds again, or its last advert if it
        expired. Returns a note for the log line."""
        if reason in _NO_RECONTACT or self._closed():
            return ""
        now = time.monotonic()
        seeds = [seed for seed, name in self._seed_names.items() if name == peer.name]
        for seed in seeds:
            self._recontact.start((_SEED, seed), None, now, pinned=True)
        if not seeds:
            if reason != "expired":
                return ""  # a goodbye: it left on purpose, and says hello when back
            for old in self._recontact.start((_PEER, peer.name), peer.advert, now):
                self._net.close_probe(old)
                self._lost_at.pop(old[1], None)
        self._lost_at[peer.name] = now
        return f"; trying it again every {self._config.recontact_max:g}s at most"

    def _warn_skew(self, peer: PeerInfo) -> None:
        level = logging.DEBUG if peer.name in self._skew_warned else logging.WARNING
        if len(self._skew_warned) < 10_000:
            self._skew_warned.add(peer.name)
        log.log(level, "peer %s: its clock is %+.1fs from ours, beyond max_clock_skew "
                "(%gs): its messages are still handled but its time is not adopted; fix "
                "its clock (NTP)", peer.name, peer.clock_skew_ms / 1000,
                self._config.max_clock_skew)
