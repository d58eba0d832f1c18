"""``porter-mesh up TEAM.toml``: start a team defined in a file and keep it running."""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
from typing import Any

from porter_mesh import eventloop
from porter_mesh.cli.common import mesh_name


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "up", help="start every agent of a team file and keep them running",
        description="Check TEAM.toml, start each of its agents as its own process, show "
        "their states as they change (starting, up, alive on the mesh, crashed, "
        "restarting, gave up), restart a crashed agent with capped backoff, and stop "
        "them all on Ctrl-C (exit status 130). A team whose agents already run on its "
        "mesh is refused at once (status 2); --mesh runs a second copy beside it. The "
        "format: examples/demo-team.toml, examples/llm-team.toml.")
    parser.add_argument("team", metavar="TEAM.toml", type=pathlib.Path,
                        help="the team file")
    parser.add_argument("--logs", type=pathlib.Path, metavar="DIR",
                        help="directory of the agents' logs, NAME.log (default: logs/ "
                        "beside the team file; logs/MESH/ with --mesh)")
    parser.add_argument("--mesh", type=mesh_name, metavar="NAME",
                        help="run the team on this mesh instead of the file's [mesh] name "
                        "(e.g. to run your own copy beside someone else's on one host)")
    parser.add_argument("--check", action="store_true",
                        help="only check the file, print the agents' command lines, exit")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from agents.supervisor import Supervisor, refuse_if_running
    from agents.team import TeamError, agent_argv, load_team

    try:
        team = load_team(args.team)
        if args.mesh is not None:
            team = dataclasses.replace(team, mesh=dataclasses.replace(team.mesh,
                                                                      name=args.mesh))
        if not args.check:
            refuse_if_running(team, shown=str(args.team))
    except TeamError as exc:
        print(f"porter-mesh up: {exc}", file=sys.stderr)
        return 2
    if args.check:
        for spec in team.agents:
            print(" ".join(["porter-mesh", *agent_argv(team, spec)]))
        return 0
    # A second copy on another mesh keeps its logs and files apart from the first's.
    apart = pathlib.Path(args.mesh) if args.mesh is not None else pathlib.Path()
    logs = args.logs if args.logs is not None else team.path.parent / "logs" / apart
    workspace = (team.path.parent / "workspace" / apart).resolve() if args.mesh else None
    return eventloop.run(Supervisor(team, logs=logs.resolve(), workspace=workspace).run())
