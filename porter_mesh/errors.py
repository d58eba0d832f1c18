"""The exceptions porter-mesh raises.

Every exception derives from :class:`PorterError`, so ``except PorterError`` catches all
of them. The tree separates "this process broke the rules" (``Local*``) from "a peer or
the network did" (``Remote*``), in the way h11 separates local and remote protocol errors::

    PorterError
    ├── ConfigError                 bad settings given to an entry point
    ├── ProtocolError               bytes or values that break the wire/profile rules
    │   ├── ActivityError           an activity (or object) fails the AS2 compact profile
    │   ├── FrameError              a ZeroMQ message or envelope cannot be decoded
    │   └── ClockError              a hybrid-logical-clock timestamp is not acceptable
    ├── DeliveryError               a message could not be delivered
    │   ├── UnknownPeerError        no such agent on the mesh
    │   ├── PeerRefusedError        (also SecurityError) the peer refused the connection:
    │   │                           keys are missing, not trusted, or not expected there
    │   └── DeliveryTimeout         (also TimeoutError) no acknowledgement by the deadline
    ├── NodeClosedError             the node is closed or closing
    ├── NotHandled                  raised by a message handler: not taken, still owed
    ├── StorageError                (also OSError) a write to the data directory failed
    ├── OperationTimeout            (also TimeoutError) a synchronous call ran out of time
    ├── KnowledgeError              knowledge-graph problems
    │   ├── QueryError              a SPARQL query is refused or fails
    │   │   └── QueryTimeout        (also TimeoutError) the query passed its deadline
    │   └── SyncError               a knowledge sync message is refused
    ├── ToolError                   an agent tool call cannot be carried out
    │   ├── WorkspaceError          a path escapes the agent's workspace
    │   └── TaskWithdrawn           the task (attempt) being worked on was withdrawn
    ├── TaskError                   a task lifecycle transition is not allowed
    └── SecurityError               keys, authentication, identity binding

Each error's message says what went wrong and, where a caller can act, what to do.
Structured details are kept as attributes so that callers need not parse messages.
"""

from __future__ import annotations

__all__ = [
    "ActivityError",
    "ClockError",
    "ConfigError",
    "DeliveryError",
    "DeliveryTimeout",
    "FrameError",
    "KnowledgeError",
    "NodeClosedError",
    "NotHandled",
    "OperationTimeout",
    "PeerRefusedError",
    "PorterError",
    "ProtocolError",
    "QueryError",
    "QueryTimeout",
    "SecurityError",
    "StorageError",
    "SyncError",
    "TaskError",
    "TaskWithdrawn",
    "ToolError",
    "UnknownPeerError",
    "WorkspaceError",
]


class PorterError(Exception):
    """Root of every porter-mesh exception."""


class ConfigError(PorterError, ValueError):
    """A setting given to an entry point is invalid. The message names the setting."""


class ProtocolError(PorterError):
    """Bytes or values break the wire format or the AS2 compact profile.

    Attributes:
        reason: a short, stable, machine-readable tag (``"bad-json"``, ``"missing-field"``...)
            used to count drops by kind.
    """

    def __init__(self, message: str, *, reason: str = "protocol") -> None:
        super().__init__(message)
        self.reason = reason


class ActivityError(ProtocolError):
    """An activity or object does not satisfy the AS2 compact profile.

    Attributes:
        field: dotted path of the offending field (``"object.items[2].url"``), or ``None``
            when the problem is the whole document.
        expected: what the profile expects there, in words.
    """

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        expected: str | None = None,
        reason: str = "invalid-activity",
    ) -> None:
        super().__init__(message, reason=reason)
        self.field = field
        self.expected = expected


class FrameError(ProtocolError):
    """A ZeroMQ message, its envelope or its batch payload cannot be decoded."""


class ClockError(ProtocolError):
    """A hybrid-logical-clock timestamp cannot be accepted (for example, too far ahead)."""


class DeliveryError(PorterError):
    """A message could not be delivered.

    Attributes:
        recipient: the agent the message was for, when known.
    """

    def __init__(self, message: str, *, recipient: str | None = None) -> None:
        super().__init__(message)
        self.recipient = recipient


class UnknownPeerError(DeliveryError):
    """The recipient is not on the mesh (never discovered, or expired)."""


class SecurityError(PorterError):
    """Keys, authentication or identity binding failed."""


class PeerRefusedError(DeliveryError, SecurityError):
    """A peer refused this node's connection in the ZeroMQ handshake, for a reason keys
    explain; the message says which keys to make or trust.

    Attributes:
        recipient: the peer (or the seed ``HOST:PORT`` when its name is unknown).
        reason: ``needs-keys`` (this node has none, the peer runs CurveZMQ),
            ``key-refused`` (this node's key is not trusted there) or ``not-secured``
            (the peer has no key and this node never downgrades).
    """

    def __init__(self, message: str, *, recipient: str | None = None,
                 reason: str = "needs-keys") -> None:
        super().__init__(message, recipient=recipient)
        self.reason = reason


class DeliveryTimeout(DeliveryError, TimeoutError):
    """No acknowledgement arrived before the delivery deadline."""


class NodeClosedError(PorterError):
    """The node is closed or closing; start a new one to continue."""


class NotHandled(PorterError):
    """Raised by a message handler that cannot act on a message yet.

    The node does not take the message: it stays owed (in the delivery journal when the
    node has one, unacknowledged otherwise, so the sender retries) and is offered to the
    handlers again later. A gateway raises it while its far side is not ready, so that it
    never acknowledges a message it has not handled.
    """


class StorageError(PorterError, OSError):
    """A write to the node's data directory failed (a full disk, say); nothing was kept.

    Attributes:
        path: the file that could not be written.
        free_bytes: the space left on its filesystem when the write failed (``None`` if
            it could not be read).
    """

    def __init__(self, message: str, *, path: str, free_bytes: int | None,
                 errno_: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.free_bytes = free_bytes
        self.errno = errno_


class OperationTimeout(PorterError, TimeoutError):
    """A synchronous facade call did not complete within its timeout."""


class KnowledgeError(PorterError):
    """A problem with the knowledge graph."""


class QueryError(KnowledgeError):
    """A SPARQL query was refused or failed.

    Attributes:
        reason: ``"syntax"``, ``"update"``, ``"load"``, ``"service"``, ``"row-limit"``...
        position: ``(line, column)`` of a syntax error, when known.
    """

    def __init__(
        self, message: str, *, reason: str = "query", position: tuple[int, int] | None = None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.position = position


class QueryTimeout(QueryError, TimeoutError):
    """A query ran past its deadline and was stopped."""


class SyncError(KnowledgeError):
    """A knowledge sync message (range pull, snapshot chunk, digest) was refused."""


class ToolError(PorterError):
    """An agent tool call cannot be carried out; the message is shown to the agent."""


class WorkspaceError(ToolError):
    """A path is outside the agent's workspace (after resolving links and ``..``)."""


class TaskWithdrawn(ToolError):
    """The task this call acts for was withdrawn from this agent: stop working on it.

    Attributes:
        context: the task URN.
        attempt: the withdrawn claim's attempt number (``None`` if the withdrawal named
            none).
        reason: the withdrawal's summary.
    """

    def __init__(self, message: str, *, context: str, attempt: int | None,
                 reason: str) -> None:
        super().__init__(message)
        self.context = context
        self.attempt = attempt
        self.reason = reason


class TaskError(PorterError):
    """A task lifecycle transition is not allowed in the task's current state."""
