"""The agent's workspace: every file path an agent gives is confined to one directory.

A path is checked after it is resolved, never by looking at its text: ``..``, absolute
paths, symlinks and symlinked parent directories are all followed first, and the result
must lie inside the resolved workspace root. Paths that do not exist yet (a file about
to be written) are resolved through their existing ancestors, so a new file under a
symlinked directory that points outside is refused as well. A dangling symlink is
judged by where it points, because writing through it would create its target.

Reads and writes are capped (:data:`DEFAULT_MAX_READ_BYTES`,
:data:`DEFAULT_MAX_WRITE_BYTES`); a read of a larger file returns its beginning and
says how to see the rest.

What this does not defend against: another process swapping a directory for a symlink
between the check and the open. The final path component is opened with
``O_NOFOLLOW``, which closes the common case; the agent's own ``bash`` tool can write
anywhere its user can anyway, so this layer keeps honest mistakes and confused models
inside the workspace rather than acting as a sandbox.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from porter_mesh.errors import ToolError, WorkspaceError

__all__ = [
    "DEFAULT_MAX_READ_BYTES",
    "DEFAULT_MAX_WRITE_BYTES",
    "EditOutcome",
    "ReadOutcome",
    "Workspace",
    "WriteOutcome",
]

#: Largest slice of a file returned by one read (bytes).
DEFAULT_MAX_READ_BYTES: Final = 256 * 1024

#: Largest content accepted by one write or produced by one edit (bytes, UTF-8).
DEFAULT_MAX_WRITE_BYTES: Final = 2 * 1024 * 1024

_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)


@dataclass(frozen=True, slots=True)
class ReadOutcome:
    """A file read.

    Attributes:
        path: the path relative to the workspace root, with ``/`` separators.
        text: the content (the first ``max_read_bytes`` of it when truncated).
        size: the file's size in bytes.
        truncated: only part of the file is in ``text``.
    """

    path: str
    text: str
    size: int
    truncated: bool


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """A file written.

    Attributes:
        path: relative path of the file.
        size: bytes written.
        created: the file did not exist before.
    """

    path: str
    size: int
    created: bool


@dataclass(frozen=True, slots=True)
class EditOutcome:
    """A replacement made in a file.

    Attributes:
        path: relative path of the file.
        removed_lines: lines of the old text.
        added_lines: lines of the new text.
        size: the file's size after the edit, in bytes.
    """

    path: str
    removed_lines: int
    added_lines: int
    size: int


class Workspace:
    """A directory that an agent's file tools may not leave.

    Args:
        root: the workspace directory; it must exist.
        max_read_bytes: largest slice returned by :meth:`read`.
        max_write_bytes: largest content accepted by :meth:`write` and :meth:`edit`.

    Raises:
        ToolError: ``root`` is not an existing directory, or a limit is not positive.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
        max_write_bytes: int = DEFAULT_MAX_WRITE_BYTES,
    ) -> None:
        resolved = Path(root).resolve()
        if not resolved.is_dir():
            raise ToolError(f"workspace {os.fspath(root)!r} is not an existing directory")
        if max_read_bytes <= 0 or max_write_bytes <= 0:
            raise ToolError("workspace limits must be positive byte counts")
        self.root = resolved
        self.max_read_bytes = max_read_bytes
        self.max_write_bytes = max_write_bytes

    def __repr__(self) -> str:
        return f"Workspace({os.fspath(self.root)!r})"

    # -- paths -------------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """Resolve an agent-given path and check that it stays inside the workspace.

        Args:
            path: relative to the workspace root, or absolute (then it must already be
                inside the root).

        Returns:
            The absolute, symlink-free path.

        Raises:
            WorkspaceError: the path is empty, malformed, or resolves outside the root.
        """
        if not isinstance(path, str) or not path.strip():
            raise WorkspaceError("path is empty; give a path relative to the workspace root")
        if "\x00" in path:
            raise WorkspaceError("path contains a NUL byte; give a plain file path")
        candidate = Path(path)
        if not candidate.is_absolute():
            candidate = self.root / candidate
        try:
            # Non-strict: existing components (and dangling links) are followed, the
            # rest is appended and its ".." applied to the resolved prefix.
            resolved = candidate.resolve(strict=False)
        except (OSError, RuntimeError) as exc:  # symlink loops
            raise WorkspaceError(f"path {path!r} cannot be resolved: {exc}") from exc
        if not resolved.is_relative_to(self.root):
            raise WorkspaceError(
                f"path {path!r} resolves to {os.fspath(resolved)!r}, outside the workspace "
                f"{os.fspath(self.root)!r}; use a path inside the workspace "
                "(symlinks and '..' are followed before this check)"
            )
        return resolved

    def relative(self, resolved: Path) -> str:
        """The workspace-relative form of a resolved path (``.`` for the root)."""
        rel = resolved.relative_to(self.root).as_posix()
        return rel or "."

    # -- operations ----------------------------------------------------------------------

    def read(self, path: str) -> ReadOutcome:
        """Read a text file.

        Args:
            path: the file, relative to the workspace root.

        Returns:
            A :class:`ReadOutcome`; ``truncated`` is set when the file is larger than
            ``max_read_bytes`` and only its beginning was read.

        Raises:
            WorkspaceError: the path escapes the workspace.
            ToolError: the file does not exist, is a directory, is binary or unreadable.
        """
        resolved = self.resolve(path)
        rel = self.relative(resolved)
        if resolved.is_dir():
            raise ToolError(f"{rel} is a directory; list it with bash (ls {rel})")
        try:
            fd = os.open(resolved, os.O_RDONLY | _NOFOLLOW)
        except FileNotFoundError:
            raise ToolError(f"{rel} does not exist; check the path with bash (ls)") from None
        except OSError as exc:
            raise ToolError(f"cannot read {rel}: {exc.strerror}") from exc
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            data = fh.read(self.max_read_bytes + 1)
        truncated = len(data) > self.max_read_bytes
        data = data[: self.max_read_bytes]
        if b"\x00" in data[:8192]:
            raise ToolError(f"{rel} is a binary file ({size} bytes); inspect it with bash")
        return ReadOutcome(rel, data.decode("utf-8", errors="replace"), size, truncated)

    def write(self, path: str, content: str) -> WriteOutcome:
        """Create or replace a text file, creating missing parent directories.

        Args:
            path: the file, relative to the workspace root.
            content: the complete new content.

        Returns:
            A :class:`WriteOutcome`.

        Raises:
            WorkspaceError: the path escapes the workspace.
            ToolError: the content is too large, or the path is a directory or unwritable.
        """
        data = content.encode("utf-8")
        resolved = self.resolve(path)
        rel = self.relative(resolved)
        self._check_size(rel, len(data))
        if resolved.is_dir():
            raise ToolError(f"{rel} is a directory; give a file path")
        created = not resolved.exists()
        self._write_bytes(resolved, rel, data)
        return WriteOutcome(rel, len(data), created)

    def edit(self, path: str, old: str, new: str) -> EditOutcome:
        """Replace the one occurrence of ``old`` in a file with ``new``.

        Args:
            path: the file, relative to the workspace root.
            old: text that occurs exactly once in the file.
            new: its replacement (may be empty, to delete ``old``).

        Returns:
            An :class:`EditOutcome`.

        Raises:
            WorkspaceError: the path escapes the workspace.
            ToolError: the file is missing or too large, or ``old`` is empty, absent or
                not unique.
        """
        if not old:
            raise ToolError("edit_file: 'old' is empty; give the exact text to replace")
        resolved = self.resolve(path)
        rel = self.relative(resolved)
        if not resolved.is_file():
            raise ToolError(f"edit_file: {rel} does not exist; create it with write_file")
        size = resolved.stat().st_size
        if size > self.max_write_bytes:
            raise ToolError(
                f"edit_file: {rel} is {size} bytes, over the {self.max_write_bytes}-byte "
                "edit limit; change it with bash (sed, patch)"
            )
        text = self.read(path).text
        count = text.count(old)
        if count == 0:
            raise ToolError(
                f"edit_file: the 'old' text was not found in {rel}; read the file again and "
                "copy the text exactly, including whitespace and indentation"
            )
        if count > 1:
            raise ToolError(
                f"edit_file: the 'old' text occurs {count} times in {rel}; include more "
                "surrounding lines so that it matches exactly once"
            )
        data = text.replace(old, new, 1).encode("utf-8")
        self._check_size(rel, len(data))
        self._write_bytes(resolved, rel, data)
        return EditOutcome(rel, old.count("\n") + 1, new.count("\n") + 1 if new else 0, len(data))

    # -- helpers -------------------------------------------------------------------------

    def _check_size(self, rel: str, size: int) -> None:
        if size > self.max_write_bytes:
            raise ToolError(
                f"content for {rel} is {size} bytes, over the {self.max_write_bytes}-byte "
                "write limit; split it into several files"
            )

    def _write_bytes(self, resolved: Path, rel: str, data: bytes) -> None:
        try:
            resolved.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(resolved, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise WorkspaceError(
                    f"{rel} became a symlink while being written; write it again"
                ) from exc
            raise ToolError(f"cannot write {rel}: {exc.strerror}") from exc
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
