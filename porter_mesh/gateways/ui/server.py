"""The dashboard's HTTP side: the API, the live stream and the page, on the node's loop.

Theory of operation
-------------------
One asyncio process runs the ``porter-ui`` node and an aiohttp application. aiohttp
was chosen because one well-kept library gives the HTTP/1.1 server, streaming
responses (Server-Sent Events), static files and a test client, all on the asyncio
loop the node already runs on: a message handler and a request handler share state
without locks or threads.

The node's batch handler turns every observed activity into a record
(:func:`~porter_mesh.gateways.ui.state.message_record`), appends it to the
:class:`~porter_mesh.gateways.ui.state.MessageLog`, folds it into the
:class:`~porter_mesh.gateways.ui.state.TaskTracker`, and queues it for the stream.
The stream is flushed at most every :data:`BATCH_INTERVAL` seconds: the records that
piled up go out as one ``messages`` event (serialised once, written to every client),
the changed task cards as one ``tasks`` event, roster changes as one ``peers`` event.
1,000 activities a second thus reach a browser as about ten events a second. A client
that falls :data:`CLIENT_BACKLOG` events behind is disconnected; its browser reconnects
with ``Last-Event-ID`` and is served the gap from the log, so nothing is lost and a
slow tab never holds memory for ever.

A :class:`~porter_mesh.gateways.ui.stats.StatsPoller` asks every peer for its own view
every few seconds (bounded: one request in flight per peer, a deadline, back-off for
peers that do not answer); the answers ride on the peer records as ``stats``, and a
change is a roster change.

Security (every rule is checked by a middleware before any handler runs):

* the ``Host`` header must name this server (``127.0.0.1:PORT``, ``localhost:PORT``,
  ``[::1]:PORT`` or a bound interface): DNS rebinding gets 403;
* ``/api/*`` needs the token, as ``Authorization: Bearer TOKEN`` or the HttpOnly,
  SameSite=Strict cookie set when ``/?token=TOKEN`` is opened (then a 302 to ``/``);
* a ``POST`` whose ``Origin`` (or ``Sec-Fetch-Site``) says another site sent it gets 403;
  state changes are POST only, with a JSON body of at most :data:`MAX_BODY` bytes;
* every answer carries ``Referrer-Policy: no-referrer``, so the URL with the token never
  leaves the browser as a ``Referer``.

Errors are JSON, ``{"error": "<code>", "reason": "<what to do>"}``; ``docs/ui.md``
lists every route. The gateway uses the node's public API only and owns no mesh rule.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import hmac
import itertools
import logging
import pathlib
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

import orjson
from aiohttp import web

from porter_mesh import __version__
from porter_mesh.core import constants as C
from porter_mesh.core.addresses import url_host
from porter_mesh.core.advert import is_human
from porter_mesh.core.as2 import Activity
from porter_mesh.core.as2 import remember as remember_activity
from porter_mesh.core.hlc import hlc_physical_ms
from porter_mesh.core.lifecycle import FINAL_STATUSES
from porter_mesh.core.peers import PeerEvent, PeerEventKind, PeerInfo, PeerState
from porter_mesh.core.profile_examples import PROFILE_EXAMPLES
from porter_mesh.core.taskid import new_task_id
from porter_mesh.core.tasks import cancel_activity
from porter_mesh.core.tracecontext import TraceContext
from porter_mesh.errors import (
    DeliveryError,
    KnowledgeError,
    PorterError,
    QueryError,
    UnknownPeerError,
)
from porter_mesh.gateways.ui.state import (
    MAX_PAGE,
    LogEntry,
    MessageFilter,
    MessageLog,
    TaskTracker,
    message_record,
)
from porter_mesh.gateways.ui.stats import StatsPoller
from porter_mesh.node.knowledge import FIRST_WRITE_WAIT, Knowledge
from porter_mesh.node.node import Message, Node
from porter_mesh.tools.messaging import check_channel, compose, default_type, normalise_context
from porter_mesh.tracing.metrics import prometheus_text
from porter_mesh.tracing.seat import SeatSpans
from porter_mesh.tracing.views import SpanClient, gather_trace, serve_spans
from porter_mesh.tracing.waterfall import waterfall_json

__all__ = ["BATCH_INTERVAL", "COOKIE", "MAX_BODY", "PROFILE_QUERY", "Dashboard", "new_token",
           "peer_record"]

log = logging.getLogger("porter_mesh.gateways.ui")

#: Seconds between two attempts to write the message log while its writes fail.
LOG_RETRY_INTERVAL: Final = 1.0
#: Seconds between two stream flushes (the most a record waits before it is sent).
BATCH_INTERVAL: Final = 0.1
#: Seconds between keep-alive comments on an idle stream.
PING_INTERVAL: Final = 15.0
#: Events a stream client may fall behind before it is disconnected (it resumes).
CLIENT_BACKLOG: Final = 256
#: Most records in one ``messages`` event (a resumed stream sends its gap in these).
MAX_EVENT_RECORDS: Final = 1000
#: Largest request body accepted (bytes).
MAX_BODY: Final = 256 * 1024
#: The cookie that carries the token after ``/?token=`` was opened.
COOKIE: Final = "porter_ui_token"
#: A message whose clock is this many seconds ahead of ours marks its sender clock-skew.
CLOCK_SKEW_LIMIT: Final = 1.0
#: Departed agents kept on the roster (as ``expired`` or ``left``).
MAX_DEPARTED: Final = 200
#: Roles of the nodes that are not agents, and what the roster calls them: a command
#: line's seat, and the nodes that only watch (``tail``, ``up``'s and ``stats``'s
#: observers, the demo's own node). They take no tasks and obey no drain.
NOT_AGENTS: Final = {C.ROLE_SEAT: "seat", "human": "seat", C.ROLE_WATCHER: "watcher",
                     "observer": "watcher", "demo": "watcher"}
#: Direct sends whose observed copy is still expected (to skip it when it comes).
MAX_OWN_COPIES: Final = 1000
#: Seconds each agent may take to answer for its spans (the task card's waterfall).
TRACE_TIMEOUT: Final = 3.0
#: The types the compose form may send.
SEND_TYPES: Final = ("Offer", "Note", "Question", "Accept", "Reject", "Announce")
#: The profile's example query (what has the team learned?), prefilled on the page.
PROFILE_QUERY: Final[str] = PROFILE_EXAMPLES["Recall (knowledge lifecycle)"]["object"]["content"]

_STATIC: Final = pathlib.Path(__file__).with_name("static")
_FINAL: Final = frozenset(s.value for s in FINAL_STATUSES)
_OBSERVATIONS_QUERY: Final = (
    "SELECT ?obs ?about ?finding ?by ?at ?context WHERE {{ ?obs porter:about ?about ; "
    "porter:finding ?finding ; porter:discoveredBy ?by ; prov:generatedAtTime ?at . "
    "OPTIONAL {{ ?obs porter:context ?context }} }} ORDER BY DESC(?at) LIMIT {limit}"
)
_COUNT_QUERY: Final = "SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }"
_UNAUTHORIZED_PAGE: Final = (
    "<!doctype html><meta charset=utf-8><title>porter-ui</title>"
    "<p>This dashboard needs its token. Open the address <code>porter-mesh ui</code> "
    "printed (<code>http://127.0.0.1:PORT/?token=...</code>).</p>"
)


class ApiError(Exception):
    """A request the API refuses: HTTP ``status`` and the JSON ``{"error", "reason"}``."""

    def __init__(self, status: int, error: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.error = error
        self.reason = reason


async def _no_referrer(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer (errors, redirects, files and the stream included) tells the browser
    never to send a ``Referer``: the page is first opened with the token in its URL."""
    response.headers["Referrer-Policy"] = "no-referrer"


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status,
                        content_type="application/json")


