"""``porter-mesh validate``: check activities against the AS2 compact profile.

The pure checking lives in :mod:`porter_mesh.core.as2`; this module only reads the input,
decides how it is laid out, and reports.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from porter_mesh.core.as2 import Activity
from porter_mesh.errors import ActivityError

#: Inputs larger than this are read line by line only (no whole-document attempt).
WHOLE_DOCUMENT_LIMIT = 64 * 1024 * 1024

_DESCRIPTION = """\
Check AS2 activities against the porter compact profile.

The input (FILE, or standard input for - or no argument) is read in one of these forms:
  - one JSON document: an activity object, an array of activities, or an object that
    maps names to activities (the form 'porter-mesh examples --json' prints);
  - otherwise JSON Lines: one activity per line; empty lines are skipped.
A line of the message log or of 'porter-mesh tail --json' (a message with "envelope"
and "activity") is checked by its activity.

Each valid activity is printed on standard output as compact, normalised JSON, one per
line. Each invalid one gets one line on standard error, e.g.
  line 3: object.items[0]: expected an object with a "type", or a string, got a number

Validation is strict: a line that is not JSON is an error here. (A node receiving
plain text delivers it as the profile's fallback {"type": "Note", "content": ...}; that
is a delivery rule, not a way for a message to pass validation.)

Exit status: 0 if every activity is valid, 1 if any is not, 2 if the input cannot be
read."""


def register(sub: Any) -> None:
    """Add the ``validate`` sub-command."""
    parser = sub.add_parser(
        "validate",
        help="check activities (JSON or JSON Lines) against the AS2 compact profile",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "file",
        nargs="?",
        default="-",
        metavar="FILE|-",
        help="file to check; - or nothing reads standard input",
    )
    parser.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="do not echo valid activities; only report errors and set the exit status",
    )
    parser.set_defaults(func=main)


def read_input(name: str) -> bytes:
    """Read the whole input.

    Args:
        name: a path, or ``"-"`` for standard input.

    Returns:
        The raw bytes.

    Raises:
        OSError: the file cannot be read.
    """
    if name == "-":
        return sys.stdin.buffer.read()
    return Path(name).read_bytes()


def check_entries(raw: bytes) -> Iterator[tuple[str, Activity | ActivityError]]:
    """Split the input into activities and check each one.

    Args:
        raw: the whole input.

    Yields:
        ``(label, activity or error)`` in input order; the label says where the entry is
        (``line 3``, ``item [2]``, ``"Worker accepts"``).
    """
    document = _whole_document(raw)
    if document is None:
        yield from _check_lines(raw)
        return
    first_line = 1 + raw[: len(raw) - len(raw.lstrip())].count(b"\n")
    if isinstance(document, list):
        for index, item in enumerate(document):
            yield f"item [{index}]", _check_value(item)
    elif isinstance(document, dict) and _is_named_map(document):
        for name, item in document.items():
            yield orjson.dumps(name).decode(), _check_value(item)
    else:
        yield f"line {first_line}", _check_value(document)


def _whole_document(raw: bytes) -> Any:
    """The input parsed as one JSON document, or ``None`` when it is not one."""
    if len(raw) > WHOLE_DOCUMENT_LIMIT or not raw.strip():
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def _is_named_map(document: dict[str, Any]) -> bool:
    # An activity always has "type"; a map of names to activities has only objects.
    return (
        "type" not in document
        and bool(document)
        and all(isinstance(value, dict) for value in document.values())
    )


def unwrap_message(value: Any) -> Any:
    """The activity inside a message line (``tail --json``, the message log), else
    ``value`` itself."""
    if (isinstance(value, dict) and "type" not in value and "envelope" in value
            and "activity" in value):
        return value["activity"]
    return value


def _check_value(value: Any) -> Activity | ActivityError:
    try:
        return Activity.from_dict(unwrap_message(value))
    except ActivityError as exc:
        return exc


def _check_lines(raw: bytes) -> Iterator[tuple[str, Activity | ActivityError]]:
    for number, line in enumerate(raw.split(b"\n"), start=1):
        line = line.strip()
        if not line:
            continue
        if b'"envelope"' in line:
            try:
                yield f"line {number}", _check_value(orjson.loads(line))
                continue
            except orjson.JSONDecodeError:
                pass  # reported as the bad JSON it is, below
        try:
            yield f"line {number}", Activity.from_json(line)
        except ActivityError as exc:
            if exc.reason == "bad-json":
                exc = ActivityError(
                    f"{exc}; plain text is not an activity (validation is strict, see --help)",
                    field=exc.field,
                    expected=exc.expected,
                    reason=exc.reason,
                )
            yield f"line {number}", exc


def main(args: argparse.Namespace) -> int:
    """Run ``porter-mesh validate``; returns the exit status."""
    try:
        raw = read_input(args.file)
    except OSError as exc:
        where = "standard input" if args.file == "-" else repr(args.file)
        print(
            f"porter-mesh validate: cannot read {where}: {exc.strerror or exc}; "
            "check the path (or pass - and pipe the activities in)",
            file=sys.stderr,
        )
        return 2
    out = sys.stdout.buffer
    invalid = 0
    try:
        for label, outcome in check_entries(raw):
            if isinstance(outcome, ActivityError):
                invalid += 1
                print(f"{label}: {outcome}", file=sys.stderr)
            elif not args.quiet:
                out.write(outcome.to_json() + b"\n")
        out.flush()
    except BrokenPipeError:
        # The reader went away (e.g. "| head"); stop quietly, as Unix filters do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    return 1 if invalid else 0
