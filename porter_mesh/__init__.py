"""porter-mesh: a broker-less agent mesh on ZeroMQ.

Layers (see the repository's DESIGN notes): ``porter_mesh.core`` is the pure protocol
core (no sockets, no event loop); ``porter_mesh.adapters`` are thin I/O drivers;
``porter_mesh.node`` is the asyncio node and its synchronous facade;
``porter_mesh.tools`` are the agent tool handlers; ``porter_mesh.cli`` is the command line.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from porter_mesh.errors import (
    ActivityError,
    ClockError,
    ConfigError,
    DeliveryError,
    DeliveryTimeout,
    FrameError,
    KnowledgeError,
    NodeClosedError,
    NotHandled,
    OperationTimeout,
    PeerRefusedError,
    PorterError,
    ProtocolError,
    QueryError,
    QueryTimeout,
    SecurityError,
    StorageError,
    SyncError,
    TaskError,
    TaskWithdrawn,
    ToolError,
    UnknownPeerError,
    WorkspaceError,
)

__version__ = "0.1.0"

logging.getLogger("porter_mesh").addHandler(logging.NullHandler())

# The public surface beyond the errors: imported after the version so that modules which
# read it at import time find it.
from porter_mesh.core.advert import PeerAdvert  # noqa: E402
from porter_mesh.core.as2 import Activity, ASObject, parse_activity  # noqa: E402
from porter_mesh.core.taskid import new_task_id  # noqa: E402
from porter_mesh.core.tasks import TaskBoard  # noqa: E402
from porter_mesh.node.config import NodeConfig  # noqa: E402
from porter_mesh.node.node import Message, Node  # noqa: E402
from porter_mesh.node.sync import SyncNode  # noqa: E402

if TYPE_CHECKING:
    from porter_mesh.tools.toolbox import Toolbox


def __getattr__(name: str) -> Any:
    # The toolbox (and the tracing it brings) loads on first use: a node does not need it.
    if name == "Toolbox":
        from porter_mesh.tools.toolbox import Toolbox

        globals()["Toolbox"] = Toolbox
        return Toolbox
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ASObject",
    "Activity",
    "ActivityError",
    "ClockError",
    "ConfigError",
    "DeliveryError",
    "DeliveryTimeout",
    "FrameError",
    "KnowledgeError",
    "Message",
    "Node",
    "NodeClosedError",
    "NodeConfig",
    "NotHandled",
    "OperationTimeout",
    "PeerAdvert",
    "PeerRefusedError",
    "PorterError",
    "ProtocolError",
    "QueryError",
    "QueryTimeout",
    "SecurityError",
    "StorageError",
    "SyncError",
    "SyncNode",
    "TaskBoard",
    "TaskError",
    "TaskWithdrawn",
    "ToolError",
    "Toolbox",
    "UnknownPeerError",
    "WorkspaceError",
    "__version__",
    "new_task_id",
    "parse_activity",
]
