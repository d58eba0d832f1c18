"""An outside A2A agent joined to the mesh as a worker (``porter-mesh a2a --join URL``).

The worker's node is named ``--name`` and advertises ``--slots``; it appears in
``peers``, the dashboard and ``tasks`` like any worker. What it does:

* an Offer on its ``task:<name>`` is accepted (or rejected when every slot is taken) and
  becomes a ``SendMessage`` to the A2A agent through the SDK's client (streaming when
  the agent's card says it can); the A2A task id is kept with the mesh context;
* the agent's events come back as the profile's activities in the task's context:
  a status with words is an ``Update`` note on ``log``, an artifact a ``Create`` of a
  ``Document`` (its text as the content), ``input-required`` a ``Question`` to the
  requester (whose next direct message in that context is sent to the agent as the
  answer), ``completed`` an ``Announce`` on ``log`` tagged ``done``, ``failed`` one
  tagged ``failed``, ``rejected`` a ``Reject`` to the requester, ``canceled`` an
  ``Announce`` tagged ``cancelled`` (the mesh's task vocabulary,
  :mod:`porter_mesh.core.lifecycle`);
* a withdrawal of the task (the mesh's cancel) becomes ``CancelTask``, confirmed with
  an ``Announce`` tagged ``cancelled``;
* an agent that cannot be reached or breaks the protocol fails the task (an
  ``Announce`` tagged ``failed`` saying what happened).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any

from a2a.client import ClientConfig, create_client
from a2a.helpers.proto_helpers import get_message_text
from a2a.types.a2a_pb2 import (
    Artifact,
    CancelTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    TaskState,
)

from porter_mesh.core import as2
from porter_mesh.core import constants as C
from porter_mesh.core.as2 import Activity
from porter_mesh.core.lifecycle import CANCELLED_TAG, DONE_TAG, FAILED_TAG
from porter_mesh.core.tasks import is_task_delete
from porter_mesh.errors import PorterError
from porter_mesh.node.node import Message as MeshMessage
from porter_mesh.node.node import Node
from porter_mesh.tools.ledger import TaskLedger

__all__ = ["JoinedAgent", "run_joined"]

log = logging.getLogger("porter_mesh.a2a")


@dataclass
class _Job:
    """One mesh task handed to the outside agent."""

    context: str
    requester: str
    a2a_task: str = ""
    a2a_context: str = ""
    answers: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    runner: asyncio.Task[None] | None = None


def _text_of(activity: Activity) -> str:
    obj = activity.object
    if isinstance(obj, as2.ASObject) and obj.content:
        return obj.content
    return activity.content or activity.summary


def _artifact_text(artifact: Artifact) -> str:
    return "\n".join(p.text for p in artifact.parts if p.HasField("text"))


class JoinedAgent:
    """An outside A2A agent on the mesh as worker ``node.name``.

    Args:
        node: the worker's node (not started yet).
        url: the A2A agent's base URL (its card is read from it).
        slots: tasks held at once.
    """

    def __init__(self, node: Node, url: str, *, slots: int) -> None:
        self.node = node
        self.url = url
        self.slots = slots
        self.jobs: dict[str, _Job] = {}
        self._client: Any = None
        #: The tasks it holds, as 'porter-mesh tasks' asks every agent for them.
        self.ledger = TaskLedger(node.name)
        node.view_sections["tasks"] = self.ledger.view

    async def astart(self) -> None:
        """Read the agent's card, then join the mesh."""
        self._client = await create_client(self.url, ClientConfig(streaming=True))
        self.node.add_handler(self.on_message)
        await self.node.astart()

    async def aclose(self) -> None:
        for job in list(self.jobs.values()):
            if job.runner is not None:
                job.runner.cancel()
        for job in list(self.jobs.values()):
            if job.runner is not None:
                with contextlib.suppress(BaseException):
                    await job.runner
        if self._client is not None:
            await self._client.close()
        await self.node.aclose()

    # -- the mesh side ---------------------------------------------------------------------

    def on_message(self, msg: MeshMessage) -> None:
        act = msg.activity
        ctx = act.context
        self.ledger.saw(act, sender=msg.sender, channel=msg.channel)
        if not msg.direct or ctx is None:
            return
        job = self.jobs.get(ctx)
        if is_task_delete(act):
            if job is not None:
                self._spawn(self._cancel(job))
            return
        if act.type == "Offer" and job is None:
            if len(self.jobs) >= self.slots:
                self._say(msg.sender, as2.reject(self.node.name, "Busy: all my slots are taken",
                                                 context=ctx))
                return
            job = _Job(ctx, msg.sender)
            self.jobs[ctx] = job
            self._say(msg.sender, as2.accept(self.node.name, f"Starting work on {act.summary}",
                                             context=ctx))
            job.runner = asyncio.get_running_loop().create_task(
                self._run(job, _text_of(act)))
            return
        if job is not None and msg.sender == job.requester and act.type != "Offer":
            job.answers.put_nowait(_text_of(act))

    def _say(self, to: str, activity: Activity) -> None:
        self._spawn(self._send(C.DIRECT_PREFIX + to, activity))

    def _publish(self, activity: Activity) -> None:
        self.ledger.saw(activity, sender=self.node.name, channel=C.CHANNEL_LOG)
        self.node.async_publish(C.CHANNEL_LOG, activity)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _send(self, channel: str, activity: Activity) -> None:
        self.ledger.saw(activity, sender=self.node.name, channel=channel)
        try:
            await self.node.send_to_channel(channel, activity, timeout=60.0)
        except PorterError as exc:
            log.warning("a2a join: could not send %s on %s: %s", activity.type, channel, exc)

    # -- the A2A side ----------------------------------------------------------------------

    async def _run(self, job: _Job, text: str) -> None:
        me = self.node.name
        try:
            while True:
                request = SendMessageRequest(message=Message(
                    message_id=str(uuid.uuid4()), role=Role.ROLE_USER,
                    parts=[Part(text=text)], task_id=job.a2a_task,
                    context_id=job.a2a_context))
                state = await self._follow(job, request)
                if state != TaskState.TASK_STATE_INPUT_REQUIRED:
                    return
                text = await job.answers.get()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the agent is down or broke the protocol: say so
            log.warning("a2a join: task %s failed: %s", job.context, exc)
            self._publish(as2.announce(
                me, f"Failed: the A2A agent at {self.url} could not do it",
                f"{type(exc).__name__}: {exc}; check that the agent is up", context=job.context,
                tag=(FAILED_TAG,)))
        finally:
            self.jobs.pop(job.context, None)

    async def _follow(self, job: _Job, request: SendMessageRequest) -> int:
        """Send one message and turn the agent's events into activities; returns the state
        the task stopped in."""
        me, ctx = self.node.name, job.context
        state = TaskState.TASK_STATE_UNSPECIFIED
        words = ""
        async for event in self._client.send_message(request):
            event = _as_stream(event)
            if event.HasField("task"):
                job.a2a_task, job.a2a_context = event.task.id, event.task.context_id
                state = event.task.status.state
                for artifact in event.task.artifacts:
                    self._created(ctx, artifact)
                words = get_message_text(event.task.status.message) \
                    if event.task.status.HasField("message") else words
            elif event.HasField("artifact_update"):
                job.a2a_task = event.artifact_update.task_id or job.a2a_task
                self._created(ctx, event.artifact_update.artifact)
            elif event.HasField("status_update"):
                job.a2a_task = event.status_update.task_id or job.a2a_task
                job.a2a_context = event.status_update.context_id or job.a2a_context
                state = event.status_update.status.state
                status = event.status_update.status
                words = get_message_text(status.message) if status.HasField("message") else ""
                if state == TaskState.TASK_STATE_WORKING and words:
                    self._publish(Activity("Update", me, words.splitlines()[0][:200],
                                           context=ctx, object=as2.note_object(words)))
            elif event.HasField("message"):
                words = get_message_text(event.message)
                state = TaskState.TASK_STATE_COMPLETED
            if state in (TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_COMPLETED,
                         TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_REJECTED,
                         TaskState.TASK_STATE_CANCELED):
                break
        if state == TaskState.TASK_STATE_INPUT_REQUIRED:
            await self._send(C.DIRECT_PREFIX + job.requester, as2.question(
                me, (words or "The agent needs more input").splitlines()[0][:200],
                words or "The agent needs more input", context=ctx, target=job.requester))
        elif state == TaskState.TASK_STATE_COMPLETED:
            self._publish(as2.announce(me, f"Done: {(words or 'completed').splitlines()[0]}"
                                       [:200], words or "completed", context=ctx,
                                       tag=(DONE_TAG,)))
        elif state == TaskState.TASK_STATE_FAILED:
            self._publish(as2.announce(me, "Failed: the A2A agent gave the task up",
                                       words or "failed", context=ctx, tag=(FAILED_TAG,)))
        elif state == TaskState.TASK_STATE_REJECTED:
            await self._send(C.DIRECT_PREFIX + job.requester, as2.reject(
                me, "The A2A agent rejected the task", words or "rejected", context=ctx))
        elif state == TaskState.TASK_STATE_CANCELED:
            self._publish(as2.announce(me, "Cancelled by the A2A agent", words or "cancelled",
                                       context=ctx, tag=(CANCELLED_TAG,)))
        return state

    def _created(self, ctx: str, artifact: Artifact) -> None:
        name = artifact.name or artifact.artifact_id
        doc = {"type": "Document", "url": name, "content": _artifact_text(artifact)}
        self._publish(as2.create(self.node.name, f"Created {name}", doc, context=ctx))

    async def _cancel(self, job: _Job) -> None:
        if job.runner is not None:
            job.runner.cancel()
        said = "Cancelled"
        if job.a2a_task:
            try:
                await self._client.cancel_task(CancelTaskRequest(id=job.a2a_task))
                said = f"Cancelled: the A2A agent's task {job.a2a_task} too"
            except Exception as exc:
                log.warning("a2a join: CancelTask %s failed: %s", job.a2a_task, exc)
                said = f"Cancelled here; CancelTask failed at the A2A agent: {exc}"
        self.jobs.pop(job.context, None)
        # The holder confirms a cancel (see porter_mesh.core.lifecycle).
        self._publish(as2.announce(self.node.name, said, context=job.context,
                                   tag=(CANCELLED_TAG,)))


