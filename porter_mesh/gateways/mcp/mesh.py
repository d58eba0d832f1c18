"""The gateway's side of the mesh: one node as an agent, and what the MCP side reads.

:class:`GatewayAgent` assembles what an agent process has (a node, its knowledge
replica, a :class:`~porter_mesh.tools.toolbox.Toolbox`) for an MCP host, plus two things
the host needs and an agent program does not:

* **a settling window.** A host may call ``send_message`` the moment the server is up,
  before discovery has found the mesh. For ``wait`` seconds after start, the first
  broadcast waits (bounded by the window) until a peer is found and every peer found
  has subscribed to this node, as ``porter-mesh send`` does; a direct message waits
  for its recipient to be found. After the window, sends go out at once.
* **a feed.** Every message the node delivers is kept in a bounded list of recent
  messages (the ``mesh://messages`` resource; ``read_messages`` still drains the
  inbox on its own), and every delivery and roster change calls the listeners, which
  the MCP side turns into ``notifications/resources/updated``.

Everything goes through the node's public API (:class:`~porter_mesh.node.sync.SyncNode`,
:class:`~porter_mesh.node.port.NodePort`); no rule of the mesh lives here.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from porter_mesh.core import constants as C
from porter_mesh.core.as2 import Activity
from porter_mesh.core.hlc import hlc_physical_ms
from porter_mesh.core.peers import PeerEvent
from porter_mesh.errors import OperationTimeout
from porter_mesh.node.cancel import LEDGER_FILE, watch_tasks
from porter_mesh.node.config import NodeConfig, knowledge_dir
from porter_mesh.node.knowledge import Knowledge, SyncKnowledge, attach_knowledge
from porter_mesh.node.node import Message, Node
from porter_mesh.node.port import NodePort
from porter_mesh.node.sync import SyncNode
from porter_mesh.tools.external import ExternalTools
from porter_mesh.tools.ledger import TaskLedger
from porter_mesh.tools.messaging import render_item
from porter_mesh.tools.port import InboxItem
from porter_mesh.tools.toolbox import Toolbox
from porter_mesh.tracing.export import start_metrics, start_tracing
from porter_mesh.tracing.tasks import TaskTracer
from porter_mesh.tracing.views import serve_spans

__all__ = ["DEFAULT_RECENT", "DEFAULT_SETTLE", "GatewayAgent", "SettlingPort"]

_log = logging.getLogger("porter_mesh.gateways.mcp")

#: Messages kept for the ``mesh://messages`` resource.
DEFAULT_RECENT: Final = 100
#: Seconds after start during which a first send waits for the mesh.
DEFAULT_SETTLE: Final = 5.0

#: Resource names the listeners are called with.
ROSTER: Final = "roster"
MESSAGES: Final = "messages"


class SettlingPort(NodePort):
    """A :class:`NodePort` whose sends wait for the mesh during a window after start.

    Args:
        node: the started node.
        knowledge: its knowledge replica, if any.
        settle: seconds, from now, during which a send first waits (see the module
            docstring).
    """

    def __init__(self, node: SyncNode, knowledge: SyncKnowledge | None, *,
                 settle: float, traces: TaskTracer | None = None) -> None:
        super().__init__(node, knowledge, traces=traces)
        self._until = time.monotonic() + settle
        self._lock = threading.Lock()
        self._settled = settle <= 0

    def send(self, channel: str, activity: Activity) -> None:
        """As :meth:`NodePort.send`, after :meth:`settle`."""
        self.settle(channel)
        super().send(channel, activity)

    def settle(self, channel: str = C.CHANNEL_LOG) -> None:
        """Wait, within the window, until a send on ``channel`` reaches the mesh."""
        left = self._until - time.monotonic()
        if left <= 0:
            return
        if channel.startswith(C.DIRECT_PREFIX):
            recipient = channel[len(C.DIRECT_PREFIX):]
            with contextlib.suppress(OperationTimeout):
                self.node.wait_for_peers([recipient], left)
            return
        with self._lock:
            if self._settled:
                return
            try:
                known = self.node.wait_for_peers(1, left)
                left = self._until - time.monotonic()
                self.node.run_coroutine(
                    self.node.node.wait_for_subscribers(C.CHANNEL_CONTROL, len(known),
                                                        max(left, 0.0)), left + 5.0)
            except (TimeoutError, OperationTimeout) as exc:
                _log.info("sending before the mesh settled: %s", exc)
            self._settled = True


@dataclass(frozen=True, slots=True)
class RecentMessage:
    """One delivered message, as the ``mesh://messages`` resource shows it."""

    item: InboxItem
    direct: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "received_at": self.item.received_at, "channel": self.item.channel,
            "sender": self.item.sender, "direct": self.direct,
            "text": render_item(self.item), "activity": self.item.activity.to_dict(),
        }