def _error(status: int, error: str, reason: str) -> web.Response:
    return _json({"error": error, "reason": reason}, status)


def _sse(event: str, data: bytes, event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\n".encode() + b"data: " + data + b"\n\n"


def _records_event(entries: list[LogEntry]) -> bytes:
    return _sse("messages", b"[" + b",".join(e.json for e in entries) + b"]", entries[-1].id)


def _chunks(entries: list[LogEntry], size: int = MAX_EVENT_RECORDS) -> Iterable[list[LogEntry]]:
    for start in range(0, len(entries), size):
        yield entries[start:start + size]


class _Client:
    """One open stream: the events waiting to be written to it."""

    def __init__(self) -> None:
        self.events: collections.deque[bytes] = collections.deque()
        self.wake = asyncio.Event()
        self.closed = False

    def push(self, event: bytes) -> None:
        if len(self.events) >= CLIENT_BACKLOG:
            self.close()  # too slow: it reconnects with Last-Event-ID and catches up
            return
        self.events.append(event)
        self.wake.set()

    def close(self) -> None:
        self.closed = True
        self.wake.set()


# ---------------------------------------------------------------------------- roster


def _peer_state(info: PeerInfo, skewed: bool) -> str:
    if info.state is PeerState.EVASIVE:
        return "evasive"
    if info.state is PeerState.EXPIRED:
        return "expired"
    if skewed:
        return "clock-skew"
    return "draining" if info.draining else "alive"


def peer_kind(name: str, role: str) -> str:
    """``agent``, or what else a node is: ``seat`` (the human's, a command line's) or
    ``watcher`` (see :data:`NOT_AGENTS`)."""
    if is_human(name):
        return "seat"
    return NOT_AGENTS.get(role, "agent")


def peer_record(info: PeerInfo, *, now: float, state: str,
                stats: dict[str, Any] | None = None) -> dict[str, Any]:
    """A roster entry as the API shows it (``last_heard``: seconds ago; ``kind``: see
    :func:`peer_kind`; ``stats``, the peer's own numbers, only once it answered for
    them)."""
    advert = info.advert
    host = url_host(advert.addresses[0]) if advert.addresses else ""
    record = {"name": advert.name, "role": advert.role,
              "kind": peer_kind(advert.name, advert.role), "state": state,
              "last_heard": round(max(0.0, now - info.last_heard), 3), "slots": advert.slots,
              "tools": list(advert.tools), "incarnation": f"{advert.incarnation:x}",
              "address": f"{host}:{advert.router_port}", "draining": info.draining}
    if stats is not None:
        record["stats"] = stats
    return record


# ---------------------------------------------------------------------------- dashboard


class Dashboard:
    """The ``porter-ui`` gateway: records what the node sees and serves it over HTTP.

    Create it before the node starts (so no message is missed), then :meth:`astart`
    (binds HTTP) and :meth:`aclose`.

    Args:
        node: the ``porter-ui`` node (not yet started is best).
        log: the message log (already loaded; its records are folded into the tasks).
        token: the secret every API call must carry.
        knowledge: the node's knowledge replica, for recall/remember (``None``: those
            routes answer 409).
        hosts: the interfaces HTTP binds on (the first is the printed one).
        port: the HTTP port (0: any free port).
        spans: the dashboard's spans (tracing on): an Offer sent from the page is the
            root of its task's trace, kept in the dashboard's ring (served to
            ``porter-mesh trace``, and drawn in the task card's waterfall).
    """

    def __init__(self, node: Node, log: MessageLog, *, token: str,
                 knowledge: Knowledge | None = None, hosts: Iterable[str] = ("127.0.0.1",),
                 port: int = 0, spans: SeatSpans | None = None) -> None:
        self.node = node
        self.me = node.name
        self.log = log
        self.token = token
        self.knowledge = knowledge
        self.hosts = tuple(hosts)
        self.port = port
        self.tracker = TaskTracker(self.me)
        self.tracker.observe_all(log.records())
        self.counters: collections.Counter[str] = collections.Counter()
        self._local_ids = itertools.count(1)
        self._own_direct: collections.Counter[Activity] = collections.Counter()
        self._skew: dict[str, float] = {}
        self._departed: dict[str, dict[str, Any]] = {}
        self._clients: set[_Client] = set()
        self._pending: list[LogEntry] = []
        self._pending_tasks: dict[str, dict[str, Any]] = {}
        self._peers_dirty = False
        self._roster_sig: tuple[Any, ...] = ()
        self._flush_handle: asyncio.TimerHandle | None = None
        self._log_retry: asyncio.TimerHandle | None = None
        self._closing = False
        self._roster_task: asyncio.Task[None] | None = None
        self._runner: web.AppRunner | None = None
        self._allowed_hosts: frozenset[str] = frozenset()
        self._allowed_origins: frozenset[str] = frozenset()
        self._queries = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="porter-ui-query")
        self._first_write_done = False
        self._remove: list[Callable[[], None]] = [
            node.add_batch_handler(self._on_messages),
            node.add_peer_listener(self._on_peer),
        ]
        self.stats = StatsPoller(node, self._stats_changed)
        self._spans = SpanClient(node)
        self.spans = spans
        if spans is not None:
            serve_spans(node, spans.tracing.ring)
        # One gathering at a time: the client pairs answers by peer, not by question.
        self._tracing = asyncio.Lock()
        self.app = self._make_app()

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The address to open, with the token."""
        return f"http://{url_host(self.hosts[0])}:{self.port}/?token={self.token}"

    async def astart(self) -> None:
        """Bind HTTP on every host (the port of the first for all) and start the roster
        watch. The node should be started already (the roster and sends need it).

        Raises:
            OSError: the port cannot be bound.
        """
        runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        self._runner = runner
        for host in self.hosts:
            site = web.TCPSite(runner, host, self.port)
            await site.start()
            if self.port == 0:
                self.port = int(runner.addresses[0][1])  # the OS's pick, for every host
        names = {"127.0.0.1", "localhost", "[::1]"} | {
            url_host(h) for h in self.hosts}
        self._allowed_hosts = frozenset(
            [f"{n}:{self.port}" for n in names] + (list(names) if self.port == 80 else []))
        self._allowed_origins = frozenset(f"http://{h}" for h in self._allowed_hosts)
        self._roster_task = asyncio.ensure_future(self._watch_roster())
        await self.stats.astart()

    async def aclose(self) -> None:
        """Close every stream, stop HTTP, flush the log (the node is the caller's)."""
        self._closing = True
        if self._log_retry is not None:
            self._log_retry.cancel()
            self._log_retry = None
        for remove in self._remove:
            with contextlib.suppress(ValueError):
                remove()
        self._remove.clear()
        await self.stats.aclose()
        if self._roster_task is not None:
            self._roster_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._roster_task
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._flush()
        for client in list(self._clients):
            client.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._queries.shutdown(wait=True, cancel_futures=True)
        self.log.close()

    # -- what the node sees ------------------------------------------------------------

    def _on_messages(self, msgs: list[Message]) -> None:
        now = time.time()
        first = msgs[0]
        env = first.envelope
        ahead = hlc_physical_ms(env.hlc) / 1000.0 - now
        if ahead > CLOCK_SKEW_LIMIT:
            if first.sender not in self._skew:
                self._peers_dirty = True
            self._skew[first.sender] = ahead
        elif self._skew.pop(first.sender, None) is not None:
            self._peers_dirty = True
        for msg in msgs:
            if msg.sender == self.me and msg.direct and self._own_direct[msg.activity]:
                # The receiver's copy of what we sent: recorded when it was sent.
                self._own_direct[msg.activity] -= 1
                if not self._own_direct[msg.activity]:
                    del self._own_direct[msg.activity]
                continue
            env = msg.envelope
            self._record(message_record(
                record_id=f"{env.msg_id}:{msg.seq - env.seq}", ts=now, channel=msg.channel,
                sender=msg.sender, recipient=env.recipient if msg.direct else None,
                direct=msg.direct, activity=msg.activity, seq=msg.seq, me=self.me))

    def _record(self, record: dict[str, Any]) -> dict[str, Any]:
        entry = self.log.append(record)
        if entry is None:
            self.counters["duplicate"] += 1
            return record
        self.counters["records"] += 1
        self._pending.append(entry)
        task = self.tracker.observe(record)
        if task is not None:
            self._pending_tasks[task["context"]] = task
        self._schedule_flush()
        return record

    def _local_record(self, channel: str, activity: Activity, *,
                      recipient: str | None = None) -> dict[str, Any]:
        return self._record(message_record(
            record_id=f"{self.me}.{self.node.incarnation:x}.ui.{next(self._local_ids)}",
            ts=time.time(), channel=channel, sender=self.me, recipient=recipient,
            direct=recipient is not None, activity=activity, seq=0, me=self.me))

    def _on_peer(self, event: PeerEvent) -> None:
        name = event.peer.name
        if event.kind is PeerEventKind.LEFT and peer_kind(name, event.peer.advert.role) != "agent":
            # A seat or a watcher that went is no news: each command has a seat of its
            # own, and a roster of every one that ever ran says nothing.
            self._departed.pop(name, None)
            self.stats.left(name)
            self._skew.pop(name, None)
        elif event.kind is PeerEventKind.LEFT:
            state = "expired" if event.reason == "expired" else "left"
            record = peer_record(event.peer, now=time.monotonic(), state=state)
            record["reason"] = event.reason
            record["left_at"] = time.time()
            last = self.stats.left(name)
            if last is not None:
                record["stats"] = last  # what it had done when it went
            self._departed[name] = record
            while len(self._departed) > MAX_DEPARTED:
                del self._departed[next(iter(self._departed))]
            self._skew.pop(name, None)
        elif event.kind is PeerEventKind.JOINED:
            self._departed.pop(name, None)
            self.stats.joined(name)
        self._peers_dirty = True
        self._schedule_flush()

    def peers(self) -> list[dict[str, Any]]:
        """The roster: live peers, then the departed ones (newest departure first)."""
        now = time.monotonic()
        live = [peer_record(info, now=now, state=_peer_state(info, info.name in self._skew),
                            stats=self.stats.stats(info.name))
                for info in self.node.peers()]
        names = {p["name"] for p in live}
        gone = [dict(p, last_heard=round(time.time() - p["left_at"], 3))
                for p in reversed(self._departed.values()) if p["name"] not in names]
        return live + gone

    async def _watch_roster(self) -> None:
        """Roster states change without events too (draining comes with heartbeats):
        compare once a second, and refresh ``last_heard`` every few seconds."""
        beats = 0
        while True:
            await asyncio.sleep(1.0)
            beats += 1
            sig = tuple((p["name"], p["state"], p["slots"]) for p in self.peers())
            if sig != self._roster_sig or beats % 5 == 0:
                self._roster_sig = sig
                self._peers_dirty = True
                self._schedule_flush()

    def _stats_changed(self) -> None:
        self._peers_dirty = True
        self._schedule_flush()

    # -- the stream ----------------------------------------------------------------------

    def _schedule_flush(self) -> None:
        if self._flush_handle is None:
            loop = asyncio.get_running_loop()
            self._flush_handle = loop.call_later(BATCH_INTERVAL, self._flush)

    def _roster_event(self) -> bytes:
        """The stream's ``peers`` event: the roster and the message log's health."""
        return _sse("peers", orjson.dumps({"peers": self.peers(), "log": self.log.status()}))

    def _retry_log(self) -> None:
        self._log_retry = None
        self._schedule_flush()

    def _flush(self) -> None:
        self._flush_handle = None
        was_ok = self.log.status()["ok"]
        if not self.log.flush():
            self.counters["log-write-failed"] += 1
            if not self._closing and self._log_retry is None:
                # Nothing new may come to flush: try again on a timer until space returns.
                loop = asyncio.get_running_loop()
                self._log_retry = loop.call_later(LOG_RETRY_INTERVAL, self._retry_log)
        if self.log.status()["ok"] != was_ok:
            self._peers_dirty = True  # the roster event carries the log's health
        events: list[bytes] = []
        if self._pending:
            pending, self._pending = self._pending, []
            events += [_records_event(chunk) for chunk in _chunks(pending)]
        if self._pending_tasks:
            tasks, self._pending_tasks = list(self._pending_tasks.values()), {}
            events.append(_sse("tasks", orjson.dumps(tasks)))
        if self._peers_dirty:
            self._peers_dirty = False
            events.append(self._roster_event())
        if events:
            self.counters["events"] += len(events)
            for client in list(self._clients):
                for event in events:
                    client.push(event)

    def _join(self, last_id: str | None) -> tuple[_Client, list[bytes]]:
        """Register a stream client and the events it must get first (no await between,
        so nothing is missed or sent twice)."""
        client = _Client()
        first = [b"retry: 1000\n\n", self._roster_event()]
        if last_id:
            gap = self.log.after(last_id)
            if gap is None:
                first.append(_sse("reset", orjson.dumps({
                    "reason": f"record {last_id!r} is no longer in the history kept; "
                              "reload the newest page from /api/messages"})))
            else:
                # Whatever is still queued for the next flush follows in that flush.
                waiting = {e.id for e in self._pending}
                gap = [e for e in gap if e.id not in waiting]
                first += [_records_event(chunk) for chunk in _chunks(gap)]
        self._clients.add(client)
        return client, first

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        last_id = request.headers.get("Last-Event-ID") or request.query.get("after")
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-store",
            "X-Accel-Buffering": "no"})
        # Joined before the headers go out: a page that sees the stream open (and only
        # then reads history) misses nothing that arrives between the two.
        client, first = self._join(last_id)
        self.counters["streams"] += 1
        try:
            await response.prepare(request)
            for event in first:
                await response.write(event)
            while not client.closed:
                if not client.events:
                    client.wake.clear()
                    try:
                        await asyncio.wait_for(client.wake.wait(), PING_INTERVAL)
                    except TimeoutError:
                        await response.write(b": ping\n\n")
                    continue
                batch = b"".join(client.events)
                client.events.clear()
                await response.write(batch)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self._clients.discard(client)
        return response

    # -- the HTTP application ------------------------------------------------------------

    def _make_app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard], client_max_size=MAX_BODY)
        app.on_response_prepare.append(_no_referrer)
        api: list[tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]] = [
            ("GET", "/api/info", self._info),
            ("GET", "/api/peers", self._peers),
            ("GET", "/api/messages", self._messages),
            ("GET", "/api/tasks", self._tasks),
            ("GET", "/api/trace", self._trace),
            ("GET", "/api/knowledge", self._knowledge),
            ("GET", "/api/stream", self._stream),
            ("POST", "/api/send", self._send),
            ("POST", "/api/review", self._review),
            ("POST", "/api/cancel", self._cancel),
            ("POST", "/api/recall", self._recall),
            ("POST", "/api/remember", self._remember),
            ("POST", "/api/control", self._control),
        ]
        for method, path, handler in api:
            app.router.add_route(method, path, handler)
        app.router.add_get("/", self._index)
        app.router.add_get("/metrics", self._metrics)
        if _STATIC.is_dir():
            app.router.add_static("/static/", _STATIC)
        return app

    def _authorised(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer":
            given = request.cookies.get(COOKIE, "")
        return bool(given) and hmac.compare_digest(given.strip().encode(), self.token.encode())

    @web.middleware
    async def _guard(self, request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        if request.host not in self._allowed_hosts:
            self.counters["refused.host"] += 1
            return _error(403, "host", f"Host {request.host[:100]!r} is not this dashboard; "
                          f"open http://127.0.0.1:{self.port}/ (DNS rebinding is refused)")
        # /metrics (Prometheus text) holds the agents' numbers: it needs the token too.
        api = request.path.startswith("/api/") or request.path == "/metrics"
        if request.method == "POST":
            site = request.headers.get("Sec-Fetch-Site", "same-origin")
            origin = request.headers.get("Origin")
            if (origin is not None and origin not in self._allowed_origins) or site not in (
                    "same-origin", "none"):
                self.counters["refused.origin"] += 1
                return _error(403, "origin", "cross-site requests are refused; use the "
                              "dashboard's own page or a client without an Origin header")
        if api and not self._authorised(request):
            self.counters["refused.token"] += 1
            return _error(401, "token", "missing or wrong token: send 'Authorization: Bearer "
                          "TOKEN', or open the URL porter-mesh ui printed to get the cookie")
        try:
            return await handler(request)
        except ApiError as exc:
            return _error(exc.status, exc.error, exc.reason)
        except web.HTTPException as exc:
            if not api or exc.status < 400:
                raise
            reason = {404: "no such route; see docs/ui.md for the API",
                      405: f"{request.method} is not allowed here; see docs/ui.md "
                           "(state changes are POST, reads are GET)"}.get(exc.status, exc.reason)
            return _error(exc.status, exc.reason.lower().replace(" ", "-"), reason)

    async def _index(self, request: web.Request) -> web.StreamResponse:
        given = request.query.get("token")
        if given is not None:
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                return web.Response(status=401, text=_UNAUTHORIZED_PAGE, content_type="text/html")
            response = web.HTTPFound("/")
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="Strict", path="/")
            return response
        if not self._authorised(request):
            return web.Response(status=401, text=_UNAUTHORIZED_PAGE, content_type="text/html")
        index = _STATIC / "index.html"
        return web.FileResponse(index, headers={"Cache-Control": "no-store"})

    # -- routes: reading -----------------------------------------------------------------

    async def _info(self, request: web.Request) -> web.StreamResponse:
        return _json({"name": self.me, "mesh": self.node.config.mesh, "version": __version__,
                      "token_hint": None, "query": PROFILE_QUERY,
                      "knowledge": self.knowledge is not None, "history": self.log.history,
                      "batch_interval": BATCH_INTERVAL})

    async def _peers(self, request: web.Request) -> web.StreamResponse:
        return _json({"self": self.me, "mesh": self.node.config.mesh, "peers": self.peers(),
                      "log": self.log.status()})

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        """The agents' service metrics (from their last views) as Prometheus text."""
        services = {}
        for peer in self.node.peers():
            view = self.stats.stats(peer.name)
            if view is not None and isinstance(view.get("service"), dict):
                services[peer.name] = view["service"]
        return web.Response(text=prometheus_text(services),
                            content_type="text/plain", charset="utf-8",
                            headers={"Cache-Control": "no-store"})

    async def _tasks(self, request: web.Request) -> web.StreamResponse:
        return _json({"tasks": self.tracker.tasks()})

    async def _trace(self, request: web.Request) -> web.StreamResponse:
        """A task's trace as a waterfall, gathered from the agents' rings as
        ``porter-mesh trace`` does (``?context=urn:porter:task:ID`` or the bare id)."""
        raw = request.query.get("context", "").strip()
        try:
            context = normalise_context(raw) if raw else None
        except PorterError as exc:
            raise ApiError(400, "context", str(exc)) from None
        if not context:
            raise ApiError(400, "context", "name the task: ?context=urn:porter:task:ID")
        agents = sorted(p.name for p in self.node.peers()
                        if peer_kind(p.name, p.advert.role) == "agent")
        async with self._tracing:
            waterfall = await gather_trace(
                self._spans, agents, TRACE_TIMEOUT, context=context,
                own=self.spans.tracing.ring if self.spans is not None else None)
        body = waterfall_json(waterfall)
        body["context"] = context
        body["asked"] = agents
        return _json(body)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        query = request.query
        raw_limit = query.get("limit", "200")
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_PAGE:
            raise ApiError(400, "limit", f"limit must be a whole number from 1 to {MAX_PAGE}")
        where = MessageFilter(
            context=query.get("context") or None, channel=query.get("channel") or None,
            type=query.get("type") or None, agent=query.get("agent") or None,
            text=query.get("q") or None, inbox=query.get("inbox", "") in ("1", "true"))
        before = query.get("before") or None
        try:
            entries, more = self.log.page(limit=int(raw_limit), before=before, where=where)
        except KeyError:
            raise ApiError(404, "before", f"no record {before!r} in the history kept (the "
                           f"newest {self.log.history}); page from the newest again") from None
        body = (b'{"messages":[' + b",".join(e.json for e in entries) + b'],"more":'
                + (b"true" if more else b"false") + b"}")
        return web.Response(body=body, content_type="application/json")

    async def _knowledge(self, request: web.Request) -> web.StreamResponse:
        knowledge = self._need_knowledge()
        raw_limit = request.query.get("limit", "50")
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_PAGE:
            raise ApiError(400, "limit", f"limit must be a whole number from 1 to {MAX_PAGE}")
        recent = await self._query(knowledge, _OBSERVATIONS_QUERY.format(limit=int(raw_limit)))
        size = await self._query(knowledge, _COUNT_QUERY)
        observations = [{"id": row.get("obs"), "about": row.get("about"),
                         "finding": row.get("finding"), "by": row.get("by"),
                         "at": row.get("at"), "context": row.get("context")}
                        for row in recent.rows]
        triples = int(size.rows[0].get("n", "0")) if size.rows else 0
        return _json({"observations": observations, "size": triples})

    # -- routes: acting ------------------------------------------------------------------

    async def _body(self, request: web.Request, *required: str) -> dict[str, Any]:
        if request.content_type != "application/json":
            raise ApiError(400, "content-type", "send the body as JSON with 'Content-Type: "
                           "application/json'")
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, "json", f"the body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "json", "the body must be a JSON object")
        for name in required:
            value = body.get(name)
            if not isinstance(value, str) or not value.strip():
                raise ApiError(400, "field", f"{name!r} is required: a non-empty string")
        for name, value in body.items():
            if value is not None and not isinstance(value, str):
                raise ApiError(400, "field", f"{name!r} must be a string")
        return body

    async def _deliver(self, channel: str, activity: Activity) -> dict[str, Any]:
        """Send on ``channel`` (direct: wait for the ack) and record it; an Offer gets
        its ``send`` span when tracing is on."""
        if self.spans is None:
            return await self._send_traced(channel, activity, None)
        trace, span = self.spans.sending(channel, activity)
        try:
            record = await self._send_traced(channel, activity, trace)
        except ApiError as exc:
            self.spans.sent(span, exc.reason)
            raise
        self.spans.sent(span)
        return record

    async def _send_traced(self, channel: str, activity: Activity,
                           trace: TraceContext | None) -> dict[str, Any]:
        if not channel.startswith(C.DIRECT_PREFIX):
            try:
                self.node.async_publish(channel, activity, trace=trace)
            except PorterError as exc:
                raise ApiError(502, "mesh", f"the mesh refused the message: {exc}") from None
            return self._local_record(channel, activity)
        recipient = channel[len(C.DIRECT_PREFIX):]
        try:
            done = self.node.async_send_nowait(recipient, activity, trace=trace)
        except UnknownPeerError:
            known = ", ".join(sorted(p.name for p in self.node.peers())) or "none"
            raise ApiError(404, "agent", f"no agent {recipient!r} on mesh "
                           f"{self.node.config.mesh!r} (known: {known})") from None
        except PorterError as exc:
            raise ApiError(502, "mesh", f"the mesh refused the message: {exc}") from None
        self._own_direct[activity] += 1
        if len(self._own_direct) > MAX_OWN_COPIES:  # copies that never came: forget them
            del self._own_direct[next(iter(self._own_direct))]
        record = self._local_record(channel, activity, recipient=recipient)
        try:
            await done
        except TimeoutError as exc:
            raise ApiError(504, "timeout", f"{exc}; the message was recorded but not "
                           "delivered") from None
        except DeliveryError as exc:
            raise ApiError(502, "delivery", str(exc)) from None
        return record

    async def _send(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, "channel", "text")
        channel = body["channel"].strip()
        if channel.startswith("@"):
            channel = C.DIRECT_PREFIX + channel[1:]
        kind = body.get("type") or default_type(channel, "human", body["text"])
        if kind not in SEND_TYPES:
            raise ApiError(400, "type", f"type must be one of {', '.join(SEND_TYPES)}")
        try:
            channel = check_channel(channel, self.me)
            context = body.get("context")
            context = normalise_context(context) if context else None
            if context is None and kind == "Offer":
                context = new_task_id()
            activity = compose(actor=self.me, channel=channel, text=body["text"], kind=kind,
                               context=context)
            if body.get("in_reply_to"):
                activity = activity.replace(extra={"inReplyTo": body["in_reply_to"]})
        except PorterError as exc:
            raise ApiError(400, "message", str(exc)) from None
        record = await self._deliver(channel, activity)
        return _json({"ok": True, "record": record, "context": context})

    async def _review(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, "context", "decision")
        decision, context = body["decision"], body["context"]
        reason = (body.get("reason") or "").strip()
        if decision not in ("approve", "reject"):
            raise ApiError(400, "decision", "decision must be 'approve' or 'reject'")
        if decision == "reject" and not reason:
            raise ApiError(400, "reason", "sending work back needs a reason the worker can act on")
        task = self.tracker.task(context)
        if task is None:
            raise ApiError(404, "task", f"no task {context!r} seen by this dashboard")
        review = task["review"]
        if review is None:
            raise ApiError(409, "review", f"task {context} has no review request waiting "
                           f"for {self.me} (it is {task['state']})")
        requester = review["from"]
        direct = str(review["channel"]).startswith(C.DIRECT_PREFIX)
        channel = C.DIRECT_PREFIX + requester if direct else C.CHANNEL_REVIEW
        kind = "Accept" if decision == "approve" else "Reject"
        text = reason or f"Approved by {self.me}"
        try:
            activity = compose(actor=self.me, channel=channel, text=text, kind=kind,
                               context=context, attempt=review.get("attempt"))
            if not direct:
                activity = activity.replace(target=requester)
        except PorterError as exc:
            raise ApiError(400, "message", str(exc)) from None
        record = await self._deliver(channel, activity)
        return _json({"ok": True, "record": record})

    async def _cancel(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, "context")
        context = body["context"]
        reason = (body.get("reason") or "").strip() or f"cancelled by {self.me}"
        task = self.tracker.task(context)
        if task is None:
            raise ApiError(404, "task", f"no task {context!r} seen by this dashboard")
        if task["state"] in _FINAL:
            raise ApiError(409, "cancel", f"task {context} is already {task['state']}; "
                           "nothing to cancel")
        # The holder stops and cascades; a task nobody holds is cancelled at its
        # requester (an architect's queue).
        target = task["holder"] or (None if is_human(task["offered_by"])
                                    else task["offered_by"])
        if target is None:
            raise ApiError(409, "cancel", f"task {context} is held by nobody and was "
                           "offered by the human: there is nothing to stop")
        record = await self._deliver(C.DIRECT_PREFIX + target,
                                     cancel_activity(self.me, context, reason, cancel=True))
        return _json({"ok": True, "record": record, "to": target})

    async def _control(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request, "kind")
        kind, target = body["kind"], body.get("to") or None
        if kind not in ("drain", "halt"):
            raise ApiError(400, "kind", "kind must be 'drain' or 'halt'")
        if target is not None and self.node.peer(target) is None:
            known = ", ".join(sorted(p.name for p in self.node.peers())) or "none"
            raise ApiError(404, "agent", f"no agent {target!r} on the roster (known: {known})")
        self.node.async_control(kind, target=target)
        return _json({"ok": True, "kind": kind, "to": target})

    def _need_knowledge(self) -> Knowledge:
        if self.knowledge is None:
            raise ApiError(409, "knowledge", "this dashboard runs without a knowledge replica; "
                           "start porter-mesh ui with a data directory")
        return self.knowledge

    async def _query(self, knowledge: Knowledge, sparql: str) -> Any:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._queries, knowledge.query, sparql)
        except QueryError as exc:
            raise ApiError(400, "query", str(exc)) from None

    async def _recall(self, request: web.Request) -> web.StreamResponse:
        knowledge = self._need_knowledge()
        body = await self._body(request, "query")
        result = await self._query(knowledge, body["query"])
        columns = list(result.variables)
        rows = [[row.get(c) for c in columns] for row in result.rows]
        return _json({"columns": columns, "rows": rows, "truncated": result.truncated})

    async def _remember(self, request: web.Request) -> web.StreamResponse:
        knowledge = self._need_knowledge()
        body = await self._body(request, "about", "finding")
        about, finding = body["about"].strip(), body["finding"].strip()
        try:
            context = normalise_context(body["context"]) if body.get("context") else None
            activity = remember_activity(self.me, f"Remembered: {about}"[:160], about, finding,
                                         context=context)
        except PorterError as exc:
            raise ApiError(400, "observation", str(exc)) from None
        if not self._first_write_done:
            # As the agents' replica does: a dashboard whose data directory was lost
            # learns its own earlier records (and next sequence number) first.
            self._first_write_done = True
            if self.node.peers() and not knowledge.caught_up_from():
                with contextlib.suppress(TimeoutError):
                    await knowledge.wait_caught_up(1, FIRST_WRITE_WAIT)
        try:
            record = knowledge.async_remember(activity)
        except KnowledgeError as exc:
            raise ApiError(400, "observation", str(exc)) from None
        self._local_record(C.CHANNEL_LOG, activity)
        body_id = getattr(record.body, "iri", None)
        return _json({"ok": True, "id": body_id, "origin": record.origin, "seq": record.seq})


def new_token() -> str:
    """A fresh random token (URL-safe)."""
    return secrets.token_urlsafe(24)

