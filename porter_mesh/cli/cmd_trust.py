"""``porter-mesh trust FILE``: allow a public key on a mesh (and list or remove keys)."""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from typing import Any

from porter_mesh.core import constants as C
from porter_mesh.errors import PorterError


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "trust", help="allow an agent's public key on a mesh",
        description="Copy a public certificate into the mesh's trusted directory, bound to "
        "an agent name (the file name without .key, or --as). Running nodes pick up "
        "the change for their next connection; a removed key is disconnected within a "
        "heartbeat.")
    parser.add_argument("file", nargs="?", type=pathlib.Path,
                        help="public certificate (NAME.key from 'porter-mesh keygen')")
    parser.add_argument("--mesh", default=os.environ.get("PORTER_MESH", C.DEFAULT_MESH),
                        help="mesh name (default: $PORTER_MESH or %(default)s)")
    parser.add_argument("--dir", type=pathlib.Path,
                        help="trusted directory (default: $PORTER_MESH_TRUSTED, else "
                        "<data root>/<mesh>/trusted)")
    parser.add_argument("--as", dest="name", metavar="NAME",
                        help="agent name to bind the key to (default: from the file name)")
    parser.add_argument("--force", action="store_true",
                        help="replace another key already trusted under that name")
    parser.add_argument("--list", action="store_true", help="list the trusted agents")
    parser.add_argument("--remove", metavar="NAME", help="stop trusting agent NAME")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from porter_mesh.adapters.security import PUBLIC_SUFFIX, TrustStore, trust_key
    from porter_mesh.node.config import ENV_TRUSTED, default_trusted_dir

    env_dir = os.environ.get(ENV_TRUSTED)
    directory: pathlib.Path = args.dir or (pathlib.Path(env_dir) if env_dir
                                           else default_trusted_dir(args.mesh))
    try:
        if args.remove:
            target = directory / f"{args.remove}{PUBLIC_SUFFIX}"
            if not target.is_file():
                print(f"porter-mesh trust: {args.remove!r} is not trusted in {directory}",
                      file=sys.stderr)
                return 1
            target.unlink()
            print(f"no longer trusted: {args.remove} (removed {target})")
            return 0
        if args.list or args.file is None:
            if args.file is None and not args.list:
                print("porter-mesh trust: give a public certificate FILE, --list or "
                      "--remove NAME", file=sys.stderr)
                return 2
            store = TrustStore(directory)
            store.refresh()
            for name in sorted(store.names):
                signs = "signs records" if store.signing_key_for(name) else (
                    "no signing key: its records are refused (keygen --add-signing-key)")
                print(f"{name:<24} {store.key_for(name)}  {signs}")
            if not store.names:
                print(f"(no trusted keys in {directory})", file=sys.stderr)
            return 0
        target = trust_key(args.file, directory, name=args.name, force=args.force)
    except PorterError as exc:
        print(f"porter-mesh trust: {exc}", file=sys.stderr)
        return 1
    print(f"trusted {target.name.removesuffix(PUBLIC_SUFFIX)} on mesh {args.mesh!r}: {target}")
    return 0