class GatewayAgent:
    """One agent on the mesh for an MCP host: node, knowledge, toolbox, feed.

    Args:
        config: the node's settings (name, role, mesh, data directory...).
        workspace: the directory the file, shell and git tools are confined to
            (``None`` for an architect, which has none of them).
        knowledge: keep a knowledge replica in the data directory.
        settle: the settling window, seconds (see the module docstring).
        recent: messages kept for the ``mesh://messages`` resource.
        external: tools of external MCP servers to add to the toolbox (closed with
            the agent).

    Raises:
        PorterError: the node or its knowledge replica cannot start (a data directory
            in use, protected mode refusing an address...).
    """

    def __init__(self, config: NodeConfig, *, workspace: Path | None, knowledge: bool = True,
                 settle: float = DEFAULT_SETTLE, recent: int = DEFAULT_RECENT,
                 external: ExternalTools | None = None) -> None:
        self._recent: collections.deque[RecentMessage] = collections.deque(maxlen=recent)
        self._listeners: list[Callable[[str], None]] = []
        self._keeps_knowledge = knowledge and config.data_dir is not None
        self.external = external
        # Spans of the tasks the host works on; an MCP request's _meta trace context is
        # handed to traces.adopt() by the server. Tracing before the node: a seat that
        # reaches it at once may hand it its spans.
        self.tracing = start_tracing(config.name)
        self.traces = TaskTracer(config.name,
                                 self.tracing.tracer if self.tracing is not None else None)
        self.node = SyncNode(config, prepare=self._prepare)
        self.knowledge: SyncKnowledge | None = None

        self.metrics = start_metrics(config.name, self.traces.metrics.snapshot)
        try:
            if self._keeps_knowledge and config.data_dir is not None:
                self.knowledge = attach_knowledge(self.node, knowledge_dir(config.data_dir))
            self.port = SettlingPort(self.node, self.knowledge, settle=settle,
                                     traces=self.traces)
            ledger = TaskLedger(config.name, path=None if config.data_dir is None
                                else config.data_dir / LEDGER_FILE)
            self.toolbox = Toolbox(self.port, workspace, role=config.role, external=external,
                                   ledger=ledger, traces=self.traces)
            # Withdrawals and cancels take effect as they arrive, even during a long call.
            watch_tasks(self.node, self.toolbox, config.name)
            self.node.call_in_loop(lambda: self.node.node.add_handler(self._on_message))
            self.node.add_peer_listener(self._on_peer)
            self.node.add_control_listener(self._on_control)
        except BaseException:
            self.close()
            raise

    def _prepare(self, node: Node) -> None:
        """Before the node starts: what a peer may ask at once (spans, the view)."""
        if self.tracing is not None:
            serve_spans(node, self.tracing.ring)
        node.view_sections["service"] = self.traces.metrics.snapshot
        if self._keeps_knowledge:
            Knowledge.expect(node)  # the shard attaches once the node is on the mesh

    @property
    def name(self) -> str:
        """The agent name."""
        return self.node.name

    @property
    def role(self) -> str:
        """The agent's role."""
        return self.node.node.config.role

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(resource)`` (``"roster"`` or ``"messages"``) when it changes.

        It runs on the node's thread and must not block.
        """
        self._listeners.append(listener)

    def recent(self) -> list[dict[str, Any]]:
        """The recent messages, oldest first, as JSON-ready dicts."""
        return [m.as_dict() for m in list(self._recent)]

    def roster(self) -> dict[str, Any]:
        """This agent and the peers it knows, as a JSON-ready dict."""
        peers = [{"name": e.name, "role": e.role, "state": e.state, "draining": e.draining}
                 for e in sorted(self.port.roster(), key=lambda e: e.name)]
        return {"me": {"name": self.name, "role": self.role,
                       "mesh": self.node.node.config.mesh}, "peers": peers}

    def announce(self) -> None:
        """Say on ``log`` that this agent is online (after the settling window's wait)."""
        self.port.send(C.CHANNEL_LOG, Activity.from_dict({
            "type": "Announce", "actor": self.name,
            "summary": f"{self.name} online as {self.role} (MCP)"}))

    def close(self) -> None:
        """Leave the mesh and stop the external servers. Idempotent."""
        self.traces.close()
        if self.knowledge is not None:
            self.knowledge.close()
            self.knowledge = None
        self.node.close()
        if self.external is not None:
            self.external.close()
        if self.tracing is not None:
            self.tracing.close()
            self.tracing = None
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None

    # -- node callbacks (on the node's thread) ---------------------------------------------

    def _changed(self, resource: str) -> None:
        for listener in tuple(self._listeners):
            try:
                listener(resource)
            except Exception:
                _log.exception("resource listener failed")

    def _on_message(self, msg: Message) -> None:
        if msg.channel == C.CHANNEL_CONTROL:
            return
        item = InboxItem(msg.channel, msg.sender, msg.activity,
                         hlc_physical_ms(msg.envelope.hlc) / 1000)
        self._recent.append(RecentMessage(item, msg.direct))
        self._changed(MESSAGES)

    def _on_peer(self, event: PeerEvent) -> None:
        self._changed(ROSTER)

    def _on_control(self, kind: str, sender: str, body: dict[str, Any]) -> None:
        if kind == "drain":
            _log.warning("drain requested by %s", sender)
            self.toolbox.drain()
        elif kind == "halt":
            _log.warning("halt requested by %s: the tools refuse every call now", sender)
            self.toolbox.halt(f"halted by {sender}")
