"""A mesh node with a knowledge shard in its own process, driven by JSON lines on stdin.

Used by the knowledge integration tests and the knowledge benchmark. Every line printed
is one JSON object with an ``ev`` key:

* ``up``: ports, incarnation, and the shard as reloaded from disk (``vv``, ``records``);
* ``peer``: a roster change; ``progress`` / ``caught-up``: catch-up from a peer;
* ``stored``: one Remember made durable (``seq``, ``id`` hex; not with ``quiet``);
  ``stored-batch``: the end of a ``remember`` command (count, seconds, top seq);
  ``retracted``; ``error``: a refused command;
* ``stats``: shard summary, replication counters and node counters;
* ``dump``: every record held (``[origin, seq, key hex]``) and every live observation
  (``[iri, discoveredBy]``); ``rows``: a query's answer.

Commands (``op`` key): ``remember`` (n, prefix, about, severity, generated_at, quiet,
concurrency: Remembers in flight at once, sharing their fdatasyncs),
``retract`` (id), ``vv`` (version vector, record count and digest, without waiting for the
store), ``index`` (whether the in-memory index is still loading and whether queries are
answered from the copy of it on disk meanwhile), ``stats``, ``dump``, ``query`` (sparql),
``wait-subscribers`` (n, timeout), ``quit``.

:class:`KgProcess` starts one and talks to it (the tests and the benchmark use it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pathlib
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

# Run as a script, this file still needs the repository on the path for the harness.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from porter_mesh.adapters.shard import Durability, Shard
from porter_mesh.core import constants as C
from porter_mesh.core.as2 import Activity
from porter_mesh.core.knowledge import DIGEST_BUCKETS
from porter_mesh.core.peers import PeerEvent
from porter_mesh.errors import PorterError
from porter_mesh.node.knowledge import Knowledge
from porter_mesh.node.node import Node
from tests.integration.harness import NodeProcess, peers_seen

KG_PROC = pathlib.Path(__file__).resolve()

#: Peer timings for loaded machines (two cores running several nodes that fsync), as
#: command-line options of this script.
TIMINGS = ("--heartbeat", "0.2", "--evasive-after", "1.5", "--expire-after", "5")

LIVE_QUERY = "SELECT ?o ?by WHERE { ?o a porter:Observation ; porter:discoveredBy ?by }"


def emit(**fields: Any) -> None:
    # ``t``: the system-wide monotonic clock, comparable across processes on one machine.
    sys.stdout.write(orjson.dumps({**fields, "t": time.monotonic()}).decode() + "\n")
    sys.stdout.flush()


def remember_activity(actor: str, about: str, finding: str, severity: str | None) -> Activity:
    note: dict[str, Any] = {"type": "Note", "about": about, "content": finding}
    if severity:
        note["severity"] = severity
    return Activity.from_dict({"type": "Remember", "actor": actor, "summary": f"finding {finding}",
                               "object": note})


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--mesh", default="test")
    parser.add_argument("--data-dir", type=pathlib.Path, required=True)
    parser.add_argument("--router-port", type=int, default=0)
    parser.add_argument("--pub-port", type=int, default=0)
    parser.add_argument("--seed", action="append", default=[])
    parser.add_argument("--no-discovery", action="store_true")
    parser.add_argument("--drop-every", type=int, default=0)
    parser.add_argument("--anti-entropy", type=float, default=0.5)
    parser.add_argument("--request-timeout", type=float, default=1.0)
    parser.add_argument("--catchup-timeout", type=float, default=10.0)
    parser.add_argument("--heartbeat", type=float, default=0.2)
    parser.add_argument("--evasive-after", type=float, default=0.8)
    parser.add_argument("--expire-after", type=float, default=2.0)
    parser.add_argument("--durability", choices=("fsync", "os"), default="fsync")
    parser.add_argument("--log", default="WARNING")
    parser.add_argument("--record-syncs", action="store_true",
                        help="keep, in knowledge.journal.synced, the journal's size before "
                        "the start of its last completed fdatasync: what a power cut "
                        "would leave of it (see power_cut)")
    parser.add_argument("--node-dir", type=pathlib.Path,
                        help="the node's own data directory (its audit log, when secured)")
    return parser.parse_args()


def record_syncs(journal: pathlib.Path) -> None:
    """Keep the journal's durable length in ``<journal>.synced`` as its syncs complete.

    What a power cut leaves of a file is what its last completed ``fdatasync`` covered:
    at least the size the file had when that call started. That size is written (8
    bytes, no sync of its own: the process dying leaves the page cache, only a power
    cut would not) after each ``fdatasync`` of the journal returns, so that a test can
    kill the process and cut the journal back to it (:func:`power_cut`) before a
    restart. The real ``fdatasync`` still runs; nothing else changes.
    """
    real = os.fdatasync
    target = os.path.realpath(journal)
    out = os.open(f"{journal}.synced", os.O_CREAT | os.O_WRONLY, 0o644)

    def fdatasync(fd: int) -> None:
        if os.path.realpath(f"/proc/self/fd/{fd}") != target:
            real(fd)
            return
        size = os.fstat(fd).st_size
        real(fd)
        os.pwrite(out, size.to_bytes(8, "little"), 0)

    os.fdatasync = fdatasync


def power_cut(data_dir: pathlib.Path) -> int:
    """Cut a dead node's journal back to what its last completed sync covered.

    Args:
        data_dir: the shard's directory of a node run with ``--record-syncs``, killed.

    Returns:
        The bytes cut off (written, never synced: lost in a power cut).
    """
    journal = data_dir / "knowledge.journal"
    synced = int.from_bytes((data_dir / "knowledge.journal.synced").read_bytes(), "little")
    size = journal.stat().st_size
    os.truncate(journal, synced)
    return size - synced


async def main() -> None:
    args = parse_args()
    if args.record_syncs:
        args.data_dir.mkdir(parents=True, exist_ok=True)
        record_syncs(args.data_dir / "knowledge.journal")
    logging.basicConfig(level=getattr(logging, args.log),
                        format="%(relativeCreated)d %(name)s %(message)s")
    logging.getLogger("zeroconf").setLevel(logging.WARNING)
    node = Node(
        name=args.name, mesh=args.mesh, interfaces=("127.0.0.1",),
        router_port=args.router_port, pub_port=args.pub_port, seeds=tuple(args.seed),
        discovery=not args.no_discovery, heartbeat_interval=args.heartbeat,
        evasive_after=args.evasive_after, expire_after=args.expire_after,
        channels=(), inbox_size=0, data_dir=args.node_dir,
    )
    shard = Shard(args.data_dir, agent=args.name, durability=Durability(args.durability))
    reloaded = shard.stats()
    knowledge = Knowledge(node, shard, anti_entropy_interval=args.anti_entropy,
                          request_timeout=args.request_timeout,
                          catchup_timeout=args.catchup_timeout, drop_every=args.drop_every)

    def on_peer(event: PeerEvent) -> None:
        emit(ev="peer", kind=event.kind.value, peer=event.peer.name,
             inc=event.peer.incarnation, reason=event.reason)

    def on_knowledge(event: str, detail: Any) -> None:
        if event == "progress":
            emit(ev="progress", done=detail[0], total=detail[1])
        elif event == "caught-up":
            emit(ev="caught-up", peer=detail)

    # Hooked before the node starts: no peer and no sync message can slip past.
    node.add_peer_listener(on_peer)
    knowledge.add_listener(on_knowledge)
    knowledge.start()
    await node.astart()
    emit(ev="up", name=node.name, pub=node.pub_port, router=node.router_port,
         inc=node.incarnation, vv=reloaded.version_vector,
         records=reloaded.observation_records + reloaded.retractions)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while True:
        line = await reader.readline()
        if not line:
            break
        cmd = orjson.loads(line)
        op = cmd["op"]
        if op == "quit":
            break
        try:
            await run_command(cmd, node, shard, knowledge)
        except PorterError as exc:
            emit(ev="error", op=op, error=str(exc), type=type(exc).__name__, tag=cmd.get("tag"))
    await knowledge.aclose()
    await node.aclose()
    emit(ev="closed")


async def run_command(cmd: dict[str, Any], node: Node, shard: Shard,
                      knowledge: Knowledge) -> None:
    op = cmd["op"]

    def reply(**fields: Any) -> None:
        emit(tag=cmd.get("tag"), **fields)

    if op == "remember" and cmd.get("concurrency", 1) > 1:
        await remember_concurrently(cmd, node, shard, knowledge, reply)
    elif op == "remember":
        quiet = cmd.get("quiet", False)
        prefix = cmd.get("prefix", "f")
        started = time.monotonic()
        for i in range(cmd.get("n", 1)):
            finding = f"{prefix}{i}"
            if cmd.get("generated_at"):
                # A wall clock far off, as a skewed machine would stamp it.
                record = knowledge.async_observe(cmd.get("about", "urn:porter:file:x"), finding,
                                                 generated_at=cmd["generated_at"],
                                                 severity=cmd.get("severity"))
            else:
                record = knowledge.async_remember(remember_activity(
                    node.name, cmd.get("about", "urn:porter:file:x"), finding,
                    cmd.get("severity")))
            if not quiet:
                emit(ev="stored", seq=record.seq, id=record.body.id.hex())
            # Let replication traffic through between records of a burst.
            await asyncio.sleep(0)
        reply(ev="stored-batch", n=cmd.get("n", 1), prefix=prefix,
              seconds=time.monotonic() - started, top=shard.state.top_seq(node.name))
    elif op == "retract":
        record = knowledge.async_retract(cmd["id"])
        reply(ev="retracted", seq=record.seq, target=cmd["id"])
    elif op == "vv":
        # Cheap: the replica state only, without waiting for the store.
        state = shard.state
        reply(ev="vv", vv=state.version_vector(), records=state.record_count,
              digest=state.digest().top.hex(), caught_up=sorted(knowledge.caught_up_from()))
    elif op == "index":
        reply(ev="index", loading=shard.index_loading, from_copy=shard.reading_from_copy,
              kind=shard.index.value, moving=shard.index_moving)
    elif op == "stats":
        reply(ev="stats", kg=knowledge.stats(), node=node.stats())
    elif op == "dump":
        state = shard.state
        listing = state.bucket_entries(range(DIGEST_BUCKETS))
        result = shard.query(LIVE_QUERY, row_limit=1_000_000, deadline=30.0)
        reply(ev="dump", records=[[o, s, k.hex()] for o, s, k in listing.entries],
              more=listing.more, retracted=sorted(t.hex() for t in state.retracted),
              live=[[row["o"], row["by"]] for row in result.items()],
              truncated=result.truncated)
    elif op == "query":
        result = shard.query(cmd["sparql"], row_limit=cmd.get("limit", 100))
        reply(ev="rows", items=result.items(), truncated=result.truncated)
    elif op == "wait-subscribers":
        try:
            await node.wait_for_subscribers(C.CHANNEL_CONTROL, cmd["n"], cmd.get("timeout", 10))
            reply(ev="subscribers", n=cmd["n"])
        except TimeoutError as exc:
            reply(ev="error", op=op, error=str(exc), type="TimeoutError")
    else:
        reply(ev="error", op=op, error=f"unknown op {op!r}", type="usage")


async def remember_concurrently(cmd: dict[str, Any], node: Node, shard: Shard,
                                knowledge: Knowledge, reply: Callable[..., None]) -> None:
    """``n`` Remembers with up to ``concurrency`` in flight (they share fdatasyncs); each
    ``stored`` event is emitted once its Remember is acknowledged."""
    quiet = cmd.get("quiet", False)
    prefix = cmd.get("prefix", "f")
    about = cmd.get("about", "urn:porter:file:x")
    slots = asyncio.Semaphore(cmd["concurrency"])
    syncs = shard.journal_syncs
    started = time.monotonic()

    async def one(i: int) -> None:
        async with slots:
            record = await knowledge.aremember(remember_activity(
                node.name, about, f"{prefix}{i}", cmd.get("severity")))
        if not quiet:
            emit(ev="stored", seq=record.seq, id=record.body.id.hex())

    await asyncio.gather(*(one(i) for i in range(cmd.get("n", 1))))
    reply(ev="stored-batch", n=cmd.get("n", 1), prefix=prefix,
          seconds=time.monotonic() - started, top=shard.state.top_seq(node.name),
          fsyncs=shard.journal_syncs - syncs)


def wait_stderr(p: KgProcess, text: str, timeout: float) -> None:
    """Wait until the process has logged ``text`` (its stderr is read by a thread)."""
    deadline = time.monotonic() + timeout
    while text not in p.stderr:
        if time.monotonic() > deadline:
            raise AssertionError(f"{p.name} did not log {text!r} within {timeout}s; "
                                 f"stderr: {p.stderr[-2000:]}")
        time.sleep(0.002)  # polling a pipe another thread reads, with a deadline


def poll(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    """Call ``cond`` until it returns something true; fail after ``timeout`` seconds.

    ``cond`` is expected to wait a little itself (a command round trip to a node).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s (last: {value!r})")


