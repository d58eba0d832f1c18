"""The git tool in a fresh repository in tmp: status, diff, log, add, commit as the
agent; paths confined to the workspace; no repository above the workspace, and no
configuration from outside it, reach git."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from porter_mesh.errors import ToolError, WorkspaceError
from porter_mesh.tools.git import git_argv, git_env
from porter_mesh.tools.toolbox import Toolbox
from porter_mesh.tools.workspace import Workspace
from tests.integration.test_tools_messaging import MemoryPort, port_of


def git(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "app.py").write_text("print('v1')\n")
    return root


@pytest.fixture
def box(repo: Path) -> Toolbox:
    return Toolbox(MemoryPort("w1"), repo, role="worker")


def test_status_add_commit_log_diff(box: Toolbox, repo: Path) -> None:
    status = box.call("git", {"command": "status"})
    assert "## No commits yet on main" in status and "?? app.py" in status
    assert box.call("git", {"command": "add", "paths": ["app.py"]}) == "git add: done, no output."
    assert "A  app.py" in box.call("git", {"command": "status"})
    assert "+print('v1')" in box.call("git", {"command": "diff", "staged": True})
    committed = box.call("git", {"command": "commit", "message": "Add the app"})
    assert "Add the app" in committed
    # The agent is the author, with an address no mail can reach.
    author = git(repo, "log", "-1", "--format=%an <%ae> / %cn <%ce>").strip()
    assert author == "w1 <w1@porter-mesh.invalid> / w1 <w1@porter-mesh.invalid>"
    (repo / "app.py").write_text("print('v2')\n")
    diff = box.call("git", {"command": "diff", "paths": ["app.py"]})
    assert "-print('v1')" in diff and "+print('v2')" in diff
    log = box.call("git", {"command": "log", "limit": 5}).splitlines()
    assert len(log) == 1 and log[0].endswith("w1: Add the app")
    # add and commit are recorded on log, like bash; the looking commands are not.
    records = [a for ch, a in port_of(box).sent if a.type == "Invoke"]
    assert [r.summary.split()[1:3] for r in records] == [["git", "add"], ["git", "commit"]]


def test_failures_say_what_to_do(box: Toolbox, repo: Path) -> None:
    with pytest.raises(ToolError, match=r"nothing to commit|nothing added"):
        box.call("git", {"command": "commit", "message": "empty"})
    with pytest.raises(ToolError, match="commit needs a 'message'"):
        box.call("git", {"command": "commit"})
    with pytest.raises(ToolError, match="add needs 'paths'"):
        box.call("git", {"command": "add"})
    with pytest.raises(ToolError, match="one of 'status'"):
        box.call("git", {"command": "push"})
    with pytest.raises(ToolError, match="'staged' is for diff"):
        box.call("git", {"command": "log", "staged": True})
    with pytest.raises(ToolError, match="at most 200"):
        box.call("git", {"command": "log", "limit": 1000})
    with pytest.raises(ToolError, match="did not match any files"):
        box.call("git", {"command": "add", "paths": ["missing.py"]})


@pytest.mark.parametrize("path", ["../outside.py", "/etc/passwd", "sub/../../x"])
def test_paths_stay_in_the_workspace(box: Toolbox, path: str) -> None:
    with pytest.raises(WorkspaceError, match="outside the workspace"):
        box.call("git", {"command": "add", "paths": [path]})


def test_a_path_that_looks_like_an_option_stays_a_path(box: Toolbox, repo: Path) -> None:
    (repo / "--all").write_text("x\n")
    box.call("git", {"command": "add", "paths": ["--all"]})
    status = box.call("git", {"command": "status"})
    assert "A  --all" in status and "?? app.py" in status  # only that file was staged
    assert git_argv(Workspace(repo), "add", paths=["--all"])[-2:] == ["--", "--all"]


def test_no_repository_above_the_workspace_is_used(tmp_path: Path) -> None:
    git(tmp_path, "init", "-q")
    inner = tmp_path / "agent"
    inner.mkdir()
    box = Toolbox(MemoryPort("w1"), inner)
    with pytest.raises(ToolError, match=r"not a git repository.*git init"):
        box.call("git", {"command": "status"})


def test_configuration_from_outside_is_ignored(box: Toolbox, repo: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Each of these, if git read it, would hide app.py from status.
    home = tmp_path / "home"
    (home / ".config" / "git").mkdir(parents=True)
    (home / "ignore-all").write_text("*.py\n")
    (home / ".gitconfig").write_text(f"[core]\n\texcludesFile = {home / 'ignore-all'}\n")
    (home / ".config" / "git" / "ignore").write_text("app.py\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("GIT_AUTHOR_NAME", "someone else")
    plain = subprocess.run(["git", "status", "--short"], cwd=repo, capture_output=True,
                           text=True, env={"HOME": str(home), "PATH": os.environ["PATH"]})
    assert "app.py" not in plain.stdout  # so the files above do hide it from plain git
    env = git_env(Workspace(repo), "w1")
    assert env["GIT_CONFIG_GLOBAL"] == os.devnull and env["GIT_CONFIG_NOSYSTEM"] == "1"
    assert "GIT_DIR" not in env and env["GIT_AUTHOR_NAME"] == "w1"
    assert "?? app.py" in box.call("git", {"command": "status"})


def test_long_output_keeps_its_beginning(repo: Path) -> None:
    box = Toolbox(MemoryPort("w1"), repo, tail_bytes=2048)
    (repo / "big.txt").write_text("".join(f"line {i}\n" for i in range(5000)))
    box.call("git", {"command": "add", "paths": ["big.txt"]})
    diff = box.call("git", {"command": "diff", "staged": True})
    assert diff.startswith("diff --git a/big.txt b/big.txt")
    assert "later bytes of output dropped" in diff and "line 4999" not in diff
