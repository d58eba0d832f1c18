"""Mesh activities to A2A task states and back: the gateway's one translation table.

Theory of operation
-------------------
An A2A task served by the gateway is one mesh task: its context is
``urn:porter:task:<A2A task id>`` (:func:`mesh_context`). The gateway's node is the
requester; the mesh agent it serves is the holder. Every activity in that context from
someone other than the gateway goes through :func:`translate`, which says what the A2A
client should see: a new state (or none), the agent's words, the files as artifacts,
and whether the agent now waits on the client (:class:`Ask`). The other direction
(the client's message into an activity) is :func:`offer_for` and :func:`answer_for`.

The mesh's task vocabulary has two states A2A lacks: ``in-review`` and
``changes-requested``. A review asked of the requester is A2A's ``input-required`` (the
client approves or sends back); a review by another agent is ``working`` with the
review named in the message. :data:`A2A_STATES` is that mapping, in one place, so the
mesh's own state names can change without touching the server.

Nothing here imports the A2A SDK, sockets or clocks: the functions are pure and their
unit tests need neither.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from porter_mesh.core import as2
from porter_mesh.core import constants as C
from porter_mesh.core.advert import is_human
from porter_mesh.core.as2 import Activity, ASObject
from porter_mesh.core.taskid import is_task_id
from porter_mesh.core.tasks import cancel_activity, is_task_delete

__all__ = [
    "A2A_STATES",
    "TERMINAL",
    "Ask",
    "FileArtifact",
    "MeshState",
    "Step",
    "answer_for",
    "approves",
    "cancel_for",
    "mesh_context",
    "offer_for",
    "translate",
]


class MeshState(enum.Enum):
    """The mesh's task vocabulary, as the gateway sees a task it requested."""

    SUBMITTED = "submitted"
    WORKING = "working"
    INPUT_REQUIRED = "input-required"
    IN_REVIEW = "in-review"
    CHANGES_REQUESTED = "changes-requested"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"


#: The A2A 1.0 state (its proto enum name) for each mesh state.
A2A_STATES: Final[Mapping[MeshState, str]] = {
    MeshState.SUBMITTED: "TASK_STATE_SUBMITTED",
    MeshState.WORKING: "TASK_STATE_WORKING",
    MeshState.INPUT_REQUIRED: "TASK_STATE_INPUT_REQUIRED",
    MeshState.IN_REVIEW: "TASK_STATE_WORKING",
    MeshState.CHANGES_REQUESTED: "TASK_STATE_WORKING",
    MeshState.COMPLETED: "TASK_STATE_COMPLETED",
    MeshState.FAILED: "TASK_STATE_FAILED",
    MeshState.CANCELLED: "TASK_STATE_CANCELED",
    MeshState.REJECTED: "TASK_STATE_REJECTED",
}

#: States a task never leaves.
TERMINAL: Final = frozenset({MeshState.COMPLETED, MeshState.FAILED, MeshState.CANCELLED,
                             MeshState.REJECTED})

#: Answers to a review that approve it (anything else sends the work back with the
#: answer as the reason).
_APPROVALS: Final = frozenset({"approve", "approved", "accept", "accepted", "lgtm", "yes",
                               "ok", "okay", "ship it"})


@dataclass(frozen=True)
class FileArtifact:
    """Something the agent made, for an A2A artifact.

    Attributes:
        name: the artifact's name (a workspace path, or ``command``).
        description: what happened to it (the activity's summary).
        path: the workspace path, when it is a file.
        text: its text, when the activity carried it (a command's output, a small file).
    """

    name: str
    description: str
    path: str | None = None
    text: str | None = None


@dataclass(frozen=True)
class Ask:
    """The agent waits on the requester.

    Attributes:
        kind: ``"review"`` (approve or send back) or ``"question"``.
        asker: the agent that asked (the answer goes to it).
        attempt: the claim's attempt the request carried, echoed on the answer.
    """

    kind: str
    asker: str
    attempt: int | None = None


@dataclass(frozen=True)
class Step:
    """What the A2A client sees of one activity.

    Attributes:
        state: the task's new state, or ``None`` when it stays as it is.
        text: the agent's words for the status message ('' for none).
        artifacts: files and outputs to publish as artifacts.
        ask: set when the agent now waits on the requester.
    """

    state: MeshState | None
    text: str
    artifacts: tuple[FileArtifact, ...] = ()
    ask: Ask | None = None


def mesh_context(task_id: str) -> str:
    """The mesh context of an A2A task: ``urn:porter:task:<task id>``.

    Raises:
        ValueError: the id cannot be a short task id (1-64 letters, digits, ``-``,
            ``_``); the SDK mints UUIDs, which can.
    """
    context = C.TASK_URN_PREFIX + task_id
    if not is_task_id(context):
        raise ValueError(f"task id {task_id!r} cannot name a mesh task: use 1-64 letters, "
                         "digits, '-' or '_'")
    return context


def _prose(activity: Activity) -> str:
    parts = [activity.summary]
    for part in (activity.object, activity.result):
        if (isinstance(part, ASObject) and part.type == "Note" and part.content
                and part.content not in parts):
            parts.append(part.content)
    if activity.content and activity.content not in parts:
        parts.append(activity.content)
    return "\n".join(p for p in parts if p)


def _documents(obj: ASObject | str | None) -> list[ASObject]:
    if not isinstance(obj, ASObject):
        return []
    if obj.type == "Document":
        return [obj]
    if obj.type == "Collection" and obj.items:
        return [item for item in obj.items if isinstance(item, ASObject)
                and item.type == "Document"]
    return []


