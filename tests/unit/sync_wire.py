"""An in-memory wire between knowledge sync sessions on a virtual clock (no sockets).

Each node is a :class:`~porter_mesh.core.session.sync.SyncSession` over a real
:class:`~porter_mesh.adapters.shard.Shard` in a temporary directory (real disk, real
journal). The wire carries the session's actions out the way ``Knowledge`` does: sync
messages travel as bytes (``encode_sync``) and are decoded by the receiving session;
``Merge`` and ``Answer`` go to the shard and its answers go back to the session. A test
can interfere with whatever is in flight (drop, duplicate, delay, reorder), fill a
node's disk, or put a hostile peer on the wire that answers requests with whatever it is
told to.

The clock is virtual: :meth:`SyncWire.run` jumps from event to event (the next message's
arrival or the next session deadline), never sleeping.
"""

from __future__ import annotations

import itertools
import pathlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from porter_mesh.adapters.shard import Durability, Shard
from porter_mesh.core.knowledge import (
    CatchupRequest,
    Record,
    SyncMessage,
    decode_sync,
    encode_sync,
)
from porter_mesh.core.session.sync import (
    Abandoned,
    Answer,
    Broadcast,
    CaughtUp,
    Count,
    Merge,
    Progress,
    PullAnswered,
    Refuse,
    Send,
    SyncAction,
    SyncSession,
)
from porter_mesh.errors import StorageError, SyncError

SETTINGS: dict[str, Any] = dict(anti_entropy_interval=1.0, request_timeout=1.0,
                                catchup_timeout=3.0)

#: A hostile peer: given the sender and the message it received, the payloads it
#: answers with (each goes back as a direct message).
Hostile = Callable[[str, SyncMessage], list[bytes]]


@dataclass(order=True)
class InFlight:
    """A sync message on its way from ``src`` to ``dest``, arriving at ``at``."""

    at: float
    tie: int
    src: str = field(compare=False)
    dest: str = field(compare=False)
    data: bytes = field(compare=False)
    broadcast: bool = field(compare=False, default=False)
    #: Put there by the test: delivered even between nodes that are not joined.
    injected: bool = field(compare=False, default=False)

    def message(self) -> SyncMessage | None:
        try:
            return decode_sync(self.data)
        except SyncError:
            return None


@dataclass
class Node:
    """One replica on the wire: its shard, its session, and what it did."""

    shard: Shard
    session: SyncSession
    counters: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    events: list[SyncAction] = field(default_factory=list)
    trace: list[SyncAction] = field(default_factory=list)
    disk_full: bool = False


