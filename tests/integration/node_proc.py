"""A mesh node in its own process, driven by JSON lines on stdin, reporting on stdout.

Used by the integration tests. Every line printed is one JSON object with an ``ev`` key:
``up`` (ports, incarnation, ``wall``: this process's ``time.time()``, to check a faked
clock; ``loop``: ``uvloop`` or ``asyncio``), ``peer`` (roster change), ``msg`` (a
delivered activity), ``sent`` (a direct send was acknowledged), ``send-failed``,
``stats``, ``roster`` (name, state and clock skew of every peer), and with
``--knowledge DIR`` (a knowledge replica in DIR): ``stored`` (a remember command done),
``rows`` (a recall's answer), ``kg`` (digest, version vector). ``--stats unsupported``
answers a view request (``stats``) as an older porter-mesh does, ``--stats mute`` not at
all; either reports each request as ``stats-asked`` (with ``t``, ``time.monotonic()``).

Commands (one JSON object per stdin line, ``op`` key): ``publish`` (channel, text, n),
``burst`` (channel, text, n, chunk: published ``chunk`` at a time, one loop turn each;
reports ``burst-start`` and ``burst-done`` with the process's peak RSS so far, ``maxrss``,
in bytes), ``send`` (to, n, start, size: numbered direct messages, pipelined, each with
``size`` bytes of content), ``stats``,
``subscribe``, ``roster``, ``remember`` (n, prefix), ``recall`` (sparql), ``kg``,
``send-kind`` (to, kind, payload in hex: one message of the mesh's own, e.g. a malformed
one; answers ``sent-kind``), ``quit``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import pathlib
import sys
import time
from typing import Any

import orjson

from porter_mesh import eventloop
from porter_mesh.adapters.shard import Shard
from porter_mesh.core import speedups
from porter_mesh.core.as2 import Activity
from porter_mesh.core.control import KIND_STATS, KIND_UNSUPPORTED
from porter_mesh.core.envelope import Envelope, encode_control
from porter_mesh.core.peers import PeerEvent
from porter_mesh.errors import PorterError
from porter_mesh.node.knowledge import Knowledge
from porter_mesh.node.node import Message, Node, Reply


def emit(**fields: Any) -> None:
    sys.stdout.write(orjson.dumps(fields).decode() + "\n")
    sys.stdout.flush()


def peak_rss() -> int:
    """This process's peak resident set in bytes (VmHWM). Not ``ru_maxrss``: that one is
    kept across exec, so a child of a large test runner would report the runner's peak."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def activity(actor: str, text: str, size: int = 0) -> Activity:
    """An Announce whose summary is ``text``, with ``size`` bytes of content if asked."""
    fields = {"type": "Announce", "actor": actor, "summary": text}
    if size:
        fields["content"] = "x" * size
    return Activity.from_dict(fields)


