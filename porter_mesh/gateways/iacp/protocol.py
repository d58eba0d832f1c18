"""IACP 1.1 on one side, the mesh's activities on the other: the bridge's pure half.

Theory of operation
-------------------
An IACP forager speaks line-delimited JSON over TCP to "the queen". The bridge plays the
queen for every forager that connects and puts each one on the mesh as an ordinary
worker. This module holds every rule of that translation and none of its I/O: the line
codec (:func:`decode_line`, :func:`encode_message`, :class:`LineSplitter`) and one
:class:`ForagerSession` per connection, which takes decoded lines, delivered activities,
control messages and ``now``, and returns :data:`Output` values for its driver
(:mod:`porter_mesh.gateways.iacp.bridge`) to carry out.

A connection's life::

    NEW --first good hb--> JOINING --driver: node up--> JOINED --silent > expire_after--> GONE
     |                        |                           |  ^                              |
     |  version 1.0/2.0,      +--driver: name taken-------+  +-------- hb ----- JOINING <---+
     +--bad name ---------------------> ctl.halt with the reason, CLOSED
    JOINED --ctl.halt from the mesh, EOF, or a flood of bad lines--> CLOSED

**Registration.** The forager's first ``hb`` names it (``from``) and carries its
heartbeat record (``slots``, ``tools``). The session asks its driver to
:class:`Register` it; the driver checks that the name is free on the mesh, starts the
forager's node (role ``worker``, its slots and tools advertised) and answers
:meth:`ForagerSession.joined` or :meth:`ForagerSession.refused`. A refusal is said to
the forager as ``ctl.halt`` with ``body.reason``, the only IACP message that makes a
forager stop, and the connection is closed.

**Assigns and fencing.** A mesh ``Offer`` on the forager's inbox becomes a
``task.assign`` with a fresh queen id (``q-...``). An assign is *open* until its final
``task.result`` or a ``task.reject`` answers it, and every answer that refers to it
(``ref``) restarts its clock: an assign that stays unanswered for ``assign_timeout``
is *fenced*. Fencing is where the bridge departs from IACP: the forager is sent
``task.cancel``, the task goes back to its offerer as a ``Reject`` (so the board offers
it to another worker), and anything the forager later sends about that assign is
refused (:class:`Dropped` ``fenced``), never forwarded. A withdrawal (the board's
``Delete`` of the task), the forager's expiry, a halt and a disconnection fence the same
way (the last three tell nobody: the forager's node leaves the mesh, and the board
fences its claims itself). A forager holds at most ``slots`` open assigns; an Offer
beyond that is rejected as busy, as a draining or silent forager rejects every Offer.

**Results and review.** Partial results become ``Update`` on ``log``. A final result
with status ``ok`` becomes ``Create`` on ``log`` (artifacts as Documents) and the
profile's review request, an ``Offer`` on ``review`` naming the reviewer, because the
mesh's board finishes a task only when a reviewer approves it and a forager cannot ask
for review itself. The reviewer's ``Accept`` makes the bridge announce the task done on
the forager's behalf; its ``Reject`` re-assigns the task to the same forager with the
reviewer's reason in ``body.changes``. A final result with another status gives the
task back (``Reject``).

**Envelope rules.** Unknown fields are ignored. Versions other than ``1.1`` are refused
with a reason (1.0 has no ``ref``, so its results cannot be paired; 2.0 was never
served). ``ts`` is the sender's clock: it is read (the skew is reported), never trusted
for ordering or timeouts, which run on the monotonic ``now``. A line that is not JSON,
is too long, or lacks a required field is :class:`Dropped` (the driver logs it once and
counts it) and answered nothing; more than ``bad_line_limit`` of them within
``bad_line_window`` seconds close that connection only.

**Not yet, not lost.** An activity that reaches the session before it has joined, or
after it expired, was halted or closed, is answered :class:`Owed`: the driver declines
it and the node offers it again later. A driver that cannot keep what an activity
changed (:meth:`ForagerSession.carried`, written to disk) undoes it
(:meth:`ForagerSession.checkpoint`, :meth:`ForagerSession.rollback`) and declines too.
After a bridge restart, :meth:`ForagerSession.restore` takes back the assigns the last
process left open for the forager (:func:`assign_from_record`).

**Liveness.** Both sides send ``hb`` every ``heartbeat`` seconds. A forager silent for
``evasive_after`` is rejected new work and shown as draining on the mesh
(:class:`SetDraining`); silent for ``expire_after``, its open assigns are fenced and its
node leaves the mesh (:class:`Leave`), so the mesh re-offers its tasks as it does for
any worker that expires. If it speaks again on the same connection it joins again.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import orjson

from porter_mesh.core import as2
from porter_mesh.core import constants as C
from porter_mesh.core.advert import AGENT_NAME_RE, MAX_SLOTS, MAX_TOOLS, TOOL_NAME_RE
from porter_mesh.core.as2 import Activity
from porter_mesh.core.tasks import attempt_of, is_task_delete, with_attempt
from porter_mesh.errors import ActivityError, ConfigError, ProtocolError

__all__ = [
    "ASSIGN_TIMEOUT",
    "BAD_LINE_LIMIT",
    "DEFAULT_PORT",
    "FORAGER_KINDS",
    "HEARTBEAT",
    "IACP_VERSION",
    "MAX_LINE_BYTES",
    "QUEEN",
    "QUEEN_KINDS",
    "Assign",
    "AssignState",
    "BridgeSettings",
    "Close",
    "Dropped",
    "Event",
    "ForagerSession",
    "IacpMessage",
    "IdMint",
    "Leave",
    "LineError",
    "LineSplitter",
    "LineTooLong",
    "Lookup",
    "MeshSend",
    "Output",
    "Owed",
    "Phase",
    "Register",
    "SendLine",
    "SetDraining",
    "Store",
    "assign_from_record",
    "assign_to_record",
    "decode_line",
    "encode_message",
]

#: The only version served.
IACP_VERSION: Final = "1.1"
#: The reserved name of the orchestrator; the bridge speaks as it.
QUEEN: Final = "queen"
#: The article's port (the phero bus).
DEFAULT_PORT: Final = 7421
#: Seconds between heartbeats, both ways (the article's 10 s).
HEARTBEAT: Final = 10.0
#: The article's default ``assign_timeout``.
ASSIGN_TIMEOUT: Final = 300.0
#: Longest line accepted by default (bytes).
MAX_LINE_BYTES: Final = C.MAX_ACTIVITY_BYTES
#: Bad lines tolerated per window by default.
BAD_LINE_LIMIT: Final = 100

K_ASSIGN: Final = "task.assign"
K_ACCEPT: Final = "task.accept"
K_REJECT: Final = "task.reject"
K_RESULT: Final = "task.result"
K_CANCEL: Final = "task.cancel"
K_HB: Final = "hb"
K_MEM: Final = "mem.sync"
K_TOOL_QUERY: Final = "tool.query"
K_TOOL_REPLY: Final = "tool.reply"
K_DRAIN: Final = "ctl.drain"
K_HALT: Final = "ctl.halt"

#: Kinds a forager sends.
FORAGER_KINDS: Final = frozenset({K_ACCEPT, K_REJECT, K_RESULT, K_HB, K_MEM, K_TOOL_QUERY})
#: Kinds only the queen sends.
QUEEN_KINDS: Final = frozenset({K_ASSIGN, K_CANCEL, K_TOOL_REPLY, K_DRAIN, K_HALT})

_REQUIRED: Final = ("v", "id", "from", "to", "kind", "ts")
_MAX_SUMMARY: Final = 200
_MAX_ID: Final = 128
#: Mesh activity types that ask a worker for something it cannot do as a forager.
_REQUESTS: Final = frozenset({"Invoke", "Question", "Create", "Update"})
_REFUSED_VERSIONS: Final = {
    "1.0": "IACP 1.0 has no 'ref', so results cannot be paired with their assigns; "
           "upgrade the forager to IACP 1.1",
    "2.0": "IACP 2.0 was never served (binary framing, batched results); speak IACP 1.1",
}


# ----------------------------------------------------------------------------- codec


class LineError(ProtocolError):
    """A line that is not a usable IACP 1.1 message.

    Attributes:
        reason: ``bad-json``, ``not-object``, ``missing-field``, ``bad-field``,
            ``too-long`` or ``version``.
        version: the version the line declared, for ``version``.
        sender: the line's ``from``, when it could be read.
    """

    def __init__(self, message: str, *, reason: str, version: str | None = None,
                 sender: str | None = None) -> None:
        super().__init__(message, reason=reason)
        self.version = version
        self.sender = sender


@dataclass(frozen=True, slots=True)
class IacpMessage:
    """One IACP envelope (unknown fields dropped).

    Attributes:
        v: protocol version.
        id: unique per sender (foragers ``m-...``, the queen ``q-...``).
        sender: ``from``.
        to: the recipient's name.
        kind: dotted type (``task.result``...).
        ts: unix seconds on the sender's clock (may be skewed).
        ref: the id answered, if any.
        body: the kind's payload (empty when absent).
    """

    v: str
    id: str
    sender: str
    to: str
    kind: str
    ts: float
    ref: str | None = None
    body: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LineTooLong:
    """A line longer than the limit, already discarded (``size``: bytes seen)."""

    size: int


def decode_line(line: bytes) -> IacpMessage:
    """Decode one line (without its ``\\n``) into a message.

    Args:
        line: the raw bytes.

    Returns:
        The message; unknown fields are ignored.

    Raises:
        LineError: the line is not JSON, not an object, misses or mistypes a required
            field, or declares a version other than 1.1 (``reason="version"``).
    """
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise LineError(f"not JSON ({exc})", reason="bad-json") from None
    if not isinstance(data, dict):
        raise LineError(f"a message is a JSON object, not {type(data).__name__}",
                        reason="not-object")
    sender = data.get("from") if isinstance(data.get("from"), str) else None
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise LineError(f"missing required field(s) {', '.join(missing)}",
                        reason="missing-field", sender=sender)
    v = data["v"]
    if not isinstance(v, str):
        raise LineError(f"'v' must be a version string such as \"1.1\", not {v!r}",
                        reason="bad-field", sender=sender)
    if v != IACP_VERSION:
        why = _REFUSED_VERSIONS.get(v, f"IACP {v[:16]!r} is not a version this bridge "
                                       "serves; speak IACP 1.1")
        raise LineError(why, reason="version", version=v[:16], sender=sender)
    for key in ("id", "from", "to", "kind"):
        value = data[key]
        if not isinstance(value, str) or not value or len(value) > _MAX_ID:
            raise LineError(f"'{key}' must be a non-empty string of at most {_MAX_ID} "
                            "characters", reason="bad-field", sender=sender)
    ts = data["ts"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise LineError("'ts' must be unix seconds (a number)", reason="bad-field",
                        sender=sender)
    ref = data.get("ref")
    if ref is not None and (not isinstance(ref, str) or not ref or len(ref) > _MAX_ID):
        raise LineError("'ref' must be the id of the message answered", reason="bad-field",
                        sender=sender)
    body = data.get("body", {})
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise LineError("'body' must be an object", reason="bad-field", sender=sender)
    return IacpMessage(v, data["id"], data["from"], data["to"], data["kind"], float(ts),
                       ref, body)


def encode_message(msg: IacpMessage) -> bytes:
    """One line (with its ``\\n``) carrying ``msg``; ``ref`` and ``body`` only when set."""
    data: dict[str, Any] = {"v": msg.v, "id": msg.id, "from": msg.sender, "to": msg.to,
                            "kind": msg.kind, "ts": int(msg.ts)}
    if msg.ref is not None:
        data["ref"] = msg.ref
    if msg.body:
        data["body"] = dict(msg.body)
    return orjson.dumps(data) + b"\n"


class LineSplitter:
    """Cut a byte stream into lines of at most ``limit`` bytes.

    A longer line is discarded as it arrives (never buffered whole) and reported once as
    :class:`LineTooLong` when its ``\\n`` comes. Empty lines are skipped.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ConfigError(f"line limit must be >= 1 byte, got {limit}")
        self.limit = limit
        self._buf = bytearray()
        self._skipping = 0  # bytes of an over-long line discarded so far

    def feed(self, data: bytes) -> list[bytes | LineTooLong]:
        """Add received bytes; returns the complete lines (without ``\\n``)."""
        out: list[bytes | LineTooLong] = []
        start = 0
        while start < len(data):
            end = data.find(b"\n", start)
            chunk = data[start:] if end < 0 else data[start:end]
            if self._skipping:
                self._skipping += len(chunk)
            elif len(self._buf) + len(chunk) > self.limit:
                self._skipping = len(self._buf) + len(chunk)
                self._buf.clear()
            else:
                self._buf += chunk
            if end < 0:
                break
            if self._skipping:
                out.append(LineTooLong(self._skipping))
                self._skipping = 0
            elif self._buf.strip():
                out.append(bytes(self._buf).rstrip(b"\r"))
            self._buf.clear()
            start = end + 1
        return out


