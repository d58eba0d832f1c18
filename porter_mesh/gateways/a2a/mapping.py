"""Mesh activities to A2A task states and back: the gateway's one translation table.

Theory of operation
-------------------
An A2A task served by the gateway is one mesh task: its context is
``urn:porter:task:<A2A task id>`` (:func:`mesh_context`). The gateway's node is the
requester; the mesh agent it serves is the holder. The task's state is the mesh's own
(:class:`~porter_mesh.core.lifecycle.Status`), kept by the mesh's pure follower
(:func:`~porter_mesh.core.lifecycle.follow`) from every activity in the context, the
gateway's own included. :func:`translate` adds what the A2A client should see besides
the state: the agent's words, the files and command outputs as artifacts, and whether
the agent now waits on the client (:class:`Ask`). The other direction (the client's
message into an activity) is :func:`offer_for`, :func:`answer_for` and
:func:`cancel_for`.

The vocabulary maps one to one onto A2A's states (:data:`A2A_STATES`) but for the
review: ``in-review`` and ``changes-requested`` are A2A's ``working``, except that a
review asked of the requester itself is ``input-required`` (:func:`a2a_state`): the
client approves or sends the work back with its next message.

The other side, an outside A2A agent joined as a mesh worker
(:mod:`porter_mesh.gateways.a2a.join`), needs the review a mesh worker asks for: the
architect's board finishes a task only when a reviewer approves it, and an A2A agent
never asks. When the agent's task completes, the joined worker sends
:func:`review_request` (an ``Offer`` on ``review`` naming :func:`reviewer_of`, as the
scripted worker does), reads the reviewer's answer with :func:`verdict_of`, and either
closes the task with :func:`done_announce` or sends the agent
:func:`revision_text` and asks again. Every activity it sends about a task carries the
claim's ``attempt`` (:func:`stamped`), so the board can fence a stale claim.

Nothing here imports the A2A SDK, sockets or clocks: the functions are pure and their
unit tests need neither.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from porter_mesh.core import as2
from porter_mesh.core import constants as C
from porter_mesh.core.advert import is_human, key_name
from porter_mesh.core.as2 import Activity, ASObject
from porter_mesh.core.lifecycle import (
    DONE_TAG,
    Status,
    TaskRecord,
    attempt_of,
    follow,
    same_party,
)
from porter_mesh.core.taskid import is_task_id
from porter_mesh.core.tasks import cancel_activity, with_attempt

__all__ = [
    "A2A_STATES",
    "Ask",
    "FileArtifact",
    "Step",
    "Verdict",
    "a2a_state",
    "answer_for",
    "approves",
    "ask_of",
    "cancel_for",
    "done_announce",
    "mesh_context",
    "note_for",
    "offer_for",
    "review_request",
    "reviewer_of",
    "revision_text",
    "stamped",
    "translate",
    "verdict_of",
]

#: The A2A 1.0 state (its proto enum name) for each mesh state.
A2A_STATES: Final[Mapping[Status, str]] = {
    Status.SUBMITTED: "TASK_STATE_SUBMITTED",
    Status.WORKING: "TASK_STATE_WORKING",
    Status.INPUT_REQUIRED: "TASK_STATE_INPUT_REQUIRED",
    Status.IN_REVIEW: "TASK_STATE_WORKING",
    Status.CHANGES_REQUESTED: "TASK_STATE_WORKING",
    Status.COMPLETED: "TASK_STATE_COMPLETED",
    Status.FAILED: "TASK_STATE_FAILED",
    Status.CANCELLED: "TASK_STATE_CANCELED",
    Status.REJECTED: "TASK_STATE_REJECTED",
}

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
        attempt: the claim's attempt, echoed on the answer.
    """

    kind: str
    asker: str
    attempt: int | None = None


