"""Mesh agents served to A2A clients, on the official SDK's server side.

One :class:`A2AGateway` is one mesh node (a seat of the human user, so the mesh's
workers ask it for review as they ask the dashboard) and one HTTP server. For each
served agent it mounts the SDK's agent card, JSON-RPC and REST routes over a
:class:`MeshExecutor`; the SDK keeps the tasks (in a :class:`~.store.FileTaskStore`)
and speaks the protocol, the executor translates (:mod:`.mapping`).

How a task flows::

    A2A client --SendMessage--> SDK --execute()--> Offer on task:<agent>
    mesh activity in the task's context --node handler--> translate() --> events
        events --(numbered, logged)--> the running execute() --> SDK --> client
                                 \\--> straight into the task store when none runs

An ``execute()`` runs while the task works and returns when it ends or waits on the
client (``input-required``); the client's next message starts another, which answers
the agent. Every event carries its sequence number (``porter.seq`` in its metadata) and
is kept in the :class:`~.store.EventLog`; a ``SubscribeToTask`` with an SSE
``Last-Event-ID`` header is served from that log (replay, then live), so a client that
lost its stream, even across a restart of the gateway, misses nothing.

A client's W3C ``traceparent``/``tracestate`` headers are continued: the gateway's
``send`` of the Offer (and of each later message of the task) is a child of the
caller's span, so every span the mesh makes for the task is in the caller's trace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pathlib
import secrets
import socket
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from a2a.helpers.proto_helpers import get_message_text
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import (
    DefaultServerCallContextBuilder,
    create_agent_card_routes,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Artifact,
    HTTPAuthSecurityScheme,
    Message,
    Part,
    Role,
    SecurityRequirement,
    SecurityScheme,
    StreamResponse,
    StringList,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import InternalError
from google.protobuf import json_format
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from porter_mesh.core import constants as C
from porter_mesh.core.as2 import Activity
from porter_mesh.core.lifecycle import Status, TaskRecord, follow
from porter_mesh.core.tracecontext import TraceContext, valid_traceparent, valid_tracestate
from porter_mesh.errors import NotHandled, PorterError, StorageError
from porter_mesh.gateways.a2a.mapping import (
    Ask,
    FileArtifact,
    Step,
    a2a_state,
    answer_for,
    ask_of,
    cancel_for,
    mesh_context,
    note_for,
    offer_for,
    translate,
)
from porter_mesh.gateways.a2a.store import EventLog, FileTaskStore
from porter_mesh.node.node import Message as MeshMessage
from porter_mesh.node.node import Node
from porter_mesh.tracing.seat import SeatSpans
from porter_mesh.tracing.views import serve_spans

__all__ = ["A2AGateway", "MeshExecutor"]

log = logging.getLogger("porter_mesh.a2a")

#: Metadata keys the gateway puts on tasks and events.
SEQ_KEY = "porter.seq"
STATE_KEY = "porter.state"
AGENT_KEY = "porter.agent"
CONTEXT_KEY = "porter.context"
TRACE_KEY = "porter.traceparent"
TRACESTATE_KEY = "porter.tracestate"
RECORD_KEY = "porter.task"
STREAM_KEY = "porter.streaming"

#: A card path, served without the bearer token (clients read it to learn the scheme).
CARD_PATH = "/.well-known/agent-card.json"


@dataclass
class _Held:
    """One task the gateway requested, as it follows it."""

    task_id: str
    context_id: str
    agent: str
    requester: str
    record: TaskRecord | None = None
    live: asyncio.Queue[StreamResponse] | None = None
    traceparent: str | None = None
    tracestate: str | None = None
    #: The latest status and every artifact, as logged: what the stored task must show.
    status: TaskStatus | None = None
    artifacts: dict[str, Artifact] = field(default_factory=dict)

    def learn(self, response: StreamResponse) -> None:
        """Keep what a logged event says the task now is."""
        if response.HasField("status_update"):
            self.status = response.status_update.status
        elif response.HasField("artifact_update"):
            artifact = response.artifact_update.artifact
            self.artifacts[artifact.artifact_id] = artifact

    def reconcile(self, task: Task) -> None:
        """Bring a task about to be stored up to the log: its latest status and every
        artifact. The SDK stores a task as its execution saw it, and the gateway stores
        what the mesh says between executions; whichever writes last, the stored task
        ends up as the log says."""
        if self.status is not None and task.status != self.status:
            task.status.CopyFrom(self.status)
            if self.status.HasField("message") and not any(
                    m.message_id == self.status.message.message_id for m in task.history):
                task.history.append(self.status.message)
        have = {a.artifact_id: i for i, a in enumerate(task.artifacts)}
        for artifact_id, artifact in self.artifacts.items():
            if artifact_id in have:
                task.artifacts[have[artifact_id]].CopyFrom(artifact)
            else:
                task.artifacts.append(artifact)

    @property
    def mesh_context(self) -> str:
        return mesh_context(self.task_id)

    @property
    def final(self) -> bool:
        return self.record is not None and self.record.final

    @property
    def ask(self) -> Ask | None:
        return ask_of(self.record, self.requester) if self.record is not None else None


def _agent_message(held: _Held, text: str) -> Message:
    return Message(message_id=str(uuid.uuid4()), role=Role.ROLE_AGENT, task_id=held.task_id,
                   context_id=held.context_id, parts=[Part(text=text)])


def _status(held: _Held, record: TaskRecord, text: str) -> StreamResponse:
    status = TaskStatus(state=TaskState.Value(a2a_state(record, held.requester)))
    if text:
        status.message.CopyFrom(_agent_message(held, text))
    status.timestamp.GetCurrentTime()
    event = TaskStatusUpdateEvent(task_id=held.task_id, context_id=held.context_id,
                                  status=status)
    event.metadata.update({STATE_KEY: record.status.value, RECORD_KEY: record.to_json()})
    return StreamResponse(status_update=event)


def _record_from(data: dict[str, Any]) -> TaskRecord:
    """A :class:`TaskRecord` from its ``to_json`` form (as kept in event metadata)."""
    attempt = data.get("attempt")
    return TaskRecord(
        context=str(data["context"]), title=str(data.get("title", "")),
        requester=str(data["requester"]), holder=data.get("holder"),
        status=Status(data["state"]),
        attempt=int(attempt) if attempt is not None else None, parent=data.get("parent"),
        reviewer=data.get("reviewer"), question=str(data.get("question", "")),
        note=str(data.get("note", "")), created=float(data.get("created", 0.0)),
        updated=float(data.get("updated", 0.0)))


def _artifact(held: _Held, item: FileArtifact, seq_hint: int) -> StreamResponse:
    artifact_id = f"file:{item.path}" if item.path else f"{item.name}-{seq_hint}"
    parts: list[Part] = []
    if item.text is not None:
        parts.append(Part(text=item.text))
    if item.path is not None:
        parts.append(json_format.ParseDict({"data": {"path": item.path}}, Part()))
    if not parts:
        parts.append(Part(text=item.description))
    artifact = Artifact(artifact_id=artifact_id, name=item.name, description=item.description,
                        parts=parts)
    event = TaskArtifactUpdateEvent(task_id=held.task_id, context_id=held.context_id,
                                    artifact=artifact, append=False, last_chunk=True)
    return StreamResponse(artifact_update=event)


def _inner(response: StreamResponse) -> Any:
    return getattr(response, response.WhichOneof("payload") or "task")


def _ends_execution(response: StreamResponse) -> bool:
    if not response.HasField("status_update"):
        return False
    state = response.status_update.status.state
    return state in (TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_COMPLETED,
                     TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED,
                     TaskState.TASK_STATE_REJECTED)


class MeshExecutor(AgentExecutor):
    """The SDK's agent executor for one mesh agent: hands the client's messages to it
    and forwards what the mesh says about the task until it ends or waits on the client.

    Args:
        gateway: the gateway that owns the node, the log and the store.
        agent: the mesh agent served.
    """

    def __init__(self, gateway: A2AGateway, agent: str) -> None:
        self.gateway = gateway
        self.agent = agent

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        try:
            await self._execute(context, event_queue)
        except StorageError as exc:
            raise InternalError(message=self.gateway.refused("storage", str(exc))) from exc

    async def _execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        gw = self.gateway
        message = context.message
        task_id = context.task_id or ""
        text = get_message_text(message) if message is not None else ""
        held = gw.held.get(task_id)
        first = context.current_task is None or held is None
        if first:
            held = gw.track(task_id, context.context_id or "", self.agent,
                            *_trace_headers(context.call_context))
            task = Task(id=task_id, context_id=held.context_id,
                        status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED))
            if message is not None:
                task.history.append(message)
            meta = {AGENT_KEY: self.agent, CONTEXT_KEY: held.mesh_context}
            if held.traceparent:
                meta[TRACE_KEY] = held.traceparent
                if held.tracestate:
                    meta[TRACESTATE_KEY] = held.tracestate
            task.metadata.update(meta)
            await event_queue.enqueue_event(_inner(gw.record(held, StreamResponse(task=task),
                                                             forward=False)))
        assert held is not None
        queue: asyncio.Queue[StreamResponse] = asyncio.Queue()
        held.live = queue
        streaming = _streaming(context.call_context)
        answering = held.ask is not None
        try:
            problem = await self._hand_over(held, text, first,
                                            _trace_of(*_trace_headers(context.call_context))
                                            or _trace_of(held.traceparent, held.tracestate))
            if problem is not None:
                failed = gw.force(held, Status.FAILED, gw.refused(*problem), forward=False)
                await event_queue.enqueue_event(_inner(failed))
                return
            if not (streaming or first or answering):
                return  # a note on a running task: nothing changes at once
            while True:
                if streaming:
                    response = await queue.get()
                else:
                    try:
                        response = await asyncio.wait_for(queue.get(), gw.settle)
                    except TimeoutError:
                        return  # not taken yet: the task stays submitted
                await event_queue.enqueue_event(_inner(response))
                if _ends_execution(response) or (not streaming
                                                 and response.HasField("status_update")):
                    # A blocking SendMessage returns once the agent has taken the task
                    # (or the answer): mesh tasks run for minutes to days, and the client
                    # follows them with GetTask or SubscribeToTask.
                    break
        finally:
            held.live = None
            while not queue.empty():  # said after the end of this execution
                gw.write_later(held, queue.get_nowait())

    async def _hand_over(self, held: _Held, text: str, first: bool,
                         trace: TraceContext | None) -> tuple[str, str] | None:
        """Send the client's message into the mesh; returns what went wrong (a reason and
        words for the client), if anything. ``trace`` is the caller's trace context (this
        request's, else the task's first): the message continues it.

        The gateway's own activity is followed first (an Offer starts the task's record,
        an approval completes it), so that the agent's reply always finds it."""
        gw = self.gateway
        me = gw.node.name
        try:
            ask = held.ask
            if first:
                activity = offer_for(me, self.agent, text, held.task_id)
                channel = C.DIRECT_PREFIX + self.agent
                held.record = follow(None, activity, sender=me, channel=channel,
                                     now=time.time())
            elif ask is not None:
                channel, activity = answer_for(me, ask, text, held.task_id)
                gw.observe(held, activity, channel=channel, sender=me)
            else:
                channel = C.DIRECT_PREFIX + self.agent
                activity = note_for(me, self.agent, text, held.task_id)
        except ValueError as exc:
            return "bad-message", str(exc)
        return await gw.deliver(channel, activity, trace)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        try:
            await self._cancel(context, event_queue)
        except StorageError as exc:
            raise InternalError(message=self.gateway.refused("storage", str(exc))) from exc

    async def _cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        gw = self.gateway
        task_id = context.task_id or ""
        held = gw.held.get(task_id) or gw.track(task_id, context.context_id or "",
                                                self.agent, None)
        held.live = None
        withdrawal = cancel_for(gw.node.name, task_id)
        problem = await gw.deliver(C.DIRECT_PREFIX + self.agent, withdrawal)
        said = (f"Cancelled; {self.agent} was told to stop" if problem is None
                else f"Cancelled; {self.agent} could not be told ({gw.refused(*problem)})")
        response = gw.force(held, Status.CANCELLED, said, forward=False)
        await event_queue.enqueue_event(_inner(response))


