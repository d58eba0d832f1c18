"""The knowledge replica of a node: a :class:`~porter_mesh.adapters.shard.Shard` kept in
step with the other nodes' replicas.

Theory of operation
-------------------
Replication rides on the node's extension kind ``sync`` (msgpack messages of
:mod:`porter_mesh.core.knowledge`):

* **Broadcast.** ``remember`` and ``retract`` make the record durable in the local
  shard, then broadcast it (``Records``) on ``control``; the AS2 ``Remember`` activity
  also goes out on ``log`` for people and observers. Receivers merge (set union, so
  duplicates and any order are harmless).
* **Gaps.** Records carry per-origin sequence numbers. After every merge the shard's
  version vector shows the missing ranges; each is pulled (``PullRequest``) from the
  origin when it is connected, else from any peer, over ROUTER/DEALER. Requests not
  answered in ``request_timeout`` are forgotten and asked again on the next tick.
* **Catch-up.** When a peer joins, a node asks it for everything past its own version
  vector (``CatchupRequest``), chunk by chunk, one peer at a time; progress is logged
  and counted. A late joiner or a restarted node (which first reloads its shard from
  disk) converges this way in a few large messages.
* **Anti-entropy.** Every ``anti_entropy_interval`` seconds a node sends its bucketed
  digest to one connected peer, round robin; differing buckets are listed and what is
  lacking is pulled. This repairs what sequence numbers cannot reveal, such as a lost
  last record.

Shard calls run on the node's loop thread; writes are grouped (one journal write and one
fsync per merged batch).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import pathlib
import time
from collections.abc import Callable
from typing import Any

from porter_mesh.adapters.shard import Shard
from porter_mesh.core import constants as C
from porter_mesh.core.as2 import Activity
from porter_mesh.core.envelope import KIND_SYNC, Envelope
from porter_mesh.core.knowledge import (
    CatchupChunk,
    CatchupRequest,
    PullReply,
    PullRequest,
    Record,
    Records,
    SyncMessage,
    decode_sync,
    encode_sync,
)
from porter_mesh.core.peers import PeerEvent, PeerEventKind
from porter_mesh.errors import ActivityError, KnowledgeError, PorterError
from porter_mesh.node.node import Node, Reply
from porter_mesh.tools.port import QueryResult

__all__ = ["Knowledge", "SyncKnowledge", "attach_knowledge"]

log = logging.getLogger("porter_mesh.knowledge")


def _asked_key(message: SyncMessage) -> tuple[Any, ...] | None:
    """Key matching a request with its reply."""
    if isinstance(message, PullRequest | PullReply):
        return ("pull", message.origin, message.first, message.last)
    if isinstance(message, CatchupRequest | CatchupChunk):
        return ("catchup",)
    return None


class Knowledge:
    """Keeps one node's shard converged with the mesh.

    Args:
        node: the node (started or not; :meth:`start` needs it running).
        shard: the local replica.
        anti_entropy_interval: seconds between digest comparisons.
        request_timeout: seconds before an unanswered pull or catch-up is asked again.
        drop_every: fault injection for tests: do not broadcast every k-th record (the
            receivers must repair it). 0 disables.
    """

    def __init__(self, node: Node, shard: Shard, *, anti_entropy_interval: float = 2.0,
                 request_timeout: float = 2.0, drop_every: int = 0) -> None:
        self.node = node
        self.shard = shard
        self.anti_entropy_interval = anti_entropy_interval
        self.request_timeout = request_timeout
        self.drop_every = drop_every
        self.counters: collections.Counter[str] = collections.Counter()
        self._asked: dict[tuple[str, tuple[Any, ...]], tuple[SyncMessage, float]] = {}
        self._catchup_peer: str | None = None
        self._catchup_queue: collections.deque[str] = collections.deque()
        self._caught_up: set[str] = set()
        self._rr = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._broadcasts = 0
        self.progress: tuple[int, int] | None = None
        self._listeners: list[Callable[[str, Any], None]] = []

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Hook into the node (loop thread)."""
        self.node.register_kind(KIND_SYNC, self._on_sync)
        self.node.add_peer_listener(self._on_peer)
        for peer in self.node.peers():
            self._queue_catchup(peer.name)
        self._task = asyncio.ensure_future(self._tick_loop())

    async def aclose(self) -> None:
        """Stop replicating and close the shard."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        self.shard.close()

    # -- local writes --------------------------------------------------------------------

    def async_remember(self, activity: Activity) -> Record:
        """Store the observation of a ``Remember`` activity and replicate it.

        Raises:
            KnowledgeError: the activity is not a Remember of a Note with ``about`` and
                ``content``, or the shard refused it.
        """
        obj = activity.object
        if activity.type != "Remember" or obj is None or isinstance(obj, str):
            raise KnowledgeError("remember needs a Remember activity whose object is a Note "
                                 "with 'about' and 'content'")
        about, finding = obj.about, obj.content
        if not about or not finding:
            raise KnowledgeError("the Remember's object needs both 'about' and 'content'")
        severity = obj.extra.get("severity")
        record = self.shard.remember(
            about, finding, context=activity.context,
            severity=severity if isinstance(severity, str) else None,
        )
        self._broadcast(record)
        with contextlib.suppress(KnowledgeError, ActivityError):
            self.node.async_publish(C.CHANNEL_LOG, activity)
        return record

    def async_retract(self, observation: str) -> Record:
        """Retract an observation everywhere, permanently."""
        record = self.shard.retract(observation)
        self._broadcast(record)
        return record

    def _broadcast(self, record: Record) -> None:
        self._broadcasts += 1
        if self.drop_every and self._broadcasts % self.drop_every == 0:
            self.counters["fault.dropped-broadcast"] += 1
            return
        self.node.async_publish_kind(KIND_SYNC, encode_sync(Records((record,))))
        self.counters["sent.records"] += 1

    def query(self, sparql: str) -> QueryResult:
        """Run a read-only query on the local shard, as the tools want it."""
        result = self.shard.query(sparql)
        if result.boolean is not None:
            return QueryResult(("answer",), ({"answer": str(result.boolean).lower()},), False)
        return QueryResult(result.variables, tuple(result.items()), result.truncated)

    # -- sync protocol -------------------------------------------------------------------

    def _send(self, peer: str, message: SyncMessage, reply: Reply | None = None) -> None:
        key = _asked_key(message)
        if key is not None and isinstance(message, PullRequest | CatchupRequest):
            self._asked[(peer, key)] = (message, time.monotonic())
        payload = encode_sync(message)
        if reply is not None:
            reply(KIND_SYNC, payload)
        else:
            try:
                self.node.async_send_kind(peer, KIND_SYNC, payload)
            except PorterError as exc:  # the peer left meanwhile
                if key is not None:
                    self._asked.pop((peer, key), None)
                log.debug("sync to %s not sent: %s", peer, exc)
        self.counters["sent." + type(message).__name__] += 1

    def _on_sync(self, env: Envelope, payload: bytes, reply: Reply) -> None:
        message = decode_sync(payload)
        peer = env.sender
        self.counters["received." + type(message).__name__] += 1
        asked: SyncMessage | None = None
        key = _asked_key(message)
        if isinstance(message, PullReply | CatchupChunk) and key is not None:
            entry = self._asked.pop((peer, key), None)
            if entry is None:
                self.counters["dropped.unasked-reply"] += 1
                log.debug("ignoring an unasked %s from %s", type(message).__name__, peer)
                return
            asked = entry[0]
        outcome = self.shard.handle(message, asked=asked)
        if outcome.merged is not None:
            self.counters["merged.records"] += outcome.merged.accepted
            self.counters["merged.duplicates"] += outcome.merged.duplicates
        if outcome.progress is not None:
            self.progress = outcome.progress
            done, total = outcome.progress
            log.info("catch-up from %s: %d/%d records", peer, done, total)
            self._notify("progress", outcome.progress)
        for out in outcome.replies:
            self._send(peer, out, reply if not isinstance(out, PullRequest | CatchupRequest)
                       else None)
        if isinstance(message, CatchupChunk) and outcome.finished:
            self._catchup_done(peer)
        if outcome.merged is not None and outcome.merged.accepted:
            self._pull_gaps(prefer=peer)
            self._notify("merged", outcome.merged)

    def _pull_gaps(self, *, prefer: str | None = None) -> None:
        connected = {p.name for p in self.node.peers()}
        if not connected:
            return
        for request in self.shard.missing_ranges():
            key = _asked_key(request)
            if any((p, key) in self._asked for p in connected):
                continue
            if request.origin in connected:
                target = request.origin
            elif prefer in connected:
                target = prefer
            else:
                target = sorted(connected)[next(self._rr) % len(connected)]
            self._send(target, request)

    # -- catch-up and anti-entropy ---------------------------------------------------------

    def _on_peer(self, event: PeerEvent) -> None:
        if event.kind is PeerEventKind.JOINED:
            self._queue_catchup(event.peer.name)
        elif event.kind is PeerEventKind.LEFT:
            name = event.peer.name
            for key in [k for k in self._asked if k[0] == name]:
                del self._asked[key]
            if self._catchup_peer == name:
                self._catchup_peer = None
                self._next_catchup()

    def _queue_catchup(self, name: str) -> None:
        if name in self._caught_up or name in self._catchup_queue or name == self._catchup_peer:
            return
        self._catchup_queue.append(name)
        self._next_catchup()

    def _next_catchup(self) -> None:
        while self._catchup_peer is None and self._catchup_queue:
            name = self._catchup_queue.popleft()
            if self.node.peer(name) is None:
                continue
            self._catchup_peer = name
            self._send(name, self.shard.catchup_request())

    def _catchup_done(self, peer: str) -> None:
        self._caught_up.add(peer)
        self._catchup_peer = None
        self.counters["catchups"] += 1
        self._notify("caught-up", peer)
        self._next_catchup()

    async def _tick_loop(self) -> None:
        last_digest = time.monotonic()
        while True:
            await asyncio.sleep(min(0.25, self.anti_entropy_interval))
            now = time.monotonic()
            try:
                for key, (message, sent) in list(self._asked.items()):
                    if now - sent > self.request_timeout:
                        del self._asked[key]
                        self.counters["timeout." + type(message).__name__] += 1
                        if isinstance(message, CatchupRequest) and key[0] == self._catchup_peer:
                            # Start that peer's catch-up over (from our current vector).
                            self._catchup_peer = None
                            self._catchup_queue.appendleft(key[0])
                            self._next_catchup()
                self._pull_gaps()
                if now - last_digest >= self.anti_entropy_interval:
                    last_digest = now
                    peers = sorted(p.name for p in self.node.peers())
                    if peers:
                        target = peers[next(self._rr) % len(peers)]
                        self._send(target, self.shard.digest())
            except Exception:
                log.exception("knowledge tick failed")

    def add_listener(self, listener: Callable[[str, Any], None]) -> None:
        """Call ``listener(event, detail)`` on ``merged``, ``progress``, ``caught-up``."""
        self._listeners.append(listener)

    def _notify(self, event: str, detail: Any) -> None:
        for listener in list(self._listeners):
            try:
                listener(event, detail)
            except Exception:
                log.exception("knowledge listener failed")

    def stats(self) -> dict[str, Any]:
        """Shard summary plus replication counters."""
        st = self.shard.stats()
        return {"observations": st.observations, "retractions": st.retractions,
                "version_vector": st.version_vector, "digest": st.digest,
                **dict(self.counters)}


class SyncKnowledge:
    """The knowledge replica for synchronous callers (the agent tools' port)."""

    def __init__(self, sync_node: Any, knowledge: Knowledge) -> None:
        self._node = sync_node
        self.knowledge = knowledge

    def remember(self, activity: Activity) -> None:
        """Store durably and replicate (returns once stored)."""
        self._node.call_in_loop(lambda: self.knowledge.async_remember(activity))

    def recall(self, sparql: str) -> QueryResult:
        """Run a read-only query on the local shard."""
        result: QueryResult = self._node.call_in_loop(lambda: self.knowledge.query(sparql), 60.0)
        return result

    def stats(self) -> dict[str, Any]:
        """Shard summary plus replication counters."""
        result: dict[str, Any] = self._node.call_in_loop(self.knowledge.stats)
        return result

    def close(self) -> None:
        """Stop replicating and close the shard."""
        self._node.run_coroutine(self.knowledge.aclose(), 30.0)


def attach_knowledge(sync_node: Any, data_dir: pathlib.Path, **options: Any) -> SyncKnowledge:
    """Open the shard in ``data_dir`` and keep it replicated through ``sync_node``.

    Args:
        sync_node: a started :class:`~porter_mesh.node.sync.SyncNode`.
        data_dir: the shard's directory.
        options: passed to :class:`Knowledge`.
    """
    node: Node = sync_node.node

    def make() -> Knowledge:
        shard = Shard(data_dir, agent=node.name)
        knowledge = Knowledge(node, shard, **options)
        knowledge.start()
        return knowledge

    knowledge: Knowledge = sync_node.call_in_loop(make, 60.0)
    return SyncKnowledge(sync_node, knowledge)
