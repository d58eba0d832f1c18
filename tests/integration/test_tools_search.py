"""list_dir, glob and grep on the real file system: what they find, and every way out
they could be led into (``..``, absolute paths, symlinks to files and directories
outside, symlink loops) refused or left unfollowed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from porter_mesh.errors import ToolError, WorkspaceError
from porter_mesh.tools import search
from porter_mesh.tools.search import glob, glob_regex, grep, list_dir
from porter_mesh.tools.toolbox import Toolbox
from porter_mesh.tools.workspace import Workspace
from tests.integration.test_tools_messaging import MemoryPort


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Workspace, Path]:
    """A workspace with code, a .git directory, a binary, and links out; and an
    "outside" directory holding a secret."""
    root = tmp_path / "ws"
    outside = tmp_path / "outside"
    (root / "src" / "pkg").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.py").write_text("SECRET = 'top secret'\n")
    (root / "src" / "app.py").write_text("import os\n\ndef main():\n    return 'hi'\n")
    (root / "src" / "pkg" / "util.py").write_text("def helper():\n    return 42\n")
    (root / "README.md").write_text("# Demo\nRun main().\n")
    (root / ".git").mkdir()
    (root / ".git" / "config.py").write_text("def main(): pass\n")
    (root / "blob.bin").write_bytes(b"\x00\x01def main\x00")
    os.symlink(outside / "secret.py", root / "leak.py")
    os.symlink(outside, root / "outdir")
    os.symlink(root / "src" / "app.py", root / "app_link.py")
    os.symlink(root / "loop", root / "loop")
    return Workspace(root), outside


def test_list_dir_shows_kinds_and_links(layout: tuple[Workspace, Path]) -> None:
    ws, _ = layout
    text = list_dir(ws)
    lines = text.splitlines()
    assert lines[0].startswith("./: ")
    assert "src/" in lines and ".git/" in lines
    assert f"README.md ({(ws.root / 'README.md').stat().st_size} bytes)" in lines
    assert "app_link.py -> src/app.py" in lines
    assert "leak.py -> outside the workspace (not followed)" in lines
    assert "outdir -> outside the workspace (not followed)" in lines
    assert "secret" not in text
    assert list_dir(ws, "src/pkg").splitlines()[1:] == ["util.py (28 bytes)"]


@pytest.mark.parametrize("path", ["..", "../outside", "src/../../outside", "outdir",
                                  "outdir/secret.py", "/etc", "leak.py"])
def test_every_tool_refuses_a_start_outside(layout: tuple[Workspace, Path], path: str) -> None:
    ws, outside = layout
    for call in (lambda: list_dir(ws, path), lambda: glob(ws, "*", path),
                 lambda: grep(ws, "SECRET", path)):
        with pytest.raises(WorkspaceError, match="outside the workspace"):
            call()
    with pytest.raises(WorkspaceError):
        list_dir(ws, str(outside))


def test_glob_finds_and_stays_inside(layout: tuple[Workspace, Path]) -> None:
    ws, _ = layout
    found = glob(ws, "**/*.py").splitlines()
    assert found == ["app_link.py", "src/app.py", "src/pkg/util.py"]  # no .git, no leak.py
    assert glob(ws, "src/*.py").splitlines() == ["src/app.py"]
    assert glob(ws, "*.py", "src/pkg").splitlines() == ["src/pkg/util.py"]
    assert glob(ws, "src/**").splitlines() == ["src/pkg/", "src/app.py", "src/pkg/util.py"]
    assert glob(ws, "[A-Z]*.md").splitlines() == ["README.md"]
    assert "outdir" not in glob(ws, "*")  # a link that leads out is not even named
    assert glob(ws, "*.rs").startswith("No path under ./ matches '*.rs'")


@pytest.mark.parametrize("pattern", ["/etc/*", "../outside/*", "src/../../*", ""])
def test_glob_refuses_patterns_that_climb(layout: tuple[Workspace, Path], pattern: str) -> None:
    ws, _ = layout
    with pytest.raises(ToolError, match="pattern"):
        glob(ws, pattern)


def test_glob_patterns_translate_as_a_shell_would() -> None:
    rx = glob_regex("a/**/b?.[!x]y")
    assert rx.fullmatch("a/b1.zy") and rx.fullmatch("a/x/y/b2.zy")
    assert not rx.fullmatch("a/b1.xy") and not rx.fullmatch("a/b12.zy")
    assert not glob_regex("*.py").fullmatch("src/a.py")  # '*' stays in one directory
    assert glob_regex("**/*.py").fullmatch("a.py")


def test_grep_finds_lines_in_text_files_only(layout: tuple[Workspace, Path]) -> None:
    ws, _ = layout
    out = grep(ws, r"def \w+\(").splitlines()
    assert "src/app.py:3: def main():" in out
    assert "src/pkg/util.py:1: def helper():" in out
    assert "app_link.py:3: def main():" in out  # a link inside is followed
    assert not any(line.startswith((".git/", "blob.bin", "leak.py")) for line in out)
    assert any("binary" in line for line in out)  # says what it skipped
    assert grep(ws, "HELPER", ignore_case=True).splitlines()[0] == (
        "src/pkg/util.py:1: def helper():")
    assert grep(ws, "def", glob="util.py").splitlines() == ["src/pkg/util.py:1: def helper():"]
    assert grep(ws, "return", "src/app.py").splitlines() == ["src/app.py:4:     return 'hi'"]
    assert grep(ws, "SECRET").startswith("No match for 'SECRET'")


def test_grep_says_what_is_wrong_with_a_pattern(layout: tuple[Workspace, Path]) -> None:
    ws, _ = layout
    with pytest.raises(ToolError, match="not a valid regular expression"):
        grep(ws, "def (")


def test_results_are_bounded_and_say_so(tmp_path: Path) -> None:
    for i in range(30):
        (tmp_path / f"f{i:02}.txt").write_text("needle\n" * 3)
    ws = Workspace(tmp_path)
    out = search.grep(ws, "needle", limit=10).splitlines()
    assert len(out) == 11 and out[-1].startswith("[the first 10 matches are shown")
    listed = search.glob(ws, "*.txt", limit=5).splitlines()
    assert len(listed) == 6 and "narrow the pattern" in listed[-1]
    assert "[the first 7 entries are shown" in search.list_dir(ws, limit=7)
    huge = tmp_path / "huge.txt"
    huge.write_text("needle\n" * (ws.max_write_bytes // 7 + 10))
    assert "skipped" in search.grep(ws, "needle", glob="huge.txt")


def test_the_toolbox_offers_them(layout: tuple[Workspace, Path]) -> None:
    ws, _ = layout
    box = Toolbox(MemoryPort("r1"), ws, role="reviewer")
    assert box.call("glob", {"pattern": "**/util.py"}) == "src/pkg/util.py"
    assert "src/app.py:3" in box.call("grep", {"pattern": "main", "path": "src",
                                               "glob": None, "ignore_case": None})
    assert "util.py" in box.call("list_dir", {"path": "src/pkg"})
    with pytest.raises(WorkspaceError):
        box.call("list_dir", {"path": "../outside"})