class SyncWire:
    """Sync sessions over real shards, joined by a lossy, reorderable in-memory network.

    Args:
        root: a directory for the shards.
        names: the nodes to create (each pair joined at once).
        latency: seconds a message takes on the wire.
        fault: called for every message put on the wire; returns the delays of its
            copies (``[]`` drops it, two values duplicate it). Default: one copy after
            ``latency``.
        settings: session settings other than :data:`SETTINGS`.
    """

    def __init__(self, root: pathlib.Path, *names: str, latency: float = 0.01,
                 fault: Callable[[InFlight], list[float]] | None = None,
                 **settings: Any) -> None:
        self.root = root
        self.now = 0.0
        self.latency = latency
        self.fault = fault
        self.settings = {**SETTINGS, **settings}
        self.nodes: dict[str, Node] = {}
        self.hostile: dict[str, Hostile] = {}
        self.links: set[frozenset[str]] = set()
        self.in_flight: list[InFlight] = []
        self._tie = itertools.count()
        for name in names:
            self.add(name)
        for a, b in itertools.combinations(names, 2):
            self.join(a, b)

    # -- building ---------------------------------------------------------------------

    def add(self, name: str) -> Node:
        """A new replica named ``name`` (joined to nobody yet)."""
        shard = Shard(self.root / name, agent=name, durability=Durability.OS)
        node = Node(shard, SyncSession(shard.state, now=self.now, **self.settings))
        self.nodes[name] = node
        return node

    def add_hostile(self, name: str, answer: Hostile) -> None:
        """A peer with no replica of its own that answers what it receives with ``answer``."""
        self.hostile[name] = answer

    def join(self, a: str, b: str) -> None:
        """``a`` and ``b`` see each other join (a replica's session is told)."""
        self.links.add(frozenset((a, b)))
        for me, other in ((a, b), (b, a)):
            if me in self.nodes:
                self.carry(me, self.nodes[me].session.peer_joined(other, seat=False,
                                                                  now=self.now))

    def leave(self, a: str, b: str) -> None:
        """``a`` and ``b`` lose each other (what is in flight between them is lost)."""
        self.links.discard(frozenset((a, b)))
        self.in_flight = [m for m in self.in_flight if {m.src, m.dest} != {a, b}]
        for me, other in ((a, b), (b, a)):
            if me in self.nodes:
                self.carry(me, self.nodes[me].session.peer_left(other, now=self.now))

    def close(self) -> None:
        for node in self.nodes.values():
            node.shard.close()

    # -- acting -----------------------------------------------------------------------

    def write(self, name: str, n: int = 1, prefix: str = "f") -> list[Record]:
        """``name`` stores ``n`` observations of its own and broadcasts each."""
        node = self.nodes[name]
        written = []
        for _ in range(n):
            i = node.shard.state.next_seq(name)
            record = node.shard.remember(f"urn:porter:file:{prefix}{i}", f"{name} {i}")
            written.append(record)
            self.carry(name, node.session.local_record(record))
        return written

    def inject(self, src: str, dest: str, message: SyncMessage | bytes, *,
               broadcast: bool = False) -> None:
        """Put a message from ``src`` on the wire (whether or not ``src`` would send it)."""
        data = message if isinstance(message, bytes) else encode_sync(message)
        self._put(src, dest, data, broadcast, injected=True)

    def carry(self, name: str, actions: list[SyncAction]) -> None:
        """Carry out ``name``'s actions in order, as ``Knowledge`` does."""
        node = self.nodes[name]
        session = node.session
        for action in actions:
            node.trace.append(action)
            if isinstance(action, Send):
                if frozenset((name, action.peer)) not in self.links:
                    self.carry(name, session.not_sent(action, now=self.now))
                    continue
                node.counters["sent." + type(action.message).__name__] += 1
                self._put(name, action.peer, encode_sync(action.message), False)
            elif isinstance(action, Broadcast):
                node.counters["sent.Records"] += 1
                for link in self.links:
                    if name in link:
                        (other,) = link - {name}
                        self._put(name, other, encode_sync(action.message), True)
            elif isinstance(action, Merge):
                self._merge(name, action)
            elif isinstance(action, Answer):
                request = action.request
                answer = (node.shard.answer_catchup(request)
                          if isinstance(request, CatchupRequest)
                          else node.shard.answer_pull(request))
                self.carry(name, [Send(action.peer, answer, reply=True)])
            elif isinstance(action, Count):
                node.counters[action.name] += action.n
            elif isinstance(action, Refuse):
                node.refused[action.reason] += 1
            elif isinstance(action, Progress | CaughtUp | Abandoned | PullAnswered):
                node.events.append(action)

    def _merge(self, name: str, action: Merge) -> None:
        node = self.nodes[name]
        if node.disk_full:
            node.counters["storage.write-failed"] += 1
            self.carry(name, node.session.merge_failed(action, "disk full", now=self.now))
            return
        try:
            report = node.shard.merge(action.records, after=action.after)
        except SyncError as exc:
            self.carry(name, node.session.merge_refused(action, str(exc), now=self.now))
            return
        except StorageError as exc:  # pragma: no cover - a real disk failing
            self.carry(name, node.session.merge_failed(action, str(exc), now=self.now))
            return
        node.counters["merged.records"] += report.accepted
        self.carry(name, node.session.merged(action, report.accepted, now=self.now))

    def _put(self, src: str, dest: str, data: bytes, broadcast: bool, *,
             injected: bool = False) -> None:
        item = InFlight(self.now + self.latency, next(self._tie), src, dest, data, broadcast,
                        injected)
        delays = [self.latency] if self.fault is None or injected else self.fault(item)
        for delay in delays:
            self.in_flight.append(InFlight(self.now + delay, next(self._tie), src, dest, data,
                                           broadcast, injected))

    # -- time -------------------------------------------------------------------------

    def arrive(self, item: InFlight) -> None:
        """Hand one message in flight to its destination now (whatever its arrival time)."""
        self.in_flight.remove(item)
        if frozenset((item.src, item.dest)) not in self.links and not item.injected:
            return  # the link is gone: so is the connection it travelled on
        hostile = self.hostile.get(item.dest)
        if hostile is not None:
            message = item.message()
            if message is not None:
                for data in hostile(item.src, message):
                    self._put(item.dest, item.src, data, False)
            return
        node = self.nodes[item.dest]
        self.carry(item.dest, node.session.receive(item.src, item.data,
                                                   broadcast=item.broadcast, now=self.now))

    def run(self, until: float) -> None:
        """Advance the virtual clock to ``until``, delivering messages and firing
        timers in time order."""
        for _ in range(1_000_000):
            due_item = min(self.in_flight, default=None)
            timers = [(node.session.next_deadline(), name) for name, node in self.nodes.items()]
            due_timer = min(timers, default=(float("inf"), ""))
            at = min(due_item.at if due_item else float("inf"), due_timer[0])
            if at > until:
                self.now = until
                return
            self.now = max(self.now, at)
            if due_item is not None and due_item.at <= due_timer[0]:
                self.arrive(due_item)
            else:
                name = due_timer[1]
                self.carry(name, self.nodes[name].session.timer(self.now))
        raise AssertionError("the wire never settled (a timer that fires without end?)")

    def advance(self, seconds: float) -> None:
        self.run(self.now + seconds)

    # -- looking ----------------------------------------------------------------------

    def digests(self) -> dict[str, bytes]:
        """Each replica's digest (its top hash)."""
        return {name: node.shard.digest().top for name, node in self.nodes.items()}

    def sent(self, name: str, kind: type) -> list[SyncMessage]:
        """The messages of ``kind`` that ``name`` sent, in order."""
        return [a.message for a in self.nodes[name].trace
                if isinstance(a, Send) and isinstance(a.message, kind)]
