"""An agent's own ledger of tasks: the ones it holds and the ones it offered.

The toolbox feeds it every activity the agent sends and every one delivered to it
(:meth:`TaskLedger.saw`), and it folds them with the mesh's one task lifecycle
(:func:`porter_mesh.core.lifecycle.follow`). It answers three questions: which task
this agent is working on now holds which sub-tasks (to cascade a cancel), who requested a
task (to refuse a cancel from anyone else), and what the agent would say when asked for
its tasks over the mesh (the ``tasks`` section of its view, which ``porter-mesh tasks``
gathers).

It is written to from the node's thread (delivered messages) and the brain's thread (the
tools), so every method takes a lock.

Given a file (an agent with a data directory keeps ``tasks.json`` there), it writes every
change through to it (a new file, then an atomic rename) and reads it back on start, so
an agent restarted after a crash still knows the tasks it holds, which of them wait on a
question, and whom to tell when one is cancelled. A write that fails is logged and the
ledger goes on in memory: the work is not stopped for want of its record.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from porter_mesh.core.as2 import Activity
from porter_mesh.core.lifecycle import TaskRecord, follow, record_from_json

_log = logging.getLogger("porter_mesh.tools")

__all__ = ["MAX_RECORDS", "TaskLedger"]

#: Most tasks kept; the oldest finished ones are forgotten first.
MAX_RECORDS: Final = 1000


class TaskLedger:
    """The tasks one agent holds or offered.

    Args:
        me: the agent's name.
        limit: most tasks kept (finished ones are forgotten first, oldest first).
        clock: wall-clock seconds, recorded in the records (ages across processes).
        path: the file the ledger is kept in (read now, written on every change), or
            ``None`` to keep it in memory only.
    """

    def __init__(self, me: str, *, limit: int = MAX_RECORDS,
                 clock: Callable[[], float] = time.time,
                 path: pathlib.Path | None = None) -> None:
        self.me = me
        self.limit = limit
        self.path = path
        self._clock = clock
        self._records: dict[str, TaskRecord] = {}
        self._lock = threading.Lock()
        self._warned = False
        if path is not None:
            self._load(path)

    def _load(self, path: pathlib.Path) -> None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            _log.warning("task ledger %s unreadable (%s); starting with none", path, exc)
            return
        for item in data.get("tasks", []) if isinstance(data, dict) else []:
            record = record_from_json(item)
            if record is not None:
                self._records[record.context] = record

    def _save(self) -> None:
        """Write the ledger through to its file (called with the lock held)."""
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump({"agent": self.me,
                           "tasks": [r.to_json() for r in self._records.values()]}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            self._warned = False
        except OSError as exc:
            if not self._warned:  # said once per run of failures, not per message
                _log.warning("could not keep the task ledger in %s: %s", self.path, exc)
                self._warned = True

    def saw(self, activity: Activity, *, sender: str, channel: str) -> TaskRecord | None:
        """Fold one activity this agent sent or received.

        Args:
            activity: the activity.
            sender: who sent it.
            channel: where it travelled.

        Returns:
            The task's record after it, or ``None`` when it is not about a task this
            agent holds or offered.
        """
        ctx = activity.context
        if ctx is None:
            return None
        with self._lock:
            old = self._records.get(ctx)
            new = follow(old, activity, sender=sender, channel=channel, now=self._clock())
            if new is None or (old is None and self.me not in (new.requester, new.holder)):
                return None
            self._records[ctx] = new
            if old is None and len(self._records) > self.limit:
                self._forget_one()
            if new != old:
                self._save()
            return new

    def _forget_one(self) -> None:
        victim = next((c for c, r in self._records.items() if r.final),
                      next(iter(self._records)))
        del self._records[victim]

    def get(self, context: str) -> TaskRecord | None:
        """The record of a task, or ``None``."""
        with self._lock:
            return self._records.get(context)

    def open_children(self, context: str) -> list[TaskRecord]:
        """The sub-tasks of ``context`` this agent offered that are still open."""
        with self._lock:
            return [r for r in self._records.values()
                    if r.parent == context and r.requester == self.me and not r.final]

    def held(self) -> list[TaskRecord]:
        """The open tasks this agent holds, oldest first."""
        with self._lock:
            return [r for r in self._records.values()
                    if r.holder == self.me and not r.final]

    def records(self) -> list[TaskRecord]:
        """Every task kept, oldest first."""
        with self._lock:
            return list(self._records.values())

    def view(self) -> dict[str, Any]:
        """The ``tasks`` section of the agent's view: ``{"agent": me, "tasks": [...]}``
        (each task as :meth:`~porter_mesh.core.lifecycle.TaskRecord.to_json`)."""
        return {"agent": self.me, "tasks": [r.to_json() for r in self.records()]}
