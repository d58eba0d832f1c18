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
  answer), ``failed`` an ``Announce`` on ``log`` tagged ``failed``, ``rejected`` a
  ``Reject`` to the requester, ``canceled`` an ``Announce`` tagged ``cancelled`` (the
  mesh's task vocabulary, :mod:`porter_mesh.core.lifecycle`);
* ``completed`` goes to review, as a mesh worker's finished work does: the worker asks
  its reviewer on ``review`` (the human for a task the human offered, else
  ``--reviewer``), and follows the verdict. An approval closes the task with the
  ``Announce`` tagged ``done`` that the architect waits for; a request for changes is
  sent to the agent as a follow-up message in the same A2A context (a new A2A task that
  names the completed one in ``referenceTaskIds``: A2A takes no message into a task in a
  final state), and its next result goes to review again;
* every activity about a task carries the Offer's ``attempt``, as the board expects of
  a worker, and a withdrawal or verdict for another attempt is ignored;
* a withdrawal of the task (the mesh's cancel) becomes ``CancelTask``, confirmed with
  an ``Announce`` tagged ``cancelled``;
* an agent that cannot be reached or breaks the protocol fails the task (an
  ``Announce`` tagged ``failed`` saying what happened).

The activities are built in :mod:`porter_mesh.gateways.a2a.mapping`; this module is
the driver that carries them between the node and the SDK's client.
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
from porter_mesh.core.advert import key_name
from porter_mesh.core.as2 import Activity
from porter_mesh.core.lifecycle import CANCELLED_TAG, FAILED_TAG, attempt_of
from porter_mesh.core.tasks import is_task_delete
from porter_mesh.errors import PorterError
from porter_mesh.gateways.a2a.mapping import (
    Verdict,
    done_announce,
    review_request,
    reviewer_of,
    revision_text,
    stamped,
    verdict_of,
)
from porter_mesh.node.node import Message as MeshMessage
from porter_mesh.node.node import Node
from porter_mesh.tools.ledger import TaskLedger

__all__ = ["JoinedAgent", "run_joined"]

log = logging.getLogger("porter_mesh.a2a")


@dataclass
class _Job:
    """One mesh task handed to the outside agent.

    ``in_review`` is set while the worker waits for its reviewer's verdict, which then
    arrives on ``verdicts``; the requester's answers to a question arrive on ``answers``.
    """

    context: str
    requester: str
    summary: str
    attempt: int | None
    reviewer: str
    a2a_task: str = ""
    a2a_context: str = ""
    in_review: bool = False
    answers: asyncio.Queue[str] = field(default_factory=asyncio.Queue)
    verdicts: asyncio.Queue[Verdict] = field(default_factory=asyncio.Queue)
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
        node: the worker's node (not started yet); it must subscribe to ``review``
            for the reviewer's verdicts.
        url: the A2A agent's base URL (its card is read from it).
        slots: tasks held at once.
        reviewer: the agent asked to review the agent's results (tasks offered by the
            human are reviewed by the human, ``porter-ui``).
    """

    def __init__(self, node: Node, url: str, *, slots: int, reviewer: str = "reviewer",
                 ) -> None:
        self.node = node
        self.url = url
        self.slots = slots
        self.reviewer = reviewer
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
        if ctx is None:
            return
        job = self.jobs.get(ctx)
        if job is not None and job.in_review:
            verdict = verdict_of(act, channel=msg.channel, sender=msg.sender,
                                 worker=self.node.name, reviewer=job.reviewer,
                                 attempt=job.attempt)
            if verdict is not None:
                job.in_review = False
                job.verdicts.put_nowait(verdict)
                return
        if not msg.direct:
            return
        if is_task_delete(act):
            said = attempt_of(act)
            if job is not None and (said is None or job.attempt is None or said == job.attempt):
                self._spawn(self._cancel(job))
            return
        if act.type == "Offer" and job is None:
            attempt = attempt_of(act)
            if len(self.jobs) >= self.slots:
                self._say(msg.sender, stamped(as2.reject(
                    self.node.name, "Busy: all my slots are taken", context=ctx), attempt))
                return
            job = _Job(ctx, msg.sender, act.summary, attempt,
                       reviewer_of(msg.sender, self.reviewer))
            self.jobs[ctx] = job
            self._say(msg.sender, stamped(as2.accept(
                self.node.name, f"Starting work on {act.summary}", context=ctx), attempt))
            job.runner = asyncio.get_running_loop().create_task(
                self._run(job, _text_of(act)))
            return
        if job is not None and msg.sender == job.requester and act.type != "Offer":
            job.answers.put_nowait(_text_of(act))

    def _say(self, to: str, activity: Activity) -> None:
        self._spawn(self._send(C.DIRECT_PREFIX + to, activity))

    def _publish(self, job: _Job, activity: Activity, channel: str = C.CHANNEL_LOG) -> None:
        activity = stamped(activity, job.attempt)
        self.ledger.saw(activity, sender=self.node.name, channel=channel)
        self.node.async_publish(channel, activity)

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
        refines = ""  # the completed A2A task the next message asks to revise
        try:
            while True:
                request = SendMessageRequest(message=Message(
                    message_id=str(uuid.uuid4()), role=Role.ROLE_USER,
                    parts=[Part(text=text)], task_id="" if refines else job.a2a_task,
                    context_id=job.a2a_context,
                    reference_task_ids=[refines] if refines else []))
                refines = ""
                state, words, files = await self._follow(job, request)
                if state == TaskState.TASK_STATE_INPUT_REQUIRED:
                    text = await job.answers.get()
                    continue
                if state != TaskState.TASK_STATE_COMPLETED:
                    return
                verdict = await self._review(job, words, files)
                if verdict.approved:
                    self._publish(job, done_announce(me, job.context, job.attempt,
                                                     words=words, reviewer=job.reviewer))
                    return
                # A2A takes no message into a completed task: the revision is a new task
                # in the same A2A context that names the one it revises.
                text, refines = revision_text(verdict), job.a2a_task
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the agent is down or broke the protocol: say so
            log.warning("a2a join: task %s failed: %s", job.context, exc)
            self._publish(job, as2.announce(
                me, f"Failed: the A2A agent at {self.url} could not do it",
                f"{type(exc).__name__}: {exc}; check that the agent is up", context=job.context,
                tag=(FAILED_TAG,)))
        finally:
            self.jobs.pop(job.context, None)

    async def _review(self, job: _Job, words: str, files: tuple[str, ...]) -> Verdict:
        """Ask the job's reviewer for review of the agent's result; wait for the verdict
        (no deadline here: the board decides how long a task may take, and withdraws or
        cancels it, which cancels this wait)."""
        if not any(key_name(peer.name) == job.reviewer for peer in self.node.peers()):
            log.warning("a2a join: task %s waits for review by %s, who is not on the mesh "
                        "now; start it, or join with --reviewer NAME", job.context,
                        job.reviewer)
        job.in_review = True
        self._publish(job, review_request(self.node.name, job.reviewer, job.context,
                                          job.attempt, summary=job.summary, files=files,
                                          words=words), C.CHANNEL_REVIEW)
        return await job.verdicts.get()

    async def _follow(self, job: _Job, request: SendMessageRequest,
                      ) -> tuple[int, str, tuple[str, ...]]:
        """Send one message and turn the agent's events into activities.

        Returns:
            The state the A2A task stopped in, the agent's last words, and the names of
            the artifacts it made.
        """
        me, ctx = self.node.name, job.context
        state = TaskState.TASK_STATE_UNSPECIFIED
        words = ""
        files: list[str] = []
        async for event in self._client.send_message(request):
            event = _as_stream(event)
            if event.HasField("task"):
                job.a2a_task, job.a2a_context = event.task.id, event.task.context_id
                state = event.task.status.state
                for artifact in event.task.artifacts:
                    files.append(self._created(job, artifact))
                words = get_message_text(event.task.status.message) \
                    if event.task.status.HasField("message") else words
            elif event.HasField("artifact_update"):
                job.a2a_task = event.artifact_update.task_id or job.a2a_task
                files.append(self._created(job, event.artifact_update.artifact))
            elif event.HasField("status_update"):
                job.a2a_task = event.status_update.task_id or job.a2a_task
                job.a2a_context = event.status_update.context_id or job.a2a_context
                state = event.status_update.status.state
                status = event.status_update.status
                words = get_message_text(status.message) if status.HasField("message") else ""
                if state == TaskState.TASK_STATE_WORKING and words:
                    self._publish(job, Activity("Update", me, words.splitlines()[0][:200],
                                                context=ctx, object=as2.note_object(words)))
            elif event.HasField("message"):
                words = get_message_text(event.message)
                state = TaskState.TASK_STATE_COMPLETED
            if state in (TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_COMPLETED,
                         TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_REJECTED,
                         TaskState.TASK_STATE_CANCELED):
                break
        if state == TaskState.TASK_STATE_INPUT_REQUIRED:
            await self._send(C.DIRECT_PREFIX + job.requester, stamped(as2.question(
                me, (words or "The agent needs more input").splitlines()[0][:200],
                words or "The agent needs more input", context=ctx, target=job.requester),
                job.attempt))
        elif state == TaskState.TASK_STATE_FAILED:
            self._publish(job, as2.announce(me, "Failed: the A2A agent gave the task up",
                                            words or "failed", context=ctx, tag=(FAILED_TAG,)))
        elif state == TaskState.TASK_STATE_REJECTED:
            await self._send(C.DIRECT_PREFIX + job.requester, stamped(as2.reject(
                me, "The A2A agent rejected the task", words or "rejected", context=ctx),
                job.attempt))
        elif state == TaskState.TASK_STATE_CANCELED:
            self._publish(job, as2.announce(me, "Cancelled by the A2A agent",
                                            words or "cancelled", context=ctx,
                                            tag=(CANCELLED_TAG,)))
        return state, words, tuple(dict.fromkeys(files))

    def _created(self, job: _Job, artifact: Artifact) -> str:
        """Publish an artifact as a ``Create`` of a Document; returns its name."""
        name = artifact.name or artifact.artifact_id
        doc = {"type": "Document", "url": name, "content": _artifact_text(artifact)}
        self._publish(job, as2.create(self.node.name, f"Created {name}", doc,
                                      context=job.context))
        return name

    async def _cancel(self, job: _Job) -> None:
        if job.runner is not None:
            job.runner.cancel()
        said = "Cancelled"
        # In review the agent's task is completed already: there is nothing to cancel.
        if job.a2a_task and not job.in_review:
            try:
                await self._client.cancel_task(CancelTaskRequest(id=job.a2a_task))
                said = f"Cancelled: the A2A agent's task {job.a2a_task} too"
            except Exception as exc:
                log.warning("a2a join: CancelTask %s failed: %s", job.a2a_task, exc)
                said = f"Cancelled here; CancelTask failed at the A2A agent: {exc}"
        self.jobs.pop(job.context, None)
        # The holder confirms a cancel (see porter_mesh.core.lifecycle).
        self._publish(job, as2.announce(self.node.name, said, context=job.context,
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
        agent = JoinedAgent(Node(config), args.join, slots=args.slots,
                            reviewer=args.reviewer)
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
