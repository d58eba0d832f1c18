"""What the dashboard remembers: the message log and the task cards.

Theory of operation
-------------------
Every activity the ``porter-ui`` node observes (broadcasts on ``log``, ``task`` and
``review``, copies of direct messages anywhere on the mesh, messages to ``porter-ui``
itself) and every activity it sends becomes one **record**, a JSON object::

    {"id", "ts", "channel", "sender", "recipient", "direct", "type", "summary",
     "context", "activity", "seq", "inbox"}

(:func:`message_record`; the contract is in ``docs/ui.md``). Records go to two places.

**The message log** (:class:`MessageLog`) appends each record as one JSON line to
``messages.jsonl`` and keeps the newest ``history`` records in memory, indexed by id,
for paging backwards (``before``), filters, and resuming a stream after a given id.
Memory and disk are both bounded: when the current file holds ``history`` lines it
becomes ``messages.1.jsonl`` (replacing the previous one) and a new file starts, so at
most ``2 * history`` lines are on disk and a restart reloads the newest ``history`` of
them. A torn last line (the process was killed mid-write) or any other line that is not
a record is skipped, counted and logged once. Lines are buffered and written by
:meth:`MessageLog.flush`, which the server calls with every stream batch (so at most one
batch is lost to ``kill -9``).

**A write that fails** (a full disk, a quota, a read-only remount) loses nothing the
dashboard has shown or acknowledged: the records stay in memory (the page keeps being
served from there), and what was not written, down to the byte where a short write
stopped, is written when a later :meth:`MessageLog.flush` succeeds, so no line on disk
is torn or doubled. The first failure of an outage is logged once (the file, the error,
the free space left there); every failed attempt is counted; :meth:`MessageLog.status`
says so for the API; and the first successful write after it is logged too. While the
disk stays full the unwritten records are bounded by ``history`` (older ones would not
be reloaded after a restart anyway); any beyond that are counted as ``dropped``.

**The task tracker** (:class:`TaskTracker`) folds the records whose ``context`` is a
task id into one card per task. It watches; it enforces nothing (the architect's
:class:`~porter_mesh.core.tasks.TaskBoard` and the holders do that). Each card's state is
the mesh's one vocabulary, followed by :func:`porter_mesh.core.lifecycle.follow` from the
activities seen (submitted, working, input-required, in-review, changes-requested,
completed, failed, cancelled, rejected; ``docs/protocol.md``, "Task states"), and the
card keeps the path of states it went through, its parent task, and the holder's open
question while it is input-required. Only an ``Offer`` starts a card: a ``Question`` or a
report with a task context and no Offer seen is not a task.

A review request is **for the human** (the card's ``review`` is set) when it is
addressed to ``porter-ui``: sent to its inbox, or with ``target`` ``porter-ui``, or on
``review`` without a target for a task that the human offered (from the dashboard or
from a command-line seat ``porter-ui-<suffix>``: :func:`same_seat`). A verdict from
anyone (Accept or Reject by a non-holder) clears it.

Nothing here touches a socket or the event loop; the tests drive it with records.
"""

from __future__ import annotations

import logging
import os
import pathlib
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from porter_mesh.adapters.journal import free_bytes
from porter_mesh.core import constants as C
from porter_mesh.core.advert import is_human
from porter_mesh.core.as2 import Activity
from porter_mesh.core.lifecycle import Status, TaskRecord, attempt_of, follow
from porter_mesh.core.taskid import is_task_id

__all__ = [
    "DEFAULT_HISTORY",
    "LOG_FILE",
    "MAX_PAGE",
    "TASK_STATES",
    "LogEntry",
    "MessageFilter",
    "MessageLog",
    "TaskTracker",
    "message_record",
]

log = logging.getLogger("porter_mesh.gateways.ui")

#: The log's file name inside ``<data-dir>/ui/``; the previous segment is ``.1``.
LOG_FILE: Final = "messages.jsonl"
#: Records kept in memory (and served) by default.
DEFAULT_HISTORY: Final = 20_000
#: Most records one page of ``/api/messages`` returns.
MAX_PAGE: Final = 1000
#: Tasks kept by the tracker; the least recently updated go first.
MAX_TASKS: Final = 5_000

