"""What the agent tools need from a node: the :class:`MeshPort` protocol.

The tools never touch sockets. They talk to the mesh through this small, synchronous
interface, which the node's synchronous facade implements (and which a test can
implement in memory). Everything here is plain data or a method call that returns when
its work is done or has failed.

What a node must provide
------------------------

``agent_name`` (read-only attribute or property)
    The name this node's agent speaks as; the ``actor`` of every activity the tools build.

``send(channel, activity) -> None``
    Put ``activity`` on ``channel``. The node chooses the transport from the name:
    ``task:<agent>`` goes to that agent only, over ROUTER/DEALER with acknowledgement;
    ``log``, ``task`` and ``review`` are broadcast. The tools never send on ``control``.
    Returns once the activity is handed over (broadcast) or acknowledged (direct).
    Raises :class:`~porter_mesh.errors.UnknownPeerError` when a direct recipient is
    not on the mesh, :class:`~porter_mesh.errors.DeliveryTimeout` when it does not
    acknowledge in time, :class:`~porter_mesh.errors.NodeClosedError` after close. The
    tools turn these into messages the agent can act on.

``drain_inbox(channel=None, limit=None) -> list[InboxItem]``
    Remove and return messages received for this agent since the last call, oldest
    first: broadcasts on the channels the node subscribes to (``log``, ``task``,
    ``review``) and its direct inbox (``task:<agent_name>``), each as an
    :class:`InboxItem`. With ``channel``, only that channel's messages are removed (the
    others stay queued). With ``limit``, at most that many are removed (the rest stay
    queued, in order). ``control`` traffic is the node's own business and never appears
    here; if it does, the tools drop it. The node may or may not include the agent's
    own broadcasts; the tools skip them.

``roster() -> list[RosterEntry]``
    The live team from discovery and heartbeats: one entry per known peer (the agent
    itself may be included; expired peers are not), with its role, liveness state
    (``"alive"`` or ``"evasive"``) and whether it is draining.

``remember(activity) -> None``
    Store a ``Remember`` activity's observation in the local knowledge shard and
    broadcast it so the other replicas converge. Raises
    :class:`~porter_mesh.errors.KnowledgeError` if it is refused.

``recall(sparql) -> QueryResult``
    Run a read-only SPARQL query against the local shard. Raises
    :class:`~porter_mesh.errors.QueryError` (with a reason) for refused or failing
    queries and :class:`~porter_mesh.errors.QueryTimeout` past the deadline.

Every method may be called from the thread that runs the agent's tool loop; none may
block longer than the node's own delivery or query deadlines.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from porter_mesh.core.as2 import Activity
from porter_mesh.core.tracecontext import TraceContext

__all__ = ["InboxItem", "MeshPort", "QueryResult", "RosterEntry"]


@dataclass(frozen=True, slots=True)
class InboxItem:
    """One received message.

    Attributes:
        channel: where it arrived: ``log``, ``task``, ``review`` or ``task:<agent>``.
        sender: the authenticated sending agent (from the envelope).
        activity: the activity (the plain-text fallback Note for non-JSON payloads).
        received_at: wall-clock arrival time, Unix seconds.
        trace: the W3C trace context the message carried (its sender's span), if any.
    """

    channel: str
    sender: str
    activity: Activity
    received_at: float
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True)
class RosterEntry:
    """One teammate, as discovery and heartbeats describe it.

    Attributes:
        name: the agent name.
        role: its advertised role (``architect``, ``worker``, ``reviewer``...).
        state: ``"alive"`` or ``"evasive"`` (silent for a while).
        draining: it finishes its current work but takes nothing new.
    """

    name: str
    role: str
    state: str
    draining: bool = False


@dataclass(frozen=True, slots=True)
class QueryResult:
    """The answer to a SPARQL query.

    Attributes:
        variables: the projected variable names, in order, without ``?``.
        rows: one mapping per solution, variable name to the value as text (IRIs
            without angle brackets, literals as their lexical form); unbound variables
            are absent from the row.
        truncated: the node's row limit cut the answer short.
    """

    variables: tuple[str, ...]
    rows: tuple[Mapping[str, str], ...]
    truncated: bool = False


@runtime_checkable
class MeshPort(Protocol):
    """The node as the agent tools see it (see the module docstring for the contract)."""

    @property
    def agent_name(self) -> str:
        """The agent this node speaks for."""
        ...

    def send(self, channel: str, activity: Activity) -> None:
        """Send ``activity`` on ``channel`` (direct for ``task:<agent>``, else broadcast)."""
        ...

    def drain_inbox(self, channel: str | None = None, limit: int | None = None) -> list[InboxItem]:
        """Remove and return received messages, oldest first."""
        ...

    def roster(self) -> list[RosterEntry]:
        """The known, unexpired teammates."""
        ...

    def remember(self, activity: Activity) -> None:
        """Store and broadcast a ``Remember`` activity."""
        ...

    def recall(self, sparql: str) -> QueryResult:
        """Run a read-only SPARQL query on the local shard."""
        ...
