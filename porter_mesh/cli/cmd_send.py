"""``porter-mesh send``: send activities as the human user (a seat ``porter-ui-<suffix>``).

See :mod:`porter_mesh.cli.seat` for how the recipients are waited for.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from porter_mesh.cli.cmd_validate import read_input, unwrap_message
from porter_mesh.cli.common import (
    add_any_channel_option,
    add_mesh_options,
    channel_name,
    check_profile_channel,
    count,
    own_seat,
    run,
    seat_config,
    seconds,
    task_context,
)
from porter_mesh.cli.seat import deliver
from porter_mesh.core import constants as C
from porter_mesh.core.advert import is_human
from porter_mesh.core.as2 import Activity
from porter_mesh.core.taskid import new_task_id
from porter_mesh.core.tracecontext import TraceContext, valid_tracestate
from porter_mesh.entrypoint import traceparent_arg
from porter_mesh.errors import ActivityError, ConfigError
from porter_mesh.node.node import Node
from porter_mesh.tracing.seat import seat_spans

#: The activity type a channel gets when ``--type`` is not given (the profile's mapping).
DEFAULT_TYPES = {C.CHANNEL_TASK: "Offer", C.CHANNEL_LOG: "Announce", C.CHANNEL_REVIEW: "Offer"}


def add_message_arguments(parser: argparse.ArgumentParser) -> None:
    """CHANNEL, TEXT, ``--type``, ``--context``, ``--wait``, ``--timeout`` (send and request)."""
    parser.add_argument("channel", metavar="CHANNEL", type=channel_name,
                        help="log, task, review, or task:<agent> for one agent")
    parser.add_argument("text", metavar="TEXT", nargs="?",
                        help="the message; its first line is the summary")
    parser.add_argument("--type", dest="type", help="AS2 activity type (default by channel: "
                        "Offer for task and task:<agent>, Announce for log)")
    parser.add_argument("--context", type=task_context, metavar="ID",
                        help="task id, e.g. urn:porter:task:a3f9 (an Offer without one "
                        "gets a new one, printed)")
    parser.add_argument("--wait", type=seconds, default=5.0, metavar="SECONDS",
                        help="how long to look for the recipients (default %(default)s)")
    parser.add_argument("--traceparent", type=traceparent_arg, metavar="TRACEPARENT",
                        help="W3C trace context to continue (00-<trace id>-<span id>-<flags>):"
                        " the task's spans on the mesh join that trace")
    parser.add_argument("--tracestate", type=tracestate, metavar="TRACESTATE",
                        help="W3C tracestate to carry with --traceparent")
    add_any_channel_option(parser)
    add_mesh_options(parser)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "send", help="send a message as the human user (porter-ui)",
        description="Send TEXT on CHANNEL as porter-ui. 'task:<agent>' is delivered "
        "directly and acknowledged; other channels are broadcast once every node found "
        "(agents and watchers such as 'tail') has subscribed. Exits 1 naming whoever "
        "could not be reached.")
    add_message_arguments(parser)
    parser.add_argument("--json", dest="json_in", metavar="FILE|-",
                        help="send the whole AS2 activity in FILE (- reads standard input) "
                        "instead of TEXT; its actor must be porter-ui or absent")
    parser.add_argument("--count", type=count, default=1, metavar="N",
                        help="send it N times (default %(default)s)")
    parser.add_argument("--timeout", type=seconds, default=10.0, metavar="SECONDS",
                        help="seconds to wait for a direct message's acknowledgement "
                        "(default %(default)s)")
    parser.add_argument("--output", choices=("text", "json"), default="text",
                        help="report format: a line on stderr, or one JSON object per "
                        "message on stdout")
    parser.set_defaults(func=main)


def tracestate(text: str) -> str:
    """``--tracestate``: printable ASCII, at most 512 characters."""
    if not valid_tracestate(text):
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a W3C tracestate: 1-512 printable ASCII characters")
    return text


def trace_of(args: argparse.Namespace) -> TraceContext | None:
    """The trace context ``--traceparent``/``--tracestate`` hand in, if any.

    Raises:
        ConfigError: ``--tracestate`` without ``--traceparent``.
    """
    if args.traceparent is None:
        if args.tracestate is not None:
            raise ConfigError("--tracestate travels only with --traceparent; give both")
        return None
    return TraceContext(args.traceparent, args.tracestate)


def build_activity(channel: str, text: str, kind: str | None, context: str | None) -> Activity:
    """The activity ``porter-mesh send`` puts on the wire."""
    if kind is None:
        direct = channel.startswith(C.DIRECT_PREFIX)
        kind = "Offer" if direct else DEFAULT_TYPES.get(channel, "Note")
    summary = text.splitlines()[0][:200] if text.strip() else text
    data: dict[str, Any] = {"type": kind, "actor": own_seat(), "summary": summary}
    if summary != text:
        data["object"] = {"type": "Note", "content": text}
    if context:
        data["context"] = context
    if channel.startswith(C.DIRECT_PREFIX):
        data["target"] = channel[len(C.DIRECT_PREFIX):]
    return Activity.from_dict(data)


def read_activity(source: str, context: str | None) -> Activity:
    """The activity in ``source`` (a path, or ``-`` for standard input), sent by this
    command's seat (an actor ``porter-ui`` stands for it).

    Raises:
        ConfigError: it cannot be read, is not one valid activity, or speaks for another
            actor.
    """
    where = "standard input" if source == "-" else source
    try:
        raw = read_input(source)
    except OSError as exc:
        raise ConfigError(f"cannot read {where}: {exc.strerror or exc}; give a file with "
                          "one AS2 activity, or - and pipe it in") from None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{where} is not JSON ({exc}); give one AS2 activity as a JSON "
                          "object ('porter-mesh examples --json' shows some)") from None
    data = unwrap_message(data)  # a line of 'tail --json' or the message log
    if not isinstance(data, dict):
        raise ConfigError(f"{where} holds a JSON {type(data).__name__}, not one activity "
                          "object")
    actor = data.setdefault("actor", C.HUMAN_AGENT)
    if not isinstance(actor, str) or not is_human(actor):
        raise ConfigError(f"the activity's actor is {actor!r}; send speaks as "
                          f"{C.HUMAN_AGENT}, so leave actor out or set it to {C.HUMAN_AGENT}")
    # Any of the human's names stands for the node that sends it: this command's seat.
    data["actor"] = own_seat()
    if context and "context" not in data:
        data["context"] = context
    try:
        return Activity.from_dict(data)
    except ActivityError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def prepare(args: argparse.Namespace) -> Activity:
    """The activity ``send``/``request`` sends; an Offer without a context gets one.

    Raises:
        ConfigError: TEXT and ``--json`` are both given or both missing, the activity
            is invalid, or the channel is not the profile's and ``--any-channel`` was not
            given.
    """
    if not args.any_channel:
        check_profile_channel(args.channel)
    source = getattr(args, "json_in", None)
    if (args.text is None) == (source is None):
        raise ConfigError("give TEXT or --json FILE|- (one of them)")
    if source is not None:
        activity = read_activity(source, args.context)
    else:
        try:
            activity = build_activity(args.channel, args.text, args.type, args.context)
        except ActivityError as exc:
            raise ConfigError(str(exc)) from None
    if activity.type == "Offer" and activity.context is None:
        data = activity.to_dict()
        data["context"] = new_task_id()
        activity = Activity.from_dict(data)
        print(f"context {activity.context}", file=sys.stderr, flush=True)
    return activity


def main(args: argparse.Namespace) -> int:
    activity = prepare(args)
    trace = trace_of(args)
    config = seat_config(args)

    async def body() -> int:
        status = 0
        async with Node(config) as node:
            for _ in range(args.count):
                outcome = await deliver(node, args.channel, activity, wait=args.wait,
                                        timeout=args.timeout, trace=trace, spans=spans)
                if args.output == "json":
                    print(orjson.dumps(outcome.as_dict(activity)).decode(), flush=True)
                else:
                    prefix = "" if outcome.ok else "porter-mesh send: "
                    print(prefix + outcome.line(), file=sys.stderr, flush=True)
                if not outcome.ok:
                    status = 1
                    if outcome.problem is not None:
                        break
        return status

    with seat_spans(config.name, trace) as spans:
        return run(body)