#: The states a task card can be in: the mesh's one vocabulary, in lifecycle order.
TASK_STATES: Final = tuple(s.value for s in Status)

_TEXT_LIMIT: Final = 2_000


def _object_text(value: Any) -> str:
    if isinstance(value, Mapping):
        text = value.get("content")
        return text if isinstance(text, str) else ""
    return value if isinstance(value, str) else ""


def same_seat(name: str | None, me: str) -> bool:
    """Whether ``name`` is the dashboard's own: ``me`` itself or, when the dashboard is the
    human's (``porter-ui``), any seat of the human user (the command line's)."""
    return name is not None and (name == me or (is_human(me) and is_human(name)))


def message_record(*, record_id: str, ts: float, channel: str, sender: str,
                   recipient: str | None, direct: bool, activity: Activity, seq: int,
                   me: str = C.HUMAN_AGENT) -> dict[str, Any]:
    """One observed or sent activity as the dashboard's record.

    Args:
        record_id: unique and stable: ``<envelope msg id>:<index in the message>`` for
            what the node received, a local id for what the dashboard sent.
        ts: the dashboard's receive (or send) time, seconds since the epoch.
        channel: where it travelled (``task:<agent>`` for direct messages).
        sender: the sending agent.
        recipient: the addressee of a direct message; ``None`` for broadcasts.
        direct: delivered over ROUTER/DEALER (or a copy of such a message).
        activity: the AS2 activity.
        seq: its sequence number in the sender's stream (0 for local sends).
        me: the dashboard's agent name; records addressed to it are its inbox.

    Returns:
        The record (a fresh dict, JSON-ready).
    """
    data = activity.to_dict()
    summary = activity.summary or activity.content or ""
    target = activity.target
    return {
        "id": record_id, "ts": ts, "channel": channel, "sender": sender,
        "recipient": recipient, "direct": direct, "type": activity.type,
        "summary": summary, "context": activity.context, "activity": data, "seq": seq,
        "inbox": not same_seat(sender, me) and (recipient == me or target == me),
    }


# ---------------------------------------------------------------------------- the log


class LogEntry:
    """One record in memory: the fields the filters read, and its JSON text."""

    __slots__ = ("agents", "channel", "context", "id", "inbox", "json", "pos", "text", "type")

    def __init__(self, pos: int, record: Mapping[str, Any], data: bytes) -> None:
        self.pos = pos
        self.id: str = record["id"]
        self.channel: str = record["channel"]
        self.type: str = record["type"]
        self.context: str | None = record.get("context")
        self.inbox = bool(record.get("inbox"))
        activity = record.get("activity")
        act = activity if isinstance(activity, Mapping) else {}
        target = act.get("target")
        self.agents = frozenset(
            a for a in (record.get("sender"), record.get("recipient"), target)
            if isinstance(a, str))
        parts = [str(record.get("summary") or ""), _object_text(act),
                 _object_text(act.get("object")), _object_text(act.get("result"))]
        self.text = " ".join(p for p in parts if p)[:_TEXT_LIMIT].casefold()
        self.json = data


@dataclass(frozen=True, slots=True)
class MessageFilter:
    """What ``/api/messages`` may filter on; ``None`` (or False) matches everything.

    Attributes:
        context: the record's ``context`` equals it.
        channel: the record's ``channel`` equals it.
        type: the activity type equals it.
        agent: the sender, the recipient or the activity's ``target`` is this agent.
        text: occurs (case-insensitively) in the summary or the activity's text.
        inbox: only records addressed to ``porter-ui``.
    """

    context: str | None = None
    channel: str | None = None
    type: str | None = None
    agent: str | None = None
    text: str | None = None
    inbox: bool = False

    def matches(self, entry: LogEntry) -> bool:
        """Whether ``entry`` passes every condition given."""
        return ((self.context is None or entry.context == self.context)
                and (self.channel is None or entry.channel == self.channel)
                and (self.type is None or entry.type == self.type)
                and (self.agent is None or self.agent in entry.agents)
                and (not self.inbox or entry.inbox)
                and (not self.text or self.text.casefold() in entry.text))


_MATCH_ALL: Final = MessageFilter()