def _as_stream(event: Any) -> StreamResponse:
    if isinstance(event, StreamResponse):
        return event
    if isinstance(event, tuple):  # (task, update) pairs from older clients
        return _as_stream(event[0])
    raise TypeError(f"unexpected event from the A2A client: {type(event).__name__}")


def run_joined(args: argparse.Namespace) -> int:
    """``porter-mesh a2a --join URL --name N``: run until SIGINT/SIGTERM."""
    from porter_mesh.cli.common import default_data_root, node_config, run

    data_dir = args.data_dir or default_data_root() / args.mesh / args.name
    config = node_config(args, name=args.name, role="worker", inbox_size=0,
                         slots=args.slots, channels=(C.CHANNEL_REVIEW,),
                         data_dir=data_dir)
    config.check_protected()

    async def body() -> int:
        agent = JoinedAgent(Node(config), args.join, slots=args.slots)
        try:
            await agent.astart()
        except PorterError:
            await agent.aclose()
            raise
        except Exception as exc:
            await agent.aclose()
            print(f"porter-mesh a2a: cannot reach the A2A agent at {args.join}: {exc}; "
                  "check the URL (its card is read from <URL>/.well-known/agent-card.json)",
                  file=sys.stderr)
            return 1
        # "up on mesh" is the line 'porter-mesh up' waits for, as from any agent.
        print(f"porter-mesh a2a: worker {args.name} up on mesh {args.mesh!r}: the A2A agent "
              f"at {args.join}, {args.slots} slot(s)", flush=True)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass
        finally:
            await agent.aclose()
        return 0

    return run(body)
