"""Looking around the workspace: ``list_dir``, ``glob`` and ``grep``.

They are confined as the file tools are (:mod:`porter_mesh.tools.workspace`): the
starting path goes through :meth:`Workspace.resolve`, so ``..``, absolute paths and
symlinks that lead out are refused before anything is read. Below it, a walk never
follows a symlinked directory (a way out, or a loop) and takes a symlinked file only
when it resolves inside the workspace; ``.git`` is skipped. ``list_dir`` shows a link
that leads out as such, without following it.

Every answer is bounded: at most ``limit`` results, at most :data:`MAX_VISITS` entries
looked at and :data:`WALK_SECONDS` of walking; the answer says when a bound cut it
short and how to narrow the search. ``grep`` reads text files up to the workspace's
write limit (the largest file the file tools make) and skips binary files (a NUL byte
in the first 8 KiB, as ``read_file`` judges them). Python's regular expressions cannot
be interrupted, so lines are clipped to :data:`MATCH_LINE_CHARS` before matching to
keep a pathological pattern's cost bounded.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from porter_mesh.errors import ToolError
from porter_mesh.tools.workspace import Workspace

__all__ = [
    "DEFAULT_GREP_LIMIT",
    "DEFAULT_LIST_LIMIT",
    "MATCH_LINE_CHARS",
    "MAX_VISITS",
    "WALK_SECONDS",
    "glob",
    "glob_regex",
    "grep",
    "list_dir",
]

#: Entries ``list_dir`` and ``glob`` return at most.
DEFAULT_LIST_LIMIT: Final = 500
#: Matching lines ``grep`` returns at most.
DEFAULT_GREP_LIMIT: Final = 200
#: Entries one walk looks at before it stops.
MAX_VISITS: Final = 50_000
#: Seconds one walk may take before it stops.
WALK_SECONDS: Final = 10.0
#: Characters of a line that ``grep`` matches against.
MATCH_LINE_CHARS: Final = 4096
#: Characters of a matching line shown.
SHOWN_LINE_CHARS: Final = 300

_SKIPPED_DIRS: Final = frozenset({".git"})
_BINARY_PROBE: Final = 8192


class _Bounds:
    """How far a walk may go; records what cut it short."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.visits = 0
        self.deadline = time.monotonic() + WALK_SECONDS
        self.stopped: str | None = None

    def visit(self) -> bool:
        self.visits += 1
        if self.visits > MAX_VISITS:
            self.stopped = f"stopped after looking at {MAX_VISITS} entries"
        elif self.visits % 256 == 0 and time.monotonic() > self.deadline:
            self.stopped = f"stopped after {WALK_SECONDS:g}s"
        return self.stopped is None


def _inside(ws: Workspace, path: Path) -> bool:
    """The path, with every link followed, lies inside the workspace."""
    try:
        return Path(os.path.realpath(path)).is_relative_to(ws.root)
    except (OSError, ValueError):
        return False


def _start(ws: Workspace, path: str | None, *, tool: str) -> Path:
    resolved = ws.resolve(path if path is not None else ".")
    if not resolved.exists():
        raise ToolError(f"{tool}: {ws.relative(resolved)} does not exist; list the "
                        "workspace with list_dir")
    return resolved


def _walk(ws: Workspace, top: Path, bounds: _Bounds) -> Iterator[tuple[Path, bool]]:
    """``(path, is_dir)`` for everything below ``top``, sorted, confined (see the module
    docstring); symlinked directories are yielded but not entered."""
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIPPED_DIRS)
        here = Path(dirpath)
        for name in dirnames:
            if not bounds.visit():
                return
            child = here / name
            if child.is_symlink() and not _inside(ws, child):
                continue
            yield child, True
        for name in sorted(filenames):
            if not bounds.visit():
                return
            child = here / name
            if child.is_symlink() and not _inside(ws, child):
                continue
            yield child, False


def _shown(ws: Workspace, path: Path, is_dir: bool) -> str:
    rel = path.relative_to(ws.root).as_posix()
    return rel + "/" if is_dir else rel