class MessageLog:
    """The records on disk (JSON lines) and the newest ``history`` of them in memory.

    Args:
        directory: where ``messages.jsonl`` lives (created if missing); ``None`` keeps
            the log in memory only.
        history: records kept in memory; also the size of one file segment.

    Raises:
        ValueError: ``history`` is below 1.
        OSError: the directory cannot be created or the file opened.
    """

    def __init__(self, directory: pathlib.Path | None, *,
                 history: int = DEFAULT_HISTORY) -> None:
        if history < 1:
            raise ValueError("history must be at least 1 record")
        self.history = history
        self.directory = directory
        self.skipped = 0
        self._entries: list[LogEntry] = []
        self._by_id: dict[str, LogEntry] = {}
        self._next_pos = 0
        # Records not yet started on disk, and the unwritten rest of the batch that a
        # failed or short write left (with the number of records it ends).
        self._pending: list[bytes] = []
        self._unwritten = b""
        self._unwritten_lines = 0
        self._file_lines = 0
        self._fd: int | None = None
        #: Failed write attempts, and records dropped unwritten while the disk was full.
        self.failures = 0
        self.dropped = 0
        self._failure: dict[str, Any] | None = None
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            self._load()
            self._fd = self._open()
            if os.fstat(self._fd).st_size and not self._ends_with_newline():
                self._unwritten = b"\n"  # end a torn last line, so the next one is whole

    @property
    def path(self) -> pathlib.Path:
        """The current segment's file."""
        assert self.directory is not None
        return self.directory / LOG_FILE

    @property
    def previous_path(self) -> pathlib.Path:
        """The previous segment's file."""
        assert self.directory is not None
        return self.directory / (LOG_FILE.removesuffix(".jsonl") + ".1.jsonl")

    def _open(self) -> int:
        # O_APPEND: each write lands at the end, after whatever the last one left.
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _ends_with_newline(self) -> bool:
        with open(self.path, "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) == b"\n"

    def _load(self) -> None:
        for path in (self.previous_path, self.path):
            if not path.exists():
                continue
            lines = 0
            with open(path, "rb") as fh:
                for lineno, line in enumerate(fh, 1):
                    lines += 1
                    self._load_line(path, lineno, line)
            if path == self.path:
                self._file_lines = lines
        if self.skipped:
            log.warning("message log: skipped %d line(s) that are not records (a torn last "
                        "line after a crash is expected)", self.skipped)

    def _load_line(self, path: pathlib.Path, lineno: int, line: bytes) -> None:
        line = line.strip()
        if not line:
            return
        try:
            record = orjson.loads(line)
            if not (isinstance(record, dict) and isinstance(record.get("id"), str)
                    and isinstance(record.get("channel"), str)
                    and isinstance(record.get("type"), str)):
                raise ValueError("not a record")
        except (orjson.JSONDecodeError, ValueError) as exc:
            self.skipped += 1
            if self.skipped == 1:
                log.warning("message log %s line %d skipped: %s", path, lineno, exc)
            return
        self._index(record, line)

    def _index(self, record: Mapping[str, Any], data: bytes) -> LogEntry | None:
        if record["id"] in self._by_id:
            return None
        entry = LogEntry(self._next_pos, record, data)
        self._next_pos += 1
        self._entries.append(entry)
        self._by_id[entry.id] = entry
        excess = len(self._entries) - self.history
        if excess > 0:
            for old in self._entries[:excess]:
                del self._by_id[old.id]
            del self._entries[:excess]
        return entry

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[LogEntry]:
        return iter(list(self._entries))

    def records(self) -> Iterator[dict[str, Any]]:
        """The records in memory, oldest first, decoded afresh."""
        for entry in list(self._entries):
            yield orjson.loads(entry.json)

    def get(self, record_id: str) -> LogEntry | None:
        """The entry with this id, if it is still in memory."""
        return self._by_id.get(record_id)

    def append(self, record: Mapping[str, Any]) -> LogEntry | None:
        """Add a record (written to disk at the next :meth:`flush`).

        Returns:
            Its entry, or ``None`` when a record with the same id is already held.
        """
        data = orjson.dumps(record)
        entry = self._index(record, data)
        if entry is not None and self.directory is not None:
            self._pending.append(data)
            excess = len(self._pending) - self.history
            if excess > 0 and self._failure is not None:  # see the module docstring
                del self._pending[:excess]
                self.dropped += excess
        return entry

    @property
    def unwritten(self) -> int:
        """Records held in memory that are not (wholly) on disk yet."""
        return len(self._pending) + self._unwritten_lines

    def flush(self) -> bool:
        """Write what was appended since the last successful flush; rotate a full segment.

        A failure is not raised: the records stay in memory and the next call tries again
        (see the module docstring).

        Returns:
            True when everything appended is on disk (or there is no disk).
        """
        if self.directory is None or (not self._pending and not self._unwritten):
            return True
        try:
            while self._pending or self._unwritten:
                if not self._unwritten:
                    self._unwritten = b"".join(line + b"\n" for line in self._pending)
                    self._unwritten_lines = len(self._pending)
                    self._pending = []
                if self._fd is None:
                    self._fd = self._open()
                written = os.write(self._fd, self._unwritten)
                self._unwritten = self._unwritten[written:]
                if not self._unwritten:
                    self._file_lines += self._unwritten_lines
                    self._unwritten_lines = 0
                    if self._file_lines >= self.history:
                        self._rotate()
        except OSError as exc:
            self._write_failed(exc)
            return False
        if self._failure is not None:
            log.warning("message log: %s is written again (%d failed attempt(s) since %s)",
                        self.path, self._failure["attempts"],
                        time.strftime("%H:%M:%S", time.localtime(self._failure["since"])))
            self._failure = None
        return True

    def _rotate(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        os.replace(self.path, self.previous_path)
        self._file_lines = 0
        self._fd = self._open()

    def _write_failed(self, exc: OSError) -> None:
        self.failures += 1
        free = free_bytes(self.path.parent)
        if self._failure is not None:
            self._failure.update(attempts=self._failure["attempts"] + 1, error=str(exc),
                                 free_bytes=free)
            return
        self._failure = {"since": time.time(), "attempts": 1, "error": str(exc),
                         "free_bytes": free}
        log.error("message log: cannot write %s: %s (%s free there); the dashboard keeps "
                  "serving from memory and writes the %d record(s) held when a write "
                  "succeeds: free some space on that disk", self.path,
                  exc.strerror or exc, "unknown" if free is None else f"{free} bytes",
                  self.unwritten)

    def status(self) -> dict[str, Any]:
        """The log's health, for the API: ``path``, ``ok`` (the last write succeeded),
        ``unwritten`` (records held in memory only), ``failures`` (failed attempts in all),
        ``dropped``, and while writes fail, ``error``, ``free_bytes`` and ``since``
        (seconds since the epoch)."""
        status: dict[str, Any] = {
            "path": str(self.path) if self.directory is not None else None,
            "ok": self._failure is None, "unwritten": self.unwritten,
            "failures": self.failures, "dropped": self.dropped}
        if self._failure is not None:
            status.update(error=self._failure["error"], free_bytes=self._failure["free_bytes"],
                          since=self._failure["since"])
        return status

    def close(self) -> None:
        """Flush and close the file (the log stays readable in memory). Records that still
        cannot be written are lost with the process: logged with their number."""
        if not self.flush():
            log.error("message log: %d record(s) could not be written to %s before the "
                      "dashboard stopped", self.unwritten, self.path)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def page(self, *, limit: int, before: str | None = None,
             where: MessageFilter = _MATCH_ALL) -> tuple[list[LogEntry], bool]:
        """The newest ``limit`` matching entries older than ``before``, oldest first.

        Args:
            limit: most entries to return (1..:data:`MAX_PAGE`).
            before: an entry id; only older entries are considered.
            where: the filter.

        Returns:
            ``(entries, more)``: ``more`` says whether older matching entries remain.

        Raises:
            KeyError: ``before`` is not an id held in memory.
        """
        entries = self._entries
        end = len(entries)
        if before is not None:
            anchor = self._by_id.get(before)
            if anchor is None:
                raise KeyError(before)
            end = anchor.pos - entries[0].pos
        found: list[LogEntry] = []
        i = end - 1
        match = where.matches
        while i >= 0:
            entry = entries[i]
            if match(entry):
                if len(found) == limit:
                    return found[::-1], True
                found.append(entry)
            i -= 1
        return found[::-1], False

    def after(self, record_id: str) -> list[LogEntry] | None:
        """The entries newer than ``record_id``, oldest first (stream resumption).

        Returns:
            The entries, or ``None`` when ``record_id`` is no longer (or never was) held.
        """
        anchor = self._by_id.get(record_id)
        if anchor is None:
            return None
        start = anchor.pos - self._entries[0].pos + 1
        return self._entries[start:]


# ---------------------------------------------------------------------------- tasks


@dataclass(slots=True)
class _Task:
    record: TaskRecord
    path: list[dict[str, Any]] = field(default_factory=list)
    review: dict[str, Any] | None = None
    updated: float = 0.0

    def move(self, state: str, ts: float, by: str) -> None:
        if not self.path or self.path[-1]["state"] != state:
            self.path.append({"state": state, "ts": ts, "by": by})

    def to_json(self) -> dict[str, Any]:
        r = self.record
        return {"context": r.context, "title": r.title, "state": r.status.value,
                "path": [dict(step) for step in self.path], "holder": r.holder,
                "attempt": r.attempt or 0, "offered_by": r.requester, "parent": r.parent,
                "question": r.question if r.status is Status.INPUT_REQUIRED else None,
                "review": dict(self.review) if self.review else None,
                "note": r.note[:_TEXT_LIMIT], "updated": self.updated}


class TaskTracker:
    """Task cards folded from records by context (see the module docstring).

    Args:
        me: the dashboard's agent name (review requests addressed to it are the human's).
        max_tasks: most cards kept; the least recently updated are forgotten first.
    """

    def __init__(self, me: str = C.HUMAN_AGENT, *, max_tasks: int = MAX_TASKS) -> None:
        self.me = me
        self.max_tasks = max_tasks
        self._tasks: dict[str, _Task] = {}

    def __len__(self) -> int:
        return len(self._tasks)

    def tasks(self) -> list[dict[str, Any]]:
        """Every card, the most recently updated first."""
        return [t.to_json() for t in reversed(self._tasks.values())]

    def task(self, context: str) -> dict[str, Any] | None:
        """The card of ``context``, or ``None``."""
        task = self._tasks.get(context)
        return task.to_json() if task is not None else None

    def observe_all(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Fold many records in order (a reload)."""
        for record in records:
            self.observe(record)

    def observe(self, record: Mapping[str, Any]) -> dict[str, Any] | None:
        """Fold one record.

        Returns:
            The card it touched (as JSON), or ``None`` when the record is not about a task
            (only an Offer starts one).
        """
        context = record.get("context")
        data = record.get("activity")
        if not is_task_id(context) or not isinstance(data, Mapping):
            return None
        assert isinstance(context, str)
        try:
            activity = Activity.from_dict(data)
        except Exception:  # a record from an older log whose activity no longer validates
            return None
        task = self._tasks.get(context)
        sender = str(record.get("sender") or activity.actor)
        ts = float(record.get("ts") or 0.0)
        recipient = record.get("recipient")
        new = follow(task.record if task is not None else None, activity, sender=sender,
                     channel=str(record.get("channel") or ""), now=ts,
                     recipient=recipient if isinstance(recipient, str) else None)
        if new is None:
            return None
        if task is None:
            task = _Task(new)
        else:
            del self._tasks[context]
        self._tasks[context] = task  # most recently updated last
        if len(self._tasks) > self.max_tasks:
            del self._tasks[next(iter(self._tasks))]
        task.record = new
        task.updated = max(task.updated, ts)
        task.move(new.status.value, ts, sender)
        if new.status is not Status.IN_REVIEW:
            task.review = None
        elif activity.type == "Offer" and sender == new.holder:
            self._review_request(task, record, activity, sender)
        return task.to_json()

    def _review_request(self, task: _Task, record: Mapping[str, Any], act: Activity,
                        sender: str) -> None:
        channel = str(record.get("channel"))
        recipient = record.get("recipient")
        for_me = (recipient == self.me or act.target == self.me
                  or (channel == C.CHANNEL_REVIEW and act.target is None
                      and same_seat(task.record.requester, self.me)))
        task.review = None
        if for_me and not same_seat(sender, self.me):
            task.review = {"from": sender, "to": self.me, "summary": act.summary,
                           "activity_id": record.get("id"), "channel": channel,
                           "attempt": attempt_of(act)}
