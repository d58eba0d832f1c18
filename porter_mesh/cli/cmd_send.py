"""``porter-mesh send``: send one activity as the human user (``porter-ui``)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from porter_mesh.cli.common import add_mesh_options, node_config, run
from porter_mesh.core import constants as C
from porter_mesh.core.as2 import Activity
from porter_mesh.errors import DeliveryError, PorterError
from porter_mesh.node.node import Node

#: The activity type a channel gets when ``--type`` is not given (the profile's mapping).
DEFAULT_TYPES = {C.CHANNEL_TASK: "Offer", C.CHANNEL_LOG: "Announce", C.CHANNEL_REVIEW: "Offer"}


def register(sub: Any) -> None:
    parser = sub.add_parser("send", help="send a message as the human user (porter-ui)",
                            description="Send TEXT on CHANNEL as porter-ui. 'task:<agent>' is "
                            "delivered directly and acknowledged; other channels are broadcast.")
    parser.add_argument("channel", metavar="CHANNEL")
    parser.add_argument("text", metavar="TEXT")
    parser.add_argument("--type", dest="type", help="AS2 activity type (default by channel: "
                        "Offer for task and task:<agent>, Announce for log)")
    parser.add_argument("--context", help="task id, e.g. urn:porter:task:a3f9")
    parser.add_argument("--wait", type=float, default=5.0, metavar="SECONDS",
                        help="how long to look for the recipient (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds to wait for the acknowledgement (default %(default)s)")
    add_mesh_options(parser)
    parser.set_defaults(func=main)


def build_activity(channel: str, text: str, kind: str | None, context: str | None) -> Activity:
    """The activity ``porter-mesh send`` puts on the wire."""
    if kind is None:
        direct = channel.startswith(C.DIRECT_PREFIX)
        kind = "Offer" if direct else DEFAULT_TYPES.get(channel, "Note")
    summary = text.splitlines()[0][:200] if text.strip() else text
    data: dict[str, Any] = {"type": kind, "actor": C.HUMAN_AGENT, "summary": summary}
    if summary != text:
        data["object"] = {"type": "Note", "content": text}
    if context:
        data["context"] = context
    if channel.startswith(C.DIRECT_PREFIX):
        data["target"] = channel[len(C.DIRECT_PREFIX):]
    return Activity.from_dict(data)


def main(args: argparse.Namespace) -> int:
    channel: str = args.channel
    if channel == C.CHANNEL_CONTROL:
        print("porter-mesh: control carries the mesh's own messages; use 'porter-mesh control "
              "drain|halt --to AGENT'", file=sys.stderr)
        return 2
    try:
        activity = build_activity(channel, args.text, args.type, args.context)
    except PorterError as exc:
        print(f"porter-mesh: {exc}", file=sys.stderr)
        return 2
    config = node_config(args, name=C.HUMAN_AGENT, role="human", advertise=False,
                         channels=())

    async def body() -> int:
        async with Node(config) as node:
            if channel.startswith(C.DIRECT_PREFIX):
                recipient = channel[len(C.DIRECT_PREFIX):]
                try:
                    await node.wait_for_peers([recipient], args.wait)
                except TimeoutError:
                    known = ", ".join(p.name for p in node.peers()) or "none"
                    print(f"porter-mesh: no agent {recipient!r} found on mesh {args.mesh!r} "
                          f"within {args.wait}s (seen: {known}); check the name and mesh",
                          file=sys.stderr)
                    return 1
                try:
                    await node.send(recipient, activity, timeout=args.timeout)
                except DeliveryError as exc:
                    print(f"porter-mesh: {exc}", file=sys.stderr)
                    return 1
                print(f"delivered to {recipient}", file=sys.stderr)
                return 0
            # Broadcast: wait until the peers we found are subscribed to us, so the
            # message is not published into the void.
            try:
                await node.wait_for_peers(1, args.wait)
            except TimeoutError:
                print(f"porter-mesh: nobody on mesh {args.mesh!r} within {args.wait}s; "
                      "nothing sent", file=sys.stderr)
                return 1
            want = len(node.peers())
            try:
                await node.wait_for_subscribers(C.CHANNEL_CONTROL, want, args.wait)
            except TimeoutError as exc:
                print(f"porter-mesh: warning: {exc}", file=sys.stderr)
            await node.publish(channel, activity)
            print(f"published on {channel} to {node.subscriber_count(channel)} subscriber(s)",
                  file=sys.stderr)
            return 0

    return run(body)
