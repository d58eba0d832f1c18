"""``porter-mesh tools``: print the agent tool descriptions as JSON.

``--format openai`` prints the list for an OpenAI-style ``tools`` request field
(``--strict``: in the form OpenAI's strict mode takes, every property required and the
optional ones nullable); ``--format mcp`` prints an MCP ``tools/list`` result.
``--role`` limits the list to one role's tools (``architect``, ``worker``,
``reviewer``).
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
    parser.add_argument(
        "--strict", action="store_true",
        help="openai: the strict-mode form (every property required, optional ones "
        "nullable, \"strict\": true)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the tool list; returns the exit status."""
    try:
        specs = specs_for(args.role)
    except ConfigError as exc:
        print(f"porter-mesh tools: {exc}", file=sys.stderr)
        return 2
    if args.strict and args.format != "openai":
        print("porter-mesh tools: --strict is for --format openai; MCP has no strict "
              "mode", file=sys.stderr)
        return 2
    document = to_openai(specs, strict=args.strict) if args.format == "openai" else to_mcp(
        specs)
    try:
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``| head``). Point stdout at /dev/null so the
        # interpreter's final flush does not complain again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