def _footer(count: int, limit: int, bounds: _Bounds, what: str, hint: str) -> str | None:
    notes = []
    if count > limit:
        notes.append(f"the first {limit} {what} are shown")
    if bounds.stopped is not None:
        notes.append(f"the search {bounds.stopped}")
    if not notes:
        return None
    return f"[{'; '.join(notes)}: {hint}]"


# -- list_dir ----------------------------------------------------------------------------


def list_dir(ws: Workspace, path: str | None = None, *, limit: int = DEFAULT_LIST_LIMIT) -> str:
    """List one directory of the workspace.

    Args:
        ws: the workspace.
        path: the directory (default: the workspace root).
        limit: entries shown at most.

    Returns:
        One entry per line: ``name/`` for a directory, ``name (N bytes)`` for a file,
        ``name -> target`` for a symlink (``-> outside the workspace`` when it leads out).

    Raises:
        WorkspaceError: the path leaves the workspace.
        ToolError: it does not exist or is not a directory.
    """
    top = _start(ws, path, tool="list_dir")
    rel = ws.relative(top)
    if not top.is_dir():
        raise ToolError(f"list_dir: {rel} is a file; read it with read_file")
    try:
        names = sorted(os.listdir(top))
    except OSError as exc:
        raise ToolError(f"list_dir: cannot list {rel}: {exc.strerror}") from exc
    lines = []
    for name in names[:limit]:
        entry = top / name
        try:
            info = entry.lstat()
        except OSError:
            continue  # removed while listing
        if stat.S_ISLNK(info.st_mode):
            if _inside(ws, entry):
                target = ws.relative(Path(os.path.realpath(entry)))
                kind = "/" if entry.is_dir() else ""
                lines.append(f"{name} -> {target}{kind}")
            else:
                lines.append(f"{name} -> outside the workspace (not followed)")
        elif stat.S_ISDIR(info.st_mode):
            lines.append(f"{name}/")
        else:
            lines.append(f"{name} ({info.st_size} bytes)")
    head = f"{rel}/: {len(names)} entr{'y' if len(names) == 1 else 'ies'}"
    if not names:
        return f"{head} (empty directory)"
    if len(names) > limit:
        lines.append(f"[the first {limit} entries are shown: use glob to find what you "
                     "need]")
    return "\n".join([head, *lines])


# -- glob --------------------------------------------------------------------------------


def _segment_regex(segment: str) -> str:
    out = []
    i = 0
    while i < len(segment):
        char = segment[i]
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = segment.find("]", i + 2 if segment[i + 1:i + 2] in ("!", "^") else i + 1)
            if end < 0:
                out.append(re.escape(char))
            else:
                body = segment[i + 1:end]
                negate = body[:1] in ("!", "^")
                body = body[1:] if negate else body
                body = body.replace("\\", "\\\\")
                out.append(f"[{'^' if negate else ''}{body}]")
                i = end
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


def glob_regex(pattern: str) -> re.Pattern[str]:
    """A compiled regular expression for a relative glob pattern.

    ``*`` matches within one path component, ``**`` any number of components
    (including none), ``?`` one character, ``[abc]``/``[!abc]`` a set.

    Raises:
        ToolError: the pattern is absolute or climbs out with ``..``.
    """
    text = pattern.strip()
    while text.startswith("./"):
        text = text[2:]
    if not text or text.startswith("/") or "\x00" in text:
        raise ToolError(f"glob: {pattern!r} is not a relative pattern; give one such as "
                        "'**/*.py', and choose the directory with 'path'")
    segments = [s for s in text.split("/") if s]
    if ".." in segments:
        raise ToolError("glob: '..' is not allowed in a pattern; choose the directory "
                        "with 'path' (inside the workspace)")
    parts = []
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            parts.append(".*" if last else "(?:[^/]+/)*")
        else:
            parts.append(_segment_regex(segment) + ("" if last else "/"))
    return re.compile("".join(parts), re.DOTALL)


