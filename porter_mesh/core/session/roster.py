"""The roster as one pure unit: which adverts a node accepts, and what each change of
the roster asks of the node (connect, disconnect, forget a stream, fail a seat's sends).

Theory of operation
-------------------
A node hears of peers from discovery (mDNS), from hellos and welcomes (the sender's own
advert, first-hand, and the peers it knows, hearsay) and from traffic. Every advert is
vetted before the roster sees it:

::

    found(advert, verified, trust)
        other mesh, or this node's own name          --> []              (not ours)
        another protocol version                      --> [Drop(version)]
        no address                                    --> [Drop(bad-advert)]
        secured, and the trusted directory objects    --> [Refuse(event)]  (audited)
        secured, hearsay that would move a live peer  --> [Drop(unverified-advert)]
        else PeerTable.found --> events --> actions (below)

    JOINED   --> [Connect(advert), SendFrame(resend)..., PeerChanged]
    LEFT     --> [Disconnect(name), Fail(left)... (a seat's goodbye),
                  Forget(name) (restarted: its streams start over), PeerChanged]
    UPDATED  --> [Reconnect(advert), SendFrame(resend)...] when its addresses or key
                 moved from those of its link, then [PeerChanged]
    others   --> [PeerChanged]

A :class:`Connect` asks the driver to open the link and introduce this node on it (its
hello goes first, so the peer knows this node before anything else arrives); the resends
that follow come from the :class:`~.sending.Sender`, so whatever waited for the peer
goes to the new link at once. The roster remembers the advert of each link it asked for;
the driver reports the links it closes on its own (a refusal, a revoked key) with
:meth:`Roster.unlinked`.

The trusted directory is passed in as a :class:`TrustView` (what the rule asks of it,
nothing more): the rule does not read keys from disk. Only the peer itself, over its
authenticated connection, may move a live peer to another incarnation, address or key;
anyone can send mDNS or repeat a public key.

Pure: no sockets, no event loop, no clock; ``now`` is monotonic seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from porter_mesh.core.advert import PeerAdvert
from porter_mesh.core.constants import PROTOCOL_VERSION
from porter_mesh.core.peers import PeerEvent, PeerEventKind, PeerInfo, PeerTable
from porter_mesh.core.session.sending import SendAction, Sender

#: Most peers whose goodbye the roster remembers (see Roster._gone).
_MAX_GONE = 1024

__all__ = ["Connect", "Disconnect", "Drop", "Forget", "PeerChanged", "Reconnect", "Refuse",
           "Roster", "RosterAction", "TrustView", "vet_advert"]

T = TypeVar("T")


class TrustView(Protocol):
    """What the advert rule asks of a secured node's trusted directory."""

    def advert_problem(self, advert: PeerAdvert) -> tuple[str, str] | None:
        """``(event, detail)`` when ``advert``'s key is not trusted for its name."""


# -- actions --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Connect:
    """Open a link to ``advert`` (subscribe to its PUB, a DEALER to its ROUTER) and say
    hello on it."""

    advert: PeerAdvert


@dataclass(frozen=True, slots=True)
class Reconnect:
    """The peer moved (address or key): close its link and open one to ``advert``."""

    advert: PeerAdvert


@dataclass(frozen=True, slots=True)
class Disconnect:
    """Close the link to ``name``."""

    name: str


@dataclass(frozen=True, slots=True)
class Forget:
    """``name`` restarted: its direct and broadcast streams start over."""

    name: str


@dataclass(frozen=True, slots=True)
class PeerChanged:
    """The roster changed (the driver counts it, logs it and tells listeners)."""

    event: PeerEvent


@dataclass(frozen=True, slots=True)
class Drop:
    """An advert was ignored for ``reason`` (counted, logged once per peer)."""

    reason: str
    peer: str
    detail: str


@dataclass(frozen=True, slots=True)
class Refuse:
    """A secured node must not accept this advert: count it and audit ``event``."""

    event: str
    peer: str
    detail: str
    key: str | None


RosterAction = Connect | Reconnect | Disconnect | Forget | PeerChanged | Drop | Refuse


def _moved(old: PeerAdvert, new: PeerAdvert) -> bool:
    return (old.endpoint_pub() != new.endpoint_pub()
            or old.endpoint_router() != new.endpoint_router()
            or old.public_key != new.public_key)


