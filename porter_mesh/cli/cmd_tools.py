"""``porter-mesh tools``: print the agent tool descriptions as JSON.

``--format openai`` prints the list for an OpenAI-style ``tools`` request field;
``--format mcp`` prints an MCP ``tools/list`` result. ``--role`` limits the list to
one role's tools (``architect``, ``worker``, ``reviewer``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from porter_mesh.errors import ConfigError
from porter_mesh.tools.schemas import ROLE_TOOLS, specs_for, to_mcp, to_openai


def register(subparsers: Any) -> None:
    """Add the ``tools`` sub-command."""
    parser = subparsers.add_parser(
        "tools",
        help="print the agent tools as JSON (OpenAI or MCP format)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--format", choices=("openai", "mcp"), default="openai", help="output format"
    )
    parser.add_argument(
        "--role", choices=sorted(ROLE_TOOLS), default=None, help="only this role's tools"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the tool list; returns the exit status."""
    try:
        specs = specs_for(args.role)
    except ConfigError as exc:
        print(f"porter-mesh tools: {exc}", file=sys.stderr)
        return 2
    document = to_openai(specs) if args.format == "openai" else to_mcp(specs)
    try:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``| head``). Point stdout at /dev/null so the
        # interpreter's final flush does not complain again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
