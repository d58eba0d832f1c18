"""The A2A gateway: mesh agents served to A2A 1.0 clients, and A2A agents joined to the
mesh as workers (``porter-mesh a2a``), on the official SDK (``pip install
'porter-mesh[a2a]'``).

* :mod:`.mapping` -- the translation between mesh activities and A2A task states, pure;
* :mod:`.store` -- the event log (every task event numbered) and the task store on disk;
* :mod:`.server` -- the inward direction: :class:`~.server.A2AGateway` serves mesh
  agents on the SDK's server side;
* :mod:`.join` -- the outward direction: an outside A2A agent works on the mesh.

``docs/a2a.md`` has the mapping table and a quick start. Importing :mod:`.server`,
:mod:`.store` or :mod:`.join` needs the SDK; :mod:`.mapping` does not.
"""

from __future__ import annotations

__all__: list[str] = []