def vet_advert(advert: PeerAdvert, *, mesh: str, own_name: str, current: PeerInfo | None,
               verified: bool, trust: TrustView | None) -> list[RosterAction] | None:
    """Whether a node accepts ``advert``.

    Args:
        advert: what arrived.
        mesh: this node's mesh.
        own_name: this node's name.
        current: the roster's entry under that name, if any.
        verified: the advert is first-hand, from that peer over an authenticated
            connection (only a secured node tells the difference).
        trust: a secured node's trusted directory; None on an unsecured node.

    Returns:
        None when the advert is accepted; else what to do instead (possibly nothing).
    """
    if advert.mesh != mesh or advert.name == own_name:
        return []
    if advert.version != PROTOCOL_VERSION:
        return [Drop("version", advert.name,
                     f"peer {advert.name} speaks protocol version {advert.version}, not "
                     f"{PROTOCOL_VERSION}; upgrade one side")]
    if not advert.addresses:
        return [Drop("bad-advert", advert.name, f"advert of {advert.name} has no address")]
    if trust is None:
        return None
    problem = trust.advert_problem(advert)
    if problem is not None:
        return [Refuse(problem[0], advert.name, problem[1], advert.public_key)]
    if (not verified and current is not None
            and (current.incarnation != advert.incarnation or _moved(current.advert, advert))):
        # A genuine restart or move says hello itself, over its own connection.
        return [Drop("unverified-advert", advert.name,
                     f"ignored a second-hand advert that would move live peer {advert.name}")]
    return None


class Roster(Generic[T]):
    """A node's peers and what their changes ask of it.

    Args:
        name: this node's name.
        mesh: this node's mesh.
        sending: this node's sending side (resends to a new link, a seat's sends failed).
        evasive_after, expire_after: peer silence bounds (:class:`PeerTable`).
    """

    def __init__(self, name: str, mesh: str, sending: Sender[T], *, evasive_after: float,
                 expire_after: float) -> None:
        self.name = name
        self.mesh = mesh
        self.sending = sending
        self.peers = PeerTable(evasive_after=evasive_after, expire_after=expire_after)
        # The advert each link was opened with (what Connect and Reconnect asked for).
        self._linked: dict[str, PeerAdvert] = {}
        # The incarnation of each peer that said goodbye: that process is ending, so an
        # advert of it that comes later (a welcome or a heartbeat read after the goodbye
        # on another socket, an mDNS cache, another peer's hearsay) must not bring it
        # back. A new process has a new incarnation. Bounded, oldest forgotten first.
        self._gone: dict[str, int] = {}

    def found(self, advert: PeerAdvert, now: float, *, verified: bool = False,
              trust: TrustView | None = None) -> list[RosterAction | SendAction[T]]:
        """An advert arrived (see :func:`vet_advert` for ``verified`` and ``trust``).

        Returns:
            What to do, in order.
        """
        refused = vet_advert(advert, mesh=self.mesh, own_name=self.name,
                             current=self.peers.get(advert.name), verified=verified,
                             trust=trust)
        if refused is not None:
            return list(refused)
        if self._gone.get(advert.name) == advert.incarnation:
            return []
        return self.apply(self.peers.found(advert, now), now)

    def heard(self, name: str, incarnation: int, now: float, skew_ms: int | None = None
              ) -> tuple[bool, list[RosterAction | SendAction[T]]]:
        """Traffic arrived from ``name`` (:meth:`PeerTable.heard`).

        Returns:
            Whether the sender is on the roster, and what its changes ask.
        """
        known, events = self.peers.heard(name, incarnation, now, skew_ms)
        return known, (self.apply(events, now) if events else [])

    def left(self, name: str, incarnation: int, now: float,
             reason: str = "goodbye") -> list[RosterAction | SendAction[T]]:
        """``name`` left: a goodbye, or the node cut it off (``reason``)."""
        return self.apply(self.peers.left(name, incarnation, reason), now)

    def tick(self, now: float) -> list[RosterAction | SendAction[T]]:
        """The peers' silence checked at ``now`` (once a heartbeat, half a beat after it)."""
        return self.apply(self.peers.tick(now), now)

    def unlinked(self, name: str) -> None:
        """The driver closed the link to ``name`` on its own (a refusal, a revoked key)."""
        self._linked.pop(name, None)

    def apply(self, events: Iterable[PeerEvent],
              now: float) -> list[RosterAction | SendAction[T]]:
        """What ``events`` of the roster ask of the node, in order (see the module
        docstring); ``PeerChanged`` comes last for each event, once it is carried out."""
        actions: list[RosterAction | SendAction[T]] = []
        for event in events:
            peer = event.peer
            name = peer.name
            if event.kind is PeerEventKind.JOINED:
                self._gone.pop(name, None)
                self._linked[name] = peer.advert
                actions.append(Connect(peer.advert))
                actions += self.sending.joined(name, now)
            elif event.kind is PeerEventKind.LEFT:
                if self._linked.pop(name, None) is not None:
                    actions.append(Disconnect(name))
                actions += self.sending.left(name, peer.advert.role, event.reason)
                if event.reason == "restarted":
                    actions.append(Forget(name))
                elif event.reason == "goodbye":
                    if len(self._gone) >= _MAX_GONE and name not in self._gone:
                        del self._gone[next(iter(self._gone))]
                    self._gone[name] = peer.incarnation
            elif event.kind is PeerEventKind.UPDATED:
                old = self._linked.get(name)
                if old is not None and _moved(old, peer.advert):
                    self._linked[name] = peer.advert
                    actions.append(Reconnect(peer.advert))
                    actions += self.sending.joined(name, now)
            actions.append(PeerChanged(event))
        return actions
