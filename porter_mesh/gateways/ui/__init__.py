"""porter-ui, the human's dashboard: a mesh node (role ``human``) serving an HTTP API,
a live event stream and the page, from one asyncio process.

* :mod:`.state` -- the message log on disk and the task cards (pure, no sockets);
* :mod:`.stats` -- each agent's own numbers (loss, queues, model calls), asked for
  every few seconds and shown on its roster card;
* :mod:`.server` -- the aiohttp application: auth, Host/Origin checks, routes, stream;
* ``static/`` -- the page (plain ES modules, no build step).

``porter-mesh ui`` (:mod:`porter_mesh.cli.cmd_ui`) runs it; ``docs/ui.md`` documents the
API.
"""

from __future__ import annotations

from porter_mesh.gateways.ui.server import Dashboard, new_token
from porter_mesh.gateways.ui.state import MessageFilter, MessageLog, TaskTracker, message_record

__all__ = ["Dashboard", "MessageFilter", "MessageLog", "TaskTracker", "message_record",
           "new_token"]
