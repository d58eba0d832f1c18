"""``porter-mesh keygen NAME``: make an agent's key pair (CurveZMQ and record signing)."""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

from porter_mesh.errors import PorterError


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "keygen", help="make a key pair for an agent (CurveZMQ and record signing)",
        description="Write NAME.key (public certificate: give it to the mesh with "
        "'porter-mesh trust') and NAME.key_secret (secret certificate, mode 0600: it "
        "stays with the agent; point PORTER_MESH_KEY at it). Standard ZeroMQ certificate "
        "format; both also hold the agent's Ed25519 key that signs its knowledge records "
        "(the public half in NAME.key, so trusting the certificate trusts it too).")
    parser.add_argument("name", help="the agent name the key is for")
    parser.add_argument("--dir", type=pathlib.Path, default=pathlib.Path("."),
                        help="directory to write the two files into (default: current)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing key pair of that name")
    parser.add_argument("--add-signing-key", action="store_true",
                        help="give an existing key pair made without a signing key one, "
                        "keeping its CurveZMQ key (then trust NAME.key again everywhere)")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from porter_mesh.adapters.security import add_signing_key, create_key_pair

    try:
        if args.add_signing_key:
            public, secret = add_signing_key(args.dir, args.name)
        else:
            public, secret = create_key_pair(args.dir, args.name, force=args.force)
    except PorterError as exc:
        print(f"porter-mesh keygen: {exc}", file=sys.stderr)
        return 1
    print(f"public key : {public}  (trust it on the mesh: porter-mesh trust {public})")
    print(f"secret key : {secret}  (mode 600; run the agent with PORTER_MESH_KEY={secret})")
    return 0