@dataclass(frozen=True)
class Step:
    """What the A2A client sees of one activity.

    Attributes:
        record: the task after it.
        changed: whether the A2A state changed (a status event is due).
        text: the activity's words for the status message ('' for none).
        artifacts: files and outputs to publish as artifacts.
    """

    record: TaskRecord
    changed: bool
    text: str
    artifacts: tuple[FileArtifact, ...] = ()


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


def a2a_state(record: TaskRecord, requester: str) -> str:
    """The A2A state (proto enum name) of a task the gateway requested."""
    if record.status is Status.IN_REVIEW and same_party(record.reviewer, requester):
        return "TASK_STATE_INPUT_REQUIRED"
    return A2A_STATES[record.status]


def ask_of(record: TaskRecord, requester: str) -> Ask | None:
    """What the holder waits on the requester for, if anything."""
    if record.holder is None:
        return None
    if record.status is Status.INPUT_REQUIRED:
        return Ask("question", record.holder, record.attempt)
    if record.status is Status.IN_REVIEW and same_party(record.reviewer, requester):
        return Ask("review", record.holder, record.attempt)
    return None


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


def _artifacts(activity: Activity) -> tuple[FileArtifact, ...]:
    if activity.type == "Invoke":
        out = activity.result.content if isinstance(activity.result, ASObject) else None
        return (FileArtifact(name="command", description=activity.summary, text=out),)
    if activity.type in ("Create", "Update", "Offer"):
        return tuple(FileArtifact(name=doc.url or doc.summary or "file",
                                  description=activity.summary, path=doc.url,
                                  text=doc.content)
                     for doc in _documents(activity.object))
    return ()


def translate(record: TaskRecord | None, activity: Activity, *, channel: str, sender: str,
              requester: str, now: float) -> Step | None:
    """What one activity in a requested task's context means to the A2A client.

    Args:
        record: the task so far (``None`` before its Offer).
        activity: the activity, in the task's context; the gateway's own too.
        channel: the channel it came on (``review``, ``log``, ``task:<agent>``...).
        sender: who sent it (authenticated on a secured mesh).
        requester: the gateway's own name.
        now: the caller's clock, recorded in the task's record.

    Returns:
        The :class:`Step`, or ``None`` when the activity is not about this task (before
        its Offer, or after its end) or says nothing to the client.
    """
    new = follow(record, activity, sender=sender, channel=channel, now=now)
    if new is None or record is None or record.final:
        return None
    changed = a2a_state(new, requester) != a2a_state(record, requester) or \
        new.status is not record.status
    holder = sender == record.holder
    artifacts = _artifacts(activity) if holder else ()
    if not (changed or artifacts or (holder and activity.type in ("Announce", "Note",
                                                                     "Update"))):
        return None
    text = _prose(activity)
    if ask_of(new, requester) is not None and ask_of(record, requester) is None:
        text += ("\nReply 'approve', or say what to change." if new.status is Status.IN_REVIEW
                 else "")
    return Step(new, changed, text, artifacts)


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
    words = text.strip()
    if ask.kind == "review":
        if approves(words):
            return C.CHANNEL_REVIEW, as2.accept(requester, "Approved", context=context,
                                                target=ask.asker, extra=extra)
        return C.CHANNEL_REVIEW, as2.reject(requester, "Changes requested",
                                            words or "Changes requested", context=context,
                                            target=ask.asker, extra=extra)
    return C.DIRECT_PREFIX + ask.asker, Activity(
        "Note", requester, words.splitlines()[0][:200] if words else "Answer",
        context=context, object=as2.note_object(words or "(no answer)"), target=ask.asker,
        extra=extra)


def note_for(requester: str, agent: str, text: str, task_id: str) -> Activity:
    """A further message of the client's on a running task, as a Note to its agent."""
    words = text.strip()
    return Activity("Note", requester, words.splitlines()[0][:200] if words else "Note",
                    context=mesh_context(task_id), object=as2.note_object(words or "(empty)"),
                    target=agent)