def glob(ws: Workspace, pattern: str, path: str | None = None, *,
         limit: int = DEFAULT_LIST_LIMIT) -> str:
    """Find workspace paths matching a glob pattern.

    Args:
        ws: the workspace.
        pattern: relative to ``path`` (see :func:`glob_regex`).
        path: the directory to search (default: the workspace root).
        limit: paths shown at most.

    Returns:
        Matching paths relative to the workspace root, one per line, sorted
        (directories end in ``/``), or a line saying nothing matched.

    Raises:
        WorkspaceError: ``path`` leaves the workspace.
        ToolError: a bad pattern, or ``path`` is not a directory.
    """
    regex = glob_regex(pattern)
    top = _start(ws, path, tool="glob")
    where = ws.relative(top)
    if not top.is_dir():
        raise ToolError(f"glob: {where} is a file; give a directory as 'path'")
    bounds = _Bounds(limit)
    found: list[str] = []
    for entry, is_dir in _walk(ws, top, bounds):
        if regex.fullmatch(entry.relative_to(top).as_posix()):
            found.append(_shown(ws, entry, is_dir))
            if len(found) > limit:
                break
    if not found:
        tail = f" ({bounds.stopped})" if bounds.stopped else ""
        return f"No path under {where}/ matches {pattern!r}{tail}."
    lines = found[:limit]
    footer = _footer(len(found), limit, bounds, "matches",
                     "narrow the pattern or the path")
    return "\n".join(lines + ([footer] if footer else []))


# -- grep --------------------------------------------------------------------------------


def _text_lines(path: Path, max_bytes: int) -> list[str] | None:
    """The file's lines, or None when it is binary, too large or unreadable."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if os.fstat(fh.fileno()).st_size > max_bytes:
            return None
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes or b"\x00" in data[:_BINARY_PROBE]:
        return None
    return data.decode("utf-8", errors="replace").splitlines()


def grep(ws: Workspace, pattern: str, path: str | None = None, *, glob: str | None = None,
         ignore_case: bool = False, limit: int = DEFAULT_GREP_LIMIT) -> str:
    """Search the workspace's text files for a regular expression.

    Args:
        ws: the workspace.
        pattern: a Python regular expression.
        path: a directory to search below, or one file (default: the workspace root).
        glob: only files whose name matches this glob (``*.py``).
        ignore_case: match regardless of case.
        limit: matching lines shown at most.

    Returns:
        ``path:line: text`` per match, or a line saying nothing matched; notes say
        which files were skipped (binary, too large) and when a bound cut it short.

    Raises:
        WorkspaceError: ``path`` leaves the workspace.
        ToolError: the pattern is not a valid regular expression.
    """
    try:
        regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)
    except re.error as exc:
        raise ToolError(f"grep: {pattern!r} is not a valid regular expression ({exc}); "
                        "escape special characters such as ( [ . * with a backslash") from exc
    name_filter = glob_regex(glob) if glob is not None else None
    top = _start(ws, path, tool="grep")
    bounds = _Bounds(limit)
    files = ([(top, False)] if not top.is_dir() else _walk(ws, top, bounds))
    matches: list[str] = []
    skipped = searched = 0
    for entry, is_dir in files:
        if is_dir or (name_filter is not None and not name_filter.fullmatch(entry.name)):
            continue
        # A symlinked file was checked to resolve inside; read what it points to.
        real = Path(os.path.realpath(entry)) if entry.is_symlink() else entry
        lines = _text_lines(real, ws.max_write_bytes)
        if lines is None:
            skipped += 1
            continue
        searched += 1
        rel = _shown(ws, entry, False)
        for number, line in enumerate(lines, 1):
            if regex.search(line[:MATCH_LINE_CHARS]):
                shown = line if len(line) <= SHOWN_LINE_CHARS else (
                    line[:SHOWN_LINE_CHARS] + "...")
                matches.append(f"{rel}:{number}: {shown}")
                if len(matches) > limit:
                    break
        if len(matches) > limit:
            break
    notes = []
    if skipped:
        notes.append(f"[{skipped} binary or unreadable file(s), or over "
                     f"{ws.max_write_bytes} bytes, were skipped]")
    footer = _footer(len(matches), limit, bounds, "matches",
                     "narrow the pattern, the path or the glob")
    if footer:
        notes.append(footer)
    if not matches:
        where = ws.relative(top)
        return "\n".join([f"No match for {pattern!r} in {searched} file(s) under "
                          f"{where}.", *notes])
    return "\n".join(matches[:limit] + notes)
