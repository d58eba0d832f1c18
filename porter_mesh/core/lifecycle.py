"""The task state vocabulary of the whole mesh, and how an observer follows a task.

Theory of operation
-------------------
Everyone who looks at a task (the architect's board, the dashboard's cards, the CLI's
``request``, ``tasks`` and ``cancel``, the MCP gateway, a worker's own ledger) names its
state with one word from :class:`Status`, which maps one to one onto A2A's task states::

    submitted --Accept by holder--> working --Offer on review by holder--> in-review
        ^   |                        |  ^  \\                               |     |
        |   |            Question to |  |   +--progress (Create, Update,   |     |
        |   |           the requester|  |      Invoke, Announce...)        |     |
        |   |                        v  |                          review  |     | review
        |   |               input-required  (answered by a Note or          |     | Accept
        |   |                                Question from the requester)   |     v
        |   |                                                               |  completed
        |   +--Reject by holder (a direct request)--> rejected              |
        +------Reject by holder of a board's claim, or a withdrawal         v
               of one claim (the board offers the task again)     changes-requested
                                                                 (back to working on
                                                                  the holder's progress)

    any open state --Delete of the task tagged "cancel" (from the requester or the
                     human), or the holder's confirmation tagged "cancelled"--> cancelled
    holder's Announce tagged "done" --> completed;  tagged "failed" --> failed

Final states (:data:`FINAL_STATUSES`) are never left.

:func:`follow` is that diagram as a pure function over immutable :class:`TaskRecord`
values: it takes the record so far (or ``None``), one activity with who sent it and
to whom, and ``now`` (any clock the caller chooses: it is only recorded), and returns the
new record. Only an ``Offer`` that is not a review request starts a task (one on
``task``, to anyone, is held by whoever accepts it): a ``Question`` or a ``Note`` with a
task context and no Offer seen before is not a task.

**Who is who.** The *requester* is whoever offered the task (an agent, or the human from
any of its seats); the *holder* is the agent it was offered to (the direct channel's
recipient, or the Offer's ``target``). The human stands for the requester of any task:
its answers and cancels count as the requester's.

**Fencing.** A claim's ``attempt`` (see :mod:`porter_mesh.core.tasks`) is followed too:
an activity that carries an attempt number below the task's current one is about a
fenced claim and changes nothing.

**Sub-tasks.** An Offer made by an agent while it holds task X carries ``"parent": X``
(:data:`PARENT_FIELD`, an extension field the profile's unknown-field rule keeps); the
record keeps it, so a tree of tasks can be drawn and a cancel can follow it down.

**Cancel.** A cancel is a ``Delete`` whose object is the task URN (as a withdrawal is,
see :func:`porter_mesh.core.tasks.is_task_delete`), tagged :data:`CANCEL_TAG`. A
withdrawal of one claim carries that claim's ``attempt`` and no tag: the board offers the
task again, so it is back to ``submitted``. The holder confirms a cancel with an
``Announce`` tagged :data:`CANCELLED_TAG` in the task's context.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Final

from porter_mesh.core.advert import is_human
from porter_mesh.core.as2 import Activity, ASObject
from porter_mesh.core.constants import CHANNEL_REVIEW, DIRECT_PREFIX
from porter_mesh.core.taskid import is_task_id

__all__ = [
    "ATTEMPT_FIELD",
    "CANCELLED_TAG",
    "CANCEL_TAG",
    "DONE_TAG",
    "FAILED_TAG",
    "FINAL_STATUSES",
    "OPEN_STATUSES",
    "PARENT_FIELD",
    "Status",
    "TaskRecord",
    "attempt_of",
    "follow",
    "is_cancel",
    "parent_of",
    "record_from_json",
    "same_party",
    "text_of",
]

#: Extension field that carries the claim's attempt number on task activities (see
#: :mod:`porter_mesh.core.tasks`).
ATTEMPT_FIELD: Final = "attempt"

#: Extension field on an Offer naming the task it is a sub-task of.
PARENT_FIELD: Final = "parent"

#: Tag on a task's ``Delete`` that cancels the whole task (not one claim of it).
CANCEL_TAG: Final = "cancel"

#: Tag on the holder's ``Announce`` confirming that it stopped a cancelled task.
CANCELLED_TAG: Final = "cancelled"

#: Tag on the holder's ``Announce`` reporting a task finished (without review).
DONE_TAG: Final = "done"

#: Tag on the holder's ``Announce`` reporting that it gave the task up.
FAILED_TAG: Final = "failed"


class Status(enum.Enum):
    """Where a task is, in the one vocabulary of the mesh (A2A's task states)."""

    SUBMITTED = "submitted"
    WORKING = "working"
    INPUT_REQUIRED = "input-required"
    IN_REVIEW = "in-review"
    CHANGES_REQUESTED = "changes-requested"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"

    @property
    def final(self) -> bool:
        """The task never leaves this state."""
        return self in FINAL_STATUSES


#: States a task never leaves.
FINAL_STATUSES: Final = frozenset(
    {Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.REJECTED}
)

#: States of a task still under way.
OPEN_STATUSES: Final = frozenset(Status) - FINAL_STATUSES

#: Activities by which a holder reports progress.
_PROGRESS: Final = frozenset({"Create", "Update", "Delete", "Invoke", "Announce", "Question"})


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A task as one observer knows it. Immutable; :func:`follow` returns new values.

    Attributes:
        context: the task URN.
        title: the Offer's summary.
        requester: who offered the task.
        holder: who it was offered to (``None`` while a board looks for a worker).
        status: the state.
        attempt: the claim's attempt number, when the offers carry one.
        parent: the task this one is a sub-task of, if any.
        reviewer: whom the holder asked for review, if anyone.
        question: the holder's open question while ``input-required``.
        note: the last reason, verdict or answer in words.
        created: when the Offer was seen (the caller's clock).
        updated: when the record last changed.
    """

    context: str
    title: str
    requester: str
    holder: str | None
    status: Status = Status.SUBMITTED
    attempt: int | None = None
    parent: str | None = None
    reviewer: str | None = None
    question: str = ""
    note: str = ""
    created: float = 0.0
    updated: float = 0.0

    @property
    def final(self) -> bool:
        """The task reached a final state."""
        return self.status in FINAL_STATUSES

    def to_json(self) -> dict[str, object]:
        """Plain values, as the ``tasks`` view, the dashboard and MCP show them."""
        return {
            "context": self.context, "title": self.title, "state": self.status.value,
            "requester": self.requester, "holder": self.holder, "attempt": self.attempt,
            "parent": self.parent, "reviewer": self.reviewer, "question": self.question,
            "note": self.note, "created": self.created, "updated": self.updated,
        }


def record_from_json(data: object) -> TaskRecord | None:
    """A record from :meth:`TaskRecord.to_json` (as kept on disk), or ``None`` when
    ``data`` is not one."""
    if not isinstance(data, dict):
        return None
    try:
        status = Status(data["state"])
        ctx, title, requester = data["context"], data["title"], data["requester"]
        if not (is_task_id(ctx) and isinstance(title, str) and isinstance(requester, str)):
            return None
        holder, parent, reviewer = data.get("holder"), data.get("parent"), data.get("reviewer")
        attempt = data.get("attempt")
        return TaskRecord(
            ctx, title, requester, holder if isinstance(holder, str) else None, status,
            attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else None,
            parent if isinstance(parent, str) else None,
            reviewer if isinstance(reviewer, str) else None,
            str(data.get("question") or ""), str(data.get("note") or ""),
            float(data.get("created") or 0.0), float(data.get("updated") or 0.0))
    except (KeyError, ValueError, TypeError):
        return None


def same_party(a: str | None, b: str | None) -> bool:
    """Whether two names are the same party: equal, or both seats of the human."""
    if a is None or b is None:
        return False
    return a == b or (is_human(a) and is_human(b))


def parent_of(activity: Activity) -> str | None:
    """The parent task an Offer names (:data:`PARENT_FIELD`), if it is a task URN."""
    value = activity.extra.get(PARENT_FIELD)
    return value if isinstance(value, str) and is_task_id(value) else None


def is_cancel(activity: Activity) -> bool:
    """Whether ``activity`` cancels its task as a whole: a ``Delete`` of the task (its
    object is the task URN) tagged :data:`CANCEL_TAG`."""
    return (
        activity.type == "Delete"
        and activity.context is not None
        and activity.object == activity.context
        and CANCEL_TAG in (activity.tag or ())
    )


def attempt_of(activity: Activity) -> int | None:
    """The claim's attempt number an activity carries, or ``None``.

    Args:
        activity: any activity.

    Returns:
        The :data:`ATTEMPT_FIELD` extension field when it is a positive integer.
    """
    value = activity.extra.get(ATTEMPT_FIELD)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def text_of(activity: Activity) -> str:
    """The activity's prose: summary plus the object's and result's text, if any."""
    parts = [activity.summary, activity.content or ""]
    for part in (activity.object, activity.result):
        if isinstance(part, ASObject) and part.content:
            parts.append(part.content)
    return " -- ".join(p for p in parts if p)


def _recipient(channel: str, recipient: str | None, activity: Activity) -> str | None:
    if recipient is not None:
        return recipient
    if channel.startswith(DIRECT_PREFIX):
        return channel[len(DIRECT_PREFIX):]
    return activity.target


def follow(
    record: TaskRecord | None,
    activity: Activity,
    *,
    sender: str,
    channel: str,
    now: float,
    recipient: str | None = None,
) -> TaskRecord | None:
    """Advance a task's record by one activity seen in its context.

    Args:
        record: the task so far, or ``None`` when none was seen yet.
        activity: the activity (its ``context`` is the task).
        sender: who sent it (the authenticated sender).
        channel: where it travelled (``task:<agent>`` for a direct message).
        now: the observer's clock, recorded as ``created``/``updated``.
        recipient: the direct recipient, when known apart from the channel.

    Returns:
        The new record; ``None`` while no task exists (only an Offer starts one); the
        same record when the activity changes nothing.
    """
    ctx = activity.context
    if ctx is None or not is_task_id(ctx) or activity.is_fallback:
        return record
    to = _recipient(channel, recipient, activity)
    kind = activity.type
    if record is None:
        if kind != "Offer" or channel == CHANNEL_REVIEW or to == sender:
            return None  # only an Offer of work starts a task
        return TaskRecord(ctx, activity.summary, sender, to, attempt=attempt_of(activity),
                          parent=parent_of(activity), created=now, updated=now)
    if record.context != ctx or record.final:
        return record
    attempt = attempt_of(activity)
    if attempt is not None and record.attempt is not None and attempt < record.attempt:
        return record  # about a fenced claim
    new = _step(record, activity, sender, channel, to, attempt)
    return record if new is record else replace(new, updated=now)


def _step(record: TaskRecord, act: Activity, sender: str, channel: str, to: str | None,
          attempt: int | None) -> TaskRecord:
    kind = act.type
    status = record.status
    from_requester = same_party(sender, record.requester) or is_human(sender)
    from_holder = record.holder is not None and sender == record.holder
    if act.type == "Delete" and act.object == act.context:
        if not from_requester:
            return record  # a cancel from anyone else is refused by the holder
        if CANCEL_TAG in (act.tag or ()) or attempt is None:
            return replace(record, status=Status.CANCELLED, note=text_of(act), question="")
        return replace(record, status=Status.SUBMITTED, holder=None, question="",
                       note=text_of(act))
    if kind == "Offer" and channel != CHANNEL_REVIEW and not from_holder and from_requester:
        if attempt is not None and (record.attempt is None or attempt > record.attempt):
            return replace(record, status=Status.SUBMITTED, holder=to, attempt=attempt,
                           reviewer=None, question="", note="")
        return record  # the same offer again
    if from_holder:
        return _from_holder(record, act, channel, to)
    if (record.holder is None and status is Status.SUBMITTED and kind == "Accept"
            and channel != CHANNEL_REVIEW and not from_requester):
        # An Offer to anyone (on 'task'): whoever accepts it holds it.
        return replace(record, status=Status.WORKING, holder=sender)
    if from_requester and status is Status.INPUT_REQUIRED and kind in ("Note", "Question") \
            and same_party(to, record.holder):
        return replace(record, status=Status.WORKING, question="", note=text_of(act))
    if status is Status.IN_REVIEW and (record.reviewer is None
                                       or same_party(sender, record.reviewer)):
        if kind == "Accept":
            return replace(record, status=Status.COMPLETED, note=text_of(act))
        if kind == "Reject":
            return replace(record, status=Status.CHANGES_REQUESTED, note=text_of(act))
    return record


def _from_holder(record: TaskRecord, act: Activity, channel: str,
                 to: str | None) -> TaskRecord:
    kind = act.type
    status = record.status
    tags = act.tag or ()
    if kind == "Accept" and channel != CHANNEL_REVIEW:
        return replace(record, status=Status.WORKING) if status is Status.SUBMITTED else record
    if kind == "Reject" and channel != CHANNEL_REVIEW:
        if record.attempt is not None:
            # A board's claim given back: the board offers the task again.
            return replace(record, status=Status.SUBMITTED, holder=None, note=text_of(act))
        return replace(record, status=Status.REJECTED, note=text_of(act))
    if kind == "Offer":
        return replace(record, status=Status.IN_REVIEW, reviewer=act.target or to,
                       question="")
    if kind == "Announce" and CANCELLED_TAG in tags:
        return replace(record, status=Status.CANCELLED, note=text_of(act), question="")
    if kind == "Announce" and DONE_TAG in tags:
        return replace(record, status=Status.COMPLETED, note=text_of(act), question="")
    if kind == "Announce" and FAILED_TAG in tags:
        return replace(record, status=Status.FAILED, note=text_of(act), question="")
    if kind == "Question" and same_party(to, record.requester):
        return replace(record, status=Status.INPUT_REQUIRED, question=text_of(act))
    if kind in _PROGRESS and status in (Status.SUBMITTED, Status.CHANGES_REQUESTED):
        return replace(record, status=Status.WORKING)
    return record