def knowledge_command(knowledge: Knowledge, name: str, cmd: dict[str, Any]) -> dict[str, Any]:
    op = cmd["op"]
    if op == "remember":
        for i in range(cmd.get("n", 1)):
            knowledge.async_remember(Activity.from_dict({
                "type": "Remember", "actor": name, "summary": "finding",
                "object": {"type": "Note", "about": "urn:porter:file:x",
                           "content": f"{cmd['prefix']}{i}"}}))
        return {"ev": "stored", "n": cmd.get("n", 1)}
    if op == "recall":
        result = knowledge.query(cmd["sparql"], row_limit=1000)
        return {"ev": "rows", "items": [dict(row) for row in result.rows]}
    state = knowledge.shard.state
    return {"ev": "kg", "digest": state.digest().top.hex(), "vv": state.version_vector(),
            "records": state.record_count}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--mesh", default="test")
    parser.add_argument("--interface", default="127.0.0.1")
    parser.add_argument("--router-port", type=int, default=0)
    parser.add_argument("--pub-port", type=int, default=0)
    parser.add_argument("--seed", action="append", default=[])
    parser.add_argument("--no-discovery", action="store_true")
    parser.add_argument("--data-dir", type=pathlib.Path)
    parser.add_argument("--insecure", action="store_true",
                        help="bind beyond loopback without keys (test hosts only)")
    parser.add_argument("--heartbeat", type=float, default=0.2)
    parser.add_argument("--evasive-after", type=float, default=0.8)
    parser.add_argument("--expire-after", type=float, default=2.0)
    parser.add_argument("--subscriber-queue-bytes", type=int)
    parser.add_argument("--broadcast-message-bytes", type=int)
    parser.add_argument("--recontact-max", type=float, default=5.0)
    parser.add_argument("--max-clock-skew", type=float, default=86_400.0)
    parser.add_argument("--quiet-messages", action="store_true",
                        help="report only a count of delivered messages")
    parser.add_argument("--knowledge", type=pathlib.Path, metavar="DIR",
                        help="keep a knowledge replica in DIR")
    parser.add_argument("--stats", choices=("answer", "unsupported", "mute"), default="answer",
                        help="how view requests (stats) are answered")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(relativeCreated)d %(name)s %(message)s")
    logging.getLogger("zeroconf").setLevel(logging.WARNING)
    sizes = {k: v for k, v in (("subscriber_queue_bytes", args.subscriber_queue_bytes),
                               ("broadcast_message_bytes", args.broadcast_message_bytes))
             if v is not None}
    node = Node(
        **sizes,
        name=args.name, mesh=args.mesh, interfaces=(args.interface,),
        router_port=args.router_port, pub_port=args.pub_port, seeds=tuple(args.seed),
        discovery=not args.no_discovery, data_dir=args.data_dir,
        heartbeat_interval=args.heartbeat, evasive_after=args.evasive_after,
        expire_after=args.expire_after, retry_initial=0.1, retry_max=0.5, send_timeout=30.0,
        insecure=args.insecure, recontact_max=args.recontact_max,
        max_clock_skew=args.max_clock_skew,
    )
    knowledge = None
    if args.knowledge is not None:
        knowledge = Knowledge(node, Shard(args.knowledge, agent=args.name),
                              anti_entropy_interval=0.5, request_timeout=1.0)

    def on_peer(event: PeerEvent) -> None:
        emit(ev="peer", kind=event.kind.value, peer=event.peer.name,
             inc=event.peer.incarnation, reason=event.reason)

    delivered = 0

    def on_msg(msg: Message) -> None:
        nonlocal delivered
        delivered += 1
        if args.quiet_messages:
            if delivered % 100 == 0:
                emit(ev="count", n=delivered)
        else:
            emit(ev="msg", ch=msg.channel, sender=msg.sender, seq=msg.seq,
                 inc=msg.envelope.incarnation, text=msg.activity.summary, direct=msg.direct)

    if args.stats != "answer":
        unsupported = encode_control({"k": KIND_STATS})

        def on_stats(env: Envelope, payload: bytes, reply: Reply) -> None:
            emit(ev="stats-asked", sender=env.sender, t=time.monotonic())
            if args.stats == "unsupported":
                reply(KIND_UNSUPPORTED, unsupported)

        node.register_kind(KIND_STATS, on_stats)

    # Listen before starting: peers can be found while discovery starts up.
    node.add_peer_listener(on_peer)
    node.add_handler(on_msg)
    if knowledge is not None:
        knowledge.start()
    await node.astart()
    emit(ev="up", name=node.name, pub=node.pub_port, router=node.router_port,
         inc=node.incarnation, wall=time.time(), compiled=speedups.in_use(),
         loop=type(asyncio.get_running_loop()).__module__.partition(".")[0])
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks: set[asyncio.Task[None]] = set()

    async def send_many(to: str, start: int, n: int, size: int) -> None:
        futs = []
        for i in range(start, start + n):
            futs.append(node.async_send_nowait(to, activity(node.name, f"m{i}", size)))
            if len(futs) % 256 == 0:
                await asyncio.sleep(0)
        ok = 0
        for fut in futs:
            try:
                await fut
                ok += 1
            except PorterError as exc:
                emit(ev="send-failed", error=str(exc))
        emit(ev="sent", to=to, ok=ok, n=n)

    while True:
        node.drain()  # the handler already reported; keep the inbox empty
        line = await reader.readline()
        if not line:
            break
        cmd = orjson.loads(line)
        op = cmd["op"]
        if op == "quit":
            break
        if op == "publish":
            for i in range(cmd.get("n", 1)):
                node.async_publish(cmd["channel"], activity(node.name, f"{cmd['text']}{i}"))
        elif op == "burst":
            emit(ev="burst-start", maxrss=peak_rss())
            chunk = cmd.get("chunk", 512)
            for first in range(0, cmd["n"], chunk):
                for i in range(first, min(first + chunk, cmd["n"])):
                    node.async_publish(cmd["channel"], activity(node.name, f"{cmd['text']}{i}"))
                await asyncio.sleep(0)  # one flush per chunk, as a busy agent's loop does
            await asyncio.sleep(0)
            emit(ev="burst-done", maxrss=peak_rss(),
                 stats=node.stats())
        elif op == "send":
            task = asyncio.ensure_future(send_many(cmd["to"], cmd.get("start", 0), cmd["n"],
                                                   cmd.get("size", 0)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        elif op == "wait-subscribers":
            try:
                await node.wait_for_subscribers(cmd["channel"], cmd["n"], cmd.get("timeout", 10))
                emit(ev="subscribers", channel=cmd["channel"], n=cmd["n"])
            except TimeoutError as exc:
                emit(ev="error", error=str(exc))
        elif op == "stats":
            emit(ev="stats", stats=node.stats(), t=time.monotonic(), tag=cmd.get("tag"))
        elif op == "send-kind":
            try:
                node.async_send_kind(cmd["to"], cmd["kind"], bytes.fromhex(cmd["payload"]))
            except PorterError as exc:
                emit(ev="error", error=str(exc), tag=cmd.get("tag"))
            else:
                emit(ev="sent-kind", tag=cmd.get("tag"))
        elif op == "send-activity":
            try:
                fut = node.async_send_nowait(cmd["to"], Activity.from_dict(cmd["activity"]))
            except PorterError as exc:
                emit(ev="error", error=str(exc), tag=cmd.get("tag"))
            else:
                tag = cmd.get("tag")

                def sent(f: asyncio.Future[None], tag: Any = tag) -> None:
                    error = None if f.cancelled() else f.exception()
                    emit(ev="sent-activity", tag=tag, error=None if error is None else str(error))

                fut.add_done_callback(sent)
        elif op == "roster":
            emit(ev="roster", peers={p.name: {"state": p.state.value, "skew": p.clock_skew_ms}
                                     for p in node.peers()}, tag=cmd.get("tag"))
        elif knowledge is not None and op in ("remember", "recall", "kg"):
            emit(tag=cmd.get("tag"), **knowledge_command(knowledge, node.name, cmd))
    for task in tasks:
        task.cancel()
    if knowledge is not None:
        await knowledge.aclose()
    await node.aclose()
    emit(ev="closed")


if __name__ == "__main__":
    eventloop.run(main())
