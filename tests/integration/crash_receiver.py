"""An application that receives direct messages and dies on purpose at a chosen point.

Used by ``test_crash_delivery.py``. It records every message it handles by appending its
text to ``--out`` with one ``write`` (so the record survives ``kill -9``), and kills
itself with SIGKILL when it reaches the message whose text is ``--kill-at``:

* ``--kill-point before``: at the start of handling that message, before recording it;
* ``--kill-point after``: right after recording it, before the node learns it was taken.

Modes: ``handler`` (no inbox; a handler per message), ``batch`` (no inbox; a batch
handler per ZeroMQ message), ``receive`` (the inbox, read one message at a time with
``receive()`` once ``go`` arrives on stdin, so a backlog can build up first), ``sync``
(a :class:`SyncNode` with an inbox that nothing reads and the handler passed to its
constructor, as a script would write it; ``--unread-warning`` sets how soon it says
that its inbox is not read).

An application that wants each message handled once even across a crash between its
own record and the take checks ``Message.redelivered``: only such a message can have
been handled before, so only then does it look in its own record.

With ``--decline`` the handler declines every message (raises ``NotHandled``), so
everything stays owed; it reports each offer as ``declined`` (``n``: offers so far).

Prints JSON lines: ``up`` (ports, incarnation), ``handled`` (count so far, every 50).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pathlib
import signal
import sys
from collections.abc import Callable

import orjson

from porter_mesh.errors import NotHandled
from porter_mesh.node.node import Message, Node
from porter_mesh.node.sync import SyncNode


def emit(**fields: object) -> None:
    sys.stdout.write(orjson.dumps(fields).decode() + "\n")
    sys.stdout.flush()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--mesh", required=True)
    parser.add_argument("--data-dir", type=pathlib.Path, required=True)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--mode", choices=("handler", "batch", "receive", "sync"), required=True)
    parser.add_argument("--kill-at")
    parser.add_argument("--kill-point", choices=("before", "after"), default="before")
    parser.add_argument("--pub-port", type=int, default=0)
    parser.add_argument("--router-port", type=int, default=0)
    parser.add_argument("--decline", action="store_true")
    parser.add_argument("--unread-warning", type=float, default=30.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(message)s")

    out = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    seen: set[str] | None = None
    handled = declined = 0

    def handle(msg: Message) -> None:
        nonlocal seen, handled, declined
        if args.decline:
            declined += 1
            emit(ev="declined", n=declined)
            raise NotHandled("declining on purpose")
        text = msg.activity.summary
        if text == args.kill_at and args.kill_point == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        if msg.redelivered:
            if seen is None:
                seen = set(args.out.read_text().split())
            if text in seen:
                return  # handled before the crash; the take did not make it
        os.write(out, f"{text}\n".encode())
        handled += 1
        if handled % 50 == 0:
            emit(ev="handled", n=handled)
        if text == args.kill_at and args.kill_point == "after":
            os.kill(os.getpid(), signal.SIGKILL)

    if args.mode == "sync":
        await asyncio.to_thread(run_sync, args, handle)
        os.close(out)
        return
    node = Node(name=args.name, mesh=args.mesh, data_dir=args.data_dir,
                pub_port=args.pub_port, router_port=args.router_port,
                inbox_size=0 if args.mode != "receive" else 100_000,
                heartbeat_interval=0.2, evasive_after=0.8, expire_after=2.0)
    if args.mode == "handler":
        node.add_handler(handle)
    elif args.mode == "batch":
        node.add_batch_handler(lambda msgs: [handle(m) for m in msgs])
    await node.astart()
    emit(ev="up", name=node.name, pub=node.pub_port, router=node.router_port,
         inc=node.incarnation)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    reading: asyncio.Task[None] | None = None

    async def read_inbox() -> None:
        while True:
            handle(await node.receive())

    while True:
        line = await reader.readline()
        if not line:
            break
        op = orjson.loads(line)["op"]
        if op == "quit":
            break
        if op == "go" and args.mode == "receive" and reading is None:
            reading = asyncio.ensure_future(read_inbox())
    if reading is not None:
        reading.cancel()
    await node.aclose()
    os.close(out)
    emit(ev="closed")


def run_sync(args: argparse.Namespace, handle: Callable[[Message], None]) -> None:
    """The ``sync`` mode: a SyncNode built with its handler, until ``quit``."""
    with SyncNode(name=args.name, mesh=args.mesh, data_dir=args.data_dir,
                  pub_port=args.pub_port, router_port=args.router_port, handlers=[handle],
                  heartbeat_interval=0.2, evasive_after=0.8, expire_after=2.0,
                  unread_warning=args.unread_warning) as node:
        emit(ev="up", name=node.name, pub=node.node.pub_port, router=node.node.router_port,
             inc=node.node.incarnation)
        for line in sys.stdin:
            cmd = orjson.loads(line)
            if cmd["op"] == "quit":
                break
            if cmd["op"] == "stats":
                emit(ev="stats", stats=node.stats(), tag=cmd.get("tag"))
    emit(ev="closed")


if __name__ == "__main__":
    asyncio.run(main())
