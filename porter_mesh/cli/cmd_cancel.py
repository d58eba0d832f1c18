"""``porter-mesh cancel CONTEXT``: cancel a task and its sub-tasks, as the human user.

The seat asks every agent for its tasks (as ``porter-mesh tasks`` does), sends a cancel
(a ``Delete`` of the task tagged ``cancel``) to the task's holder, and waits until every
holder in the task's tree confirmed on ``log`` that it stopped (an ``Announce`` tagged
``cancelled``). Each holder cancels the sub-tasks it offered in turn. It prints the tree
of what stopped, naming each holder that did not confirm within ``--timeout`` (and
whether it is gone from the mesh: its cancel stays owed until it comes back), and exits
0 only when every holder confirmed; 1 when one did not, when the cancel was refused, or
when no agent knows the task.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from porter_mesh.cli.cmd_tasks import gather_tasks, tree_lines
from porter_mesh.cli.common import add_mesh_options, run, seat_config, seconds, task_context
from porter_mesh.core import constants as C
from porter_mesh.core.advert import is_human
from porter_mesh.core.lifecycle import CANCELLED_TAG, FINAL_STATUSES, Status, parent_of
from porter_mesh.core.tasks import cancel_activity
from porter_mesh.errors import DeliveryError
from porter_mesh.node.node import Node

_FINAL = frozenset(s.value for s in FINAL_STATUSES)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "cancel", help="cancel a task and its sub-tasks; print the tree of what stopped",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("context", type=task_context, metavar="CONTEXT",
                        help="the task: urn:porter:task:<id> or the bare id")
    parser.add_argument("--reason", default="cancelled by the user", metavar="TEXT",
                        help="why, shown to every holder (default: %(default)r)")
    parser.add_argument("--timeout", type=seconds, default=15.0, metavar="SECONDS",
                        help="how long every holder has to confirm (default %(default)s)")
    parser.add_argument("--wait", type=seconds, default=2.0, metavar="SECONDS",
                        help="how long to look for agents (default %(default)s)")
    add_mesh_options(parser)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    context: str = args.context
    config = seat_config(args, channels=(C.CHANNEL_LOG,))

    async def body() -> int:
        async with Node(config) as node:
            tasks, problems = await gather_tasks(node, wait=args.wait, timeout=5.0)
            for problem in problems:
                print(f"porter-mesh cancel: {problem}", file=sys.stderr)
            top = tasks.get(context)
            if top is None:
                print(f"porter-mesh cancel: no agent on mesh {node.config.mesh!r} reports "
                      f"task {context}; `porter-mesh tasks --all` lists the tasks they "
                      "know", file=sys.stderr)
                return 1
            if top.get("state") in _FINAL and top.get("state") != Status.CANCELLED.value:
                print(f"porter-mesh cancel: task {context} is already {top['state']}; "
                      "nothing to cancel", file=sys.stderr)
                return 1
            holder = top.get("holder")
            requester = top.get("requester")
            # A task no one holds yet is cancelled at its requester (a board's queue).
            target = holder or (requester if not is_human(requester) else None)
            tree = _subtree(tasks, context)
            started = time.monotonic()
            if target is not None:
                cancel = cancel_activity(node.name, context, args.reason, cancel=True)
                try:
                    await node.send(target, cancel, timeout=min(args.timeout, 10.0))
                except DeliveryError as exc:
                    print(f"porter-mesh cancel: could not reach {target}: {exc}",
                          file=sys.stderr)
            refused = await _await_confirmations(node, tree, started, args.timeout)
        now_present = {p.name for p in node.peers()}
        lines = tree_lines(tree, [context], lambda r: _line(r, now_present, args.timeout))
        print("\n".join(lines))
        for why in refused:
            print(f"porter-mesh cancel: refused: {why}", file=sys.stderr)
        confirmed = all(r.get("confirmed") is not None or r.get("holder") is None
                        or r.get("state") in _FINAL - {Status.CANCELLED.value}
                        for r in tree.values())
        return 0 if confirmed and not refused else 1

    return run(body)


def _subtree(tasks: dict[str, dict[str, Any]], root: str) -> dict[str, dict[str, Any]]:
    """``root`` and its open descendants, each a copy to annotate."""
    tree = {root: dict(tasks[root])}
    grew = True
    while grew:
        grew = False
        for ctx, record in tasks.items():
            if (ctx not in tree and record.get("parent") in tree
                    and record.get("state") not in _FINAL):
                tree[ctx] = dict(record)
                grew = True
    return tree


async def _await_confirmations(node: Node, tree: dict[str, dict[str, Any]], started: float,
                               timeout: float) -> list[str]:
    """Collect the holders' confirmations (and refusals) until every open task of the
    tree is confirmed or ``timeout`` passes; sub-tasks named by a confirmation join the
    tree."""
    deadline = started + timeout
    refused: list[str] = []

    def waiting() -> bool:
        return any(r.get("confirmed") is None and r.get("holder") is not None
                   and r.get("state") not in _FINAL - {Status.CANCELLED.value}
                   for r in tree.values())

    while waiting() and not refused:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            msg = await node.receive(timeout=left)
        except TimeoutError:
            break
        act = msg.activity
        ctx = act.context
        if ctx is None:
            continue
        if act.type == "Reject" and ctx in tree and msg.direct:
            refused.append(f"{msg.sender}: {act.summary}")
            continue
        if act.type != "Announce" or CANCELLED_TAG not in (act.tag or ()):
            continue
        if ctx not in tree and parent_of(act) in tree:
            tree[ctx] = {"context": ctx, "title": "", "holder": msg.sender,
                         "parent": parent_of(act), "state": Status.CANCELLED.value}
        record = tree.get(ctx)
        if record is None or msg.sender != record.get("holder"):
            continue
        record["confirmed"] = time.monotonic() - started
        record["state"] = Status.CANCELLED.value
        record["stop"] = act.summary
    return refused


def _line(record: dict[str, Any], present: set[str], timeout: float) -> str:
    holder = record.get("holder")
    head = f"{record['context']} {str(record.get('title', ''))[:40]!r}"
    if holder is None:
        return f"{head}: held by nobody, nothing to stop"
    if record.get("confirmed") is not None:
        return f"{head}: {holder} stopped, confirmed after {record['confirmed'] * 1000:.0f} ms"
    if record.get("state") in _FINAL - {Status.CANCELLED.value}:
        return f"{head}: already {record['state']} ({holder})"
    gone = "" if holder in present else (
        f"; {holder} is not on the mesh: its cancel stays owed until it comes back")
    return f"{head}: {holder} did NOT confirm within {timeout:g}s{gone}"
