"""``porter-mesh tail``: print activities as they cross the mesh."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import orjson

from porter_mesh.cli.common import (
    add_any_channel_option,
    add_mesh_options,
    agent_name,
    check_profile_channel,
    count,
    node_config,
    peer_event_line,
    run,
)
from porter_mesh.core import constants as C
from porter_mesh.core.hlc import hlc_physical_ms
from porter_mesh.core.peers import PeerEvent, PeerEventKind
from porter_mesh.node.config import ENV_KEY
from porter_mesh.node.node import Message, Node


def register(sub: Any) -> None:
    parser = sub.add_parser("tail", help="print activities as they arrive",
                            description="Watch channels (default: log, task, review and every "
                            "direct inbox) and print each activity.")
    parser.add_argument("channels", nargs="*", metavar="CHANNEL",
                        help="channels to watch; 'task:' alone watches every direct inbox")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--count", type=count, default=0, help="stop after N activities")
    parser.add_argument("--name", type=agent_name,
                        help="this watcher's name on the mesh (default porter-tail-<pid>; "
                        "on a secured mesh, the name its key is bound to)")
    add_any_channel_option(parser)
    add_mesh_options(parser)
    parser.set_defaults(func=main)


def sent_at(msg: Message) -> float:
    """When the sender sent ``msg``, in Unix seconds (the physical part of its HLC)."""
    return hlc_physical_ms(msg.envelope.hlc) / 1000


def message_json(msg: Message) -> str:
    """A message as one JSON line: time, channel, sender, envelope fields, activity."""
    env = msg.envelope
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sent_at(msg)))
    return orjson.dumps({
        "time": f"{stamp}.{hlc_physical_ms(env.hlc) % 1000:03d}Z",
        "channel": msg.channel, "sender": msg.sender, "seq": msg.seq, "direct": msg.direct,
        "envelope": {"version": env.version, "msg_id": env.msg_id, "incarnation": env.incarnation,
                     "hlc": env.hlc, "recipient": env.recipient, "ref": env.ref,
                     "count": env.count},
        "activity": msg.activity.to_dict(),
    }).decode()


def message_line(msg: Message) -> str:
    """A message for people: local time, channel, sender, type, [context] summary."""
    act = msg.activity
    summary = act.summary or ""
    if not summary and isinstance(act.object, str):
        summary = act.object
    context = f" [{act.context}]" if act.context else ""
    ms = hlc_physical_ms(msg.envelope.hlc) % 1000
    clock = time.strftime("%H:%M:%S", time.localtime(sent_at(msg)))
    return (f"{clock}.{ms:03d} {msg.channel:<16} {msg.sender:<16} {act.type:<9}{context} "
            f"{summary}")


def main(args: argparse.Namespace) -> int:
    wanted = list(args.channels) or [C.CHANNEL_LOG, C.CHANNEL_TASK, C.CHANNEL_REVIEW, "task:"]
    if not args.any_channel:
        for channel in wanted:  # a misspelt channel would be watched in silence forever
            check_profile_channel(channel, allowed=(C.CHANNEL_CONTROL,))
    watch_direct = "task:" in wanted
    channels = tuple(c for c in wanted if c != "task:")
    # A watcher announces itself, so that 'send' knows it and waits for it to subscribe
    # before it broadcasts. A secured node must speak under the name its key is bound
    # to; without --name it only observes, as before (unannounced; it may then miss a
    # broadcast sent while it connects).
    secured_anonymous = args.name is None and bool(os.environ.get(ENV_KEY))
    config = node_config(args, name=args.name or f"porter-tail-{os.getpid()}",
                         role=C.ROLE_WATCHER, observer=secured_anonymous,
                         channels=channels)

    async def body() -> int:
        seen = 0
        node = Node(config)

        def on_peer(event: PeerEvent) -> None:
            if peer_event_line(event, verbose=args.verbose > 0) is None:
                return
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
