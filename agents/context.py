"""What a brain gets to work with: :class:`AgentContext`, and the :class:`Brain` protocol."""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from porter_mesh.node.port import NodePort
from porter_mesh.tools.port import InboxItem, MeshPort
from porter_mesh.tools.toolbox import Toolbox


class TappedPort:
    """A :class:`MeshPort` that also keeps the structured items the tools drained.

    ``read_messages`` gives a model plain text; a scripted brain calls the same tool and
    then looks at :attr:`last_items` to decide, so both brains go through one path.
    """

    def __init__(self, inner: NodePort) -> None:
        self.inner = inner
        self.last_items: list[InboxItem] = []

    @property
    def agent_name(self) -> str:
        return self.inner.agent_name

    def send(self, channel: str, activity: Any) -> None:
        self.inner.send(channel, activity)

    def drain_inbox(self, channel: str | None = None, limit: int | None = None) -> list[InboxItem]:
        items = self.inner.drain_inbox(channel, limit)
        self.last_items.extend(items)
        return items

    def roster(self) -> Any:
        return self.inner.roster()

    def remember(self, activity: Any) -> None:
        self.inner.remember(activity)

    def recall(self, sparql: str) -> Any:
        return self.inner.recall(sparql)

    def take(self) -> list[InboxItem]:
        """The items drained since the last call."""
        items, self.last_items = self.last_items, []
        return items


@dataclass
class AgentContext:
    """One running agent, as its brain sees it.

    Attributes:
        name: the agent name.
        role: ``architect``, ``worker`` or ``reviewer``.
        toolbox: the agent's tools (the only way a brain acts on the world).
        port: the node behind the tools (tapped, see :class:`TappedPort`).
        stop: set when the agent must stop (halt, SIGTERM).
        options: role-specific settings from the command line.
    """

    name: str
    role: str
    toolbox: Toolbox
    port: TappedPort
    stop: threading.Event
    options: dict[str, Any] = field(default_factory=dict)

    def wait_for_messages(self, timeout: float) -> bool:
        """Block until a message waits (True), the agent must stop, or ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self.stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self.port.inner.wait_for_messages(min(left, 0.25)):
                return True
        return False

    def say(self, text: str) -> None:
        """A line on the agent's own stderr (its console), not on the mesh."""
        print(f"[{self.name}] {text}", file=sys.stderr, flush=True)


class Brain(Protocol):
    """Decides which tools to call. ``run`` returns the process exit status."""

    def run(self, ctx: AgentContext) -> int:
        """Work until done or ``ctx.stop`` is set."""
        ...


def is_mesh_port(port: object) -> bool:
    """True when ``port`` satisfies the tools' MeshPort protocol."""
    return isinstance(port, MeshPort)
