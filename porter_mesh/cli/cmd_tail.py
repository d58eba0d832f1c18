"""``porter-mesh tail``: print activities as they cross the mesh."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

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
from porter_mesh.core.peers import PeerEvent, PeerEventKind
from porter_mesh.node.config import ENV_KEY
from porter_mesh.node.node import Node
from porter_mesh.node.transcript import message_json, message_line


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
