"""``porter-mesh trace CONTEXT|TRACE_ID``: a task's trace as a waterfall, no collector.

Every agent keeps its recent spans in a bounded ring. The command joins as an observer
(as ``stats`` does), asks every agent found within ``--wait`` for the spans of the trace
(a 32-hex trace id) or of the traces of a task (``urn:porter:task:<id>`` or the bare
id), and prints them as a tree: agent, span, start offset, duration, status, and a bar;
``*`` marks the slowest path. When spans are missing (an agent restarted or did not
answer, a ring overflowed) it says so instead of drawing a wrong tree, and exits 1.
``--json`` prints the span records, one JSON object per line.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

import orjson

from porter_mesh.cli.cmd_stats import add_asking_options, find_agents, observer_config
from porter_mesh.cli.common import refuse_negative, run
from porter_mesh.core.constants import TASK_URN_PREFIX
from porter_mesh.node.node import Node
from porter_mesh.tracing.views import SpanClient, gather_trace
from porter_mesh.tracing.waterfall import render_waterfall

_TRACE_ID = re.compile(r"[0-9a-fA-F]{32}")


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "trace", help="show a task's trace as a waterfall, gathered from the agents",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", metavar="CONTEXT|TRACE_ID",
                        help="a task (urn:porter:task:<id> or the id) or a 32-hex trace id")
    parser.add_argument("--json", action="store_true", help="one JSON span record per line")
    add_asking_options(parser)
    parser.set_defaults(func=main)


def _query(what: str) -> tuple[tuple[str, ...], str | None]:
    """(trace ids, task context) to ask for."""
    value = what.strip()
    if _TRACE_ID.fullmatch(value):
        return (value.lower(),), None
    if not value.startswith(TASK_URN_PREFIX):
        value = TASK_URN_PREFIX + value
    return (), value


def main(args: argparse.Namespace) -> int:
    refused = refuse_negative(args, "wait", "timeout")
    if refused is not None:
        return refused
    trace_ids, context = _query(args.what)
    config = observer_config(args, "porter-trace")

    async def body() -> int:
        async with Node(config) as node:
            names = await find_agents(node, None, args.wait)
            waterfall = await gather_trace(SpanClient(node), names, args.timeout,
                                           trace_ids=trace_ids, context=context)
        if args.json:
            for row in waterfall.rows:
                print(orjson.dumps(row.record).decode())
        else:
            print(render_waterfall(waterfall))
        if not waterfall.rows:
            print(f"porter-mesh trace: no spans of {args.what} on the {len(names)} agent(s) "
                  "found; check the id, or whether tracing is on (pip install "
                  "'porter-mesh[otel]')", file=sys.stderr)
            return 1
        return 0 if waterfall.complete else 1

    return run(body)
