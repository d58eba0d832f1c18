"""The mesh node: an asyncio core and a synchronous facade over it."""

from porter_mesh.node.config import NodeConfig
from porter_mesh.node.node import Message, Node
from porter_mesh.node.sync import SyncNode

__all__ = ["Message", "Node", "NodeConfig", "SyncNode"]
