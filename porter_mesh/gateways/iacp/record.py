"""What the IACP bridge keeps on disk for each forager, so that a restarted bridge takes
its foragers back.

One small JSON file per forager, ``iacp-forager.json`` in the forager's data directory
(``<data root>/<mesh>/<name>``, beside its node's delivery journal and knowledge replica):

* ``incarnations``: the incarnations of the nodes this bridge ran for the forager, the
  newest last (a few kept). A node killed with its bridge (``kill -9``) says no goodbye,
  so the rest of the mesh shows it on the roster until its heartbeats expire; when the
  forager reconnects to the restarted bridge, an entry of its name whose incarnation is
  listed here is this bridge's own dead node, not another agent holding the name;
* ``assigns``: the assigns the forager may still hold (sent, accepted or in review), as
  :func:`~.protocol.assign_to_record` writes them, so the new process carries them over.

Writes are atomic (a temporary file, ``fsync``, ``rename``, ``fsync`` of the directory):
a reader sees the old record or the new one. A write that fails (a full disk) raises
:class:`~porter_mesh.errors.StorageError` and leaves the old record in place; the
bridge then declines the mesh message that changed its state, so nothing acknowledged
is lost.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from porter_mesh.adapters.journal import free_bytes
from porter_mesh.errors import StorageError

__all__ = ["RECORD_FILE", "ForagerRecord", "load_record", "save_record"]

log = logging.getLogger("porter_mesh.iacp")

#: The record's file name inside the forager's data directory.
RECORD_FILE: Final = "iacp-forager.json"
#: Incarnations remembered per forager (restarts in a row that can still be recognised).
KEEP_INCARNATIONS: Final = 16
_FORMAT: Final = 1


@dataclass(slots=True)
class ForagerRecord:
    """One forager's record (see the module docstring).

    Attributes:
        incarnations: node incarnations this bridge ran for the forager, oldest first.
        assigns: the carried-over assigns, as JSON-ready records.
    """

    incarnations: list[int] = field(default_factory=list)
    assigns: list[dict[str, Any]] = field(default_factory=list)

    def with_incarnation(self, incarnation: int) -> ForagerRecord:
        """A copy that also lists ``incarnation`` (the oldest ones drop off)."""
        kept = [i for i in self.incarnations if i != incarnation] + [incarnation]
        return ForagerRecord(kept[-KEEP_INCARNATIONS:], list(self.assigns))


def load_record(directory: pathlib.Path) -> ForagerRecord:
    """The record in ``directory``; an empty one when there is none.

    A damaged record is logged and read as empty: the forager then joins as a new one
    (its old node, if still on the roster, makes the name look taken until it expires).

    Args:
        directory: the forager's data directory.

    Returns:
        The record.
    """
    path = directory / RECORD_FILE
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return ForagerRecord()
    except (OSError, orjson.JSONDecodeError) as exc:
        log.warning("iacp: cannot read %s (%s); starting that forager afresh", path, exc)
        return ForagerRecord()
    incarnations = data.get("incarnations") if isinstance(data, dict) else None
    assigns = data.get("assigns") if isinstance(data, dict) else None
    if (not isinstance(incarnations, list) or not isinstance(assigns, list)
            or not all(isinstance(i, int) and not isinstance(i, bool) for i in incarnations)
            or not all(isinstance(a, dict) for a in assigns)):
        log.warning("iacp: %s is not a forager record; starting that forager afresh", path)
        return ForagerRecord()
    return ForagerRecord(incarnations[-KEEP_INCARNATIONS:], assigns)


def save_record(directory: pathlib.Path, record: ForagerRecord) -> None:
    """Write ``record`` into ``directory`` atomically.

    Args:
        directory: the forager's data directory (created if missing).
        record: what to keep.

    Raises:
        StorageError: it could not be written (the old record is left in place).
    """
    path = directory / RECORD_FILE
    tmp = path.with_name(f".{RECORD_FILE}.tmp")
    data = orjson.dumps({"format": _FORMAT, "incarnations": record.incarnations,
                         "assigns": record.assigns})
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        free = free_bytes(directory)
        raise StorageError(
            f"cannot write {path}: {exc.strerror or exc}; free space on its filesystem "
            "(or point PORTER_MESH_DATA elsewhere) and the bridge takes the message again",
            path=str(path), free_bytes=free, errno_=exc.errno) from None
