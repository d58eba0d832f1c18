"""``porter-mesh recall 'SPARQL'``: query the knowledge graph.

The query is checked first (limits, the read-only guard, the parser): a malformed or
refused query fails at once with exit status 2, before any network work.

Online by default: the command joins the mesh as the human user (a seat
``porter-ui-<hex>``), catches a throw-away replica up from a peer (progress on stderr; see
:mod:`porter_mesh.cli.cmd_kgsync`), then queries it locally. Offline with ``--data-dir``
(a node's data directory) or ``--agent``: it opens that stopped node's shard directly.

Runs the same read-only guard as a node's ``Recall``: SELECT, ASK, CONSTRUCT and
DESCRIBE with the prefixes porter, as, prov, rdf, rdfs and xsd predefined; updates, LOAD
and SERVICE refused; a row limit and a deadline. Prints a table by default, or
``--json`` / ``--csv``. A result cut at the row limit says so (on stderr for CSV).
"""

from __future__ import annotations

import argparse
import csv
import sys
from typing import Any

import orjson

from porter_mesh.adapters.sparql import (
    DEFAULT_DEADLINE,
    DEFAULT_ROW_LIMIT,
    QueryForm,
    QueryResult,
    term_text,
    validate_query,
)
from porter_mesh.cli.cmd_kg import add_shard_options, open_shard
from porter_mesh.cli.cmd_kgsync import (
    SECONDS_OPTIONS,
    add_online_options,
    catch_up,
    find_replica,
    online_replica,
)
from porter_mesh.cli.common import add_mesh_options, refuse_negative, run
from porter_mesh.errors import PorterError

#: Widest a table cell gets before it is shortened with an ellipsis.
CELL_WIDTH = 60


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "recall", help="run a read-only SPARQL query on the knowledge graph",
        conflict_handler="resolve",
        description="Run a read-only SPARQL query. Online by default (join the mesh as "
        "porter-ui, catch its replica up from a peer, query it); with --data-dir or --agent, "
        "on that stopped node's shard. Prefixes porter, as, prov, rdf, rdfs, xsd are "
        "predefined.",
    )
    parser.add_argument("sparql", help="the query, e.g. 'SELECT ?about ?finding WHERE { ?o "
                        "porter:about ?about ; porter:finding ?finding }'")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="JSON output")
    out.add_argument("--csv", action="store_true", help="CSV output")
    parser.add_argument("--limit", type=int, default=DEFAULT_ROW_LIMIT, metavar="ROWS",
                        help="row limit (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_DEADLINE, metavar="SECONDS",
                        help="query deadline (default %(default)s)")
    add_shard_options(parser)
    add_mesh_options(parser)  # --mesh again, same meaning: the later one is kept
    add_online_options(parser, data_dir=False)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        validate_query(args.sparql, row_limit=args.limit, deadline=args.timeout)
    except PorterError as exc:  # QueryError messages carry the reason and the position
        print(f"porter-mesh recall: {exc}", file=sys.stderr)
        return 2
    refused = refuse_negative(args, *SECONDS_OPTIONS)
    if refused is not None:
        return refused
    if args.data_dir is None and not args.agent:
        return _online(args)
    try:
        with open_shard(args) as shard:
            result = shard.query(args.sparql, row_limit=args.limit, deadline=args.timeout)
    except PorterError as exc:  # past the deadline, no shard there, in use...
        print(f"porter-mesh recall: {exc}", file=sys.stderr)
        return 1
    _print(args, result)
    return 0


def _online(args: argparse.Namespace) -> int:
    async def body() -> int:
        async with online_replica(args) as knowledge:
            await find_replica(knowledge, args.wait)
            await catch_up(knowledge, args.catchup_timeout)
            result = knowledge.shard.query(args.sparql, row_limit=args.limit,
                                           deadline=args.timeout)
        _print(args, result)
        return 0

    return run(body)


def _print(args: argparse.Namespace, result: QueryResult) -> None:
    if args.json:
        print(orjson.dumps(as_json(result)).decode())
    elif args.csv:
        write_csv(result)
    else:
        print(as_table(result))


def as_json(result: QueryResult) -> dict[str, Any]:
    """The result as a JSON-ready map (ASK: ``boolean``; else ``vars`` and ``items``)."""
    if result.form is QueryForm.ASK:
        return {"boolean": result.boolean}
    return {"vars": list(result.variables), "items": result.items(),
            "truncated": result.truncated, "row_limit": result.row_limit}


def write_csv(result: QueryResult) -> None:
    """Write the result as CSV on stdout; a cut is reported on stderr."""
    writer = csv.writer(sys.stdout, lineterminator="\n")
    if result.form is QueryForm.ASK:
        writer.writerow(["boolean"])
        writer.writerow(["true" if result.boolean else "false"])
        return
    writer.writerow(result.variables)
    for row in result.rows:
        writer.writerow([term_text(t) for t in row])
    if result.truncated:
        print(f"porter-mesh recall: result cut at the row limit of {result.row_limit} rows; "
              "raise it with --limit", file=sys.stderr)


def _cell(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= CELL_WIDTH else text[:CELL_WIDTH - 1] + "\u2026"


def as_table(result: QueryResult) -> str:
    """The result as an aligned text table with a one-line summary under it."""
    if result.form is QueryForm.ASK:
        return "true" if result.boolean else "false"
    cells = [[_cell(term_text(t)) for t in row] for row in result.rows]
    widths = [max([len(v)] + [len(r[i]) for r in cells]) for i, v in enumerate(result.variables)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(result.variables, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    summary = f"{len(cells)} row{'s' if len(cells) != 1 else ''} in {result.elapsed * 1000:.1f} ms"
    if result.truncated:
        summary += f" (cut at the row limit of {result.row_limit}; raise it with --limit)"
    lines.append(summary)
    return "\n".join(lines)