class IdMint:
    """The queen's message ids: ``q-`` and at least 6 hex digits, unique per bridge."""

    def __init__(self, start: int = 0) -> None:
        self._next = itertools.count(start)

    def __call__(self) -> str:
        return f"q-{next(self._next):06x}"


# ----------------------------------------------------------------------------- outputs


@dataclass(frozen=True, slots=True)
class SendLine:
    """Write ``message`` to the forager."""

    message: IacpMessage


@dataclass(frozen=True, slots=True)
class Register:
    """Put the forager on the mesh: start its node (the driver answers ``joined`` or
    ``refused``)."""

    name: str
    slots: int
    tools: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class MeshSend:
    """Send ``activity`` from the forager's node: ``task:<agent>`` direct, else broadcast."""

    channel: str
    activity: Activity


@dataclass(frozen=True, slots=True)
class Store:
    """Remember ``activity`` (a ``Remember``) in the forager's knowledge replica."""

    activity: Activity


@dataclass(frozen=True, slots=True)
class Lookup:
    """Answer the forager's ``tool.query`` from the mesh's adverts (``tool``: the tool
    asked about, or ``None`` for all); the driver calls
    :meth:`ForagerSession.tool_reply`."""

    query: IacpMessage
    tool: str | None


@dataclass(frozen=True, slots=True)
class SetDraining:
    """Show the forager's node as draining (``on``) or open on the mesh."""

    on: bool


