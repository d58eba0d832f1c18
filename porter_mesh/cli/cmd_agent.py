"""``porter-mesh agent ROLE --name N``: run one example agent (architect, worker, reviewer)."""

from __future__ import annotations

import argparse
from typing import Any

from porter_mesh.cli.common import checked_options


def register(sub: Any) -> None:
    from agents.runtime import add_arguments

    parser = sub.add_parser("agent", help="run an example agent as this process",
                            description="Run an architect, worker or reviewer on the mesh, "
                            "with the scripted brain (default) or an LLM endpoint.")
    add_arguments(parser)
    checked_options(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from agents.runtime import main as run_agent

    status: int = run_agent(args)
    return status
