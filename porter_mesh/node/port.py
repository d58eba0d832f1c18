"""The node as the agent tools see it: :class:`NodePort` implements
:class:`~porter_mesh.tools.port.MeshPort` over a :class:`~porter_mesh.node.sync.SyncNode`.
"""

from __future__ import annotations

import collections
from typing import Protocol

from porter_mesh.core import constants as C
from porter_mesh.core.as2 import Activity
from porter_mesh.core.hlc import hlc_physical_ms
from porter_mesh.errors import KnowledgeError
from porter_mesh.node.node import Message
from porter_mesh.node.sync import SyncNode
from porter_mesh.tools.port import InboxItem, QueryResult, RosterEntry
from porter_mesh.tracing.tasks import TaskTracer

__all__ = ["KnowledgePort", "NodePort"]


class KnowledgePort(Protocol):
    """What the port needs from the knowledge replica attached to the node."""

    def remember(self, activity: Activity) -> None:
        """Store a Remember durably and broadcast it."""
        ...

    def recall(self, sparql: str) -> QueryResult:
        """Run a read-only query on the local shard."""
        ...


class NodePort:
    """A :class:`~porter_mesh.tools.port.MeshPort` backed by a running node.

    Args:
        node: the node (already started).
        knowledge: the knowledge replica, or ``None`` when the agent has none (memory
            tools then say so).
        traces: the agent's task spans: messages about a traced task carry their
            context, and what is read is accounted (see :mod:`porter_mesh.tracing`).
    """

    def __init__(self, node: SyncNode, knowledge: KnowledgePort | None = None, *,
                 traces: TaskTracer | None = None) -> None:
        self.node = node
        self.knowledge = knowledge
        self.traces = traces
        self._held: collections.deque[Message] = collections.deque()
        # The newest journaled message handed to the tools with none older still held:
        # taken (Node.ack) when the tools next ask, as receive() would.
        self._given: Message | None = None

    @property
    def agent_name(self) -> str:
        """The agent this node speaks for."""
        return self.node.name

    def send(self, channel: str, activity: Activity) -> None:
        """Direct (acknowledged) for ``task:<agent>``, broadcast otherwise."""
        if self.traces is None:
            self.node.send_to_channel(channel, activity)
            return
        trace, span = self.traces.sending(channel, activity)
        try:
            self.node.send_to_channel(channel, activity, trace=trace)
        except BaseException as exc:
            self.traces.sent(channel, activity, span, exc)
            raise
        self.traces.sent(channel, activity, span)

    def wait_for_messages(self, timeout: float) -> bool:
        """Block until a message is waiting (True) or ``timeout`` passes (False)."""
        if self._held:
            return True
        return self.node.wait_readable(timeout)

    def drain_inbox(self, channel: str | None = None, limit: int | None = None) -> list[InboxItem]:
        """Received messages, oldest first; ``channel``/``limit`` leave the rest queued."""
        if self._given is not None:
            self.node.ack(self._given)
            self._given = None
        self._held.extend(self.node.drain(ack=False))
        taken: list[Message] = []
        kept: collections.deque[Message] = collections.deque()
        while self._held:
            msg = self._held.popleft()
            wanted = channel is None or msg.channel == channel
            if wanted and msg.channel != C.CHANNEL_CONTROL and (limit is None
                                                                or len(taken) < limit):
                taken.append(msg)
            else:
                kept.append(msg)
        self._held = kept
        oldest_held = min((m.offset for m in kept if m.offset >= 0), default=None)
        for msg in taken:
            if msg.offset >= 0 and (oldest_held is None or msg.offset < oldest_held):
                self._given = msg
        if self.traces is not None:
            for m in taken:
                self.traces.received(m.channel, m.sender, m.activity, m.trace,
                                     msg_id=m.envelope.msg_id)
        return [
            InboxItem(m.channel, m.sender, m.activity, hlc_physical_ms(m.envelope.hlc) / 1000,
                      m.trace)
            for m in taken
        ]

    def roster(self) -> list[RosterEntry]:
        """Known, unexpired teammates."""
        return [RosterEntry(p.name, p.advert.role, p.state.value, p.draining)
                for p in self.node.peers()]

    def remember(self, activity: Activity) -> None:
        """Store and broadcast a Remember.

        Raises:
            KnowledgeError: this agent has no knowledge replica.
        """
        if self.knowledge is None:
            raise KnowledgeError("this agent runs without a knowledge shard; start it with "
                                 "a data directory")
        self.knowledge.remember(activity)

    def recall(self, sparql: str) -> QueryResult:
        """Run a read-only query on the local shard.

        Raises:
            KnowledgeError: this agent has no knowledge replica.
        """
        if self.knowledge is None:
            raise KnowledgeError("this agent runs without a knowledge shard; start it with "
                                 "a data directory")
        return self.knowledge.recall(sparql)
