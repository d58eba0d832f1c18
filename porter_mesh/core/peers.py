"""Peer liveness: the roster of a node and its state machine.

Theory of operation
-------------------
A node learns of peers from discovery adverts (mDNS), from ``hello`` messages (static
seeds and peer exchange), and from traffic. It never trusts mDNS for liveness: a killed
process sends no goodbye. Liveness comes from hearing the peer (heartbeats or any other
message) on the monotonic clock:

    (unknown) --found--> ALIVE --quiet > evasive_after--> EVASIVE --quiet > expire_after--> gone
                          ^  |  ^                              |
               heard in   |  |  +----------- heard ------------+
               bound      |  | heard beyond the clock bound
                          |  v
                        CLOCK_SKEW --quiet > evasive_after--> EVASIVE

CLOCK_SKEW is a live peer whose hybrid-clock timestamps are further from our wall clock
than the node's ``max_clock_skew`` (see :mod:`porter_mesh.core.hlc`). Its messages are
handled like anyone's; only its clock is not adopted. The state is there to be seen
(``porter-mesh peers``) and is left as soon as a timestamp within the bound arrives.

A peer is identified by its agent name *and* its incarnation (random per process start).
A new incarnation under a known name is a restart: the old peer leaves (reason
``"restarted"``) and a new one joins, so nothing of the old process is attributed to the
new one. A message from an incarnation older than the one we hold is stale and ignored.
A graceful leave removes the peer at once (reason ``"goodbye"``).

Re-contact. A peer that expired may only be on the other side of a partition, and a
static seed may be down for a while; neither must be given up, however long it lasts.
:class:`Recontact` is the schedule for trying them again: capped exponential backoff
with jitter (``initial``, doubling, at most ``cap`` seconds apart), per target, until
the caller reports the target reached. It holds a bounded number of targets (the oldest
unpinned one goes first; seeds are pinned) and costs nothing between attempts: the
caller asks for :meth:`Recontact.due` targets only when :attr:`Recontact.next_due` has
passed.

This module is pure: every method takes ``now`` (monotonic seconds) and returns the
events it caused; the node turns them into socket connects/disconnects and callbacks.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from porter_mesh.core.advert import PeerAdvert

__all__ = ["MAX_RECONTACTS", "PeerEvent", "PeerEventKind", "PeerInfo", "PeerState",
           "PeerTable", "Recontact"]

#: Most targets a :class:`Recontact` schedule holds besides its pinned ones.
MAX_RECONTACTS = 256


class PeerState(enum.Enum):
    """Liveness of a peer as this node sees it."""

    ALIVE = "alive"
    EVASIVE = "evasive"
    EXPIRED = "expired"
    #: Alive, but its clock is beyond the bound the node adopts (see the module docstring).
    CLOCK_SKEW = "clock-skew"


class PeerEventKind(enum.Enum):
    """What happened to a peer."""

    JOINED = "joined"
    EVASIVE = "evasive"
    ALIVE = "alive"  # back from evasive or from clock-skew
    LEFT = "left"
    CLOCK_SKEW = "clock-skew"  # its clock went beyond the bound
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
    #: While CLOCK_SKEW: how far (ms) its last timestamp was from our wall clock.
    clock_skew_ms: int = 0

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
            dict(self.last_seqs), self.clock_skew_ms,
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

    def heard(self, name: str, incarnation: int, now: float,
              skew_ms: int | None = None) -> tuple[bool, list[PeerEvent]]:
        """Traffic arrived from ``name``/``incarnation``.

        Args:
            skew_ms: ``None`` when the message's timestamp was within the clock bound;
                else its offset from our wall clock (:meth:`HybridClock.receive
                <porter_mesh.core.hlc.HybridClock.receive>` returns exactly this).

        Returns ``(known, events)``: ``known`` is False when the name or incarnation is
        not in the roster (the caller should ask that peer for a hello, not trust it).
        """
        info = self._peers.get(name)
        if info is None or info.advert.incarnation != incarnation:  # (every message)
            return False, []
        info.last_heard = now
        if skew_ms is None:
            if info.state is PeerState.ALIVE:
                return True, []
            info.state = PeerState.ALIVE
            info.clock_skew_ms = 0
            return True, [PeerEvent(PeerEventKind.ALIVE, info)]
        info.clock_skew_ms = skew_ms
        if info.state is PeerState.CLOCK_SKEW:
            return True, []
        info.state = PeerState.CLOCK_SKEW
        return True, [PeerEvent(PeerEventKind.CLOCK_SKEW, info)]

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
            elif quiet >= self.evasive_after and info.state is not PeerState.EVASIVE:
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


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(slots=True)
class _Attempts(Generic[V]):
    value: V
    since: float
    due: float
    delay: float
    attempts: int = 0
    pinned: bool = False


class Recontact(Generic[K, V]):
    """When to try lost targets again (see "Re-contact" in the module docstring).

    A target is a key (what the caller tries: a seed, a peer's name) with a value the
    caller keeps with it (the peer's last advert). The first attempt is due when
    :meth:`start` says; after it the gaps are ``initial``, ``2 * initial``, ``4 *
    initial``... up to ``cap``, each less up to ``jitter`` of itself at random (so nodes
    that lost each other at once do not knock in step, and no gap exceeds ``cap``).

    Args:
        initial: seconds before the second attempt (the node uses its heartbeat interval).
        cap: most seconds between attempts.
        limit: most unpinned targets; starting one more forgets the oldest.
        jitter: fraction of each delay taken off at random, in ``[0, 1)``.
        rand: the random source (``random.random`` by default; tests pass their own).
    """

    def __init__(self, *, initial: float, cap: float, limit: int = MAX_RECONTACTS,
                 jitter: float = 0.25, rand: Callable[[], float] = random.random) -> None:
        if not 0 < initial <= cap:
            raise ValueError("need 0 < initial <= cap")
        if not 0 <= jitter < 1 or limit < 0:
            raise ValueError("need 0 <= jitter < 1 and limit >= 0")
        self.initial = initial
        self.cap = cap
        self.limit = limit
        self.jitter = jitter
        self._rand = rand
        self._targets: dict[K, _Attempts[V]] = {}
        #: No attempt is due before this (monotonic seconds); ``inf`` when none waits.
        self.next_due = float("inf")

    def __len__(self) -> int:
        return len(self._targets)

    def __contains__(self, key: object) -> bool:
        return key in self._targets

    def start(self, key: K, value: V, now: float, *, delay: float | None = None,
              pinned: bool = False) -> list[K]:
        """Begin trying ``key`` (first attempt ``delay`` seconds from now, default
        ``initial``). A target already being tried keeps its schedule; its value is
        replaced.

        Returns:
            The targets forgotten to stay within ``limit`` (oldest unpinned first).
        """
        current = self._targets.get(key)
        if current is not None:
            current.value = value
            current.pinned = current.pinned or pinned
            return []
        due = now + (self.initial if delay is None else delay)
        self._targets[key] = _Attempts(value, now, due, self.initial, pinned=pinned)
        self.next_due = min(self.next_due, due)
        forgotten: list[K] = []
        unpinned = [k for k, a in self._targets.items() if not a.pinned]
        for old in unpinned[:max(0, len(unpinned) - self.limit)]:
            del self._targets[old]
            forgotten.append(old)
        return forgotten

    def stop(self, key: K) -> tuple[float, int] | None:
        """``key`` was reached (or is no longer wanted): stop trying it.

        Returns:
            ``(since, attempts)``: when trying began and how many attempts were due; or
            ``None`` when ``key`` was not being tried.
        """
        gone = self._targets.pop(key, None)
        return None if gone is None else (gone.since, gone.attempts)

    def restart(self, now: float) -> None:
        """Make every target due now, with its backoff reset (e.g. the trusted keys
        changed, so an attempt refused before may succeed)."""
        for attempts in self._targets.values():
            attempts.due = now
            attempts.delay = self.initial
        if self._targets:
            self.next_due = now

    def due(self, now: float) -> list[tuple[K, V]]:
        """The targets whose attempt is due; each is rescheduled with a longer delay.

        Cheap when nothing is due: callers may ask on every timer tick.
        """
        if now < self.next_due:
            return []
        out = []
        next_due = float("inf")
        for key, attempts in self._targets.items():
            if attempts.due <= now:
                out.append((key, attempts.value))
                attempts.attempts += 1
                attempts.due = now + attempts.delay * (1 - self.jitter * self._rand())
                attempts.delay = min(self.cap, attempts.delay * 2)
            next_due = min(next_due, attempts.due)
        self.next_due = next_due
        return out