@dataclass(frozen=True, slots=True)
class Leave:
    """The forager's node leaves the mesh; the connection stays open."""

    reason: str


@dataclass(frozen=True, slots=True)
class Close:
    """Close the connection (and the forager's node)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Dropped:
    """Something from the forager did not count: log it once per reason, count it.

    Attributes:
        reason: a short tag (``bad-json``, ``fenced``, ``unknown-ref``...).
        detail: what happened, in words.
        bad_line: the line itself was malformed (these count toward the flood limit).
    """

    reason: str
    detail: str
    bad_line: bool = False


@dataclass(frozen=True, slots=True)
class Owed:
    """The session cannot act on a mesh activity now (the forager is not joined yet, or
    not any more): the driver declines it, so the node keeps it owed and offers it again
    later, rather than acknowledging a message nobody handled."""

    reason: str


@dataclass(frozen=True, slots=True)
class Event:
    """Something worth reporting (``kind``: ``registered``, ``assigned``, ``fenced``,
    ``refused``...) with its details."""

    kind: str
    fields: Mapping[str, Any]


Output = SendLine | Register | MeshSend | Store | Lookup | SetDraining | Leave | Close | \
    Dropped | Owed | Event


# ----------------------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class BridgeSettings:
    """The bridge's timings and limits.

    Attributes:
        assign_timeout: seconds an assign may go unanswered before it is fenced and
            re-issued (IACP's ``assign_timeout``, default 300).
        heartbeat: seconds between ``hb`` messages, both ways (default 10).
        evasive_after: seconds of forager silence before it gets no new work (25).
        expire_after: seconds of forager silence before its node leaves the mesh (60).
        max_line_bytes: longest line accepted (1 MiB).
        bad_line_limit: bad lines tolerated per ``bad_line_window`` before the
            connection is closed (100).
        bad_line_window: seconds (10).
        reviewer: the agent asked to review a forager's results (``reviewer``; tasks the
            human offered are reviewed by the human, ``porter-ui``).
    """

    assign_timeout: float = ASSIGN_TIMEOUT
    heartbeat: float = HEARTBEAT
    evasive_after: float = 25.0
    expire_after: float = 60.0
    max_line_bytes: int = MAX_LINE_BYTES
    bad_line_limit: int = BAD_LINE_LIMIT
    bad_line_window: float = 10.0
    reviewer: str = "reviewer"

    def __post_init__(self) -> None:
        for name in ("assign_timeout", "heartbeat", "bad_line_window"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a positive number of seconds, got {value}")
        if not 0 < self.heartbeat < self.evasive_after < self.expire_after:
            raise ConfigError(
                "timings must satisfy 0 < heartbeat < evasive_after < expire_after (got "
                f"{self.heartbeat}, {self.evasive_after}, {self.expire_after})")
        if self.max_line_bytes < 256:
            raise ConfigError(f"max_line_bytes must be >= 256, got {self.max_line_bytes}")
        if self.bad_line_limit < 1:
            raise ConfigError(f"bad_line_limit must be >= 1, got {self.bad_line_limit}")
        if not AGENT_NAME_RE.fullmatch(self.reviewer):
            raise ConfigError(f"reviewer {self.reviewer!r} is not an agent name")


# ----------------------------------------------------------------------------- session


class Phase(enum.Enum):
    """Where a connection is (see the diagram in the module docstring)."""

    NEW = "new"
    JOINING = "joining"
    JOINED = "joined"
    GONE = "gone"
    CLOSED = "closed"


class AssignState(enum.Enum):
    """Where one ``task.assign`` is."""

    SENT = "sent"  # waiting for an answer
    ACCEPTED = "accepted"  # the forager took it
    IN_REVIEW = "in-review"  # final result forwarded; the reviewer decides
    DONE = "done"  # approved
    REVISED = "revised"  # sent back by the reviewer: a new assign carries the task on
    DECLINED = "declined"  # task.reject
    FAILED = "failed"  # final result with a status other than ok
    FENCED = "fenced"  # timed out, withdrawn, expired, halted: nothing from it counts


_OPEN: Final = frozenset({AssignState.SENT, AssignState.ACCEPTED})


@dataclass(slots=True)
class Assign:
    """One ``task.assign`` and the mesh task it carries (mutable, inside a session).

    Attributes:
        qid: the queen's message id; the forager's answers ``ref`` it.
        context: the task URN.
        attempt: the board's claim attempt (echoed on every activity), if the Offer had one.
        offered_by: who offered the task (answers go to ``task:<offered_by>``).
        summary / content / tag: the task.
        revision: 0 for the first assign of a claim, then 1, 2... after review rejects.
        changes: the reviewer's reason, for a revision.
        state: see :class:`AssignState`.
        answered_at: monotonic time of the assign or of its last answer.
        note: why it was fenced, declined or failed.
    """

    qid: str
    context: str
    attempt: int | None
    offered_by: str
    summary: str
    content: str | None
    tag: tuple[str, ...]
    revision: int
    changes: str | None
    state: AssignState
    answered_at: float
    note: str = ""


#: Assigns a restarted bridge carries over: the forager may still hold them.
_CARRIED: Final = frozenset({*_OPEN, AssignState.IN_REVIEW})
_RECORD_FIELDS: Final = ("qid", "context", "attempt", "offered_by", "summary", "content",
                         "tag", "revision", "changes", "state")


def assign_to_record(a: Assign) -> dict[str, Any]:
    """``a`` as a JSON-ready record (what a restarted bridge needs to carry it over)."""
    return {"qid": a.qid, "context": a.context, "attempt": a.attempt,
            "offered_by": a.offered_by, "summary": a.summary, "content": a.content,
            "tag": list(a.tag), "revision": a.revision, "changes": a.changes,
            "state": a.state.value}


def assign_from_record(record: Mapping[str, Any], *, now: float) -> Assign:
    """The assign a record written by :func:`assign_to_record` describes.

    Args:
        record: the decoded record.
        now: monotonic seconds; the assign's clock restarts here.

    Returns:
        The assign (its ``answered_at`` is ``now``).

    Raises:
        ProtocolError: the record is not one (``reason="bad-record"``).
    """
    try:
        missing = [k for k in _RECORD_FIELDS if k not in record]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        state = AssignState(record["state"])
        if state not in _CARRIED:
            raise ValueError(f"state {state.value} is not carried over")
        strings = ("qid", "context", "offered_by", "summary")
        if not all(isinstance(record[k], str) and record[k] for k in strings):
            raise ValueError(f"{', '.join(strings)} must be non-empty strings")
        attempt, revision = record["attempt"], record["revision"]
        if attempt is not None and (isinstance(attempt, bool) or not isinstance(attempt, int)):
            raise ValueError("attempt must be a whole number or null")
        if isinstance(revision, bool) or not isinstance(revision, int) or revision < 0:
            raise ValueError("revision must be a whole number >= 0")
        tag, content, changes = record["tag"], record["content"], record["changes"]
        if not (isinstance(tag, list) and all(isinstance(t, str) for t in tag)):
            raise ValueError("tag must be a list of strings")
        if not all(v is None or isinstance(v, str) for v in (content, changes)):
            raise ValueError("content and changes must be strings or null")
    except (ValueError, TypeError) as exc:
        raise ProtocolError(f"not an assign record ({exc})", reason="bad-record") from None
    return Assign(record["qid"], record["context"], attempt, record["offered_by"],
                  record["summary"], content, tuple(tag), revision, changes, state, now)


def _text_of(act: Activity) -> str | None:
    obj = act.object
    if isinstance(obj, str):
        return obj
    if obj is not None and obj.content:
        return obj.content
    return act.content


def _line_summary(text: str) -> str:
    first = (text.strip().splitlines() or [""])[0]
    return first[:_MAX_SUMMARY] or "(no summary)"


def _artifacts(body: Mapping[str, Any]) -> list[str] | None:
    """The result's artifact references, or ``None`` when ``artifacts`` is malformed."""
    raw = body.get("artifacts", [])
    if not isinstance(raw, list):
        return None
    out = []
    for item in raw:
        if isinstance(item, str) and item:
            out.append(item)
        elif isinstance(item, dict) and isinstance(item.get("url"), str) and item["url"]:
            out.append(item["url"])
        else:
            return None
    return out


