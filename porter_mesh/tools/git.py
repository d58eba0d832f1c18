"""The ``git`` tool: status, diff, log, add and commit in the workspace's repository.

Theory of operation
-------------------
:func:`git_argv` turns a tool call into one fixed git command line (pure: it only
checks and arranges the arguments); :func:`run_git` runs it through
:func:`~porter_mesh.tools.shell.run_command`, the runner behind ``bash``, so a git
call has the same timeout, the same process-group cleanup and a bounded output (the
beginning is kept, where a diff or a log starts).

What git may see is fenced in:

* every path goes through :meth:`Workspace.resolve` first, so ``..``, absolute paths and
  symlinks that lead out are refused, and is passed after ``--`` (never as an option);
* git runs at the workspace root with ``GIT_CEILING_DIRECTORIES`` set to its parent,
  so a workspace that is not a repository is reported as such instead of git finding
  a repository above it;
* configuration comes only from the repository itself: ``GIT_CONFIG_NOSYSTEM=1``,
  ``GIT_CONFIG_GLOBAL`` pointing at the null device, and every ``GIT_*`` variable of
  the caller's environment removed, and the ignore and attributes files git would read
  from the user's home by default replaced by the null device; no pager, no colour, no
  external diff or textconv driver, no commit signing, no editor, no prompt;
* the author and committer are the agent (``<name>@porter-mesh.invalid``), so a commit
  needs no identity from outside.

The repository's own hooks still run on ``commit`` (they are part of the workspace);
that is no wider than what the ``bash`` tool allows.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from porter_mesh.errors import ToolError
from porter_mesh.tools.schemas import DEFAULT_GIT_LOG, GIT_COMMANDS, MAX_GIT_LOG
from porter_mesh.tools.shell import (
    DEFAULT_GRACE,
    DEFAULT_TAIL_BYTES,
    CommandHandle,
    CommandResult,
    run_command,
)
from porter_mesh.tools.workspace import Workspace

__all__ = ["AUTHOR_DOMAIN", "git_argv", "git_env", "run_git"]

#: The mail domain of the agents' commit identity (``.invalid`` is reserved: no mail
#: can reach it).
AUTHOR_DOMAIN: Final = "porter-mesh.invalid"

#: Options in front of every command: no pager, plain output, no drivers from config.
_BASE: Final = (
    "git", "--no-pager",
    "-c", "color.ui=never",
    "-c", "core.quotepath=off",
    "-c", "core.pager=cat",
    "-c", "commit.gpgsign=false",
    # Read from the user's home even without a global config file: not here.
    "-c", f"core.excludesFile={os.devnull}",
    "-c", f"core.attributesFile={os.devnull}",
)

_NOT_A_REPO: Final = "not a git repository"


def git_argv(
    ws: Workspace,
    command: str,
    *,
    paths: Sequence[str] | None = None,
    message: str | None = None,
    staged: bool = False,
    limit: int | None = None,
) -> list[str]:
    """The git command line for one tool call.

    Args:
        ws: the workspace (paths are checked against it).
        command: one of :data:`~porter_mesh.tools.schemas.GIT_COMMANDS`.
        paths: paths inside the workspace.
        message: the commit message.
        staged: ``diff`` of the index instead of the working tree.
        limit: commits ``log`` shows.

    Returns:
        The argument vector.

    Raises:
        WorkspaceError: a path leaves the workspace.
        ToolError: an argument does not fit the command.
    """
    if command not in GIT_COMMANDS:
        raise ToolError(f"git: {command!r} is not allowed; use one of {', '.join(GIT_COMMANDS)}")
    rel = [ws.relative(ws.resolve(p)) for p in paths or ()]
    if message is not None and command != "commit":
        raise ToolError(f"git: 'message' is for commit, not {command}")
    if staged and command != "diff":
        raise ToolError(f"git: 'staged' is for diff, not {command}")
    if limit is not None and command != "log":
        raise ToolError(f"git: 'limit' is for log, not {command}")
    argv = list(_BASE)
    if command == "status":
        argv += ["status", "--short", "--branch"]
    elif command == "diff":
        argv += ["diff", "--no-ext-diff", "--no-textconv", "--no-color"]
        if staged:
            argv.append("--cached")
    elif command == "log":
        count = DEFAULT_GIT_LOG if limit is None else limit
        if not 1 <= count <= MAX_GIT_LOG:
            raise ToolError(f"git: 'limit' must be 1 to {MAX_GIT_LOG}")
        argv += ["log", f"-n{count}", "--no-color", "--date=short",
                 "--format=%h %ad %an: %s"]
    elif command == "add":
        if not rel:
            raise ToolError("git: add needs 'paths' (the files to stage; '.' for all)")
        argv += ["add"]
    else:  # commit
        if paths:
            raise ToolError("git: commit takes what is staged; stage files with "
                            "git add and 'paths' first")
        if message is None or not message.strip():
            raise ToolError("git: commit needs a 'message'")
        if "\x00" in message:
            raise ToolError("git: the message contains a NUL byte; remove it")
        argv += ["commit", "--no-edit", "-m", message]
    if rel:
        argv += ["--", *rel]
    return argv


def git_env(ws: Workspace, author: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment git runs in (see the module docstring).

    Args:
        ws: the workspace.
        author: the agent name, used as author and committer.
        base: the environment to start from (default: this process's).
    """
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith("GIT_")}
    email = f"{author}@{AUTHOR_DOMAIN}"
    env.update({
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CEILING_DIRECTORIES": os.fspath(ws.root.parent),
        "GIT_AUTHOR_NAME": author,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_COMMITTER_NAME": author,
        "GIT_COMMITTER_EMAIL": email,
        "GIT_EDITOR": "true",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_PAGER": "cat",
        "GIT_TERMINAL_PROMPT": "0",
    })
    return env


def run_git(
    ws: Workspace,
    argv: Sequence[str],
    *,
    author: str,
    timeout: float,
    grace: float = DEFAULT_GRACE,
    output_bytes: int = DEFAULT_TAIL_BYTES,
    on_start: Callable[[CommandHandle], None] | None = None,
) -> tuple[str, CommandResult]:
    """Run a command line from :func:`git_argv` at the workspace root.

    Returns:
        The text for the agent (git's output, or a line saying there was none) and the
        runner's result.

    Raises:
        ToolError: git failed (the message carries its output), the workspace is not a
            repository, or git cannot be started.
    """
    result = run_command(
        shlex.join(argv), cwd=ws.root, timeout=timeout, grace=grace,
        tail_bytes=output_bytes, env=git_env(ws, author), on_start=on_start,
        keep_head=True,
    )
    sub = next((a for a in argv[len(_BASE):] if not a.startswith("-")), "git")
    if result.ok:
        text = result.render()
        body = text.rsplit("\n", 1)[0] if "\n" in text else ""
        return (body if body.strip() else f"git {sub}: done, no output."), result
    if _NOT_A_REPO in result.output:
        raise ToolError(
            "git: the workspace is not a git repository (git looks no higher than the "
            "workspace); create one with bash: git init")
    if result.exit_status == 127:
        raise ToolError("git: git is not installed on this machine; tell the team on 'log'")
    raise ToolError(f"git {sub} failed: {result.render()}")
