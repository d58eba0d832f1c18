"""Peer liveness: the roster of a node and its state machine.

Theory of operation
-------------------
A node learns of peers from discovery adverts (mDNS), from ``hello`` messages (static
seeds and peer exchange), and from traffic. It never trusts mDNS for liveness: a killed
process sends no goodbye. Liveness comes from hearing the peer (heartbeats or any other
message) on the monotonic clock:

    (unknown) --found--> ALIVE --quiet > evasive_after--> EVASIVE --quiet > expire_after--> gone
                           ^                                 |
                           +------------- heard -------------+

A peer is identified by its agent name *and* its incarnation (random per process start).
A new incarnation under a known name is a restart: the old peer leaves (reason
``"restarted"``) and a new one joins, so nothing of the old process is attributed to the
new one. A message from an incarnation older than the one we hold is stale and ignored.
A graceful leave removes the peer at once (reason ``"goodbye"``).

This module is pure: every method takes ``now`` (monotonic seconds) and returns the
events it caused; the node turns them into socket connects/disconnects and callbacks.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field

from porter_mesh.core.advert import PeerAdvert

__all__ = ["PeerEvent", "PeerEventKind", "PeerInfo", "PeerState", "PeerTable"]


class PeerState(enum.Enum):
    """Liveness of a peer as this node sees it."""

    ALIVE = "alive"
    EVASIVE = "evasive"
    EXPIRED = "expired"


class PeerEventKind(enum.Enum):
    """What happened to a peer."""

    JOINED = "joined"
    EVASIVE = "evasive"
    ALIVE = "alive"  # back from evasive
    LEFT = "left"
    UPDATED = "updated"  # same incarnation, new advert details


@dataclass(slots=True)
class PeerInfo:
    """One roster entry. Mutable inside the table; callers get copies via ``snapshot``."""

    advert: PeerAdvert
    state: PeerState
    joined_at: float
    last_heard: float
    draining: bool = False
    #: Last sequence per channel the peer said it sent (from heartbeats).
    last_seqs: dict[str, int] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.advert.name

    @property
    def incarnation(self) -> int:
        return self.advert.incarnation

    def copy(self) -> PeerInfo:
        """An independent copy, safe to hand to other threads."""
        return PeerInfo(
            self.advert, self.state, self.joined_at, self.last_heard, self.draining,
            dict(self.last_seqs),
        )


@dataclass(frozen=True, slots=True)
class PeerEvent:
    """A change in the roster. ``reason`` explains LEFT (``expired``, ``goodbye``,
    ``restarted``, ``lost``) and is empty otherwise."""

    kind: PeerEventKind
    peer: PeerInfo
    reason: str = ""


class PeerTable:
    """The roster, keyed by agent name.

    Args:
        evasive_after: seconds of silence after which a peer is EVASIVE.
        expire_after: seconds of silence after which a peer is removed (LEFT, ``expired``).
    """

    def __init__(self, *, evasive_after: float, expire_after: float) -> None:
        if not 0 < evasive_after < expire_after:
            raise ValueError("need 0 < evasive_after < expire_after")
        self.evasive_after = evasive_after
        self.expire_after = expire_after
        self._peers: dict[str, PeerInfo] = {}

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, name: object) -> bool:
        return name in self._peers

    def __iter__(self) -> Iterator[PeerInfo]:
        return iter(list(self._peers.values()))

    def get(self, name: str) -> PeerInfo | None:
        """The live entry for ``name``, or ``None``."""
        return self._peers.get(name)

    def snapshot(self) -> list[PeerInfo]:
        """Copies of every entry, sorted by name."""
        return [p.copy() for _, p in sorted(self._peers.items())]

    def found(self, advert: PeerAdvert, now: float) -> list[PeerEvent]:
        """An advert arrived (mDNS, hello, or peer exchange).

        Returns JOINED for a new name; LEFT(restarted)+JOINED for a newer incarnation;
        UPDATED when details changed; nothing for a repeat or a stale incarnation.
        """
        current = self._peers.get(advert.name)
        if current is None:
            info = PeerInfo(advert, PeerState.ALIVE, now, now)
            self._peers[advert.name] = info
            return [PeerEvent(PeerEventKind.JOINED, info)]
        if advert.incarnation != current.incarnation:
            return self._restart(current, advert, now)
        if advert != current.advert:
            current.advert = advert
            return [PeerEvent(PeerEventKind.UPDATED, current)]
        return []

    def _restart(self, current: PeerInfo, advert: PeerAdvert, now: float) -> list[PeerEvent]:
        del self._peers[current.name]
        current.state = PeerState.EXPIRED
        info = PeerInfo(advert, PeerState.ALIVE, now, now)
        self._peers[advert.name] = info
        return [
            PeerEvent(PeerEventKind.LEFT, current, "restarted"),
            PeerEvent(PeerEventKind.JOINED, info),
        ]

    def heard(self, name: str, incarnation: int, now: float) -> tuple[bool, list[PeerEvent]]:
        """Traffic arrived from ``name``/``incarnation``.

        Returns ``(known, events)``: ``known`` is False when the name or incarnation is
        not in the roster (the caller should ask that peer for a hello, not trust it).
        """
        info = self._peers.get(name)
        if info is None or info.incarnation != incarnation:
            return False, []
        info.last_heard = now
        if info.state is PeerState.EVASIVE:
            info.state = PeerState.ALIVE
            return True, [PeerEvent(PeerEventKind.ALIVE, info)]
        return True, []

    def left(self, name: str, incarnation: int, reason: str = "goodbye") -> list[PeerEvent]:
        """The peer said goodbye (or was removed for ``reason``)."""
        info = self._peers.get(name)
        if info is None or info.incarnation != incarnation:
            return []
        del self._peers[name]
        info.state = PeerState.EXPIRED
        return [PeerEvent(PeerEventKind.LEFT, info, reason)]

    def tick(self, now: float) -> list[PeerEvent]:
        """Advance time: mark silent peers EVASIVE, remove long-silent ones."""
        events: list[PeerEvent] = []
        for name, info in list(self._peers.items()):
            quiet = now - info.last_heard
            if quiet >= self.expire_after:
                del self._peers[name]
                info.state = PeerState.EXPIRED
                events.append(PeerEvent(PeerEventKind.LEFT, info, "expired"))
            elif quiet >= self.evasive_after and info.state is PeerState.ALIVE:
                info.state = PeerState.EVASIVE
                events.append(PeerEvent(PeerEventKind.EVASIVE, info))
        return events

    def shift_clock(self, delta: float) -> None:
        """Forgive a pause of this process of ``delta`` seconds (e.g. SIGSTOP).

        While this process was stopped nobody could be heard; counting that time as the
        peers' silence would expire everyone at once on resume.
        """
        for info in self._peers.values():
            info.last_heard += delta
