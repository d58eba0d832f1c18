"""Gateways: processes that put something that is not a mesh agent onto the mesh.

Each gateway is an ordinary node driven through the node's public API only; it
translates at its edge and owns no rule of the mesh (``DESIGN.md``, "Layers").

* :mod:`porter_mesh.gateways.ui` -- the human's dashboard (``porter-ui``): an HTTP API,
  a live event stream and the page, served by ``porter-mesh ui``.
* :mod:`porter_mesh.gateways.mcp` -- an MCP host as an agent: the agent's tools, the
  roster and recent messages over MCP's stdio transport, served by ``porter-mesh mcp``.
* :mod:`porter_mesh.gateways.iacp` -- IACP 1.1 foragers join as workers, one node each,
  served by ``porter-mesh iacp-bridge``.
* :mod:`porter_mesh.gateways.a2a` -- A2A 1.0 both ways: mesh agents served to A2A
  clients, and outside A2A agents joined as workers, by ``porter-mesh a2a``.
"""

from __future__ import annotations

__all__: list[str] = []
