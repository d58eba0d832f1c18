"""An in-memory wire between mesh endpoints on a virtual clock (no sockets).

In the spirit of h11's ``ConnectionPair`` and aioquic's ``transfer()``: each
:class:`~porter_mesh.core.session.endpoint.Endpoint` returns actions, and the wire carries
them out the way the node would -- frames go into flight, journal writes go to a list
that outlives a restart (the "disk"), deliveries, settlements, failures and counters are
recorded -- so that a test can see the whole exchange and interfere with it: drop,
duplicate, delay or reorder any frame in flight, fill the disk, shrink an inbox, pause an
endpoint, restart one with a new incarnation.

The clock is virtual: :meth:`Wire.run` jumps from event to event (the next frame's
arrival or the next endpoint deadline), never sleeping.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from porter_mesh.core.advert import PeerAdvert
from porter_mesh.core.constants import PROTOCOL_VERSION
from porter_mesh.core.session.endpoint import (
    AckFrame,
    Action,
    BroadcastFrame,
    ByeFrame,
    Count,
    Deliver,
    DirectFrame,
    Endpoint,
    Fail,
    Frame,
    HeartbeatFrame,
    Journal,
    PeerChanged,
    SendFrame,
    Settle,
)

#: Wall clock at virtual time 0 (idempotency keys use wall time).
WALL0 = 1_800_000_000.0

SETTINGS = dict(retry_initial=0.2, retry_max=2.0, max_pending=64, key_window=60.0,
                evasive_after=3.0, expire_after=8.0, heartbeat_interval=1.0)


def advert(name: str, incarnation: int, role: str = "worker") -> PeerAdvert:
    return PeerAdvert(name=name, role=role, mesh="m", pub_port=5000, router_port=5001,
                      version=PROTOCOL_VERSION, incarnation=incarnation,
                      addresses=("127.0.0.1",))


@dataclass(order=True)
class InFlight:
    """A frame on its way to ``dest``, arriving at ``at``."""

    at: float
    tie: int
    dest: str = field(compare=False)
    frame: Frame = field(compare=False)


@dataclass
class Side:
    """What the wire keeps for one endpoint name across its incarnations."""

    endpoint: Endpoint[int]
    journal: list[tuple[DirectFrame, float]] = field(default_factory=list)
    delivered: list[DirectFrame | BroadcastFrame] = field(default_factory=list)
    counters: Counter[str] = field(default_factory=Counter)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    trace: list[Action[int]] = field(default_factory=list)
    disk_full: bool = False
    room: int | None = None
    paused: bool = False
    restarts: int = 0


class Wire:
    """Endpoints joined by a lossy, reorderable in-memory network.

    Args:
        names: the endpoints to create (each says hello to the others at once).
        latency: seconds a frame takes on the wire.
        journal: whether the endpoints journal what they receive.
        fault: called for every frame put on the wire; returns the delays of its
            copies (``[]`` drops it, two values duplicate it). Default: one copy after
            ``latency``.
        roles: an endpoint's role when not ``worker``.
        overrides: endpoint settings other than :data:`SETTINGS`.
    """

    def __init__(self, *names: str, latency: float = 0.01, journal: bool = True,
                 fault: Callable[[str, Frame], list[float]] | None = None,
                 roles: dict[str, str] | None = None, **overrides: float) -> None:
        self.now = 0.0
        self.latency = latency
        self.journal = journal
        self.fault = fault
        self.roles = roles or {}
        self.settings = {**SETTINGS, **overrides}
        self.in_flight: list[InFlight] = []
        self._tie = itertools.count()
        self._tokens = itertools.count(1)
        self._incarnations = itertools.count(0x1000)
        self.sides: dict[str, Side] = {}
        # Completion tokens as their sender resolved them, in order.
        self.settled: list[int] = []
        self.failed: list[tuple[int, str]] = []
        self.tokens: dict[int, str] = {}  # token -> sending endpoint name
        # Acknowledgements sent before their message was journaled (must stay empty).
        self.acked_unjournaled: list[tuple[str, DirectFrame]] = []
        for name in names:
            self.sides[name] = Side(self._endpoint(name))
        for name in names:
            self._say_hello(name)

    # -- building ---------------------------------------------------------------------

    @property
    def wall(self) -> float:
        return WALL0 + self.now

    def _endpoint(self, name: str) -> Endpoint[int]:
        return Endpoint(advert(name, next(self._incarnations), self.roles.get(name, "worker")),
                        journal=self.journal, now=self.now, **self.settings)  # type: ignore[arg-type]

    def _say_hello(self, name: str) -> None:
        endpoint = self.sides[name].endpoint
        for other in self.sides:
            if other != name:
                self.carry(name, endpoint.hello(other))

    def endpoint(self, name: str) -> Endpoint[int]:
        return self.sides[name].endpoint

    def restart(self, name: str) -> None:
        """Kill ``name`` and start it again: a new incarnation that keeps its journal
        (the disk) and says hello to everyone."""
        side = self.sides[name]
        for entry in side.endpoint.outbox.fail_all():
            # The process died: its callers are gone with it.
            for token in entry.token.tokens:
                self._resolve(token, failed="killed")
        side.endpoint = self._endpoint(name)
        side.endpoint.restore(side.journal)
        side.restarts += 1
        side.paused = False
        self._say_hello(name)

    def pause(self, name: str) -> None:
        """Stop ``name`` (SIGSTOP): it reads nothing and its timer does not fire."""
        self.sides[name].paused = True

    def resume(self, name: str) -> None:
        """Continue ``name``; like the node after a pause, it re-introduces itself."""
        self.sides[name].paused = False
        self._say_hello(name)

    # -- acting -----------------------------------------------------------------------

    def send(self, src: str, dst: str, payload: bytes = b"x", *, timeout: float = 10.0,
             key: str | None = None, count: int = 1) -> int:
        """Send a direct message; returns its completion token."""
        token = next(self._tokens)
        self.tokens[token] = src
        self.carry(src, self.endpoint(src).send(dst, payload, now=self.now,
                                                deadline=self.now + timeout, token=token,
                                                count=count, key=key))
        return token

    def broadcast(self, src: str, channel: str = "log", payload: bytes = b"b") -> None:
        self.carry(src, self.endpoint(src).broadcast(channel, payload))

    def carry(self, name: str, actions: list[Action[int]],
              received: Frame | None = None) -> None:
        """Carry out ``name``'s actions in order, as the node does."""
        side = self.sides[name]
        for action in actions:
            side.trace.append(action)
            if isinstance(action, SendFrame):
                self._put(name, action.frame)
            elif isinstance(action, Journal):
                if side.disk_full:
                    # The write fails: nothing after it is carried out.
                    self.carry(name, side.endpoint.journal_failed(action.frame))
                    return
                side.journal.append((action.frame, self.wall))
            elif isinstance(action, Deliver):
                side.delivered.append(action.frame)
            elif isinstance(action, Settle):
                for token in action.tokens:
                    self._resolve(token)
            elif isinstance(action, Fail):
                for token in action.tokens:
                    self._resolve(token, failed=action.reason)
            elif isinstance(action, Count):
                side.counters[action.name] += action.n
            elif isinstance(action, PeerChanged):
                event = action.event
                side.events.append((event.kind.value, event.peer.name, event.reason))
            if (isinstance(action, SendFrame) and isinstance(action.frame, AckFrame)
                    and isinstance(received, DirectFrame) and self.journal
                    and not self._on_record(side, received)):
                self.acked_unjournaled.append((name, received))

    @staticmethod
    def _on_record(side: Side, frame: DirectFrame) -> bool:
        """Whether ``frame`` (or, for a keyed one, a message with its key) is journaled."""
        keyed = frame.msg_id.startswith("k:")
        return any(f == frame or (keyed and f.sender == frame.sender and f.msg_id == frame.msg_id)
                   for f, _ in side.journal)

    def _resolve(self, token: int, failed: str | None = None) -> None:
        if failed is None:
            self.settled.append(token)
        else:
            self.failed.append((token, failed))

    def _put(self, src: str, frame: Frame) -> None:
        if isinstance(frame, BroadcastFrame | HeartbeatFrame | ByeFrame):
            dests = [n for n in self.sides if n != src]
        else:
            dests = [frame.recipient]
        for dest in dests:
            delays = [self.latency] if self.fault is None else self.fault(dest, frame)
            for delay in delays:
                self.in_flight.append(InFlight(self.now + delay, next(self._tie), dest, frame))

    # -- time -------------------------------------------------------------------------

    def arrive(self, item: InFlight) -> None:
        """Hand one frame in flight to its endpoint now (whatever its arrival time)."""
        self.in_flight.remove(item)
        side = self.sides[item.dest]
        if side.paused:
            return  # a stopped process reads nothing; its socket drops it here
        self.carry(item.dest, side.endpoint.receive(item.frame, now=self.now, wall=self.wall,
                                                    room=side.room),
                   received=item.frame)

    def run(self, until: float) -> None:
        """Advance the virtual clock to ``until``, delivering frames and firing timers
        in time order."""
        while True:
            due_frame = min(self.in_flight, default=None)
            timers = [(side.endpoint.next_deadline(), name)
                      for name, side in self.sides.items() if not side.paused]
            due_timer = min(timers, default=(float("inf"), ""))
            at = min(due_frame.at if due_frame else float("inf"), due_timer[0])
            if at > until:
                self.now = until
                return
            self.now = max(self.now, at)
            if due_frame is not None and due_frame.at <= due_timer[0]:
                self.arrive(due_frame)
            else:
                name = due_timer[1]
                self.carry(name, self.sides[name].endpoint.timer(self.now))

    def advance(self, seconds: float) -> None:
        self.run(self.now + seconds)

    # -- looking ----------------------------------------------------------------------

    def direct_delivered(self, name: str) -> list[tuple[str, int, int]]:
        """(sender, incarnation, seq) of each direct message ``name`` delivered."""
        return [(f.sender, f.incarnation, f.seq) for f in self.sides[name].delivered
                if isinstance(f, DirectFrame)]

    def outcome(self, token: int) -> list[str]:
        """How ``token`` was resolved: ``"settled"`` and/or failure reasons, in order."""
        return (["settled"] * self.settled.count(token)
                + [reason for t, reason in self.failed if t == token])
