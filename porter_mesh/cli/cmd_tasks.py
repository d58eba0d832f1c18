"""``porter-mesh tasks``: the tasks on the mesh, asked over the mesh as ``stats`` is.

Every agent answers for the tasks it holds or offered (the ``tasks`` section of its
view, kept by its tools' ledger). A task known to several agents is shown as its holder
tells it (the requester's record otherwise). Open tasks only, unless ``--all``.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import orjson

from porter_mesh.cli.cmd_stats import add_asking_options, find_agents, observer_config
from porter_mesh.cli.common import refuse_negative, run
from porter_mesh.core.lifecycle import FINAL_STATUSES
from porter_mesh.node.node import Node
from porter_mesh.node.views import ViewClient

__all__ = ["gather_tasks", "register", "tree_lines"]

DEFAULT_WAIT = 2.0
_FINAL = frozenset(s.value for s in FINAL_STATUSES)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "tasks", help="list the tasks on the mesh (asked of every agent)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="one JSON object per task")
    parser.add_argument("--all", action="store_true",
                        help="finished tasks too (completed, failed, cancelled, rejected)")
    add_asking_options(parser, wait=DEFAULT_WAIT)
    parser.set_defaults(func=main)


async def gather_tasks(node: Node, *, wait: float, timeout: float
                       ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Ask every agent found within ``wait`` for its tasks.

    Args:
        node: the asking node (an observer or a seat).
        wait: seconds to look for agents.
        timeout: seconds each agent may take to answer.

    Returns:
        ``(tasks by context, problems)``: each task as the agent that holds it tells it
        (else the most recently updated record), with ``"told_by"`` added; problems name
        the agents that did not answer.

    Raises:
        PorterError: no agent found.
    """
    client = ViewClient(node)
    names = await find_agents(node, None, wait)
    answers = await client.ask_all(names, timeout)
    merged: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for name, view in answers.items():
        if isinstance(view, BaseException):
            why = (f"no answer within {timeout:g}s" if isinstance(view, TimeoutError)
                   else str(view))
            problems.append(f"{name}: {why}")
            continue
        section = view.get("tasks")
        records = section.get("tasks") if isinstance(section, dict) else None
        for record in records or ():
            if not isinstance(record, dict) or not isinstance(record.get("context"), str):
                continue
            record = {**record, "told_by": name}
            old = merged.get(record["context"])
            if old is None or _better(record, old):
                merged[record["context"]] = record
    return merged, problems


def _better(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """The holder knows its task best; otherwise the latest word counts."""
    new_holds: bool = new.get("holder") == new["told_by"]
    old_holds: bool = old.get("holder") == old["told_by"]
    if new_holds != old_holds:
        return new_holds
    return float(new.get("updated") or 0) > float(old.get("updated") or 0)


def tree_lines(tasks: dict[str, dict[str, Any]], roots: list[str],
               label: Any) -> list[str]:
    """Lines drawing ``roots`` and their sub-tasks (by ``parent``) as a tree.

    Args:
        tasks: records by context.
        roots: the contexts to start from.
        label: ``label(record) -> str``, the text of one line.
    """
    children: dict[str, list[str]] = {}
    for ctx, record in tasks.items():
        parent = record.get("parent")
        if isinstance(parent, str) and parent in tasks:
            children.setdefault(parent, []).append(ctx)
    lines: list[str] = []

    def walk(ctx: str, prefix: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└─ " if last else "├─ ")
        lines.append(prefix + branch + label(tasks[ctx]))
        kids = sorted(children.get(ctx, ()), key=lambda c: float(tasks[c].get("created") or 0))
        inner = prefix + ("" if top else ("   " if last else "│  "))
        for i, kid in enumerate(kids):
            walk(kid, inner, i == len(kids) - 1, False)

    for root in roots:
        walk(root, "", True, True)
    return lines


def _label(now: float) -> Any:
    def label(r: dict[str, Any]) -> str:
        age = max(0.0, now - float(r.get("created") or now))
        attempt = f" attempt {r['attempt']}" if r.get("attempt") else ""
        wait = f" -- asks: {r['question']}" if r.get("question") else ""
        return (f"{r['context']}  {r.get('state', '?'):17} {str(r.get('title', ''))[:40]!r} "
                f"requester {r.get('requester')} holder {r.get('holder') or '-'}{attempt} "
                f"age {age:.0f}s{wait}")
    return label


def main(args: argparse.Namespace) -> int:
    refused = refuse_negative(args, "wait", "timeout")
    if refused is not None:
        return refused

    async def body() -> int:
        async with Node(observer_config(args, "porter-tasks")) as node:
            tasks, problems = await gather_tasks(node, wait=args.wait, timeout=args.timeout)
        for problem in problems:
            print(f"porter-mesh tasks: {problem}", file=sys.stderr)
        shown = {c: r for c, r in tasks.items() if args.all or r.get("state") not in _FINAL}
        if args.json:
            for record in sorted(shown.values(), key=lambda r: float(r.get("created") or 0)):
                print(orjson.dumps(record).decode())
        elif not shown:
            print("no open tasks" if not args.all else "no tasks", file=sys.stderr)
        else:
            roots = sorted((c for c, r in shown.items() if r.get("parent") not in shown),
                           key=lambda c: float(shown[c].get("created") or 0))
            print("\n".join(tree_lines(shown, roots, _label(time.time()))))
        return 1 if problems else 0

    return run(body)