def _streaming(call: ServerCallContext | None) -> bool:
    """Whether the call is a streaming one (SendStreamingMessage, or REST message:stream)."""
    if call is None:
        return False
    return bool(call.state.get("method") == "SendStreamingMessage"
                or call.state.get(STREAM_KEY))


class _CallContexts(DefaultServerCallContextBuilder):
    """The SDK's call context, marked when a REST call streams (JSON-RPC names its
    method in the context; REST says it only by its path)."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        context.state[STREAM_KEY] = request.url.path.endswith(":stream")
        return context


def _trace_headers(call: ServerCallContext | None) -> tuple[str | None, str | None]:
    """The request's W3C ``traceparent`` and ``tracestate`` headers (either may be
    ``None``; a malformed one is ``None``)."""
    if call is None:
        return None, None
    headers = call.state.get("headers") or {}
    parent, state = headers.get("traceparent"), headers.get("tracestate")
    if not valid_traceparent(parent):
        return None, None
    return parent, state if valid_tracestate(state) else None


def _trace_of(traceparent: str | None, tracestate: str | None) -> TraceContext | None:
    return None if traceparent is None else TraceContext(traceparent, tracestate)


class _BearerAuth:
    """Refuse every request without ``Authorization: Bearer <token>``, except the cards."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].endswith(CARD_PATH):
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope["headers"]:
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                given = value[7:].strip()
        if not secrets.compare_digest(given, self.token):
            response = JSONResponse(
                {"error": "a bearer token is required: send 'Authorization: Bearer <token>' "
                          "(the token porter-mesh a2a printed or was given with --token)"},
                status_code=401, headers={"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class A2AGateway:
    """Serve mesh agents to A2A clients.

    Args:
        node: the gateway's node (not started yet; :meth:`astart` starts it).
        agents: the mesh agents to serve (at least one).
        data_dir: where the event log and the tasks live (``None``: memory only).
        host: the address to listen on.
        port: the TCP port (0 picks a free one).
        token: a bearer token every call but the card's must carry, or ``None``.
        settle: seconds a first message waits for its agent to appear on the mesh.
        deliver_timeout: seconds a message to the agent may take to be acknowledged.
        spans: the gateway's spans (tracing on): each message it sends into the mesh
            gets a ``send`` span under the caller's ``traceparent``, kept in the
            gateway's ring (served to ``porter-mesh trace``) and exported.

    Raises:
        ValueError: no agent.
    """

    def __init__(self, node: Node, agents: Sequence[str], *, data_dir: pathlib.Path | None,
                 host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 settle: float = 10.0, deliver_timeout: float = 30.0,
                 spans: SeatSpans | None = None) -> None:
        if not agents:
            raise ValueError("name at least one mesh agent to serve (--agent NAME)")
        self.node = node
        self.agents = tuple(dict.fromkeys(agents))
        self.data_dir = data_dir
        self.host = host
        self.token = token
        self.settle = settle
        self.deliver_timeout = deliver_timeout
        self.spans = spans
        self.held: dict[str, _Held] = {}
        self._by_context: dict[str, _Held] = {}
        self.log = EventLog(data_dir / "events.jsonl" if data_dir is not None else None)
        self.stores = {agent: FileTaskStore(data_dir / "tasks" / agent
                                            if data_dir is not None else None,
                                            reconcile=self._reconcile,
                                            on_error=self._save_failed)
                       for agent in self.agents}
        self._writes: asyncio.Queue[tuple[_Held, StreamResponse]] | None = None
        self._writer: asyncio.Task[None] | None = None
        self._server: Any = None
        self._serving: asyncio.Task[None] | None = None
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port: int = self._sock.getsockname()[1]
        #: Requests the gateway could not carry out, by reason (``failed.<reason>``).
        self.counters: dict[str, int] = {}

    # -- the URLs --------------------------------------------------------------------------

    def prefix(self, agent: str) -> str:
        """The path under which ``agent`` is served: the root with one agent, else
        ``/agents/<name>``."""
        return "" if len(self.agents) == 1 else f"/agents/{agent}"

    def url(self, agent: str | None = None) -> str:
        """The base URL a client gives the SDK for ``agent`` (host ``localhost``)."""
        host = "localhost" if self.host in ("127.0.0.1", "::1", "localhost") else self.host
        base = f"http://{host}:{self.port}"
        return base + (self.prefix(agent) if agent is not None else "")

    # -- tasks -----------------------------------------------------------------------------

    def track(self, task_id: str, context_id: str, agent: str,
              traceparent: str | None, tracestate: str | None = None) -> _Held:
        """Start following ``task_id`` (its mesh context must be valid)."""
        held = _Held(task_id, context_id, agent, self.node.name, traceparent=traceparent,
                     tracestate=tracestate)
        self.held[task_id] = held
        self._by_context[held.mesh_context] = held
        return held

    def record(self, held: _Held, response: StreamResponse, *, forward: bool = True,
               ) -> StreamResponse:
        """Number ``response``, log it, and (``forward``) pass it on: to the running
        execution, else straight into the task store. Returns it, numbered."""
        seq = self.log.last(held.task_id) + 1
        _inner(response).metadata.update({SEQ_KEY: seq})
        self.log.append(held.task_id, json_format.MessageToDict(response))
        held.learn(response)
        if forward:
            if held.live is not None:
                held.live.put_nowait(response)
            else:
                self.write_later(held, response)
        return response

    def step(self, held: _Held, step: Step, *, forward: bool = True) -> list[StreamResponse]:
        """Turn a :class:`~.mapping.Step` into numbered events (artifacts first, then the
        status: a new state, or the agent's words in the same state)."""
        out = [self.record(held, _artifact(held, item, self.log.last(held.task_id) + 1),
                           forward=forward) for item in step.artifacts]
        if step.changed or step.text:
            out.append(self.record(held, _status(held, step.record, step.text),
                                   forward=forward))
        # Only once it is logged: a write that failed leaves the task where it was, so
        # the same activity, delivered again, is translated again.
        held.record = step.record
        return out

    def force(self, held: _Held, status: Status, text: str, *, forward: bool = True,
              ) -> StreamResponse:
        """End a task in ``status`` on the gateway's own account (its agent could not be
        reached, or the client cancelled it); returns the numbered status event."""
        record = held.record or TaskRecord(held.mesh_context, "", self.node.name, held.agent)
        held.record = replace(record, status=status, note=text, updated=time.time())
        return self.record(held, _status(held, held.record, text), forward=forward)

    def observe(self, held: _Held, activity: Activity, *, channel: str, sender: str) -> None:
        """Follow one activity in ``held``'s context (the gateway's own too)."""
        step = translate(held.record, activity, channel=channel, sender=sender,
                         requester=self.node.name, now=time.time())
        if step is not None:
            self.step(held, step)

    def tasks_view(self) -> dict[str, Any]:
        """The ``tasks`` section of the node's view (``porter-mesh tasks`` gathers it):
        the tasks requested through A2A, in the mesh's vocabulary."""
        return {"agent": self.node.name,
                "tasks": [h.record.to_json() for h in self.held.values()
                          if h.record is not None]}

    def _reconcile(self, task: Task) -> None:
        held = self.held.get(task.id)
        if held is not None:
            held.reconcile(task)

    def write_later(self, held: _Held, response: StreamResponse) -> None:
        """Apply an event to the stored task (no execution is running to do it)."""
        if self._writes is not None:
            self._writes.put_nowait((held, response))

    async def _write_loop(self) -> None:
        assert self._writes is not None
        while True:
            held, response = await self._writes.get()
            try:
                await self._apply(held, response)
            except StorageError as exc:
                self.refused("storage", str(exc))
            except Exception:
                log.exception("a2a: could not update task %s in the store", held.task_id)

    async def _apply(self, held: _Held, response: StreamResponse) -> None:
        store = self.stores[held.agent]
        call = ServerCallContext()
        task = await store.get(held.task_id, call)
        if task is not None:
            await store.save(task, call)  # the store reconciles it with the log

    async def deliver(self, channel: str, activity: Activity,
                      trace: TraceContext | None = None) -> tuple[str, str] | None:
        """Send ``activity`` on ``channel`` (direct ones acknowledged); returns what went
        wrong (a reason, and words a client can act on), or ``None``.

        ``trace`` is the caller's trace context: the message continues it (under the
        gateway's ``send`` span when tracing is on, else directly)."""
        if self.spans is None:
            return await self._deliver(channel, activity, trace)
        sent_trace, span = self.spans.sending(channel, activity, trace)
        try:
            problem = await self._deliver(channel, activity, sent_trace)
        except BaseException as exc:  # the client went away meanwhile: the span ends too
            self.spans.sent(span, f"{type(exc).__name__}: {exc}")
            raise
        self.spans.sent(span, None if problem is None else problem[1])
        return problem

    async def _deliver(self, channel: str, activity: Activity,
                       trace: TraceContext | None) -> tuple[str, str] | None:
        if channel.startswith(C.DIRECT_PREFIX):
            agent = channel[len(C.DIRECT_PREFIX):]
            if self.node.peer(agent) is None:
                with contextlib.suppress(TimeoutError, PorterError):
                    await self.node.wait_for_peers([agent], timeout=self.settle)
            if self.node.peer(agent) is None:
                return "agent-absent", (f"agent {agent} is not on mesh "
                                        f"{self.node.config.mesh!r}: start it, or check the "
                                        "gateway's --mesh")
        try:
            await self.node.send_to_channel(channel, activity, timeout=self.deliver_timeout,
                                            trace=trace)
        except PorterError as exc:
            return "undeliverable", f"could not deliver to {channel}: {exc}"
        return None

    def refused(self, reason: str, text: str) -> str:
        """Count a request the gateway could not carry out (``failed.<reason>`` in
        :attr:`counters`), log the first of each reason, and return ``text``."""
        key = f"failed.{reason}"
        self.counters[key] = self.counters.get(key, 0) + 1
        if self.counters[key] == 1:
            log.warning("a2a: %s (further %s are only counted)", text, key)
        else:
            log.debug("a2a: %s", text)
        return text

    def _save_failed(self, exc: StorageError) -> None:
        self.refused("storage", str(exc))

    def on_message(self, msg: MeshMessage) -> None:
        """The node's handler: activities in a followed task's context become events."""
        context = msg.activity.context
        held = self._by_context.get(context) if context is not None else None
        if held is None:
            return
        if msg.sender == self.node.name:
            return
        try:
            self.observe(held, msg.activity, channel=msg.channel, sender=msg.sender)
        except StorageError as exc:
            # Not taken: a direct message stays owed and comes again once there is room.
            raise NotHandled(self.refused("storage", str(exc))) from exc

    def _restore(self) -> None:
        """Follow again the tasks of an earlier run, from the event log."""
        for task_id in self.log.tasks():
            events = [e for _, e in self.log.since(task_id, 0)]
            first = events[0].get("task") if events else None
            if not first:
                continue
            meta = first.get("metadata") or {}
            agent = meta.get(AGENT_KEY)
            if agent not in self.agents:
                continue
            held = self.track(task_id, first.get("contextId", ""), agent,
                              meta.get(TRACE_KEY), meta.get(TRACESTATE_KEY))
            held.record = TaskRecord(held.mesh_context, "", self.node.name, agent)
            for event in events:
                with contextlib.suppress(json_format.ParseError):
                    held.learn(json_format.ParseDict(event, StreamResponse(),
                                                     ignore_unknown_fields=True))
                kept = ((event.get("statusUpdate") or {}).get("metadata") or {}).get(RECORD_KEY)
                if isinstance(kept, dict):
                    try:
                        held.record = _record_from(kept)
                    except (KeyError, ValueError, TypeError) as exc:
                        log.warning("a2a: task %s: an unreadable record in the log: %s",
                                    task_id, exc)

    # -- the card --------------------------------------------------------------------------

    def card(self, agent: str) -> AgentCard:
        """The agent card of ``agent``, from its advert when the mesh knows it."""
        peer = self.node.peer(agent)
        role = peer.advert.role if peer is not None else "worker"
        tools = tuple(peer.advert.tools) if peer is not None else ()
        url = self.url(agent)
        card = AgentCard(
            name=agent,
            description=f"{agent}, a {role} on the porter-mesh mesh "
                        f"{self.node.config.mesh!r}: send it a task in plain text; it "
                        "reports progress, files and commands as it works, and asks you to "
                        "review its work (reply 'approve' or say what to change).",
            version="1.0.0",
            capabilities=AgentCapabilities(streaming=True, push_notifications=False),
            default_input_modes=["text/plain"],
            default_output_modes=["text/plain", "application/json"],
            supported_interfaces=[
                AgentInterface(url=url + "/", protocol_binding="JSONRPC",
                               protocol_version="1.0"),
                AgentInterface(url=url + "/rest", protocol_binding="HTTP+JSON",
                               protocol_version="1.0"),
            ],
            skills=[AgentSkill(
                id=f"{role}-task", name=f"{role} task",
                description=f"Do a task as a mesh {role}"
                            + (f" with the tools {', '.join(tools)}" if tools else ""),
                tags=[role, *tools], examples=["Add a GET /users endpoint"])],
        )
        if self.token is not None:
            card.security_schemes["bearer"].CopyFrom(SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="bearer", description="the token porter-mesh a2a printed")))
            card.security_requirements.append(SecurityRequirement(
                schemes={"bearer": StringList()}))
        return card

    def _directory_card(self) -> AgentCard:
        """The root card when several agents are served: one skill per agent, naming
        the URL of its own card."""
        card = AgentCard(
            name=f"porter-mesh {self.node.config.mesh}",
            description="Mesh agents served over A2A. Each skill is one agent; its card is "
                        f"at <its URL>{CARD_PATH}, and a client talks to that URL.",
            version="1.0.0", capabilities=AgentCapabilities(streaming=True),
            default_input_modes=["text/plain"], default_output_modes=["text/plain"],
            supported_interfaces=[AgentInterface(url=self.url(self.agents[0]) + "/",
                                                 protocol_binding="JSONRPC",
                                                 protocol_version="1.0")],
            skills=[AgentSkill(id=agent, name=agent, tags=["mesh-agent"],
                               description=f"agent {agent}: {self.url(agent)}"
                                           f"{CARD_PATH}")
                    for agent in self.agents])
        return card

    # -- the app ---------------------------------------------------------------------------

    def _agent_routes(self, agent: str) -> list[BaseRoute]:
        card = self.card(agent)
        handler = DefaultRequestHandler(agent_executor=MeshExecutor(self, agent),
                                        task_store=self.stores[agent], agent_card=card)

        async def fresh_card(_: AgentCard) -> AgentCard:
            return self.card(agent)

        jsonrpc = create_jsonrpc_routes(handler, "/")
        rest = create_rest_routes(handler, context_builder=_CallContexts(), path_prefix="/rest")
        sdk_rpc = next(r.endpoint for r in jsonrpc if isinstance(r, Route))
        sdk_sub = next(r.endpoint for r in rest
                       if isinstance(r, Route) and r.path == "/rest/tasks/{id}:subscribe")

        async def rpc(request: Request) -> Response:
            try:
                body = orjson.loads(await request.body())
            except orjson.JSONDecodeError:
                body = None
            if isinstance(body, dict) and body.get("method") == "SubscribeToTask":
                params = body.get("params") or {}
                mine = await self._subscription(agent, str(params.get("id", "")),
                                                request.headers.get("last-event-id"),
                                                rpc_id=body.get("id"))
                if mine is not None:
                    return mine
            response: Response = await sdk_rpc(request)
            return response

        async def rest_sub(request: Request) -> Response:
            mine = await self._subscription(agent, request.path_params["id"],
                                            request.headers.get("last-event-id"), rpc_id=None)
            if mine is not None:
                return mine
            response: Response = await sdk_sub(request)
            return response

        return [*create_agent_card_routes(card, card_modifier=fresh_card),
                Route("/", rpc, methods=["POST"]),
                Route("/rest/tasks/{id}:subscribe", rest_sub, methods=["GET", "POST"]),
                *rest]

    async def _subscription(self, agent: str, task_id: str, last: str | None, *,
                            rpc_id: Any) -> Response | None:
        """Serve a ``SubscribeToTask`` from the event log, or ``None`` to leave it to the
        SDK (a task the gateway does not know, or one whose execution is running and
        no ``Last-Event-ID`` was given).

        With ``Last-Event-ID: N`` the stream is every event after N, then the live ones;
        without, it starts with the task as stored. Either way it ends when the task ends,
        or when it waits on the client and nothing came after."""
        held = self.held.get(task_id)
        if held is None or held.agent != agent or (last is None and held.live is not None):
            return None
        first: dict[str, Any] | None = None
        if last is None:
            if held.record is not None and held.record.final:
                return _error(rpc_id, -32004, f"task {task_id} is "
                              f"{held.record.status.value}: there is nothing more to stream "
                              "(GetTask reads it)", 400)
            after = self.log.last(task_id)
            task = await self.stores[agent].get(task_id, ServerCallContext())
            if task is not None:
                first = json_format.MessageToDict(StreamResponse(task=task))
        else:
            try:
                after = int(last)
            except ValueError:
                after = -1
            if after < 0:
                return _error(rpc_id, -32602, "Last-Event-ID must be the sequence number of "
                              f"the last event seen (porter.seq, 0 or more), not {last!r}", 400)

        def frame(n: int, event: dict[str, Any]) -> bytes:
            data = event if rpc_id is None else {"jsonrpc": "2.0", "id": rpc_id,
                                                 "result": event}
            return b"id: %d\ndata: %s\n\n" % (n, orjson.dumps(data))

        async def events() -> AsyncIterator[bytes]:
            seq = after
            if first is not None:
                yield frame(seq, first)
            while True:
                for n, event in self.log.since(task_id, seq):
                    seq = n
                    yield frame(n, event)
                    status = event.get("statusUpdate")
                    if status is not None and _ends_stream(status, latest=n == self.log.last(
                            task_id)):
                        return
                if not await self.log.wait(task_id, seq, 15.0):
                    yield b": keep-alive\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})

    def app(self) -> ASGIApp:
        """The ASGI application: every agent's routes (at the root with one agent, under
        ``/agents/<name>`` with several, beside a root card listing them)."""
        routes: list[BaseRoute]
        if len(self.agents) == 1:
            routes = self._agent_routes(self.agents[0])
        else:
            routes = [Mount(self.prefix(agent), routes=self._agent_routes(agent))
                      for agent in self.agents]
            routes.insert(0, *create_agent_card_routes(self._directory_card()))
        app: ASGIApp = Starlette(routes=routes)
        if self.token is not None:
            app = _BearerAuth(app, self.token)
        return app

    # -- running ---------------------------------------------------------------------------

    async def astart(self) -> None:
        """Load earlier tasks, start the node and the HTTP server."""
        import uvicorn

        for store in self.stores.values():
            await store.load()
        self._restore()
        self.node.add_handler(self.on_message)
        self.node.view_sections["tasks"] = self.tasks_view
        if self.spans is not None:
            serve_spans(self.node, self.spans.tracing.ring)
        await self.node.astart()
        self._writes = asyncio.Queue()
        self._writer = asyncio.create_task(self._write_loop())
        config = uvicorn.Config(self.app(), log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None
        self._sock.listen(128)
        self._sock.setblocking(False)
        self._serving = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        while not self._server.started:
            if self._serving.done():
                await self._serving  # raises what stopped it
                raise RuntimeError("the A2A HTTP server stopped while starting")
            await asyncio.sleep(0.01)

    async def wait_closed(self) -> None:
        """Wait until the HTTP server stops."""
        if self._serving is not None:
            await self._serving

    async def aclose(self) -> None:
        """Stop serving, close the node and the log."""
        if self._server is not None:
            self._server.should_exit = True
        if self._serving is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._serving, 5)
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(BaseException):
                await self._writer
        await self.node.aclose()
        if self.spans is not None:
            self.spans.close()  # after the node: the last spans are exported
        self.log.close()
        self._sock.close()


def _ends_stream(status: dict[str, Any], *, latest: bool) -> bool:
    """Whether a replayed status ends the stream: a terminal one always, a wait on the
    client only when nothing came after it (else the replay goes on past it)."""
    state = (status.get("status") or {}).get("state")
    if state == "TASK_STATE_INPUT_REQUIRED":
        return latest
    return state in ("TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED",
                     "TASK_STATE_REJECTED")


def _error(rpc_id: Any, code: int, message: str, status: int) -> Response:
    """A JSON-RPC error (``rpc_id`` given) or a REST one."""
    error = {"code": code, "message": message}
    if rpc_id is None:
        return JSONResponse({"error": error}, status_code=status)
    return JSONResponse({"jsonrpc": "2.0", "id": rpc_id, "error": error})

