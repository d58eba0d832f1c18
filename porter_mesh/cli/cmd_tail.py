"""``porter-mesh tail``: print activities as they cross the mesh."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from porter_mesh.cli.common import add_mesh_options, ephemeral_name, node_config, run
from porter_mesh.core import constants as C
from porter_mesh.core.peers import PeerEvent, PeerEventKind
from porter_mesh.node.node import Message, Node


def register(sub: Any) -> None:
    parser = sub.add_parser("tail", help="print activities as they arrive",
                            description="Watch channels (default: log, task, review and every "
                            "direct inbox) and print each activity.")
    parser.add_argument("channels", nargs="*", metavar="CHANNEL",
                        help="channels to watch; 'task:' alone watches every direct inbox")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--count", type=int, default=0, help="stop after N activities")
    add_mesh_options(parser)
    parser.set_defaults(func=main)


def message_json(msg: Message) -> str:
    """A message as one JSON line: channel, sender, envelope fields, activity."""
    env = msg.envelope
    return orjson.dumps({
        "channel": msg.channel, "sender": msg.sender, "seq": msg.seq, "direct": msg.direct,
        "envelope": {"version": env.version, "msg_id": env.msg_id, "incarnation": env.incarnation,
                     "hlc": env.hlc, "recipient": env.recipient, "ref": env.ref,
                     "count": env.count},
        "activity": msg.activity.to_dict(),
    }).decode()


def message_line(msg: Message) -> str:
    """A message for people: channel, sender, type, summary."""
    act = msg.activity
    summary = act.summary or ""
    if not summary and isinstance(act.object, str):
        summary = act.object
    context = f" [{act.context}]" if act.context else ""
    return f"{msg.channel:<16} {msg.sender:<16} {act.type:<9}{context} {summary}"


def main(args: argparse.Namespace) -> int:
    wanted = list(args.channels) or [C.CHANNEL_LOG, C.CHANNEL_TASK, C.CHANNEL_REVIEW, "task:"]
    watch_direct = "task:" in wanted
    channels = tuple(c for c in wanted if c != "task:")
    config = node_config(args, name=ephemeral_name("porter-tail"), role="observer",
                         observer=True, channels=channels)

    async def body() -> int:
        seen = 0
        node = Node(config)

        def on_peer(event: PeerEvent) -> None:
            if event.kind is PeerEventKind.JOINED:
                print(f"watching {event.peer.name}", file=sys.stderr, flush=True)
            elif event.kind is PeerEventKind.LEFT:
                print(f"{event.peer.name} left ({event.reason})", file=sys.stderr, flush=True)

        node.add_peer_listener(on_peer)
        async with node:
            if watch_direct:
                node.observe_direct()
            while args.count <= 0 or seen < args.count:
                msg = await node.receive()
                if msg.direct and not watch_direct and msg.channel not in channels:
                    continue
                print(message_json(msg) if args.json else message_line(msg), flush=True)
                seen += 1
        return 0

    try:
        return run(body)
    except BrokenPipeError:
        sys.stderr.close()
        return 0