def cancel_for(requester: str, task_id: str) -> Activity:
    """The mesh's cancel of a requested task: a ``Delete`` of the task tagged
    ``cancel``, which the holder obeys and passes down to its sub-tasks."""
    return cancel_activity(requester, mesh_context(task_id), "Cancelled by the A2A client",
                           cancel=True)



# -- out: an outside A2A agent's work goes to review -------------------------------------


@dataclass(frozen=True)
class Verdict:
    """A reviewer's answer to a joined agent's review request.

    Attributes:
        approved: ``True`` for an ``Accept``, ``False`` for a ``Reject`` (changes asked).
        reason: the reviewer's words (the changes asked, for a ``Reject``).
    """

    approved: bool
    reason: str


def stamped(activity: Activity, attempt: int | None) -> Activity:
    """``activity`` carrying the claim's ``attempt`` (unchanged when the Offer had none),
    as a mesh worker's tools echo it on everything about the task."""
    return with_attempt(activity, attempt)


def reviewer_of(requester: str, reviewer: str) -> str:
    """Who reviews a joined agent's work: the human (``porter-ui``) for a task one of
    the human's seats offered, else ``reviewer`` (the scripted worker's rule)."""
    return key_name(requester) if is_human(requester) else reviewer


def review_request(worker: str, reviewer: str, context: str, attempt: int | None, *,
                   summary: str, files: tuple[str, ...], words: str) -> Activity:
    """The profile's review request for the agent's result: an ``Offer`` on ``review``
    naming ``reviewer`` as ``target``, the artifacts as Documents.

    Args:
        worker: the joined worker's name (the actor).
        reviewer: who is asked (:func:`reviewer_of`).
        context: the mesh task.
        attempt: the claim's attempt, echoed.
        summary: what the task asked (its Offer's summary).
        files: the artifact names the agent made for this result.
        words: the agent's closing words, the request's ``result`` (a Note), so that
            the reviewer and the architect's board see what the agent says it did.
    """
    return stamped(Activity(
        "Offer", worker, f"Ready for review: {summary}"[:200], context=context,
        target=reviewer, object=as2.collection([as2.document(name) for name in files]),
        result=as2.note_object(words) if words else None), attempt)


def verdict_of(activity: Activity, *, channel: str, sender: str, worker: str,
               reviewer: str, attempt: int | None) -> Verdict | None:
    """Whether ``activity`` is ``reviewer``'s verdict on the joined worker's request.

    A verdict is an ``Accept`` or ``Reject`` from the reviewer (any of the human's seats
    when it is ``porter-ui``), on ``review`` or straight to the worker, that does not
    name another agent and does not carry another claim's attempt (an answer to a fenced
    attempt's request counts for nothing).

    Returns:
        The :class:`Verdict`, or ``None`` when it is none.
    """
    if activity.type not in ("Accept", "Reject") or key_name(sender) != reviewer:
        return None
    if channel not in (C.CHANNEL_REVIEW, C.DIRECT_PREFIX + worker):
        return None
    if activity.target is not None and activity.target != worker:
        return None
    said = attempt_of(activity)
    if said is not None and attempt is not None and said != attempt:
        return None
    return Verdict(activity.type == "Accept", _prose(activity))


def revision_text(verdict: Verdict) -> str:
    """The message that sends a reviewer's requested changes to the outside agent."""
    return f"The reviewer asked for changes. Please revise your work:\n{verdict.reason}"


def done_announce(worker: str, context: str, attempt: int | None, *, words: str,
                  reviewer: str) -> Activity:
    """The closing ``Announce`` (tagged ``done``) the architect waits for, sent once the
    reviewer approved the agent's result."""
    first = (words or "completed").splitlines()[0]
    return stamped(as2.announce(worker, f"Done: {first}"[:200],
                                f"{words or 'completed'}\nApproved by {reviewer}.",
                                context=context, tag=(DONE_TAG,)), attempt)
