"""One process per data directory: an ``flock`` on a lock file that names its holder.

A node's data directory (its delivery journal, its knowledge shard) must never be open
in two processes at once: two writers would interleave journal frames and reuse
sequence numbers. :class:`DirLock` takes an exclusive, non-blocking ``flock`` on a file
in the directory and writes the holder's pid into it, so that a refusal can say who
holds it. The lock belongs to the open file, so the kernel releases it when the holder
dies in any way (``kill -9`` included): a stale lock file never blocks a restart.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib

from porter_mesh.errors import ConfigError, PorterError

__all__ = ["DirLock", "lock_holder"]


class DirLock:
    """An exclusive lock on ``directory`` (created if missing), held until :meth:`release`.

    Args:
        directory: the directory to lock.
        filename: the lock file inside it.
        what: how the refusal names the directory (``"the data directory"``...).
        error: the exception class a refusal raises.

    Raises:
        PorterError: (``error``) another live process holds the lock; the message names
            its pid.
    """

    def __init__(self, directory: str | os.PathLike[str], *, filename: str = "lock",
                 what: str = "the data directory",
                 error: type[PorterError] = ConfigError) -> None:
        self.path = pathlib.Path(directory) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise error(f"{what} {self.path.parent} is open in another process (pid "
                        f"{holder}); stop that process first, or use another --data-dir"
                        ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        """True until :meth:`release`."""
        return self._fd is not None

    def release(self) -> None:
        """Give the lock up (idempotent). The file stays; only the lock matters."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> DirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_holder(directory: str | os.PathLike[str], *, filename: str = "lock") -> str | None:
    """Who holds the :class:`DirLock` of ``directory``, without taking it.

    Args:
        directory: the locked directory.
        filename: the lock file inside it.

    Returns:
        The holder's pid as its lock file says (``"?"`` when the file names none), or
        ``None`` when no live process holds the lock (or there is no lock file).
    """
    try:
        fd = os.open(pathlib.Path(directory) / filename, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
