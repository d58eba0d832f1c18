"""``porter-mesh demo``: the demo mesh (the README's main job)."""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

from porter_mesh import eventloop
from porter_mesh.cli.common import mesh_name
from porter_mesh.errors import ConfigError, PorterError


def register(sub: Any) -> None:
    parser = sub.add_parser("demo", help="run the demo mesh: architect, two workers, reviewer",
                            description="Start four agents as separate processes on loopback "
                            "and play the profile's task story end to end.")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("demo-out"),
                        help="output directory, made fresh (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=30.0,
                        help="seconds for the whole story (default %(default)s)")
    parser.add_argument("--secure", action="store_true",
                        help="run every node with CurveZMQ: keys made in OUT/keys, all "
                        "trusted (see docs/security.md)")
    parser.add_argument("--ui", action="store_true",
                        help="also run the dashboard (porter-mesh ui), print its address, "
                        "and keep the mesh running after the story until Ctrl-C")
    parser.add_argument("--stay", action="store_true",
                        help="keep the whole team on the mesh after the story until Ctrl-C "
                        "(for porter-mesh trace and stats)")
    parser.add_argument("--ui-port", type=int, default=0, metavar="PORT",
                        help="the dashboard's HTTP port with --ui (default: a free one)")
    parser.add_argument("--team", type=pathlib.Path, metavar="TEAM.toml",
                        help="the team to run (default: examples/demo-team.toml)")
    parser.add_argument("--mesh", type=mesh_name, metavar="NAME",
                        help="the mesh to run on (default: the team file's mesh name with "
                        "this process's pid, a mesh of its own for every run)")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from agents.demo import DemoError, demo_team, run_demo

    try:
        demo_team(args.team)  # a wrong team file is the user's to fix: one line, status 2
    except DemoError as exc:
        print(f"porter-mesh demo: {exc}", file=sys.stderr)
        return 2
    try:
        return eventloop.run(run_demo(args.out.resolve(), timeout=args.timeout,
                                       secure=args.secure, ui=args.ui,
                                       ui_port=args.ui_port, team_file=args.team,
                                       mesh=args.mesh, stay=args.stay))
    except KeyboardInterrupt:
        return 130
    except ConfigError as exc:  # a setting to change (PORTER_MESH_LOOP, say): status 2
        print(f"porter-mesh demo: {exc}", file=sys.stderr)
        return 2
    except PorterError as exc:
        print(f"porter-mesh demo: {exc}", file=sys.stderr)
        return 1