def _files(activity: Activity) -> tuple[FileArtifact, ...]:
    return tuple(FileArtifact(name=doc.url or doc.summary or "file",
                              description=activity.summary, path=doc.url,
                              text=doc.content)
                 for doc in _documents(activity.object))


def _attempt(activity: Activity) -> int | None:
    value = activity.extra.get("attempt") if activity.extra else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def addressed_to(target: str | None, requester: str) -> bool:
    """Whether ``target`` names the requester (any seat of the human names them all,
    as the mesh's workers address a review to ``porter-ui``)."""
    if target is None:
        return False
    return target == requester or (is_human(requester) and is_human(target))


def translate(activity: Activity, *, channel: str, sender: str, requester: str,
              agent: str, state: MeshState) -> Step | None:
    """What one activity in a requested task's context means to the A2A client.

    Args:
        activity: the activity, already known to be in the task's context.
        channel: the channel it came on (``review``, ``log``, ``task:<me>``...).
        sender: who sent it (authenticated on a secured mesh).
        requester: the gateway's own name.
        agent: the agent the task was offered to.
        state: the task's state before it.

    Returns:
        The :class:`Step`, or ``None`` for an activity the client need not see (the
        gateway's own, one from an unrelated agent, or anything after the end).
    """
    if sender == requester or state in TERMINAL:
        return None
    kind = activity.type
    text = _prose(activity)
    if is_task_delete(activity):
        return Step(MeshState.CANCELLED, text)
    review = channel == C.CHANNEL_REVIEW
    if sender != agent:
        # Another agent (a reviewer) speaks about the task: only its verdicts count.
        if review and kind == "Reject":
            return Step(MeshState.CHANGES_REQUESTED, f"{sender} asked for changes: {text}")
        if review and kind == "Accept":
            return Step(MeshState.WORKING, f"{sender} approved: {text}")
        return None
    if kind == "Accept" and not review:
        return Step(MeshState.WORKING, text)
    if kind == "Reject" and not review:
        ended = MeshState.REJECTED if state is MeshState.SUBMITTED else MeshState.FAILED
        return Step(ended, text)
    if kind == "Offer" and review:
        files = _files(activity)
        if addressed_to(activity.target, requester):
            return Step(MeshState.INPUT_REQUIRED,
                        f"{text}\nReply 'approve', or say what to change.", files,
                        Ask("review", sender, _attempt(activity)))
        return Step(MeshState.IN_REVIEW, f"{text} (review by {activity.target or 'a reviewer'})",
                    files)
    if kind == "Question" and (addressed_to(activity.target, requester)
                               or channel.startswith(C.DIRECT_PREFIX)):
        return Step(MeshState.INPUT_REQUIRED, text, (), Ask("question", sender,
                                                             _attempt(activity)))
    if kind in ("Create", "Update"):
        return Step(MeshState.WORKING, text, _files(activity))
    if kind == "Invoke":
        out = activity.result.content if isinstance(activity.result, ASObject) else None
        return Step(MeshState.WORKING, activity.summary,
                    (FileArtifact(name="command", description=activity.summary, text=out),))
    if kind == "Announce":
        if review or state is MeshState.SUBMITTED:
            return Step(None, text)
        return Step(MeshState.COMPLETED, text)
    return Step(None, text)


def offer_for(requester: str, agent: str, text: str, task_id: str) -> Activity:
    """The Offer that hands an A2A message to ``agent``: the first line is its summary,
    the whole text its content.

    Raises:
        ValueError: the message has no text.
    """
    body = text.strip()
    if not body:
        raise ValueError("the message has no text: send a text part saying what to do")
    summary = body.splitlines()[0][:200]
    return as2.offer(requester, summary, body, target=agent, context=mesh_context(task_id),
                     tag=("a2a",))


def approves(text: str) -> bool:
    """Whether the client's answer to a review approves it."""
    return re.sub(r"[^a-z ]", "", text.strip().lower()).strip() in _APPROVALS


def answer_for(requester: str, ask: Ask, text: str, task_id: str) -> tuple[str, Activity]:
    """The channel and activity that answer ``ask`` with the client's ``text``.

    A review is approved (``Accept`` on ``review``) when the text approves
    (:func:`approves`), else sent back (``Reject`` with the text as the reason); a
    question is answered directly to the asker with a Note.
    """
    context = mesh_context(task_id)
    extra = {"attempt": ask.attempt} if ask.attempt is not None else None
    if ask.kind == "review":
        if approves(text):
            return C.CHANNEL_REVIEW, as2.accept(requester, "Approved", context=context,
                                                target=ask.asker, extra=extra)
        return C.CHANNEL_REVIEW, as2.reject(requester, "Changes requested",
                                            text.strip() or "Changes requested",
                                            context=context, target=ask.asker, extra=extra)
    return C.DIRECT_PREFIX + ask.asker, Activity(
        "Note", requester, text.strip().splitlines()[0][:200] if text.strip() else "Answer",
        context=context, object=as2.note_object(text.strip() or "(no answer)"),
        target=ask.asker, extra=extra)


def cancel_for(requester: str, task_id: str) -> Activity:
    """The mesh's cancel of a requested task (a withdrawal, :func:`is_task_delete`)."""
    return cancel_activity(requester, mesh_context(task_id), "Cancelled by the A2A client")
