"""The MCP gateway: any MCP host joins the mesh as an agent (``porter-mesh mcp``).

* :mod:`.mesh` -- the agent the host acts as: node, knowledge, toolbox, the settling
  window for the first send and the feed of recent messages;
* :mod:`.server` -- the MCP server over it (the official SDK's low-level server): the
  toolbox as tools, ``mesh://roster`` and ``mesh://messages`` as resources, with update
  notifications.

``porter-mesh mcp`` (:mod:`porter_mesh.cli.cmd_mcp`) serves it over stdio;
``docs/mcp.md`` shows how to hook it into a host. Importing :mod:`.server` needs the
SDK (``pip install 'porter-mesh[mcp]'``).
"""

from __future__ import annotations

from porter_mesh.gateways.mcp.mesh import GatewayAgent, SettlingPort

__all__ = ["GatewayAgent", "SettlingPort"]
