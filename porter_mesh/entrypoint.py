"""What every entry point of a porter-mesh process shares, the command line's commands
and the agent programs alike: the options that name a node's data directory, and how an
error becomes one line on standard error and an exit status (:data:`EXIT_CODES`).

It lives outside ``porter_mesh.cli`` so that the agent programs (``agents/``), which the
CLI starts, do not depend on the CLI package.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from porter_mesh.core.tracecontext import valid_traceparent
from porter_mesh.errors import ConfigError, PorterError, SecurityError
from porter_mesh.node.config import default_data_dir

__all__ = ["EXIT_CODES", "EXIT_INTERRUPTED", "EXIT_SETTINGS", "add_data_options",
           "data_dir_of", "report_error"]

#: The status of a mistake in the settings (the command line, a file, missing keys).
EXIT_SETTINGS = 2
#: The status of a command stopped by Ctrl-C (SIGINT), as shells report it (128 + 2).
EXIT_INTERRUPTED = 130

#: Exit statuses of every ``porter-mesh`` command.
EXIT_CODES = (
    (0, "done: sent and acknowledged, found, valid"),
    (1, "the mesh said no or did not answer: a timeout, a recipient not found or not "
        "reached, a Reject, an invalid activity"),
    (2, "a mistake on the command line or in a file, or keys the mesh needs: fix the "
        "value or make the keys the message names"),
    (130, "interrupted (Ctrl-C)"),
)


def add_data_options(parser: argparse.ArgumentParser) -> None:
    """``--data-dir`` and ``--no-knowledge``, as ``node`` and ``agent`` take them."""
    parser.add_argument("--data-dir", type=pathlib.Path, metavar="DIR",
                        help="the node's data directory: knowledge shard, delivery journal "
                        "(default: $PORTER_MESH_DATA/<mesh>/<name>, else the user data "
                        "directory, e.g. ~/.local/share/porter-mesh/<mesh>/<name>)")
    parser.add_argument("--no-knowledge", action="store_true",
                        help="keep no knowledge shard (remember/recall then need another "
                        "node that keeps one)")


def data_dir_of(args: argparse.Namespace) -> pathlib.Path:
    """The data directory the options name (``--data-dir`` or the default)."""
    if args.data_dir is not None:
        return pathlib.Path(args.data_dir)
    return default_data_dir(args.mesh, args.name)


def report_error(command: str | None, exc: BaseException) -> int:
    """Print ``exc`` as the one line a user sees; returns the exit status.

    Settings the user gave (:class:`ConfigError`, keys and protected mode
    (:class:`SecurityError`), paths the system refuses (:class:`OSError`)) are 2; what
    the mesh did is 1. Anything else is a bug: one line too, and ``-vv`` shows more.
    """
    prog = f"porter-mesh {command}" if command else "porter-mesh"
    if isinstance(exc, ConfigError | SecurityError):
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, PorterError):
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    if isinstance(exc, OSError):
        where = f" {exc.filename}" if exc.filename else ""
        print(f"{prog}: cannot use{where}: {exc.strerror or exc}; check the path and its "
              "permissions", file=sys.stderr)
        return 2
    print(f"{prog}: internal error: {type(exc).__name__}: {exc} (please report it; "
          "-vv shows where it happened)", file=sys.stderr)
    return 1


def traceparent_arg(text: str) -> str:
    """An argparse type for ``--traceparent``: a W3C traceparent string.

    Raises:
        argparse.ArgumentTypeError: it is not one; the message shows the form.
    """
    if not valid_traceparent(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a W3C traceparent; expected 00-<32 hex trace id>-<16 hex "
            "span id>-<2 hex flags>")
    return text
