"""One side of a node-benchmark measurement, run as its own OS process.

Usage (from the repository root): ``python -m bench.node_peer ROLE [options]``.

Every role talks to the benchmark driver (:mod:`bench.bench_node`) through JSON lines
on stdout: ``{"event": "ready", ...}`` once it listens or is connected, then
``{"event": "result", ...}`` with what it measured. Roles that others depend on (a
publisher, an echo server) stay up after their result until their stdin closes, so a
peer is never cut off mid-stream. Errors go to stderr and end the process with status 2.

Roles:

* ``mesh-pub`` / ``mesh-sub``: broadcast on the ``log`` channel through :class:`Node`
  (``--mode orjson``: a fresh ``Activity.from_dict`` per message; ``--mode raw``: one
  prebuilt activity published again and again). The subscriber is a node without an
  inbox whose batch handler counts (``--mode read``: and reads a field of each);
  ``--mode inbox`` gives it an inbox too, emptied as it fills.
* ``mesh-recv``: a node that drains its direct inbox (``--echo``: and answers every
  direct message with a direct message back).
* ``mesh-send``: direct sends with acknowledgement, ``--window`` futures in flight.
* ``mesh-ping``: direct round trips against ``mesh-recv --echo``, one at a time.
* ``mesh-discover``: a node with zeroconf discovery on loopback; reports when it sees
  ``--expect`` others. Waits for a ``go`` line first, so interpreter start-up and
  imports are not counted as discovery.
* ``zmq-pub`` / ``zmq-sub``: raw pyzmq XPUB/SUB (``--mode raw``: the same pre-encoded
  bytes every time; ``--mode orjson``: ``orjson.dumps`` per send, ``orjson.loads`` per
  receive).
* ``zmq-echo`` / ``zmq-ping``: raw pyzmq ROUTER/DEALER ping-pong of the same bytes.
* ``aio-echo`` / ``aio-ping``: the same ping-pong driven from asyncio event loops the
  way the node reads its sockets, without any codec: the floor for an asyncio node.
* ``proto-echo`` / ``proto-ping``: the aio ping-pong carrying the mesh's direct messages:
  envelope, validated activity, de-duplication and acknowledgements (``--no-ack``: none),
  and nothing of the node around them: the floor of the protocol itself.
* ``zenoh-pub`` / ``zenoh-sub``: eclipse-zenoh peers, multicast scouting off, explicit
  ``tcp/127.0.0.1`` endpoints, reliable (blocking congestion control) publication.

Throughput is measured where messages arrive: messages received after the first
arrival divided by the time from the first arrival to the last one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import functools
import json
import os
import pathlib
import selectors
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import orjson

#: The AS2 profile's status announcement, the payload of every measurement.
ANNOUNCE: dict[str, Any] = {
    "type": "Announce",
    "actor": "worker-backend",
    "summary": "All tests passing",
    "context": "urn:porter:task:a3f9",
    "object": {"type": "Note", "content": "14 tests passing, 0 failures. Coverage: 87%."},
}
PAYLOAD = orjson.dumps(ANNOUNCE)

CHANNEL = "log"
#: ``--port`` value that means "read the peer's port from stdin first".
ASK_PORT = -1
PUB_NAME = "pub"
RECV_NAME = "recv"
ZENOH_DATA_KEY = "bench/data"
ZENOH_READY_KEY = "bench/ready"


def emit(event: str, **fields: Any) -> None:
    """Write one JSON event line on stdout for the driver."""
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def note(text: str) -> None:
    """Progress for the human watching, on stderr."""
    sys.stderr.write(f"  [{os.getpid()}] {text}\n")
    sys.stderr.flush()


class Arrivals:
    """Counts received messages and times the first and the last arrival."""

    __slots__ = ("count", "cpu", "first", "first_batch", "last", "reached", "target")

    def __init__(self) -> None:
        self.count = 0
        self.first = 0.0
        self.first_batch = 0
        self.last = 0.0
        self.cpu = CpuClock()
        #: Resolved once ``count`` reaches ``target`` (see :func:`until_counted`).
        self.reached: asyncio.Future[None] | None = None
        self.target = 0

    def add(self, n: int) -> None:
        now = time.perf_counter()
        if self.count == 0:
            self.first = now
            self.first_batch = n
            self.cpu.start()
        self.count += n
        self.last = now
        if self.count >= self.target and self.reached is not None and not self.reached.done():
            self.reached.set_result(None)

    def result(self) -> dict[str, Any]:
        span = self.last - self.first
        # The first batch arrived at `first`; only what came after it fills the span.
        after_first = self.count - self.first_batch
        rate = after_first / span if span > 0 and after_first > 0 else 0.0
        # Process CPU only: zenoh runs its callbacks on threads of its own.
        cpu = self.cpu.per(self.count)["cpu_process_us"]
        return {"received": self.count, "seconds": span, "rate": rate, "cpu_process_us": cpu}


class CpuClock:
    """CPU time used from ``start()`` on: this thread alone, and the whole process
    (which includes libzmq's or zenoh's own I/O threads)."""

    def __init__(self) -> None:
        self.thread = self.process = 0.0

    def start(self) -> None:
        self.thread, self.process = time.thread_time(), time.process_time()

    def per(self, n: int) -> dict[str, float]:
        """Microseconds of CPU per operation over ``n`` operations."""
        n = max(n, 1)
        return {
            "cpu_thread_us": (time.thread_time() - self.thread) / n * 1e6,
            "cpu_process_us": (time.process_time() - self.process) / n * 1e6,
        }


def percentiles(samples_ns: list[int]) -> dict[str, float]:
    """p50/p90/p99/max/mean of nanosecond samples, in microseconds."""
    if not samples_ns:
        return {"n": 0}
    ordered = sorted(samples_ns)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000.0

    return {
        "n": len(ordered),
        "p50_us": pick(0.50),
        "p90_us": pick(0.90),
        "p99_us": pick(0.99),
        "max_us": ordered[-1] / 1000.0,
        "mean_us": sum(ordered) / len(ordered) / 1000.0,
    }


class RoundTrips:
    """Paces ``--warmup`` untimed then ``--count`` timed round trips within ``--limit``.

    Iterating yields the seconds left for each trip; ``record`` keeps a timed one.
    """

    def __init__(self, a: argparse.Namespace) -> None:
        self.warmup, self.count = a.warmup, a.count
        self.deadline = time.monotonic() + a.limit
        self.samples: list[int] = []
        self.cpu = CpuClock()
        self._timed = False

    def __iter__(self) -> Iterator[float]:
        for i in range(self.warmup + self.count):
            left = self.deadline - time.monotonic()
            if left <= 0:
                return
            if i == self.warmup:
                self.cpu.start()
            self._timed = i >= self.warmup
            yield left

    def record(self, t0_ns: int, t1_ns: int) -> None:
        if self._timed:
            self.samples.append(t1_ns - t0_ns)

    def result(self) -> dict[str, float]:
        return {**percentiles(self.samples), **self.cpu.per(len(self.samples))}


def publish_all(a: argparse.Namespace, send: Callable[[bytes], Any]) -> None:
    """Send ``--count`` payloads (``--mode orjson``: ``orjson.dumps`` each time; ``raw``:
    the same bytes), report the send rate, then stay up until stdin closes."""
    started = time.perf_counter()
    cpu = CpuClock()
    cpu.start()
    if a.mode == "orjson":
        dumps, obj = orjson.dumps, ANNOUNCE
        for _ in range(a.count):
            send(dumps(obj))
    else:
        for _ in range(a.count):
            send(PAYLOAD)
    elapsed = time.perf_counter() - started
    emit("result", sent=a.count, seconds=elapsed, rate=a.count / elapsed, **cpu.per(a.count))
    wait_stdin_closed(a.limit)


def wait_stdin_closed(limit: float) -> None:
    """Block until the driver closes our stdin (or ``limit`` seconds pass)."""
    deadline = time.monotonic() + limit
    with selectors.DefaultSelector() as sel:
        sel.register(sys.stdin.fileno(), selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if sel.select(left) and not os.read(sys.stdin.fileno(), 4096):
                return


async def async_stdin_closed(limit: float) -> None:
    """Wait on the loop until our stdin closes (or ``limit`` seconds pass)."""
    loop = asyncio.get_running_loop()
    closed = loop.create_future()
    fd = sys.stdin.fileno()

    def readable() -> None:
        if not os.read(fd, 4096) and not closed.done():
            closed.set_result(None)

    loop.add_reader(fd, readable)
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(closed, limit)
    finally:
        loop.remove_reader(fd)


# -- the mesh ---------------------------------------------------------------------------


def _node(name: str, **settings: Any) -> Any:
    from porter_mesh.node.node import Node

    settings.setdefault("discovery", False)
    settings.setdefault("channels", ())
    return Node(name=name, **settings)


def _fresh_activity() -> Any:
    """A new activity from the Announce dict, validated, as an application builds one."""
    return _from_dict(ANNOUNCE)


def _from_dict(data: dict[str, Any]) -> Any:
    # Bound on first use so that the zmq and zenoh roles never import the mesh.
    global _from_dict
    from porter_mesh.core.as2 import Activity

    _from_dict = Activity.from_dict
    return _from_dict(data)


async def mesh_pub(a: argparse.Namespace) -> None:
    async with _node(PUB_NAME) as node:
        emit("ready", port=node.router_port)
        await node.wait_for_subscribers(CHANNEL, a.subs, a.limit)
        note(f"mesh-pub: {a.subs} subscriber(s), publishing {a.count}")
        # Default: a fresh, validated activity per message, as an application builds
        # it. --mode raw reuses one prebuilt activity (its JSON is then encoded once).
        from porter_mesh.core.as2 import Activity

        prebuilt = _fresh_activity() if a.mode == "raw" else None
        publish, from_dict = node.async_publish, Activity.from_dict
        started = time.perf_counter()
        cpu = CpuClock()
        cpu.start()
        for i in range(a.count):
            publish(CHANNEL, prebuilt or from_dict(ANNOUNCE))
            if i & 255 == 255:
                await asyncio.sleep(0)  # let the node flush what accumulated
        await asyncio.sleep(0)
        elapsed = time.perf_counter() - started
        emit(
            "result",
            sent=a.count,
            seconds=elapsed,
            rate=a.count / elapsed,
            **cpu.per(a.count),
            stats=node.stats(),
        )
        await async_stdin_closed(a.limit)


def delivery_counter(keep: Callable[[Any], bool], *,
                     read: bool = False) -> tuple[Arrivals, Callable[[list[Any]], None]]:
    """A batch handler counting the activities a node delivers, as soon as they are
    decoded and validated, and what it counts into.

    One call per ZeroMQ message, timed on arrival, as an application that counts or
    forwards would. Timing inbox drains instead would be too coarse: when data queues
    up, one drain can return everything at once. With ``read``, a field of every activity
    is read first, as an application that looks at each does (an activity arrives
    validated; its dict is made when first read). Give it to the node's constructor
    (``batch_handlers``) so that it counts from the first message.
    """
    arrivals = Arrivals()
    add = arrivals.add

    def seen(msgs: list[Any]) -> None:
        # One batch is one envelope: a single sender, channel and kind of delivery.
        if msgs and keep(msgs[0]):
            if read:
                for msg in msgs:
                    msg.activity.type  # noqa: B018
            add(len(msgs))

    return arrivals, seen


def count_deliveries(node: Any, keep: Callable[[Any], bool], *, read: bool = False) -> Arrivals:
    """:func:`delivery_counter` added to a running ``node`` (before any peer can send)."""
    arrivals, seen = delivery_counter(keep, read=read)
    node.add_batch_handler(seen)
    return arrivals


async def empty_inbox(node: Any, arrivals: Arrivals, count: int, limit: float, idle: float) -> None:
    """Take messages out of the inbox, as an application does, until ``count`` arrived,
    ``limit`` seconds passed, or nothing came for ``idle`` seconds after the first."""
    deadline = time.monotonic() + limit
    while arrivals.count < count:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            async with asyncio.timeout(min(left, idle) if arrivals.count else left):
                await node.wait_readable()
        except TimeoutError:
            break
        node.drain()


async def until_counted(arrivals: Arrivals, count: int, limit: float, idle: float) -> None:
    """Wait until ``count`` arrived, ``limit`` seconds passed, or nothing more came for
    ``idle`` seconds after the first (checked every ``idle`` seconds)."""
    loop = asyncio.get_running_loop()
    arrivals.target, arrivals.reached = count, loop.create_future()
    if arrivals.count >= count:
        return
    deadline = loop.time() + limit
    while not arrivals.reached.done():
        left = deadline - loop.time()
        if left <= 0:
            return
        before = arrivals.count
        await asyncio.wait([arrivals.reached], timeout=min(left, idle))
        if before and arrivals.count == before:
            return


async def mesh_sub(a: argparse.Namespace) -> None:
    # By default the subscriber is what the mesh's own observers are (the dashboard, the
    # demo's timeline, `porter-mesh node`): a node without an inbox whose handler is the
    # application, as zenoh's subscriber is a callback. `--mode inbox` also keeps an inbox
    # and empties it as an application reading with drain() does.
    inbox = a.mode == "inbox"
    settings = {} if inbox else {"inbox_size": 0}
    arrivals, seen = delivery_counter(lambda m: m.channel == CHANNEL and not m.direct,
                                      read=a.mode == "read")
    async with _node(a.name, seeds=(a.seed,), channels=(CHANNEL,), batch_handlers=[seen],
                     **settings) as node:
        if inbox:
            # Take messages out from the start: the publisher may begin as soon as our
            # subscription reaches it, and an inbox left to fill would measure a stalled
            # application instead.
            waiting = empty_inbox(node, arrivals, a.count, a.limit, a.idle)
        else:
            waiting = until_counted(arrivals, a.count, a.limit, a.idle)
        done = asyncio.ensure_future(waiting)
        await node.wait_for_peers([PUB_NAME], a.limit)
        emit("ready")
        await done
        emit("result", **arrivals.result(), stats=node.stats())


async def mesh_recv(a: argparse.Namespace) -> None:
    with contextlib.ExitStack() as stack:
        # --journal: a data directory, so every message is journaled before its ack and
        # taken as the inbox is emptied (the crash-safe path).
        data_dir = (pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory()))
                    if a.journal else None)
        await _mesh_recv(a, data_dir)


async def _mesh_recv(a: argparse.Namespace, data_dir: pathlib.Path | None) -> None:
    async with _node(RECV_NAME, data_dir=data_dir, **_polling(a)) as node:
        if a.echo:

            def forget(fut: asyncio.Future[None]) -> None:
                if not fut.cancelled():
                    fut.exception()  # retrieved, so asyncio does not log it

            def answer(msg: Any) -> None:
                if msg.direct:
                    node.async_send_nowait(msg.sender, msg.activity).add_done_callback(forget)

            node.add_handler(answer)
        arrivals = count_deliveries(node, lambda m: m.direct)
        cpu = CpuClock()
        cpu.start()
        emit("ready", port=node.router_port)
        drainer = asyncio.ensure_future(empty_inbox(node, arrivals, 1 << 62, a.limit, a.limit))
        await async_stdin_closed(a.limit)
        drainer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await drainer
        emit("result", received=arrivals.count, **cpu.per(arrivals.count), stats=node.stats())


async def mesh_send(a: argparse.Namespace) -> None:
    async with _node("send", seeds=(a.seed,)) as node:
        await node.wait_for_peers([RECV_NAME], a.limit)
        emit("ready")
        loop = asyncio.get_running_loop()
        # --mode raw: one prebuilt activity sent again and again (see mesh_pub).
        prebuilt = _fresh_activity() if a.mode == "raw" else None
        acked = failed = in_flight = 0
        errors: list[str] = []
        room = asyncio.Event()
        low_water = max(1, a.window // 2)
        last_ack = 0.0

        def settled(fut: asyncio.Future[None], size: int) -> None:
            nonlocal acked, failed, in_flight, last_ack
            in_flight -= size
            if fut.cancelled() or fut.exception() is not None:
                failed += size
                if len(errors) < 3:
                    errors.append(repr(fut.exception()) if not fut.cancelled() else "cancelled")
            else:
                acked += size
                last_ack = time.perf_counter()
            if in_flight <= low_water:
                room.set()

        deadline = loop.time() + a.limit
        sent = 0
        started = time.perf_counter()
        cpu = CpuClock()
        cpu.start()
        while sent < a.count and loop.time() < deadline:
            burst = min(a.window - in_flight, a.count - sent, 1024)
            # One completion per burst (the node's pipelined burst API); every activity
            # is still its own sequenced, acknowledged, de-duplicated message.
            for start in range(0, burst, 64):
                size = min(64, burst - start)
                batch = [prebuilt or _fresh_activity() for _ in range(size)]
                node.async_send_many(RECV_NAME, batch).add_done_callback(
                    functools.partial(settled, size=size))
            sent += burst
            in_flight += burst
            if in_flight >= a.window:
                room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(room.wait(), max(0.0, deadline - loop.time()))
            else:
                await asyncio.sleep(0)
        while in_flight and loop.time() < deadline:
            room.clear()
            low_water = 0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(room.wait(), max(0.0, deadline - loop.time()))
        span = last_ack - started
        emit(
            "result",
            sent=sent,
            acked=acked,
            failed=failed,
            errors=errors,
            seconds=span,
            rate=acked / span if span > 0 else 0.0,
            **cpu.per(acked),
            stats=node.stats(),
        )


def _polling(a: argparse.Namespace) -> dict[str, float]:
    """The node's ``busy_poll`` setting if ``--busy-poll`` gave one (else its default)."""
    return {} if a.busy_poll is None else {"busy_poll": a.busy_poll}


