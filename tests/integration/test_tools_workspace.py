"""Workspace confinement and the file tools, on the real file system.

Every escape the profile's tools could be led into is tried: ``..``, absolute paths,
symlinks to files and directories outside, a symlinked parent directory, a dangling
symlink pointing outside, and new files below such links.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from porter_mesh.errors import ToolError, WorkspaceError
from porter_mesh.tools.workspace import Workspace


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Workspace, Path]:
    """A workspace next to an "outside" directory holding a secret."""
    root = tmp_path / "ws"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret")
    (root / "src").mkdir()
    (root / "src" / "app.py").write_text("print('hi')\n")
    return Workspace(root), outside


ESCAPES = [
    "../outside/secret.txt",
    "src/../../outside/secret.txt",
    "nonexistent/../../outside/secret.txt",
    "..",
]


@pytest.mark.parametrize("path", ESCAPES)
def test_dotdot_is_refused(layout: tuple[Workspace, Path], path: str) -> None:
    ws, _ = layout
    with pytest.raises(WorkspaceError, match="outside the workspace"):
        ws.read(path)
    with pytest.raises(WorkspaceError):
        ws.write(path, "x")


def test_absolute_path_outside_is_refused(layout: tuple[Workspace, Path]) -> None:
    ws, outside = layout
    with pytest.raises(WorkspaceError):
        ws.read(str(outside / "secret.txt"))
    with pytest.raises(WorkspaceError):
        ws.write("/etc/passwd-porter-test", "x")
    assert not Path("/etc/passwd-porter-test").exists()


def test_absolute_path_inside_is_allowed(layout: tuple[Workspace, Path]) -> None:
    ws, _ = layout
    assert ws.read(str(ws.root / "src" / "app.py")).text == "print('hi')\n"


def test_symlink_to_outside_file_is_refused(layout: tuple[Workspace, Path]) -> None:
    ws, outside = layout
    (ws.root / "link.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(WorkspaceError):
        ws.read("link.txt")
    with pytest.raises(WorkspaceError):
        ws.write("link.txt", "overwritten")
    with pytest.raises(WorkspaceError):
        ws.edit("link.txt", "top", "bottom")
    assert (outside / "secret.txt").read_text() == "top secret"


def test_symlinked_parent_dir_is_refused(layout: tuple[Workspace, Path]) -> None:
    ws, outside = layout
    (ws.root / "out").symlink_to(outside, target_is_directory=True)
    with pytest.raises(WorkspaceError):
        ws.read("out/secret.txt")
    # A new file below the symlinked directory is checked through its parent.
    with pytest.raises(WorkspaceError):
        ws.write("out/new.txt", "x")
    with pytest.raises(WorkspaceError):
        ws.write("out/deeper/new.txt", "x")
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_dangling_symlink_pointing_outside_is_refused(layout: tuple[Workspace, Path]) -> None:
    ws, outside = layout
    (ws.root / "dangling").symlink_to(outside / "created-through-link.txt")
    with pytest.raises(WorkspaceError):
        ws.write("dangling", "x")
    assert not (outside / "created-through-link.txt").exists()


def test_symlink_inside_the_workspace_is_fine(layout: tuple[Workspace, Path]) -> None:
    ws, _ = layout
    (ws.root / "alias.py").symlink_to(ws.root / "src" / "app.py")
    assert ws.read("alias.py").path == "src/app.py"


def test_symlink_loop_is_refused_cleanly(layout: tuple[Workspace, Path]) -> None:
    ws, _ = layout
    (ws.root / "a").symlink_to(ws.root / "b")
    (ws.root / "b").symlink_to(ws.root / "a")
    with pytest.raises(ToolError):
        ws.read("a")


def test_workspace_root_reached_through_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real, target_is_directory=True)
    ws = Workspace(tmp_path / "alias")
    assert ws.write("f.txt", "ok").created
    assert (real / "f.txt").read_text() == "ok"


@pytest.mark.parametrize("path", ["", "   ", "a\x00b"])
def test_malformed_paths_are_refused(layout: tuple[Workspace, Path], path: str) -> None:
    ws, _ = layout
    with pytest.raises(WorkspaceError):
        ws.read(path)


def test_write_creates_parents_and_reports_created(layout: tuple[Workspace, Path]) -> None:
    ws, _ = layout
    first = ws.write("src/routes/users.ts", "export {}\n")
    assert first.created and first.path == "src/routes/users.ts" and first.size == 10
    second = ws.write("src/routes/users.ts", "export const x = 1\n")
    assert not second.created
    assert (ws.root / "src/routes/users.ts").read_text() == "export const x = 1\n"


def test_write_size_cap(tmp_path: Path) -> None:
    ws = Workspace(tmp_path, max_write_bytes=10)
    with pytest.raises(ToolError, match="over the 10-byte write limit"):
        ws.write("big.txt", "x" * 11)
    assert not (tmp_path / "big.txt").exists()


def test_read_size_cap_says_so(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("a" * 100)
    ws = Workspace(tmp_path, max_read_bytes=10)
    outcome = ws.read("big.txt")
    assert outcome.truncated and outcome.text == "a" * 10 and outcome.size == 100


def test_read_errors_say_what_to_do(layout: tuple[Workspace, Path]) -> None:
    ws, _ = layout
    with pytest.raises(ToolError, match="does not exist"):
        ws.read("missing.txt")
    with pytest.raises(ToolError, match="is a directory"):
        ws.read("src")
    (ws.root / "blob.bin").write_bytes(b"\x00\x01\x02")
    with pytest.raises(ToolError, match="binary"):
        ws.read("blob.bin")


def test_edit_replaces_exactly_once(layout: tuple[Workspace, Path]) -> None:
    ws, _ = layout
    ws.write("f.txt", "alpha\nbeta\ngamma\nbeta\n")
    with pytest.raises(ToolError, match="occurs 2 times"):
        ws.edit("f.txt", "beta", "BETA")
    with pytest.raises(ToolError, match="not found"):
        ws.edit("f.txt", "delta", "x")
    with pytest.raises(ToolError, match="empty"):
        ws.edit("f.txt", "", "x")
    with pytest.raises(ToolError, match="does not exist"):
        ws.edit("nope.txt", "a", "b")
    outcome = ws.edit("f.txt", "alpha\nbeta", "ALPHA\nBETA\nBETA2")
    assert (outcome.removed_lines, outcome.added_lines) == (2, 3)
    assert (ws.root / "f.txt").read_text() == "ALPHA\nBETA\nBETA2\ngamma\nbeta\n"


def test_workspace_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="not an existing directory"):
        Workspace(tmp_path / "missing")


def test_nofollow_on_final_component(layout: tuple[Workspace, Path]) -> None:
    """The open itself refuses a symlink, should one appear after the check."""
    ws, outside = layout
    target = ws.root / "late.txt"
    os.symlink(outside / "secret.txt", target)
    # Bypass resolve() to reach the open: writing to the link's own path must fail.
    with pytest.raises(WorkspaceError, match="symlink"):
        ws._write_bytes(target, "late.txt", b"x")
    assert (outside / "secret.txt").read_text() == "top secret"
