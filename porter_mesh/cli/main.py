# PYTHON_ARGCOMPLETE_OK
"""Entry point of the ``porter-mesh`` command.

Sub-commands live in sibling modules named ``cmd_<name>.py``; each exposes
``register(subparsers)`` which adds its parser and sets ``func`` (a callable taking the
parsed namespace and returning an exit status). They are found at start-up, so adding a
command never means editing this file.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
from collections.abc import Sequence

import porter_mesh.cli as _cli_pkg
from porter_mesh import __version__
from porter_mesh.cli.common import (
    CliParser,
    checked_numbers,
    chosen_log_level,
    exit_code_table,
)
from porter_mesh.entrypoint import report_error


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Build the top-level parser with every discovered sub-command.

    Args:
        command: when given and a module ``cmd_<command>`` exists, only that sub-command
            is registered. Importing every command module costs a process about 24 MB
            (the dashboard's web server, the query engine...), which a long-running
            ``porter-mesh node`` would otherwise carry for its whole life.
    """
    parser = CliParser(
        prog="porter-mesh",
        description="A broker-less agent mesh on ZeroMQ.",
        epilog=exit_code_table(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"porter-mesh {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (repeatable)"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = sorted(m.name for m in pkgutil.iter_modules(_cli_pkg.__path__)
                     if m.name.startswith("cmd_"))
    if command is not None and f"cmd_{command}" in modules:
        modules = [f"cmd_{command}"]
    for name in modules:
        importlib.import_module(f"{_cli_pkg.__name__}.{name}").register(sub)
    checked_numbers(parser)
    return parser


def _command_named(argv: Sequence[str]) -> str | None:
    """The sub-command ``argv`` names: its first word that is not an option (the
    top-level options take no value)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    completing = argv is None and "_ARGCOMPLETE" in os.environ
    parser = build_parser(None if completing else _command_named(
        sys.argv[1:] if argv is None else argv))
    if argv is None:
        import argcomplete

        argcomplete.autocomplete(parser)  # answers the shell and exits when it asks
    args = parser.parse_args(argv)
    level = chosen_log_level(args.verbose) or logging.WARNING
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        status: int = func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if args.verbose >= 2:
            raise
        return report_error(args.command, exc)
    return status


if __name__ == "__main__":
    sys.exit(main())
