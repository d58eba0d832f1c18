"""``porter-mesh request``: send as the human user and print the replies, like ``nats req``.

The seat (``porter-ui-<suffix>``, :func:`~porter_mesh.cli.common.own_seat`) stays on
the mesh after sending: it receives its direct inbox and the broadcast channels, and
prints every activity in the request's context that a node other than the human's
sends, until ``--count N`` replies when given, otherwise:

* for an ``Offer`` of a task to an agent: until the task reaches a final state
  (completed, failed, cancelled, rejected) or waits on the requester (input-required:
  the holder asked a question; in-review with the human as reviewer). Each change of
  state is said on stderr, and the last line says where the task ended. Exit 0 only
  for completed;
* for anything else, until a reply that ends the exchange: a ``Reject`` (exit 1), an
  approval (an ``Accept`` on ``review``), a result (an activity with a ``result``, or an
  ``Announce``), or, for a ``Question``, the first direct answer.

No such reply within ``--timeout`` seconds is exit 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from porter_mesh.cli.cmd_send import add_message_arguments, prepare, trace_of
from porter_mesh.cli.common import count, run, seat_config, seconds
from porter_mesh.cli.seat import HAND_OVER_SECONDS, deliver
from porter_mesh.core import constants as C
from porter_mesh.core.advert import is_human
from porter_mesh.core.as2 import Activity
from porter_mesh.core.lifecycle import Status, TaskRecord, follow
from porter_mesh.node.node import Message, Node
from porter_mesh.node.transcript import message_json, message_line
from porter_mesh.tracing.seat import seat_spans


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "request", help="send as porter-ui and print the replies in its context",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_message_arguments(parser)
    parser.add_argument("--count", type=count, default=0, metavar="N",
                        help="stop after N replies (default: at the reply that ends the "
                        "exchange)")
    parser.add_argument("--timeout", type=seconds, default=30.0, metavar="SECONDS",
                        help="seconds to wait for the replies (default %(default)s)")
    parser.add_argument("--json", action="store_true",
                        help="one JSON line per reply: the message with its whole activity")
    parser.set_defaults(func=main)


def ends_exchange(msg: Message, request: Activity) -> bool:
    """Whether ``msg`` is a reply after which nothing more is awaited."""
    act = msg.activity
    if act.type == "Reject" or act.result is not None:
        return True
    if act.type == "Accept":
        return msg.channel == C.CHANNEL_REVIEW
    if act.type == "Announce":
        return True
    return request.type == "Question" and msg.direct


def task_end(task: TaskRecord) -> str | None:
    """Where a followed task stopped, in words, or ``None`` while it goes on."""
    ctx = task.context
    if task.final:
        note = f": {task.note}" if task.note else ""
        return f"task {ctx} ended {task.status.value}{note}"
    if task.status is Status.INPUT_REQUIRED:
        return (f"task {ctx} is input-required: {task.holder} asks: {task.question}; "
                f"answer with porter-mesh send task:{task.holder} TEXT --type Note "
                f"--context {ctx}")
    if task.status is Status.IN_REVIEW and is_human(task.reviewer):
        return (f"task {ctx} is in-review, waiting for your review; approve or request "
                f"changes with porter-mesh send review TEXT --type Accept|Reject "
                f"--context {ctx}")
    return None


def main(args: argparse.Namespace) -> int:
    request = prepare(args)
    trace = trace_of(args)
    context = request.context
    if context is None:
        print("porter-mesh request: replies are matched by context: give --context ID "
              "(an Offer gets one by itself)", file=sys.stderr)
        return 2
    config = seat_config(args, channels=(C.CHANNEL_LOG, C.CHANNEL_TASK, C.CHANNEL_REVIEW))

    async def body() -> int:
        async with Node(config) as node:
            if spans is None:
                return await exchange(node)
            # The request's span: from the send to the reply that ends the exchange, then
            # handed with the send's span to whoever received the request.
            spans.begin_request(args.channel.removeprefix(C.DIRECT_PREFIX), request)
            reached: set[str] = set()
            try:
                return await exchange(node, reached)
            finally:
                spans.end_request(problems[0] if problems else None)
                if reached:
                    await spans.hand_over(node, reached, HAND_OVER_SECONDS)

    problems: list[str] = []

    async def exchange(node: Node, reached: set[str] | None = None) -> int:
        outcome = await deliver(node, args.channel, request, wait=args.wait,
                                timeout=args.timeout, trace=trace, spans=spans)
        if reached is not None:
            reached |= outcome.reached
        if outcome.problem is not None:
            problems.append(outcome.problem)
            print(f"porter-mesh request: {outcome.problem}", file=sys.stderr)
            return 1
        print(outcome.line(), file=sys.stderr, flush=True)
        deadline = time.monotonic() + args.timeout
        replies = 0
        task = follow(None, request, sender=node.name, channel=args.channel,
                      now=time.time())
        while True:
            try:
                msg = await node.receive(timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                want = f"{args.count} replies" if args.count else "a reply that ends it"
                problems.append(f"no {want} within {args.timeout:g}s")
                print(f"porter-mesh request: {replies} repl{'y' if replies == 1 else 'ies'}"
                      f" in {context} within {args.timeout:g}s, waited for {want}; "
                      "is the recipient busy? (--timeout waits longer)", file=sys.stderr)
                return 1
            if msg.activity.context != context or is_human(msg.sender):
                continue
            replies += 1
            print(message_json(msg) if args.json else message_line(msg), flush=True)
            if args.count and replies >= args.count:
                return 0
            if task is not None:
                before = task.status
                task = follow(task, msg.activity, sender=msg.sender,
                              channel=msg.channel, now=time.time())
                assert task is not None
                if task.status is not before:
                    print(f"task {context}: {task.status.value}", file=sys.stderr,
                          flush=True)
                if not args.count and (end := task_end(task)) is not None:
                    print(f"porter-mesh request: {end}", file=sys.stderr, flush=True)
                    return 0 if task.status is Status.COMPLETED else 1
                continue
            if not args.count and ends_exchange(msg, request):
                return 1 if msg.activity.type == "Reject" else 0
        return 0

    with seat_spans(config.name, trace) as spans:
        return run(body)
