"""What the A2A gateway keeps on disk: every task event with its sequence number, and the
tasks themselves, so that a restarted gateway still answers ``GetTask`` and resumes a
stream where the client's last event left off.

* :class:`EventLog` -- one JSON line per task event (``{"task", "seq", "event"}``), the
  event being A2A's ``StreamResponse`` in its JSON form. Sequence numbers count from 1
  per task; a resumed stream replays every event after the one the client names.
* :class:`FileTaskStore` -- the SDK's in-memory task store, with each saved task also
  written to ``tasks/<id>.json`` (atomically) and read back at start.

Both are plain files because the gateway is one process that owns its data directory
(the node's directory lock guards it); a line cut short by a crash is skipped on load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import shutil
from collections import defaultdict
from collections.abc import Callable
from typing import Any, BinaryIO

import orjson
from a2a.server.context import ServerCallContext
from a2a.server.tasks.inmemory_task_store import InMemoryTaskStore
from a2a.types.a2a_pb2 import Task
from google.protobuf import json_format

from porter_mesh.errors import StorageError

__all__ = ["EventLog", "FileTaskStore"]

log = logging.getLogger("porter_mesh.a2a")


def _storage_error(message: str, path: pathlib.Path, exc: OSError) -> StorageError:
    try:
        free: int | None = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    return StorageError(message, path=str(path), free_bytes=free, errno_=exc.errno)


class EventLog:
    """Task events in order, numbered per task, kept in memory and (with a path) on disk.

    Args:
        path: the JSON-lines file, or ``None`` to keep events in memory only.

    Raises:
        StorageError: the file cannot be opened.
    """

    def __init__(self, path: pathlib.Path | None) -> None:
        self._events: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._changed: dict[str, asyncio.Event] = {}
        self._file: BinaryIO | None = None
        self._path = pathlib.Path(".")
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():
                self._load(path)
            self._file = path.open("ab")
        except OSError as exc:
            raise _storage_error(f"cannot open the A2A event log {path}: "
                                 f"{exc.strerror or exc}; check the data directory's "
                                 "permissions and free space", path, exc) from exc
        self._path = path

    def _load(self, path: pathlib.Path) -> None:
        skipped = 0
        with path.open("rb") as lines:
            for line in lines:
                try:
                    row = orjson.loads(line)
                    task, seq, event = row["task"], row["seq"], row["event"]
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    skipped += 1
                    continue
                if seq == len(self._events[task]) + 1:
                    self._events[task].append(event)
        if skipped:
            log.warning("a2a: skipped %d unreadable line(s) of %s (cut short by a crash?)",
                        skipped, path)

    def append(self, task_id: str, event: dict[str, Any]) -> int:
        """Add ``event`` (a ``StreamResponse`` as JSON) to ``task_id``'s events.

        Returns:
            Its sequence number (1 for the task's first event).

        Raises:
            StorageError: the line could not be written.
        """
        events = self._events[task_id]
        seq = len(events) + 1
        if self._file is not None:
            try:
                self._file.write(orjson.dumps({"task": task_id, "seq": seq, "event": event})
                                 + b"\n")
                self._file.flush()
            except OSError as exc:
                raise _storage_error(f"cannot write the A2A event log: {exc.strerror or exc};"
                                     " free some space in the data directory", self._path,
                                     exc) from exc
        events.append(event)
        changed = self._changed.pop(task_id, None)
        if changed is not None:
            changed.set()
        return seq

    def last(self, task_id: str) -> int:
        """The sequence number of ``task_id``'s latest event (0 for none)."""
        return len(self._events.get(task_id, ()))

    def since(self, task_id: str, seq: int) -> list[tuple[int, dict[str, Any]]]:
        """Every event of ``task_id`` after sequence number ``seq``, numbered."""
        events = self._events.get(task_id, [])
        start = max(seq, 0)
        return [(start + i + 1, event) for i, event in enumerate(events[start:])]

    def tasks(self) -> list[str]:
        """Every task with at least one event."""
        return [task for task, events in self._events.items() if events]

    async def wait(self, task_id: str, seq: int, timeout: float) -> bool:
        """Wait until ``task_id`` has an event after ``seq``; ``False`` on timeout."""
        if self.last(task_id) > seq:
            return True
        changed = self._changed.setdefault(task_id, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout)
        return self.last(task_id) > seq

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


class FileTaskStore(InMemoryTaskStore):
    """The SDK's task store, each task also written to ``<directory>/<id>.json``.

    Args:
        directory: where the task files live, or ``None`` for memory only.
        reconcile: called with every task about to be saved, to bring it up to date
            (two writers save tasks: the SDK and the gateway).
        on_error: told of a save that failed before it is raised (the SDK answers the
            request with the error but logs it its own way; the gateway counts and logs
            it as it does its own).
    """

    def __init__(self, directory: pathlib.Path | None, *,
                 reconcile: Callable[[Task], None] | None = None,
                 on_error: Callable[[StorageError], None] | None = None) -> None:
        super().__init__()
        self._dir = directory
        self._reconcile = reconcile
        self._on_error = on_error
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)

    async def load(self) -> int:
        """Read back every task file; returns how many were read."""
        if self._dir is None:
            return 0
        loaded = 0
        for path in sorted(self._dir.glob("*.json")):
            try:
                task = json_format.Parse(path.read_bytes(), Task())
            except (OSError, json_format.ParseError) as exc:
                log.warning("a2a: skipped the unreadable task file %s: %s", path, exc)
                continue
            await super().save(task, ServerCallContext())
            loaded += 1
        return loaded

    async def save(self, task: Task, context: ServerCallContext) -> None:
        if self._reconcile is not None:
            mine = Task()
            mine.CopyFrom(task)  # the caller's copy is the SDK's own: left as it is
            self._reconcile(mine)
            task = mine
        await super().save(task, context)
        if self._dir is None:
            return
        path = self._dir / f"{task.id}.json"
        tmp = path.with_suffix(".tmp")
        try:
            tmp.write_text(json_format.MessageToJson(task))
            os.replace(tmp, path)
        except OSError as exc:
            error = _storage_error(f"cannot save task {task.id} in {self._dir}: "
                                   f"{exc.strerror or exc}; free some space", path, exc)
            if self._on_error is not None:
                self._on_error(error)
            raise error from exc