class ForagerSession:
    """The queen's side of one forager connection, and its agent's side on the mesh.

    Args:
        settings: timings and limits.
        mint: makes the queen's message ids.
        peer: the connection's address, for messages.
        now: monotonic seconds at connection.
        draining: the forager starts drained (the bridge itself was told to drain).
    """

    def __init__(self, settings: BridgeSettings, mint: Callable[[], str], *, peer: str,
                 now: float, draining: bool = False) -> None:
        self.settings = settings
        self.mint = mint
        self.peer = peer
        self.phase = Phase.NEW
        self.name: str | None = None
        self.slots = 1
        self.tools: tuple[str, ...] = ()
        self.draining = draining  # told to drain (ctl.drain sent or due on joining)
        self.evasive = False
        self.skew: float | None = None  # forager clock minus ours, seconds (last hb)
        self.connected_at = now
        self.last_heard = now
        self._last_beat: float | None = None
        self._assigns: dict[str, Assign] = {}
        self._current: dict[str, str] = {}  # context -> qid of its latest assign
        self._bad_window_start = now
        self._bad_in_window = 0

    # -- queries ---------------------------------------------------------------------------

    def assigns(self) -> list[Assign]:
        """Every assign of this connection, oldest first."""
        return list(self._assigns.values())

    def assign(self, qid: str) -> Assign | None:
        """The assign with this queen id, if any."""
        return self._assigns.get(qid)

    @property
    def open_assigns(self) -> list[Assign]:
        """Assigns waiting for the forager's answer (they use its slots)."""
        return [a for a in self._assigns.values() if a.state in _OPEN]

    def carried(self) -> list[Assign]:
        """The assigns a restarted bridge must carry over (sent, accepted or in review):
        what its driver keeps on disk."""
        return [a for a in self._assigns.values() if a.state in _CARRIED]

    def checkpoint(self) -> tuple[dict[str, Assign], dict[str, str]]:
        """A copy of the assigns, for :meth:`rollback` (a driver that cannot keep what an
        input changed undoes it, and declines the input)."""
        return ({q: replace(a) for q, a in self._assigns.items()}, dict(self._current))

    def rollback(self, checkpoint: tuple[dict[str, Assign], dict[str, str]]) -> None:
        """Put the assigns back as :meth:`checkpoint` copied them."""
        assigns, current = checkpoint
        self._assigns = {q: replace(a) for q, a in assigns.items()}
        self._current = dict(current)

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`tick` has something to do, or ``None``."""
        if self.phase in (Phase.NEW, Phase.JOINING, Phase.CLOSED):
            return None
        times = [a.answered_at + self.settings.assign_timeout for a in self.open_assigns]
        times.append((self._last_beat or 0.0) + self.settings.heartbeat)
        if self.phase is Phase.JOINED:
            later = self.settings.expire_after if self.evasive else self.settings.evasive_after
            times.append(self.last_heard + later)
        return min(times)

    # -- inputs: the forager ---------------------------------------------------------------

    def receive_line(self, line: bytes | LineTooLong, *, now: float,
                     wall: float) -> list[Output]:
        """Handle one line from the forager.

        Args:
            line: the line's bytes, or the marker of a discarded over-long line.
            now: monotonic seconds.
            wall: this host's unix time (for ``ts`` and the skew).

        Returns:
            The outputs.
        """
        if self.phase is Phase.CLOSED:
            return []
        if isinstance(line, LineTooLong):
            return self._bad(now, "too-long", f"a line of {line.size} bytes is longer than "
                             f"the {self.settings.max_line_bytes}-byte limit; it was skipped")
        try:
            msg = decode_line(line)
        except LineError as exc:
            if exc.reason == "version":
                return self._refuse(f"refused: {exc}", to=exc.sender, wall=wall,
                                    event={"version": exc.version})
            return self._bad(now, exc.reason, str(exc))
        if self.name is not None and msg.sender != self.name:
            return self._bad(now, "wrong-sender", f"this connection speaks for {self.name}, "
                             f"not {msg.sender[:60]!r}")
        self.last_heard = now
        if msg.kind in QUEEN_KINDS:
            return [Dropped("wrong-direction", f"{msg.kind} is sent by the queen, not to it")]
        if msg.kind not in FORAGER_KINDS:
            return [Dropped("unknown-kind", f"unknown kind {msg.kind[:40]!r} (ignored)")]
        if msg.kind == K_HB:
            return self._on_hb(msg, now, wall)
        if self.phase is not Phase.JOINED:
            what = "it left the mesh after its silence" if self.phase is Phase.GONE else \
                "it has not sent its first hb"
            return self._late_or(msg, now, Dropped(
                "not-registered", f"{msg.kind} from {msg.sender} before it joined the mesh "
                f"({what}); send hb first"))
        if msg.kind == K_ACCEPT:
            return self._on_accept(msg, now)
        if msg.kind == K_REJECT:
            return self._on_reject(msg, now)
        if msg.kind == K_RESULT:
            return self._on_result(msg, now)
        if msg.kind == K_MEM:
            return self._on_mem(msg, now)
        tool = msg.body.get("tool")
        return [Lookup(msg, tool if isinstance(tool, str) else None)]

    def disconnected(self, now: float) -> list[Output]:
        """The connection ended (EOF or error): fence what was open."""
        if self.phase is Phase.CLOSED:
            return []
        out: list[Output] = []
        for a in self.open_assigns:
            out += self._fence(a, "the forager disconnected", 0.0, cancel=False, tell=False)
        self.phase = Phase.CLOSED
        return [*out, Event("disconnected", {"forager": self.name, "peer": self.peer})]

    # -- inputs: the driver ------------------------------------------------------------------

    def joined(self, *, now: float, wall: float) -> list[Output]:
        """The forager's node is on the mesh."""
        if self.phase is not Phase.JOINING:
            return []
        self.phase = Phase.JOINED
        self.last_heard = now
        self.evasive = False
        out: list[Output] = [Event("registered", {"forager": self.name, "slots": self.slots,
                                                  "tools": list(self.tools)}),
                             self._beat(now, wall)]
        if self.draining:
            out += [SetDraining(True), self._line(K_DRAIN, wall, body={
                "reason": "the bridge is draining"})]
        return out

    def restore(self, assigns: Sequence[Assign], *, now: float, wall: float) -> list[Output]:
        """Carry over the assigns an earlier bridge process left open for this forager.

        Call it right after :meth:`joined`. The forager reconnected after the bridge
        restarted; it may still hold them or may have lost them, and IACP cannot ask. So
        each open one is sent again with its own id (an id is unique per sender: a forager
        that still holds it sees the same assign) and its clock restarts; one in review
        waits for the reviewer's verdict as before. Answers to them count as usual, and
        the mesh's board decides as for any worker whose node restarted: its withdrawal
        or a new attempt's Offer supersedes them.

        Args:
            assigns: from :func:`assign_from_record`.
            now: monotonic seconds.
            wall: this host's unix time.

        Returns:
            The outputs (the assigns sent again, an event per assign).
        """
        if self.phase is not Phase.JOINED:
            return []
        out: list[Output] = []
        for a in assigns:
            if a.qid in self._assigns or a.context in self._current:
                continue
            a.answered_at = now
            if a.state in _OPEN:
                out += self._send_assign(a, wall)
            else:
                self._assigns[a.qid] = a
                self._current[a.context] = a.qid
            out.append(Event("restored", {"forager": self.name, "ref": a.qid,
                                          "context": a.context, "state": a.state.value}))
        return out

    def deferred(self, reason: str) -> list[Output]:
        """The forager cannot join *now* (the bridge cannot keep its record): close the
        connection without ``ctl.halt``, which would stop it for good; it may connect
        again."""
        self.phase = Phase.CLOSED
        return [Event("deferred", {"forager": self.name, "peer": self.peer,
                                   "reason": reason}), Close(reason)]

    def refused(self, reason: str, *, wall: float) -> list[Output]:
        """The forager cannot join (its name is taken...): say why and close."""
        return self._refuse(reason, to=self.name, wall=wall, event={})

    def tool_reply(self, query: IacpMessage, agents: Mapping[str, Sequence[str]], *,
                   wall: float) -> list[Output]:
        """Answer a ``tool.query`` (:class:`Lookup`) with what the mesh advertises.

        Args:
            query: the forager's query.
            agents: every agent on the mesh and the tools it advertises.
            wall: this host's unix time.
        """
        tool = query.body.get("tool")
        if isinstance(tool, str):
            body: dict[str, Any] = {"tool": tool,
                                    "agents": sorted(a for a, ts in agents.items() if tool in ts)}
        else:
            by_tool: dict[str, list[str]] = {}
            for agent, tools in sorted(agents.items()):
                for t in tools:
                    by_tool.setdefault(t, []).append(agent)
            body = {"tools": by_tool}
        return [self._line(K_TOOL_REPLY, wall, ref=query.id, body=body)]

    def tick(self, *, now: float, wall: float) -> list[Output]:
        """Advance time: heartbeats, the forager's liveness, assign timeouts."""
        out: list[Output] = []
        if self.phase in (Phase.NEW, Phase.JOINING, Phase.CLOSED):
            return out
        if now - self._bad_window_start >= self.settings.bad_line_window:
            self._bad_window_start, self._bad_in_window = now, 0
        if self._last_beat is None or now - self._last_beat >= self.settings.heartbeat:
            out.append(self._beat(now, wall))
        if self.phase is Phase.JOINED:
            quiet = now - self.last_heard
            if quiet >= self.settings.expire_after:
                reason = f"silent for {quiet:.0f}s (no hb): expired"
                for a in self.open_assigns:
                    out += self._fence(a, f"{self.name} {reason}", wall, tell=False)
                self.phase = Phase.GONE
                self.evasive = False
                return [*out, Event("expired", {"forager": self.name}), Leave(reason)]
            if quiet >= self.settings.evasive_after and not self.evasive:
                self.evasive = True
                out += [SetDraining(True), Event("evasive", {"forager": self.name})]
        for a in self.open_assigns:
            if now - a.answered_at >= self.settings.assign_timeout:
                out += self._fence(
                    a, f"{self.name} did not answer {K_ASSIGN} {a.qid} within "
                    f"{self.settings.assign_timeout:g}s (assign_timeout)", wall,
                    tell=self.phase is Phase.JOINED)
        return out

    # -- inputs: the mesh ----------------------------------------------------------------------

    def on_activity(self, channel: str, sender: str, activity: Activity, *, now: float,
                    wall: float) -> list[Output]:
        """An activity delivered to the forager's node.

        Args:
            channel: where it travelled (``task:<forager>`` when direct).
            sender: the sending agent.
            activity: the activity.
            now: monotonic seconds.
            wall: this host's unix time.
        """
        if self.phase is not Phase.JOINED or self.name is None:
            return [Owed(f"{self.name or 'the forager'} is {self.phase.value}, not joined: "
                         f"the {activity.type} from {sender} waits")]
        direct = channel == C.DIRECT_PREFIX + self.name
        ctx = activity.context
        current = self._assigns.get(self._current.get(ctx, "")) if ctx else None
        if direct and activity.type == "Offer":
            return self._on_offer(sender, activity, current, now, wall)
        if direct and is_task_delete(activity):
            if current is None or current.state not in _OPEN:
                return []
            attempt = attempt_of(activity)
            if attempt is not None and current.attempt is not None and attempt != current.attempt:
                return []
            return self._fence(current, f"withdrawn by {sender}: {activity.summary}", wall,
                               tell=False)
        if (current is not None and current.state is AssignState.IN_REVIEW
                and activity.type in ("Accept", "Reject")
                and sender == self._reviewer(current)
                and (direct or channel == C.CHANNEL_REVIEW)):
            attempt = attempt_of(activity)
            if attempt is not None and current.attempt is not None and attempt != current.attempt:
                return []
            return self._on_verdict(current, activity, now, wall)
        if direct and activity.type in _REQUESTS and current is None:
            return [self._reply(sender, as2.reject(
                self.name, f"I am an IACP forager: I take tasks as an Offer with a context; "
                f"I cannot act on a {activity.type}", context=ctx), None)]
        return []

    def on_control(self, kind: str, sender: str, *, now: float, wall: float) -> list[Output]:
        """A control message addressed to the forager's node (or to every node).

        ``drain`` becomes ``ctl.drain`` (once); ``halt`` becomes ``ctl.halt``, fences
        every open assign and closes the connection.
        """
        if self.phase in (Phase.NEW, Phase.CLOSED):
            return []
        if kind == "drain":
            if self.draining:
                return []
            self.draining = True
            if self.phase is not Phase.JOINED:
                return []
            return [SetDraining(True), self._line(K_DRAIN, wall, body={
                "reason": f"drain requested by {sender}"}),
                Event("drained", {"forager": self.name, "by": sender})]
        if kind == "halt":
            reason = f"halted by {sender}"
            out: list[Output] = []
            for a in self.open_assigns:
                out += self._fence(a, reason, wall, cancel=False, tell=False)
            self.phase = Phase.CLOSED
            return [*out, self._line(K_HALT, wall, body={"reason": reason}),
                    Event("halted", {"forager": self.name, "by": sender}), Close(reason)]
        return []

    # -- internals: forager lines ------------------------------------------------------------

    def _bad(self, now: float, reason: str, detail: str) -> list[Output]:
        if now - self._bad_window_start >= self.settings.bad_line_window:
            self._bad_window_start, self._bad_in_window = now, 0
        self._bad_in_window += 1
        out: list[Output] = [Dropped(reason, detail, bad_line=True)]
        if self._bad_in_window > self.settings.bad_line_limit:
            out += self._close_all(
                f"more than {self.settings.bad_line_limit} bad lines within "
                f"{self.settings.bad_line_window:g}s", now)
        return out

    def _close_all(self, reason: str, now: float) -> list[Output]:
        out: list[Output] = []
        for a in self.open_assigns:
            out += self._fence(a, reason, 0.0, cancel=False, tell=False)
        self.phase = Phase.CLOSED
        return [*out, Event("closed", {"forager": self.name, "peer": self.peer,
                                       "reason": reason}), Close(reason)]

    def _refuse(self, reason: str, *, to: str | None, wall: float,
                event: Mapping[str, Any]) -> list[Output]:
        self.phase = Phase.CLOSED
        return [self._line(K_HALT, wall, to=to, body={"reason": reason}),
                Event("refused", {"forager": to, "peer": self.peer, "reason": reason, **event}),
                Close(reason)]

    def _on_hb(self, msg: IacpMessage, now: float, wall: float) -> list[Output]:
        self.skew = msg.ts - wall
        if self.phase is Phase.JOINED:
            if self.evasive:
                self.evasive = False
                return [SetDraining(self.draining), Event("alive", {"forager": self.name})]
            return []
        if self.phase is Phase.JOINING:
            return []
        slots = msg.body.get("slots", 1)
        if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= MAX_SLOTS:
            return self._bad(now, "bad-field", f"hb body.slots must be a whole number "
                             f"1-{MAX_SLOTS}, not {slots!r}")
        tools = msg.body.get("tools", [])
        if (not isinstance(tools, list) or len(tools) > MAX_TOOLS
                or not all(isinstance(t, str) and TOOL_NAME_RE.fullmatch(t) for t in tools)):
            return self._bad(now, "bad-field", f"hb body.tools must be a list of at most "
                             f"{MAX_TOOLS} tool names (letters, digits, . _ -)")
        name = msg.sender
        if name == QUEEN or not AGENT_NAME_RE.fullmatch(name):
            return self._refuse(
                f"refused: {name[:60]!r} cannot be an agent name on the mesh; use 1-56 "
                "lowercase letters, digits, '-' or '_' ('queen' is reserved)",
                to=name, wall=wall, event={})
        self.name, self.slots = name, slots
        self.tools = tuple(dict.fromkeys(tools))
        self.phase = Phase.JOINING
        return [Register(name, self.slots, self.tools)]

    def _answered(self, msg: IacpMessage) -> Assign | list[Output]:
        """The open assign ``msg`` answers, or the outputs that refuse it."""
        if msg.ref is None:
            return self._bad(self.last_heard, "missing-field",
                             f"{msg.kind} must carry 'ref' (the id of its task.assign)")
        a = self._assigns.get(msg.ref)
        if a is None:
            return [Dropped("unknown-ref", f"{msg.kind} refers to {msg.ref[:40]!r}, which "
                            "is not an assign sent on this connection")]
        if a.state is AssignState.FENCED:
            return self._refused_late(msg, a)
        if a.state not in _OPEN:
            return [Dropped("already-answered", f"{msg.kind} for {a.qid}, which is "
                            f"already {a.state.value} (ignored)")]
        return a

    def _refused_late(self, msg: IacpMessage, a: Assign) -> list[Output]:
        return [Dropped("fenced", f"refused {msg.kind} {msg.id} for {a.qid} ({a.context}): "
                        f"that assign was fenced ({a.note}); the task is done elsewhere"),
                Event("refused-late", {"forager": self.name, "kind": msg.kind, "ref": a.qid,
                                       "context": a.context, "why": a.note})]

    def _late_or(self, msg: IacpMessage, now: float, otherwise: Dropped) -> list[Output]:
        a = self._assigns.get(msg.ref or "")
        if a is not None and a.state is AssignState.FENCED:
            return self._refused_late(msg, a)
        return [otherwise]

    def _on_accept(self, msg: IacpMessage, now: float) -> list[Output]:
        a = self._answered(msg)
        if not isinstance(a, Assign):
            return a
        if a.state is AssignState.ACCEPTED:
            return [Dropped("already-answered", f"second task.accept for {a.qid} (ignored)")]
        a.state, a.answered_at = AssignState.ACCEPTED, now
        return self._accept_out(a)

    def _accept_out(self, a: Assign) -> list[Output]:
        assert self.name is not None
        return [self._reply(a.offered_by, as2.accept(
            self.name, _line_summary(f"Starting work on {a.summary}"), context=a.context), a),
            Event("accepted", {"forager": self.name, "ref": a.qid, "context": a.context})]

    def _on_reject(self, msg: IacpMessage, now: float) -> list[Output]:
        reason = msg.body.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            return self._bad(now, "missing-field", "task.reject must carry body.reason")
        a = self._answered(msg)
        if not isinstance(a, Assign):
            return a
        assert self.name is not None
        a.state, a.answered_at, a.note = AssignState.DECLINED, now, reason
        self._current.pop(a.context, None)
        return [self._reply(a.offered_by, as2.reject(
            self.name, _line_summary(reason), reason, context=a.context), a),
            Event("rejected", {"forager": self.name, "ref": a.qid, "reason": reason})]

    def _on_result(self, msg: IacpMessage, now: float) -> list[Output]:
        body = msg.body
        partial = body.get("partial", False)
        artifacts = _artifacts(body)
        status = body.get("status", "ok")
        if not isinstance(partial, bool) or artifacts is None or not isinstance(status, str):
            return self._bad(now, "bad-field", "task.result: body.partial must be true or "
                             "false, body.status a string, body.artifacts a list of "
                             "references")
        a = self._answered(msg)
        if not isinstance(a, Assign):
            return a
        assert self.name is not None
        out: list[Output] = []
        if a.state is AssignState.SENT:
            # A result without task.accept first: the board needs the Accept.
            a.state = AssignState.ACCEPTED
            out += self._accept_out(a)
        a.answered_at = now
        text = body.get("summary") if isinstance(body.get("summary"), str) else None
        docs = as2.collection([as2.document(u) for u in artifacts]) if artifacts else None
        if partial:
            summary = _line_summary(text or f"Progress on {a.summary}")
            obj: Any = docs if docs is not None else as2.note_object(text or summary)
            out += [MeshSend(C.CHANNEL_LOG, self._stamp(
                as2.update(self.name, summary, obj, context=a.context), a)),
                Event("partial", {"forager": self.name, "ref": a.qid, "artifacts": artifacts})]
            return out
        if status != "ok":
            reason = body.get("reason") if isinstance(body.get("reason"), str) else text
            why = f"the forager reported status {status!r}" + (f": {reason}" if reason else "")
            a.state, a.note = AssignState.FAILED, why
            self._current.pop(a.context, None)
            return [*out, self._reply(a.offered_by, as2.reject(
                self.name, _line_summary(why), why, context=a.context), a),
                Event("failed", {"forager": self.name, "ref": a.qid, "status": status})]
        a.state = AssignState.IN_REVIEW
        reviewer = self._reviewer(a)
        result_note = as2.note_object(text or f"status {status}")
        created = Activity("Create", self.name, _line_summary(f"Result: {text or a.summary}"),
                           context=a.context, object=docs or as2.collection([]),
                           result=result_note, instrument=("iacp",))
        request = as2.offer(self.name, _line_summary(f"Ready for review: {a.summary}"),
                            target=reviewer, context=a.context,
                            object=docs or as2.collection([]))
        return [*out, MeshSend(C.CHANNEL_LOG, self._stamp(created, a)),
                MeshSend(C.CHANNEL_REVIEW, self._stamp(request, a)),
                Event("result", {"forager": self.name, "ref": a.qid, "context": a.context,
                                 "artifacts": artifacts, "reviewer": reviewer})]

    def _on_mem(self, msg: IacpMessage, now: float) -> list[Output]:
        body = msg.body
        facts = body.get("facts")
        items = facts if isinstance(facts, list) else [body]
        pairs = []
        for item in items:
            about = item.get("about") if isinstance(item, dict) else None
            finding = item.get("finding") if isinstance(item, dict) else None
            if not (isinstance(about, str) and about and isinstance(finding, str) and finding):
                return self._bad(now, "missing-field", "mem.sync needs body.about and "
                                 "body.finding (or body.facts, a list of them)")
            pairs.append((about, finding))
        a = self._assigns.get(msg.ref or "")
        if a is not None and a.state is AssignState.FENCED:
            return self._refused_late(msg, a)
        assert self.name is not None
        out: list[Output] = []
        for about, finding in pairs:
            try:
                act = as2.remember(self.name, _line_summary(finding), about, finding,
                                   context=a.context if a is not None else None)
            except ActivityError as exc:
                return self._bad(now, "bad-field", f"mem.sync: {exc}")
            out.append(Store(self._stamp(act, a) if a is not None else act))
        return out

    # -- internals: the mesh ------------------------------------------------------------------

    def _reviewer(self, a: Assign) -> str:
        return C.HUMAN_AGENT if a.offered_by == C.HUMAN_AGENT else self.settings.reviewer

    def _on_offer(self, sender: str, offer: Activity, current: Assign | None, now: float,
                  wall: float) -> list[Output]:
        assert self.name is not None
        ctx = offer.context
        if ctx is None:
            return [self._reply(sender, as2.reject(
                self.name, "Cannot take an Offer without a task context: send it with "
                "context urn:porter:task:<id>"), None)]
        attempt = attempt_of(offer)
        out: list[Output] = []
        if current is not None and current.state in (*_OPEN, AssignState.IN_REVIEW):
            if current.attempt == attempt:
                return []  # the same offer again
            out += self._fence(current, f"superseded by attempt {attempt} of {ctx}", wall,
                               tell=False)
        refusal = None
        if self.draining:
            refusal = "Draining: finishing what I hold, taking nothing new"
        elif self.evasive:
            refusal = f"{self.name} is not answering heartbeats; offer it elsewhere"
        elif len(self.open_assigns) >= self.slots:
            refusal = f"Busy: all {self.slots} slot(s) taken"
        if refusal is not None:
            return [*out, self._reply(sender, with_attempt(as2.reject(
                self.name, refusal, context=ctx), attempt), None),
                Event("busy", {"forager": self.name, "context": ctx, "reason": refusal})]
        a = Assign(self.mint(), ctx, attempt, sender, _line_summary(offer.summary),
                   _text_of(offer), tuple(offer.tag or ()), 0, None, AssignState.SENT, now)
        return [*out, *self._send_assign(a, wall)]

    def _send_assign(self, a: Assign, wall: float) -> list[Output]:
        self._assigns[a.qid] = a
        self._current[a.context] = a.qid
        body: dict[str, Any] = {"node": a.context, "summary": a.summary,
                                "deadline": int(wall + self.settings.assign_timeout)}
        if a.content:
            body["content"] = a.content
        if a.tag:
            body["tag"] = list(a.tag)
        if a.attempt is not None:
            body["attempt"] = a.attempt
        if a.revision:
            body["revision"] = a.revision
            body["changes"] = a.changes or ""
        return [self._line(K_ASSIGN, wall, msg_id=a.qid, body=body),
                Event("assigned", {"forager": self.name, "id": a.qid, "context": a.context,
                                   "attempt": a.attempt, "revision": a.revision})]

    def _on_verdict(self, a: Assign, verdict: Activity, now: float,
                    wall: float) -> list[Output]:
        assert self.name is not None
        if verdict.type == "Accept":
            a.state = AssignState.DONE
            self._current.pop(a.context, None)
            done = as2.announce(self.name, _line_summary(f"Done: {a.summary}"),
                                f"Approved by {verdict.actor}.", context=a.context)
            return [MeshSend(C.CHANNEL_LOG, self._stamp(done, a)),
                    Event("approved", {"forager": self.name, "ref": a.qid,
                                       "context": a.context})]
        a.state = AssignState.REVISED
        reason = _text_of(verdict) or verdict.summary
        nxt = Assign(self.mint(), a.context, a.attempt, a.offered_by, a.summary, a.content,
                     a.tag, a.revision + 1, reason, AssignState.SENT, now)
        return [Event("changes-requested", {"forager": self.name, "ref": a.qid,
                                            "reason": reason}), *self._send_assign(nxt, wall)]

    def _fence(self, a: Assign, reason: str, wall: float, *, cancel: bool = True,
               tell: bool = True) -> list[Output]:
        """End an open assign: nothing from it counts any more.

        ``cancel``: send the forager ``task.cancel``; ``tell``: give the task back to its
        offerer with a ``Reject`` (so the board re-issues it to another worker).
        """
        a.state, a.note = AssignState.FENCED, reason
        if self._current.get(a.context) == a.qid:
            del self._current[a.context]
        out: list[Output] = [Event("fenced", {"forager": self.name, "ref": a.qid,
                                              "context": a.context, "reason": reason})]
        if cancel:
            out.append(self._line(K_CANCEL, wall, ref=a.qid, body={"node": a.context,
                                                                    "reason": reason}))
        if tell and self.name is not None:
            out.append(self._reply(a.offered_by, as2.reject(
                self.name, _line_summary(reason), reason, context=a.context), a))
        return out

    def _stamp(self, act: Activity, a: Assign | None) -> Activity:
        return with_attempt(act, a.attempt) if a is not None else act

    def _reply(self, recipient: str, act: Activity, a: Assign | None) -> MeshSend:
        return MeshSend(C.DIRECT_PREFIX + recipient, self._stamp(act, a))

    def _beat(self, now: float, wall: float) -> SendLine:
        self._last_beat = now
        return self._line(K_HB, wall, body={"role": QUEEN, "slots": self.slots,
                                            "open": len(self.open_assigns)})

    def _line(self, kind: str, wall: float, *, to: str | None = None, ref: str | None = None,
              body: Mapping[str, Any] | None = None, msg_id: str | None = None) -> SendLine:
        return SendLine(IacpMessage(IACP_VERSION, msg_id or self.mint(), QUEEN,
                                    to or self.name or "unknown", kind, wall, ref,
                                    dict(body or {})))
