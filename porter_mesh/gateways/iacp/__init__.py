"""The IACP 1.1 bridge: legacy foragers (line-delimited JSON over TCP) join the mesh as
workers, one mesh node each.

* :mod:`.protocol` -- the line codec and the per-forager session: every rule of the
  translation, pure (no sockets, no event loop);
* :mod:`.bridge` -- the asyncio driver: the TCP listener and the foragers' nodes.

``porter-mesh iacp-bridge`` (:mod:`porter_mesh.cli.cmd_iacp_bridge`) runs it;
``docs/iacp.md`` documents the mapping.
"""

from __future__ import annotations

from porter_mesh.gateways.iacp.protocol import (
    DEFAULT_PORT,
    IACP_VERSION,
    BridgeSettings,
    ForagerSession,
    IacpMessage,
    LineError,
    decode_line,
    encode_message,
)

__all__ = ["DEFAULT_PORT", "IACP_VERSION", "BridgeSettings", "ForagerSession", "IacpMessage",
           "LineError", "decode_line", "encode_message"]