async def mesh_ping(a: argparse.Namespace) -> None:
    async with _node("ping", seeds=(a.seed,), **_polling(a)) as node:
        await node.wait_for_peers([RECV_NAME], a.limit)
        emit("ready")
        trips = RoundTrips(a)
        for left in trips:
            activity = _fresh_activity()
            t0 = time.perf_counter_ns()
            ack = node.async_send_nowait(RECV_NAME, activity)
            reply = await node.receive(timeout=left)
            trips.record(t0, time.perf_counter_ns())
            await ack
            if not reply.direct:
                raise SystemExit(f"mesh-ping: expected a direct reply, got {reply.channel}")
        emit("result", **trips.result(), stats=node.stats())


async def mesh_discover(a: argparse.Namespace) -> None:
    from porter_mesh.node.node import Node

    emit("loaded")
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    if (await asyncio.wait_for(reader.readline(), a.limit)).strip() != b"go":
        return
    started = time.monotonic()
    node = Node(name=a.name, mesh=a.mesh, interfaces=("127.0.0.1",), discovery=True)
    async with node:
        up = time.monotonic()
        emit("up", start=started, up=up)
        try:
            await node.wait_for_peers(a.expect, a.limit)
        except TimeoutError:
            emit("seen", start=started, up=up, seen=None, peers=len(node.peers()))
            return
        emit("seen", start=started, up=up, seen=time.monotonic(), peers=len(node.peers()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reader.read(), a.limit)


# -- raw pyzmq --------------------------------------------------------------------------


@contextlib.contextmanager
def zmq_socket(kind: int) -> Iterator[Any]:
    """A socket of ``kind`` in a context of its own, both closed on the way out."""
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        yield sock
    finally:
        sock.close()
        ctx.term()


def zmq_pub(a: argparse.Namespace) -> None:
    import zmq

    with zmq_socket(zmq.XPUB) as sock:
        sock.setsockopt(zmq.XPUB_VERBOSE, 1)  # one notice per subscriber, not per topic
        sock.setsockopt(zmq.SNDHWM, 0)
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        emit("ready", port=port)
        subscribed = 0
        deadline = time.monotonic() + a.limit
        while subscribed < a.subs:
            left = deadline - time.monotonic()
            if left <= 0 or not sock.poll(int(left * 1000)):
                raise SystemExit(f"zmq-pub: only {subscribed} of {a.subs} subscribed")
            if sock.recv()[:1] == b"\x01":
                subscribed += 1
        note(f"zmq-pub ({a.mode}): {a.subs} subscriber(s), publishing {a.count}")
        publish_all(a, sock.send)


def zmq_sub(a: argparse.Namespace) -> None:
    import zmq

    with zmq_socket(zmq.SUB) as sock:
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.connect(f"tcp://127.0.0.1:{a.port}")
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        emit("ready")
        arrivals = Arrivals()
        deadline = time.monotonic() + a.limit
        loads = orjson.loads if a.mode == "orjson" else None
        recv, again, noblock = sock.recv, zmq.Again, zmq.NOBLOCK
        while arrivals.count < a.count:
            left = deadline - time.monotonic()
            wait = min(left, a.idle) if arrivals.count else left
            if wait <= 0 or not sock.poll(int(wait * 1000)):
                break
            n = 0
            try:
                if arrivals.count == 0:  # the first arrival starts the clock on its own
                    data = recv(noblock)
                    if loads is not None:
                        loads(data)
                    arrivals.add(1)
                room = a.count - arrivals.count
                while n < room:
                    data = recv(noblock)
                    if loads is not None:
                        loads(data)
                    n += 1
            except again:
                pass
            if n:
                arrivals.add(n)
        emit("result", **arrivals.result())


def zmq_echo(a: argparse.Namespace) -> None:
    import zmq

    with zmq_socket(zmq.ROUTER) as sock:
        emit("ready", port=sock.bind_to_random_port("tcp://127.0.0.1"))
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(sys.stdin.fileno(), zmq.POLLIN)
        deadline = time.monotonic() + a.limit
        echoed = 0
        cpu = CpuClock()
        cpu.start()
        while (left := deadline - time.monotonic()) > 0:
            ready = dict(poller.poll(int(left * 1000)))
            if sock in ready:
                sock.send_multipart(sock.recv_multipart())
                echoed += 1
            if sys.stdin.fileno() in ready and not os.read(sys.stdin.fileno(), 4096):
                break
        emit("result", received=echoed, **cpu.per(echoed))


def zmq_ping(a: argparse.Namespace) -> None:
    import zmq

    with zmq_socket(zmq.DEALER) as sock:
        sock.connect(f"tcp://127.0.0.1:{a.port}")
        emit("ready")
        trips = RoundTrips(a)
        for left in trips:
            t0 = time.perf_counter_ns()
            sock.send(PAYLOAD)
            if not sock.poll(int(left * 1000)):
                break
            reply = sock.recv()
            trips.record(t0, time.perf_counter_ns())
            if reply != PAYLOAD:
                raise SystemExit("zmq-ping: the echo changed the message")
        emit("result", **trips.result())


def _watch_zmq(sock: Any, on_message: Callable[[list[bytes]], None]) -> Callable[[], None]:
    """Call ``on_message`` for every message ``sock`` receives, from the event loop.

    The same reading discipline as the node (descriptor watched with ``add_reader``,
    drained without blocking while ``EVENTS`` says there is input), with no codec at
    all: the floor an asyncio program on pyzmq cannot go below.
    """
    import zmq

    def drain() -> None:
        while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            on_message(sock.recv_multipart(zmq.NOBLOCK))

    loop = asyncio.get_running_loop()
    loop.add_reader(sock.getsockopt(zmq.FD), drain)
    loop.call_soon(drain)
    return drain


async def _echo_server(a: argparse.Namespace,
                       respond: Callable[[list[bytes]], list[list[bytes]]]) -> None:
    """A ROUTER on an asyncio loop sending back what ``respond`` makes of each message
    (an empty list: nothing; a duplicate, say)."""
    import zmq

    with zmq_socket(zmq.ROUTER) as sock:
        echoed = 0
        cpu = CpuClock()
        cpu.start()

        def answer(frames: list[bytes]) -> None:
            nonlocal echoed
            out = respond(frames)
            for message in out:
                sock.send_multipart(message, zmq.NOBLOCK)
            echoed += bool(out)

        _watch_zmq(sock, answer)
        emit("ready", port=sock.bind_to_random_port("tcp://127.0.0.1"))
        await async_stdin_closed(a.limit)
        asyncio.get_running_loop().remove_reader(sock.getsockopt(zmq.FD))
        emit("result", received=echoed, **cpu.per(echoed))


async def _ping_client(a: argparse.Namespace, request: Callable[[], list[bytes]],
                       reply_of: Callable[[Any, list[bytes]], Any], expected: Any) -> None:
    """A DEALER on an asyncio loop timing ``request()`` until ``reply_of(sock, frames)``
    gives a reply (``None``: not one; an acknowledgement, say), which must equal
    ``expected``."""
    import zmq

    with zmq_socket(zmq.DEALER) as sock:
        sock.connect(f"tcp://127.0.0.1:{a.port}")
        loop = asyncio.get_running_loop()
        waiter: list[asyncio.Future[Any]] = []

        def arrived(frames: list[bytes]) -> None:
            reply = reply_of(sock, frames)
            if reply is not None and waiter and not waiter[0].done():
                waiter[0].set_result(reply)

        drain = _watch_zmq(sock, arrived)
        emit("ready")
        trips = RoundTrips(a)
        for left in trips:
            frames = request()
            waiter[:] = [loop.create_future()]
            t0 = time.perf_counter_ns()
            sock.send_multipart(frames, zmq.NOBLOCK)
            if sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:  # a send can consume the edge
                loop.call_soon(drain)
            reply = await asyncio.wait_for(waiter[0], left)
            trips.record(t0, time.perf_counter_ns())
            if reply != expected:
                raise SystemExit(f"{a.role}: the echo changed the message")
        loop.remove_reader(sock.getsockopt(zmq.FD))
        emit("result", **trips.result())


async def aio_echo(a: argparse.Namespace) -> None:
    await _echo_server(a, lambda frames: [frames])


async def aio_ping(a: argparse.Namespace) -> None:
    await _ping_client(a, lambda: [PAYLOAD], lambda sock, frames: frames[-1], PAYLOAD)


class _Wire:
    """The mesh's direct-message work with none of the node around it: the protocol
    floor of a round trip (envelope, validation, de-duplication, acknowledgement)."""

    def __init__(self, name: str) -> None:
        from porter_mesh.core import constants as C
        from porter_mesh.core import envelope as E
        from porter_mesh.core.as2 import Activity

        self.E, self.C, self.from_dict = E, C, Activity.from_dict
        self.name = name
        self.incarnation = E.new_incarnation()
        self.seq = 0
        self.seen: dict[tuple[str, int], int] = {}  # (sender, incarnation) -> last seq

    def _env(self, channel: str, seq: int, *, recipient: str | None = None,
             kind: str | None = None) -> Any:
        E = self.E
        return E.Envelope(self.C.PROTOCOL_VERSION, E.make_msg_id(self.incarnation, channel, seq),
                          self.name, channel, seq, self.incarnation, time.time_ns() // 1_000_000,
                          recipient, None, 1, kind)

    def message(self, activity: Any, recipient: str) -> list[bytes]:
        self.seq += 1
        env = self._env(self.C.DIRECT_PREFIX + recipient, self.seq, recipient=recipient)
        return self.E.encode_direct(env, self.E.encode_payload([activity]))

    def ack(self, env: Any) -> list[bytes]:
        return self.E.encode_direct(self._env(self.C.CHANNEL_CONTROL, 0, kind=self.E.KIND_ACK),
                                    self.E.encode_control({"f": [env.seq, env.seq]}))

    def accept(self, frames: list[bytes]) -> tuple[Any, Any]:
        """Decode one message: ``(envelope, activity)`` for a new one, ``(envelope,
        None)`` for a duplicate or an acknowledgement."""
        env, payload = self.E.decode_direct(frames)
        if env.kind is not None:
            self.E.decode_control(payload)
            return env, None
        key = (env.sender, env.incarnation)
        if self.seen.get(key, 0) >= env.seq:
            return env, None
        self.seen[key] = env.seq
        return env, self.E.decode_payload(payload, env.count)[0]


async def proto_echo(a: argparse.Namespace) -> None:
    wire = _Wire(RECV_NAME)

    def respond(frames: list[bytes]) -> list[list[bytes]]:
        ident = frames[0]
        env, activity = wire.accept(frames[1:])
        if activity is None:
            return []
        out = [[ident, *wire.message(activity, env.sender)]]
        if not a.no_ack:
            out.append([ident, *wire.ack(env)])
        return out

    await _echo_server(a, respond)


async def proto_ping(a: argparse.Namespace) -> None:
    import zmq

    wire = _Wire("ping")

    def reply_of(sock: Any, frames: list[bytes]) -> Any:
        env, activity = wire.accept(frames)
        if activity is not None and not a.no_ack:
            sock.send_multipart(wire.ack(env), zmq.NOBLOCK)
        return None if activity is None else activity.type

    # The activity and its message are made before each trip's clock starts (mesh-ping
    # makes only the activity first): a floor may err low, never high.
    await _ping_client(a, lambda: wire.message(wire.from_dict(ANNOUNCE), RECV_NAME),
                       reply_of, ANNOUNCE["type"])


# -- eclipse-zenoh ----------------------------------------------------------------------


def _zenoh_session(*, connect: int | None) -> Any:
    import zenoh

    conf = zenoh.Config()
    conf.insert_json5("mode", '"peer"')
    conf.insert_json5("scouting/multicast/enabled", "false")
    # Explicit loopback endpoints; the default would listen on every interface.
    conf.insert_json5("listen/endpoints", '["tcp/127.0.0.1:0"]')
    if connect is not None:
        conf.insert_json5("connect/endpoints", json.dumps([f"tcp/127.0.0.1:{connect}"]))
    else:
        conf.insert_json5("adminspace/enabled", "true")  # to read back the chosen port
    return zenoh.open(conf)


def _zenoh_port(session: Any) -> int:
    for reply in session.get(f"@/{session.zid()}/peer"):
        if reply.ok is not None:
            for locator in json.loads(reply.ok.payload.to_bytes())["locators"]:
                if locator.startswith("tcp/127.0.0.1:"):
                    return int(locator.rsplit(":", 1)[1])
    raise SystemExit("zenoh-pub: could not read the listening port from the admin space")


def zenoh_pub(a: argparse.Namespace) -> None:
    import zenoh

    session = _zenoh_session(connect=None)
    try:
        ready_subs: set[bytes] = set()
        all_ready = threading.Event()

        def on_ready(sample: Any) -> None:
            ready_subs.add(sample.payload.to_bytes())
            if len(ready_subs) >= a.subs:
                all_ready.set()

        ready_listener = session.declare_subscriber(ZENOH_READY_KEY, on_ready)
        pub = session.declare_publisher(
            ZENOH_DATA_KEY, congestion_control=zenoh.CongestionControl.BLOCK
        )
        emit("ready", port=_zenoh_port(session))
        if not all_ready.wait(a.limit):
            raise SystemExit(f"zenoh-pub: only {len(ready_subs)} of {a.subs} subscribed")
        note(f"zenoh-pub ({a.mode}): {a.subs} subscriber(s), publishing {a.count}")
        publish_all(a, pub.put)
        pub.undeclare()
        ready_listener.undeclare()
    finally:
        session.close()


def zenoh_sub(a: argparse.Namespace) -> None:
    session = _zenoh_session(connect=a.port)
    try:
        arrivals = Arrivals()
        done = threading.Event()
        loads = orjson.loads if a.mode == "orjson" else None
        count = a.count

        def on_sample(sample: Any) -> None:
            data = sample.payload.to_bytes()
            if loads is not None:
                loads(data)
            arrivals.add(1)
            if arrivals.count >= count:
                done.set()

        data_sub = session.declare_subscriber(ZENOH_DATA_KEY, on_sample)
        # Say "ready" only once the publisher's ready-listener is known here; our
        # subscription was declared before, on the same link, so it is known there.
        matched = threading.Event()
        ready_pub = session.declare_publisher(ZENOH_READY_KEY)
        listener = ready_pub.declare_matching_listener(
            lambda status: matched.set() if status.matching else None
        )
        if not (ready_pub.matching_status or matched.wait(a.limit)):
            raise SystemExit("zenoh-sub: the publisher never appeared")
        ready_pub.put(a.name.encode())
        emit("ready")
        deadline = time.monotonic() + a.limit
        while not done.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            done.wait(min(left, 0.05))
            if arrivals.count and time.perf_counter() - arrivals.last > a.idle:
                break
        emit("result", **arrivals.result())
        listener.undeclare()
        ready_pub.undeclare()
        data_sub.undeclare()
    finally:
        session.close()


ROLES: dict[str, Callable[[argparse.Namespace], Any]] = {
    "mesh-pub": mesh_pub,
    "mesh-sub": mesh_sub,
    "mesh-recv": mesh_recv,
    "mesh-send": mesh_send,
    "mesh-ping": mesh_ping,
    "mesh-discover": mesh_discover,
    "zmq-pub": zmq_pub,
    "zmq-sub": zmq_sub,
    "zmq-echo": zmq_echo,
    "zmq-ping": zmq_ping,
    "aio-echo": aio_echo,
    "proto-echo": proto_echo,
    "proto-ping": proto_ping,
    "aio-ping": aio_ping,
    "zenoh-pub": zenoh_pub,
    "zenoh-sub": zenoh_sub,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Options shared by every role."""
    p = argparse.ArgumentParser(
        prog="python -m bench.node_peer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("role", choices=sorted(ROLES))
    p.add_argument("--count", type=int, default=1000, help="messages to send or expect")
    p.add_argument("--subs", type=int, default=1, help="subscribers a publisher waits for")
    p.add_argument("--window", type=int, default=20_000, help="direct sends in flight")
    p.add_argument("--warmup", type=int, default=100, help="untimed round trips first")
    p.add_argument("--limit", type=float, default=60.0, help="hard time limit (seconds)")
    p.add_argument(
        "--idle",
        type=float,
        default=3.0,
        help="stop receiving after this many quiet seconds once data flowed",
    )
    p.add_argument("--mode", choices=("raw", "orjson", "read", "inbox"), default="orjson")
    p.add_argument(
        "--port",
        type=int,
        default=0,
        help=f"port of the peer to connect to ({ASK_PORT}: read it from the first stdin line)",
    )
    p.add_argument("--name", default="sub-0", help="agent name")
    p.add_argument("--mesh", default="bench", help="mesh name (discovery)")
    p.add_argument("--expect", type=int, default=9, help="peers to discover")
    p.add_argument("--echo", action="store_true", help="mesh-recv answers every message")
    p.add_argument("--journal", action="store_true",
                   help="mesh-recv keeps a data directory (the delivery journal)")
    p.add_argument(
        "--no-ack",
        action="store_true",
        help="proto-echo/proto-ping leave acknowledgements out (the bound of any ack scheme)",
    )
    p.add_argument("--busy-poll", type=float, default=None,
                   help="mesh-ping/mesh-recv: the node's busy_poll seconds (0: the loop "
                   "sleeps at once; default: the node's own default)")
    p.add_argument("--profile", default="", help="write cProfile stats to this file")
    p.add_argument("--stages", action="store_true",
                   help="mesh-ping/mesh-recv stamp the node's direct path and report each "
                   "trip's stamps at the end (see bench.bench_rtt_stages)")
    return p.parse_args(argv)


def _read_port() -> int:
    """The peer's port from the first line of stdin (read unbuffered: stdin is also
    watched for its end later)."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(sys.stdin.fileno(), 1)
        if not chunk:
            raise SystemExit("stdin closed before the peer's port arrived")
        line += chunk
    return int(line)


def run_role(func: Callable[[argparse.Namespace], Any], a: argparse.Namespace) -> None:
    """Run one role to its end: on a fresh event loop of the kind the mesh's own
    processes run on (:mod:`porter_mesh.eventloop`) if it is a coroutine function, so
    the asyncio floors share the mesh's loop."""
    if asyncio.iscoroutinefunction(func):
        from porter_mesh import eventloop

        eventloop.run(func(a))
    else:
        func(a)


def main(argv: list[str] | None = None) -> int:
    """Run one role; exit status 2 on failure."""
    a = parse_args(argv)
    if a.port == ASK_PORT:
        # Started before its peer (so that start-up overlaps): wait for the address.
        a.port = _read_port()
    a.seed = f"127.0.0.1:{a.port}"  # the mesh peer to say hello to
    func = ROLES[a.role]
    # CPU time of this thread, so that time spent descheduled on a busy machine is not
    # charged to whichever function happened to be running.
    profiler = cProfile.Profile(time.thread_time) if a.profile else None
    stamps = None
    if a.stages:
        from bench.bench_rtt_stages import install_probes

        stamps = install_probes()
    try:
        if profiler is not None:
            profiler.enable()
        run_role(func, a)
        if stamps is not None:
            from bench.bench_rtt_stages import report

            emit("stages", **report(stamps, a.role))
    except SystemExit as exc:
        if isinstance(exc.code, str):
            sys.stderr.write(f"{a.role}: {exc.code}\n")
            return 2
        raise
    except Exception as exc:
        sys.stderr.write(f"{a.role}: {type(exc).__name__}: {exc}\n")
        return 2
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(a.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