def see_each_other(nodes: list[KgProcess], timeout: float = 20) -> None:
    """Wait until every node has seen every other one join."""
    names = {n.name for n in nodes}
    for node in nodes:
        others = names - {node.name}
        node.wait_until(lambda ev, o=others: peers_seen(ev) >= o, timeout,
                        f"{node.name} finds {sorted(others)}")


class KgProcess(NodeProcess):
    """One ``kg_proc.py`` process, with helpers to ask it for stats and dumps.

    Args:
        name: the agent name.
        data_dir: its data directory (the shard).
        extra: more command-line options of this script.
        mesh: the mesh name (unique per test).
        env: more environment variables (``PORTER_MESH_KEY``... for a secured node).
    """

    def __init__(self, name: str, data_dir: pathlib.Path, *extra: str, mesh: str,
                 env: dict[str, str] | None = None) -> None:
        # The harness's start-up, with this script instead of node_proc.py.
        self.name = name
        self.data_dir = data_dir
        cmd = [sys.executable, str(KG_PROC), "--name", name, "--mesh", mesh,
               "--data-dir", str(data_dir), *extra]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
        self.events = []
        self._queue = queue.Queue()
        self._stderr = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._err_reader = threading.Thread(target=self._read_err, daemon=True)
        self._err_reader.start()
        self._cursor = 0
        self.up = self.wait_for(lambda e: e["ev"] == "up", 30, "start-up")

    def stats(self) -> dict[str, Any]:
        """The shard summary and replication counters (``kg``) and node counters."""
        return self.ask("stats", "stats")

    def stored(self) -> list[dict[str, Any]]:
        """Every ``stored`` event so far (the records this process reported durable)."""
        return [e for e in self.events if e["ev"] == "stored"]


if __name__ == "__main__":
    asyncio.run(main())
