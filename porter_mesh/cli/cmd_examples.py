"""``porter-mesh examples``: the profile's example activities, validated and printed."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from porter_mesh.core.as2 import Activity
from porter_mesh.core.profile_examples import profile_examples
from porter_mesh.errors import ActivityError


def register(sub: Any) -> None:
    """Add the ``examples`` sub-command."""
    parser = sub.add_parser(
        "examples",
        help="print the AS2 profile's example activities, each validated",
        description=(
            "Validate every example activity of the AS2 compact profile and print it: a "
            "heading line with its name and a one-line digest (type, actor -> target, "
            "[context], summary), then the activity as indented JSON. "
            "Use --json to get them as one JSON object (name -> activity), which "
            "'porter-mesh validate' also reads."
        ),
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="only the examples whose name contains NAME, or whose activity type is NAME "
        "(case-insensitive)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object mapping each example's name to its activity",
    )
    parser.set_defaults(func=main)


def render(name: str, activity: Activity) -> str:
    """The text block ``porter-mesh examples`` prints for one example.

    Args:
        name: the example's heading in the profile.
        activity: the validated activity.

    Returns:
        A heading line, then the JSON indented by two spaces, ending with a newline.
    """
    body = orjson.dumps(activity.to_dict(), option=orjson.OPT_INDENT_2).decode()
    indented = "\n".join("  " + line for line in body.splitlines())
    return f"# {name}: {activity.headline()}\n{indented}\n"


def main(args: argparse.Namespace) -> int:
    """Run ``porter-mesh examples``; returns the exit status."""
    examples = profile_examples()
    wanted: list[str] = [n.casefold() for n in args.names]
    if wanted:
        examples = {
            name: data
            for name, data in examples.items()
            if any(w in name.casefold() or w == str(data.get("type", "")).casefold()
                   for w in wanted)
        }
        if not examples:
            names = "; ".join(profile_examples())
            print(f"porter-mesh examples: no example matches; the names are: {names}",
                  file=sys.stderr)
            return 2
    status = 0
    blocks: list[str] = []
    valid: dict[str, Any] = {}
    for name, data in examples.items():
        try:
            activity = Activity.from_dict(data)
        except ActivityError as exc:
            print(f"{name}: {exc}", file=sys.stderr)
            status = 1
            continue
        valid[name] = activity.to_dict()
        blocks.append(render(name, activity))
    if args.json:
        sys.stdout.write(orjson.dumps(valid, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        sys.stdout.write("\n".join(blocks))
    return status
