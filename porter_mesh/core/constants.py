"""Wire constants shared by every part of the mesh. Change them here only."""

from __future__ import annotations

from typing import Final

#: Envelope protocol version this code speaks. A frame with another version is refused.
#: Version 2: the conventional message id is derived from (incarnation, channel, seq)
#: instead of sent, and sequence and clock travel as fixed-width integers at the end.
PROTOCOL_VERSION: Final = 2

#: zeroconf service type, one instance per node, named after the agent.
SERVICE_TYPE: Final = "_porter-mesh._tcp.local."

#: Default mesh name; several meshes can share a LAN by using different names.
DEFAULT_MESH: Final = "default"

#: The profile's channels. ``task:<agent>`` is the direct inbox of one agent.
CHANNEL_LOG: Final = "log"
CHANNEL_TASK: Final = "task"
CHANNEL_REVIEW: Final = "review"
CHANNEL_CONTROL: Final = "control"
DIRECT_PREFIX: Final = "task:"
STANDARD_CHANNELS: Final = (CHANNEL_LOG, CHANNEL_TASK, CHANNEL_REVIEW, CHANNEL_CONTROL)

#: Name the human at the dashboard or CLI sends as.
HUMAN_AGENT: Final = "porter-ui"
#: Role of a command line's short-lived seat (``send``, ``request``...): nodes log its
#: arrival and departure at debug level only, since every command comes and goes,
#: and neither catch up from it nor compare knowledge digests with it.
ROLE_SEAT: Final = "cli"
#: Role of a watcher (``tail``, the dashboard): it announces itself so that senders know
#: it and can wait until it subscribes before they broadcast.
ROLE_WATCHER: Final = "watcher"

#: Knowledge vocabulary.
PORTER_VOCAB: Final = "https://porter.chapeaux.io/vocab#"
AS_NS: Final = "https://www.w3.org/ns/activitystreams#"
PROV_NS: Final = "http://www.w3.org/ns/prov#"
TASK_URN_PREFIX: Final = "urn:porter:task:"

#: Size limits (bytes). A ZeroMQ message larger than MAX_MESSAGE_BYTES is refused by
#: libzmq itself (ZMQ_MAXMSGSIZE) and the connection that sent it is dropped.
MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024
MAX_ACTIVITY_BYTES: Final = 1024 * 1024
MAX_JSON_DEPTH: Final = 32
MAX_BATCH: Final = 256
