"""``porter-mesh kg export|stats``: look at a node's knowledge shard on disk.

Both work on a node's data directory while no node has it open (the shard is locked by
the node that runs it): ``--data-dir`` names it, or ``--mesh`` and ``--agent`` find the
node's default one (``$PORTER_MESH_DATA/<mesh>/<agent>``, else the platform's user data
directory, e.g. ``~/.local/share/porter-mesh/<mesh>/<agent>``). The shard is in the data
directory's ``knowledge/``; a directory that is itself a shard is opened as it is.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from typing import Any

import orjson

from porter_mesh.adapters.shard import Shard
from porter_mesh.cli.common import mesh_name
from porter_mesh.core import constants as C
from porter_mesh.errors import ConfigError
from porter_mesh.node.config import default_data_dir, knowledge_dir


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "kg", help="inspect the local knowledge shard (export, stats)",
        description="Inspect a node's knowledge shard on disk (the node must be stopped).",
    )
    actions = parser.add_subparsers(dest="kg_action", metavar="ACTION", required=True)
    export = actions.add_parser("export", help="write the knowledge graph as RDF")
    export.add_argument("--format", choices=("turtle", "nt", "jsonld"), default="turtle",
                        help="RDF syntax (default %(default)s)")
    export.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    add_shard_options(export)
    export.set_defaults(func=export_main)
    stats = actions.add_parser(
        "stats", help="observations, retractions, version vector, digest")
    stats.add_argument("--json", action="store_true", help="one JSON object")
    add_shard_options(stats)
    stats.set_defaults(func=stats_main)


def add_shard_options(parser: argparse.ArgumentParser) -> None:
    """``--data-dir``, ``--mesh`` and ``--agent``: which shard to open."""
    parser.add_argument("--data-dir", metavar="DIR", type=pathlib.Path,
                        help="the node's data directory (default: found from --mesh/--agent)")
    parser.add_argument("--mesh", type=mesh_name,
                        default=os.environ.get("PORTER_MESH", C.DEFAULT_MESH),
                        help="mesh name (default: $PORTER_MESH or %(default)s)")
    parser.add_argument("--agent", default=os.environ.get("PORTER_MESH_AGENT"),
                        help="agent whose shard to open (default: $PORTER_MESH_AGENT)")


def shard_dir(args: argparse.Namespace) -> pathlib.Path:
    """The shard directory the options name: ``knowledge/`` in the node's data directory,
    or the directory itself when it is a shard.

    Raises:
        ConfigError: neither ``--data-dir`` nor an agent name was given.
    """
    if args.data_dir is not None:
        data_dir = pathlib.Path(args.data_dir)
    elif args.agent:
        data_dir = default_data_dir(args.mesh, args.agent)
    else:
        raise ConfigError("say which shard: --data-dir DIR, or --agent NAME (and --mesh if "
                          "not the default)")
    if (data_dir / "shard.json").exists():
        return data_dir
    return knowledge_dir(data_dir)


def open_shard(args: argparse.Namespace) -> Shard:
    """Open the shard the options name, without creating one."""
    return Shard(shard_dir(args), create=False)


def export_main(args: argparse.Namespace) -> int:
    # Errors go to the entry point's report_error: "porter-mesh kg: ...", status 2 for
    # options to fix (no shard named), 1 for a shard that cannot be read.
    with open_shard(args) as shard:
        data = shard.export(args.format)
    if args.output:
        pathlib.Path(args.output).write_bytes(data)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return 0


def stats_main(args: argparse.Namespace) -> int:
    with open_shard(args) as shard:
        stats = shard.stats()
        agent = shard.agent
    if args.json:
        row = {"agent": agent, "observations": stats.observations,
               "observation_records": stats.observation_records,
               "retractions": stats.retractions, "version_vector": stats.version_vector,
               "digest": stats.digest, "journal_bytes": stats.journal_bytes,
               "data_dir": stats.data_dir, "index": stats.index}
        print(orjson.dumps(row).decode())
        return 0
    print(f"shard          {stats.data_dir} (agent {agent or '?'})")
    print(f"observations   {stats.observations} in the graph "
          f"({stats.observation_records} recorded, {stats.retractions} retractions)")
    print(f"digest         {stats.digest}")
    print(f"journal        {stats.journal_bytes} bytes")
    print(f"index          {stats.index}")
    print("version vector" + ("  (empty)" if not stats.version_vector else ""))
    for origin, seq in stats.version_vector.items():
        print(f"  {origin:24} {seq}")
    return 0
