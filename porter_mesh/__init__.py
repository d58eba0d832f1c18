"""porter-mesh: a broker-less agent mesh on ZeroMQ.

Layers (see the repository's DESIGN notes): ``porter_mesh.core`` is the pure protocol
core (no sockets, no event loop); ``porter_mesh.adapters`` are thin I/O drivers;
``porter_mesh.node`` is the asyncio node and its synchronous facade;
``porter_mesh.tools`` are the agent tool handlers; ``porter_mesh.cli`` is the command line.
"""

from __future__ import annotations

import logging

from porter_mesh.errors import (
    ActivityError,
    ClockError,
    ConfigError,
    DeliveryError,
    DeliveryTimeout,
    FrameError,
    KnowledgeError,
    NodeClosedError,
    OperationTimeout,
    PorterError,
    ProtocolError,
    QueryError,
    QueryTimeout,
    SecurityError,
    SyncError,
    TaskError,
    ToolError,
    UnknownPeerError,
    WorkspaceError,
)

__version__ = "0.1.0"

logging.getLogger("porter_mesh").addHandler(logging.NullHandler())

__all__ = [
    "ActivityError",
    "ClockError",
    "ConfigError",
    "DeliveryError",
    "DeliveryTimeout",
    "FrameError",
    "KnowledgeError",
    "NodeClosedError",
    "OperationTimeout",
    "PorterError",
    "ProtocolError",
    "QueryError",
    "QueryTimeout",
    "SecurityError",
    "SyncError",
    "TaskError",
    "ToolError",
    "UnknownPeerError",
    "WorkspaceError",
    "__version__",
]
