"""The task lifecycle, and the architect's board that pairs tasks with workers.

Theory of operation
-------------------
A task is a thread of AS2 activities sharing one ``context`` (``urn:porter:task:<id>``).
Its life, as the profile draws it::

    PENDING --offer--> OFFERED --Accept--> ACCEPTED --Create/Update/Invoke/...--> IN_PROGRESS
       ^                  |                    |                                      |
       |      Reject, offer timeout,           |            Offer (review request)    |
       +----- holder expired or halted --------+----------------+---------------------+
                                                                 v
                          CHANGES_REQUESTED <--review Reject-- IN_REVIEW --review Accept--> DONE
                                  |                               ^
                                  +--Update.. then Offer again----+

    any live state --cancel (Delete of the task)--> CANCELLED
    declined by every worker --> REJECTED;  out of attempts --> FAILED

:func:`apply` is that diagram as a pure function over immutable :class:`Task` values.

**Claims and fencing.** Each offer of a task to a worker is a *claim*: the pair
(worker, attempt), where ``attempt`` counts the offers of that task from 1. The Offer
carries it as the extension field ``"attempt"`` (kept by the profile's unknown-field
rule) and the worker's tools echo it on every activity about the task. When a claim
ends without the work being finished (the worker rejects it, the offer is not accepted
within ``offer_timeout``, the worker expires, restarts or is halted), the claim is
*fenced* and the task is offered again with the next attempt number. From then on
nothing from the fenced claim counts: an Accept, a progress report or a review request
carrying it is refused and reported (:class:`ResultRefused`), and the task is left as it
was. This is where the mesh departs from IACP, whose reissue after ``assign_timeout``
let two foragers both deliver a result: here at most one claim's results are ever
accepted.

**Withdrawal.** The fenced worker is also told, once, to stop: a *withdrawal*, a
``Delete`` of the task carrying the fenced attempt (:func:`cancel_activity`), sent to its
direct channel, which it must obey by stopping that attempt at once (the tools stop a
running command and refuse to act for the attempt any further). A worker that is still
there (its offer timed out, it was halted, it sent a late report) is told at once. A
worker that expired or left cannot be told then; the withdrawal is *owed*, and sent when
the worker appears on the roster again (:meth:`TaskBoard.worker_up`), which is what a
paused (SIGSTOP) worker does when it resumes: it stops the stale attempt instead of
running it to the end. So two workers may both *run* a task for a while, but the old
one stops as soon as it can hear about it.

A report without an ``attempt`` field (a worker whose tools do not echo it) is judged by
its sender: it counts when the sender is the current holder and never held an earlier,
fenced claim of the same task; otherwise it is ambiguous and refused.

**Who is who.** An activity about a task from its holder (or from a fenced former
holder) is the worker's: Accept takes the offer, Reject gives it back, Offer asks for
review, Create/Update/Delete/Invoke/Announce/Question report progress. From anyone else
Accept, Reject and Note are review verdicts; the reviewer's tools echo the attempt of
the review request, so a verdict on a fenced attempt's work is refused too. A task is
done by a review Accept; a task submitted with ``review=False`` is also done by the
holder's Announce tagged :data:`DONE_TAG`, and :meth:`TaskBoard.complete` lets the
architect close a held task itself.

**The board** (:class:`TaskBoard`) is the architect's side. It learns workers and their
``slots`` from the node's roster (:meth:`TaskBoard.worker_up`,
:meth:`TaskBoard.worker_gone`), hands each pending task to the least loaded live worker
that has a free slot, is not draining or halted and has not declined it (preferring one
that has not held it before), and never lets a worker hold more than ``slots`` tasks.
Every method takes ``now`` (monotonic seconds) and returns outputs for its driver to
carry out: :class:`Send` (an activity to send on a channel), :class:`TaskChanged` and
:class:`ResultRefused` (to log or show). Nothing here touches a socket or a clock.

**Cancel, drain, halt.** :meth:`TaskBoard.cancel` ends a task and tells its holder.
A draining worker finishes what it holds but is offered nothing new; a halted worker's
claims are fenced and re-offered elsewhere. The board itself can drain (stop offering)
and halt (cancel every open task).
"""

from __future__ import annotations

import enum
import itertools
import logging
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Final

from porter_mesh.core import as2
from porter_mesh.core.advert import is_human
from porter_mesh.core.as2 import Activity
from porter_mesh.core.constants import CHANNEL_LOG, DIRECT_PREFIX
from porter_mesh.core.lifecycle import (
    ATTEMPT_FIELD,
    CANCEL_TAG,
    DONE_TAG,
    PARENT_FIELD,
    Status,
    attempt_of,
)
from porter_mesh.core.lifecycle import text_of as _text_of
from porter_mesh.core.taskid import is_task_id, new_task_id
from porter_mesh.errors import ConfigError, TaskError

__all__ = [
    "ATTEMPT_FIELD",
    "DONE_TAG",
    "HELD_STATES",
    "TERMINAL_STATES",
    "BoardOutput",
    "Claim",
    "EventKind",
    "ResultRefused",
    "Send",
    "Task",
    "TaskBoard",
    "TaskChanged",
    "TaskEvent",
    "TaskState",
    "apply",
    "attempt_of",
    "cancel_activity",
    "fence_reason",
    "is_task_delete",
    "with_attempt",
]

_log = logging.getLogger("porter_mesh.tasks")




class TaskState(enum.Enum):
    """Where a task is in its lifecycle."""

    PENDING = "pending"
    OFFERED = "offered"
    ACCEPTED = "accepted"
    IN_PROGRESS = "in-progress"
    IN_REVIEW = "in-review"
    CHANGES_REQUESTED = "changes-requested"
    DONE = "done"
    REJECTED = "rejected"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def status(self) -> Status:
        """The state in the mesh's one vocabulary (:class:`~.lifecycle.Status`)."""
        return _STATUS[self]


_STATUS: Final[Mapping[TaskState, Status]] = {
    TaskState.PENDING: Status.SUBMITTED,
    TaskState.OFFERED: Status.SUBMITTED,
    TaskState.ACCEPTED: Status.WORKING,
    TaskState.IN_PROGRESS: Status.WORKING,
    TaskState.IN_REVIEW: Status.IN_REVIEW,
    TaskState.CHANGES_REQUESTED: Status.CHANGES_REQUESTED,
    TaskState.DONE: Status.COMPLETED,
    TaskState.REJECTED: Status.REJECTED,
    TaskState.CANCELLED: Status.CANCELLED,
    TaskState.FAILED: Status.FAILED,
}


#: States in which a worker holds the task (and so uses one of its slots).
HELD_STATES: Final = frozenset(
    {
        TaskState.OFFERED,
        TaskState.ACCEPTED,
        TaskState.IN_PROGRESS,
        TaskState.IN_REVIEW,
        TaskState.CHANGES_REQUESTED,
    }
)

#: States a task never leaves.
TERMINAL_STATES: Final = frozenset(
    {TaskState.DONE, TaskState.REJECTED, TaskState.CANCELLED, TaskState.FAILED}
)


@dataclass(frozen=True, slots=True, order=True)
class Claim:
    """One offer of a task to a worker: the fencing token.

    Attributes:
        worker: the agent the task was offered to.
        attempt: 1 for the first offer of the task, then 2, 3...
    """

    worker: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Task:
    """A task as the board knows it. Immutable; :func:`apply` returns new values.

    Attributes:
        context: the task URN.
        summary: one line saying what to do.
        content: the full task text, if any.
        tag: the Offer's labels.
        review: the task is finished only by a review ``Accept`` (otherwise the holder
            may also finish it with an ``Announce`` tagged :data:`DONE_TAG`).
        state: the lifecycle state.
        holder: the worker holding the task, in :data:`HELD_STATES`; else ``None``.
        attempt: attempt number of the current (or last) claim; 0 before the first offer.
        offered_at: when the current claim was offered (monotonic seconds).
        declined_by: workers that rejected the task, with their reasons.
        fenced: claims that ended without finishing the task.
        note: the last reason or review note (empty if none).
        submitted_at: when the task entered the board.
        parent: the task this one is a sub-task of (its Offers name it), if any.
    """

    context: str
    summary: str
    content: str | None = None
    tag: tuple[str, ...] = ()
    review: bool = True
    state: TaskState = TaskState.PENDING
    holder: str | None = None
    attempt: int = 0
    offered_at: float | None = None
    declined_by: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    fenced: frozenset[Claim] = frozenset()
    note: str = ""
    submitted_at: float = 0.0
    parent: str | None = None

    @property
    def claim(self) -> Claim | None:
        """The live claim, or ``None`` when nobody holds the task."""
        if self.holder is None or self.state not in HELD_STATES:
            return None
        return Claim(self.holder, self.attempt)

    @property
    def held(self) -> bool:
        """A worker holds the task."""
        return self.state in HELD_STATES

    @property
    def finished(self) -> bool:
        """The task reached a terminal state."""
        return self.state in TERMINAL_STATES

    @property
    def status(self) -> Status:
        """The state in the mesh's one vocabulary."""
        return self.state.status


class EventKind(enum.Enum):
    """What an activity means for a task, once its sender's role is known."""

    OFFER = "offer"  # the board offers the task to a worker (new claim)
    ACCEPT = "accept"  # the holder takes the offered task
    DECLINE = "decline"  # the holder gives it back (Reject)
    PROGRESS = "progress"  # Create/Update/Delete/Invoke/Announce/Question by the holder
    REVIEW_REQUEST = "review-request"  # Offer by the holder
    APPROVE = "approve"  # review Accept by someone other than the holder
    REQUEST_CHANGES = "request-changes"  # review Reject by someone other than the holder
    REVIEW_NOTE = "review-note"  # review Note
    COMPLETE = "complete"  # holder's Announce tagged "done" (tasks without review)
    FENCE = "fence"  # the board ends the current claim (timeout, expiry, halt)
    CANCEL = "cancel"  # the task is withdrawn
    GIVE_UP = "give-up"  # out of attempts
    ALL_DECLINED = "all-declined"  # every known worker rejected the task


@dataclass(frozen=True, slots=True)
class TaskEvent:
    """An input to :func:`apply`.

    Attributes:
        kind: what happened.
        actor: who did it; for OFFER, the worker offered to.
        attempt: the claim's attempt number for OFFER; otherwise as carried (or ``None``).
        text: a reason, a review note, or a summary.
    """

    kind: EventKind
    actor: str
    attempt: int | None = None
    text: str = ""


_WORKER_EVENTS: Final = frozenset(
    {
        EventKind.ACCEPT,
        EventKind.DECLINE,
        EventKind.PROGRESS,
        EventKind.REVIEW_REQUEST,
        EventKind.COMPLETE,
    }
)

_ALLOWED: Final[Mapping[EventKind, frozenset[TaskState]]] = {
    EventKind.OFFER: frozenset({TaskState.PENDING}),
    EventKind.ACCEPT: frozenset({TaskState.OFFERED}),
    EventKind.DECLINE: frozenset(HELD_STATES - {TaskState.IN_REVIEW}),
    EventKind.PROGRESS: HELD_STATES,
    EventKind.REVIEW_REQUEST: frozenset(
        {
            TaskState.ACCEPTED,
            TaskState.IN_PROGRESS,
            TaskState.CHANGES_REQUESTED,
            TaskState.IN_REVIEW,
        }
    ),
    EventKind.APPROVE: frozenset({TaskState.IN_REVIEW}),
    EventKind.REQUEST_CHANGES: frozenset({TaskState.IN_REVIEW}),
    EventKind.REVIEW_NOTE: frozenset({TaskState.IN_REVIEW, TaskState.CHANGES_REQUESTED}),
    EventKind.COMPLETE: frozenset(
        {TaskState.ACCEPTED, TaskState.IN_PROGRESS, TaskState.CHANGES_REQUESTED}
    ),
    EventKind.FENCE: HELD_STATES,
    EventKind.CANCEL: frozenset(TaskState) - TERMINAL_STATES,
    EventKind.GIVE_UP: frozenset({TaskState.PENDING}),
    EventKind.ALL_DECLINED: frozenset({TaskState.PENDING}),
}


def fence_reason(task: Task, actor: str, attempt: int | None) -> str | None:
    """Say why a worker-side report about ``task`` must not count, or ``None`` if it may.

    Args:
        task: the task the report is about.
        actor: who sent it.
        attempt: the attempt number it carries, or ``None`` if it carries none.

    Returns:
        A reason the sender can act on, or ``None`` when the report belongs to the live
        claim.
    """
    if task.finished:
        return f"task {task.context} is already {task.state.value}"
    live = task.claim
    if attempt is not None and Claim(actor, attempt) in task.fenced:
        now_held = f"attempt {task.attempt} by {task.holder}" if live else "no live claim"
        return (
            f"claim attempt {attempt} of {task.context} by {actor} was fenced "
            f"({task.note or 'the task was re-offered'}; now {now_held})"
        )
    if live is None or live.worker != actor:
        holder = f"held by {live.worker} (attempt {live.attempt})" if live else "not held"
        return f"{actor} does not hold task {task.context}; it is {holder}"
    if attempt is None:
        if any(c.worker == actor for c in task.fenced):
            return (
                f"report from {actor} on {task.context} carries no attempt number, and "
                f"{actor} held an earlier, fenced claim; echo \"attempt\": {live.attempt}"
            )
        return None
    if attempt != live.attempt:
        return (
            f"report from {actor} on {task.context} carries attempt {attempt}, but the "
            f"live claim is attempt {live.attempt}"
        )
    return None


def apply(task: Task, event: TaskEvent, now: float) -> Task:
    """Advance ``task`` by one event.

    Fencing is checked separately (:func:`fence_reason`); this function assumes the
    event is from the right party and checks only the state diagram.

    Args:
        task: the current task.
        event: what happened.
        now: monotonic seconds (recorded as the offer time for OFFER).

    Returns:
        The new task value (the same value when the event changes nothing).

    Raises:
        TaskError: the event is not allowed in the task's state.
    """
    allowed = _ALLOWED[event.kind]
    if task.state not in allowed:
        raise TaskError(
            f"{event.kind.value} by {event.actor} is not allowed for task {task.context} "
            f"in state {task.state.value} (allowed in: "
            f"{', '.join(sorted(s.value for s in allowed))})"
        )
    kind = event.kind
    if kind is EventKind.OFFER:
        if event.attempt is None or event.attempt <= task.attempt:
            raise TaskError(
                f"offer of {task.context} needs an attempt number above {task.attempt}"
            )
        return replace(
            task,
            state=TaskState.OFFERED,
            holder=event.actor,
            attempt=event.attempt,
            offered_at=now,
            note="",
        )
    if kind is EventKind.ACCEPT:
        return replace(task, state=TaskState.ACCEPTED)
    if kind is EventKind.PROGRESS:
        if task.state in (TaskState.IN_REVIEW, TaskState.IN_PROGRESS):
            return task
        return replace(task, state=TaskState.IN_PROGRESS)
    if kind is EventKind.REVIEW_REQUEST:
        return replace(task, state=TaskState.IN_REVIEW)
    if kind is EventKind.APPROVE:
        if event.actor == task.holder:
            raise TaskError(f"{event.actor} cannot approve its own work on {task.context}")
        return replace(task, state=TaskState.DONE, note=event.text)
    if kind is EventKind.REQUEST_CHANGES:
        if event.actor == task.holder:
            raise TaskError(f"{event.actor} cannot review its own work on {task.context}")
        return replace(task, state=TaskState.CHANGES_REQUESTED, note=event.text)
    if kind is EventKind.REVIEW_NOTE:
        return replace(task, note=event.text)
    if kind is EventKind.COMPLETE:
        if task.review:
            raise TaskError(
                f"task {task.context} needs a review; send an Offer on 'review' instead"
            )
        return replace(task, state=TaskState.DONE, note=event.text)
    if kind in (EventKind.DECLINE, EventKind.FENCE):
        claim = task.claim
        assert claim is not None  # HELD_STATES always have a holder
        declined = task.declined_by
        if kind is EventKind.DECLINE:
            declined = MappingProxyType({**declined, claim.worker: event.text})
        return replace(
            task,
            state=TaskState.PENDING,
            holder=None,
            offered_at=None,
            declined_by=declined,
            fenced=task.fenced | {claim},
            note=event.text,
        )
    if kind is EventKind.CANCEL:
        claim = task.claim
        fenced = task.fenced | {claim} if claim is not None else task.fenced
        return replace(
            task, state=TaskState.CANCELLED, holder=None, fenced=fenced, note=event.text
        )
    state = TaskState.FAILED if kind is EventKind.GIVE_UP else TaskState.REJECTED
    return replace(task, state=state, note=event.text)


# -- AS2 helpers --------------------------------------------------------------------------


def with_attempt(activity: Activity, attempt: int | None) -> Activity:
    """Return ``activity`` carrying the ``"attempt"`` extension field.

    Args:
        activity: the activity to stamp.
        attempt: the attempt number; ``None`` returns the activity unchanged.

    Returns:
        The stamped activity.
    """
    if attempt is None:
        return activity
    return activity.replace(extra={ATTEMPT_FIELD: attempt})


def is_task_delete(activity: Activity) -> bool:
    """Tell whether an activity withdraws a task: a ``Delete`` whose object is the task.

    The profile has no cancel activity. This mesh cancels (and tells a fenced worker to
    stop) with ``Delete`` whose ``object`` is the task URN itself, which a ``Delete`` of
    a file (its object a ``Document``) can never be mistaken for.

    Args:
        activity: any activity.

    Returns:
        ``True`` for a task withdrawal.
    """
    return (
        activity.type == "Delete"
        and activity.context is not None
        and activity.object == activity.context
    )


def cancel_activity(
    actor: str, context: str, summary: str, *, attempt: int | None = None,
    cancel: bool = False, parent: str | None = None,
) -> Activity:
    """Build the withdrawal of a task (see :func:`is_task_delete`).

    Args:
        actor: who withdraws it (the board's owner, or the task's requester).
        context: the task URN.
        summary: why, in one line.
        attempt: the claim withdrawn, when only one claim is meant.
        cancel: the task itself is cancelled, not only this claim: tagged
            :data:`~.lifecycle.CANCEL_TAG`, so every observer shows it cancelled.
        parent: the parent task, for a sub-task cancelled with it.

    Returns:
        A ``Delete`` activity.
    """
    extra: dict[str, object] = {} if attempt is None else {ATTEMPT_FIELD: attempt}
    if parent is not None:
        extra["parent"] = parent
    return as2.delete(actor, summary, context, context=context, extra=extra or None,
                      tag=[CANCEL_TAG] if cancel else None)


# -- the board ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """An activity the board's driver must send.

    Attributes:
        channel: ``task:<worker>`` for offers and withdrawals, ``log`` for notices.
        activity: the activity.
    """

    channel: str
    activity: Activity


@dataclass(frozen=True, slots=True)
class TaskChanged:
    """A task changed state (or was submitted: then ``previous`` is ``PENDING`` too).

    Attributes:
        task: the task after the change.
        previous: its state before.
        reason: why, in words.
    """

    task: Task
    previous: TaskState
    reason: str


@dataclass(frozen=True, slots=True)
class ResultRefused:
    """A report did not count, because its claim is fenced or the task is over.

    Attributes:
        context: the task.
        actor: who sent the report.
        attempt: the attempt it carried (``None`` if none).
        activity_type: its AS2 type.
        reason: why it was refused, in words.
    """

    context: str
    actor: str
    attempt: int | None
    activity_type: str
    reason: str


BoardOutput = Send | TaskChanged | ResultRefused


#: What an activity means when its sender holds (or held) the task.
_HOLDER_EVENTS: Final[Mapping[str, EventKind]] = {
    "Accept": EventKind.ACCEPT,
    "Reject": EventKind.DECLINE,
    "Offer": EventKind.REVIEW_REQUEST,
    "Create": EventKind.PROGRESS,
    "Update": EventKind.PROGRESS,
    "Delete": EventKind.PROGRESS,
    "Invoke": EventKind.PROGRESS,
    "Question": EventKind.PROGRESS,
    "Announce": EventKind.PROGRESS,
}

#: What an activity means when anyone else sends it: a review of the holder's work.
_REVIEWER_EVENTS: Final[Mapping[str, EventKind]] = {
    "Accept": EventKind.APPROVE,
    "Reject": EventKind.REQUEST_CHANGES,
    "Note": EventKind.REVIEW_NOTE,
}


@dataclass(slots=True)
class _Worker:
    name: str
    slots: int
    alive: bool = True  # False while the roster says evasive
    advertised_draining: bool = False  # the worker's own advert says it drains
    drained: bool = False  # this board decided to drain it
    halted: bool = False  # this board halted it

    @property
    def open(self) -> bool:
        """The worker may be offered new tasks."""
        return self.alive and not (self.advertised_draining or self.drained or self.halted)


class TaskBoard:
    """The architect's task board: assigns tasks to workers and fences stale claims.

    Args:
        owner: the agent name the board offers as (the architect).
        offer_timeout: seconds an offer may stay unaccepted before it is fenced and
            re-offered (IACP's ``assign_timeout``, default 300 as there).
        max_attempts: offers of one task before it is given up (FAILED).

    Raises:
        ConfigError: a setting is out of range.
    """

    def __init__(
        self, owner: str, *, offer_timeout: float = 300.0, max_attempts: int = 5
    ) -> None:
        if not owner:
            raise ConfigError("owner: the board needs the agent name it offers as")
        if not offer_timeout > 0:
            raise ConfigError(f"offer_timeout must be > 0 seconds, got {offer_timeout}")
        if max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {max_attempts}")
        self.owner = owner
        self.offer_timeout = offer_timeout
        self.max_attempts = max_attempts
        self.draining = False
        self._tasks: dict[str, Task] = {}  # insertion order is submission order
        self._workers: dict[str, _Worker] = {}
        # Indexes kept by _store, so that an event costs O(workers + tasks offered),
        # not O(all tasks): held tasks per worker, and the pending queue in two parts:
        # tasks never offered, in submission order, and tasks that lost a claim, which
        # go first, by submission number (a re-offered task keeps its place).
        self._load: Counter[str] = Counter()
        self._fresh: dict[str, None] = {}
        self._requeued: dict[str, int] = {}
        self._order: dict[str, int] = {}
        # Fenced claims already told to stop, and already reported on the log: each is
        # said once, however many late reports a stale worker keeps sending.
        self._told: set[tuple[str, Claim]] = set()
        self._reported: set[tuple[str, Claim]] = set()
        # Withdrawals of claims lost by workers that were gone, sent when they return:
        # worker -> [(task, claim, reason)].
        self._owed: dict[str, list[tuple[str, Claim, str]]] = {}

    # -- queries ---------------------------------------------------------------------------

    def task(self, context: str) -> Task | None:
        """The task with this context, or ``None``."""
        return self._tasks.get(context)

    def tasks(self) -> list[Task]:
        """Every task, in submission order."""
        return list(self._tasks.values())

    def load(self, worker: str) -> int:
        """How many tasks ``worker`` holds."""
        return self._load[worker]

    def workers(self) -> dict[str, int]:
        """Known workers and their slots."""
        return {w.name: w.slots for w in self._workers.values()}

    def owed_withdrawals(self, worker: str) -> list[Claim]:
        """Claims of ``worker`` fenced while it was gone, not yet withdrawn."""
        return [c for ctx, c, _ in self._owed.get(worker, ()) if (ctx, c) not in self._told]

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`tick` has something to do, or ``None``."""
        times = [
            t.offered_at + self.offer_timeout
            for t in self._tasks.values()
            if t.state is TaskState.OFFERED and t.offered_at is not None
        ]
        return min(times, default=None)

    # -- inputs: tasks ---------------------------------------------------------------------

    def submit(
        self,
        summary: str,
        content: str | None = None,
        *,
        now: float,
        context: str | None = None,
        tag: Iterable[str] = (),
        review: bool = True,
        parent: str | None = None,
    ) -> tuple[str, list[BoardOutput]]:
        """Add a task and offer it if a worker is free.

        Args:
            summary: one line saying what to do.
            content: the full task description.
            now: monotonic seconds.
            context: the task URN; a new one is minted when ``None``.
            tag: labels for the Offer.
            review: the task needs a review ``Accept`` to be done.
            parent: the task this one is part of (the board's owner holds it); every
                Offer of this task names it (``docs/protocol.md``, "Sub-tasks").

        Returns:
            ``(context, outputs)``.

        Raises:
            TaskError: the summary is empty, or the context is malformed or in use.
        """
        if not summary.strip():
            raise TaskError("a task needs a one-line summary saying what to do")
        ctx = context if context is not None else new_task_id()
        if not is_task_id(ctx):
            raise TaskError(f"context {ctx!r} is not a task URN (urn:porter:task:<id>)")
        if ctx in self._tasks:
            raise TaskError(f"task {ctx} already exists; submit with a new context")
        task = Task(ctx, summary, content, tuple(tag), review, submitted_at=now,
                    parent=parent)
        self._order[ctx] = len(self._order)
        self._tasks[ctx] = task
        self._fresh[ctx] = None
        out: list[BoardOutput] = [TaskChanged(task, TaskState.PENDING, "submitted")]
        out += self._dispatch(now)
        return ctx, out

    def cancel(self, context: str, reason: str, *, now: float) -> list[BoardOutput]:
        """Withdraw a task; its holder (if any) is told to stop.

        Args:
            context: the task.
            reason: why, in words (shown to the holder).
            now: monotonic seconds.

        Returns:
            The outputs.

        Raises:
            TaskError: no such task, or it is already finished.
        """
        task = self._require(context)
        if task.finished:
            raise TaskError(f"task {context} is already {task.state.value}; nothing to cancel")
        return self._cancel(task, reason, now)

    def complete(self, context: str, note: str, *, now: float) -> list[BoardOutput]:
        """Mark a held task done by the architect's own decision (no review needed).

        Args:
            context: the task.
            note: why, in words.
            now: monotonic seconds.

        Returns:
            The outputs.

        Raises:
            TaskError: no such task, or nobody holds it.
        """
        task = self._require(context)
        if not task.held:
            raise TaskError(f"task {context} is {task.state.value}; only a held task completes")
        done = replace(task, state=TaskState.DONE, note=note)
        return self._store(task, done, f"completed by {self.owner}: {note}") + self._dispatch(
            now
        )

    def handle(self, activity: Activity, *, now: float) -> list[BoardOutput]:
        """Feed an activity seen on any channel.

        Activities without a known task context, and the board's own, are ignored.

        Args:
            activity: the activity.
            now: monotonic seconds.

        Returns:
            The outputs (empty when the activity does not concern the board's tasks).
        """
        ctx = activity.context
        actor = activity.actor
        if ctx is None or not actor or actor == self.owner:
            return []
        task = self._tasks.get(ctx)
        if task is None:
            return []
        if is_task_delete(activity):
            if is_human(actor) and not task.finished:
                return self._cancel(task, f"cancelled by {actor}: {activity.summary}", now)
            return []
        event = self._classify(task, activity)
        if event is None:
            return []
        if event.kind in _WORKER_EVENTS:
            refusal = fence_reason(task, actor, event.attempt)
            if refusal is not None:
                return self._refuse(task, activity, event, refusal)
        elif event.attempt is not None and event.attempt != task.attempt:
            # A review verdict about an earlier claim's work.
            return self._refuse(
                task,
                activity,
                event,
                f"review of attempt {event.attempt} of {ctx} no longer applies; the live "
                f"claim is attempt {task.attempt}",
            )
        try:
            new = apply(task, event, now)
        except TaskError as exc:
            _log.debug("ignored %s: %s", activity.type, exc)
            return []
        reason = event.kind.value + (f": {event.text}" if event.text else "")
        out = self._store(task, new, reason)
        if new.state is TaskState.PENDING:
            out += self._after_claim_ended(new, now)
        if not new.held:
            out += self._dispatch(now)
        return out

    # -- inputs: workers and time -----------------------------------------------------------

    def worker_up(
        self, name: str, *, slots: int = 1, draining: bool = False, now: float
    ) -> list[BoardOutput]:
        """A worker joined, came back, or changed its advert.

        A worker that comes back after it expired is first sent the withdrawals of the
        claims it lost meanwhile (see the module docstring).

        Args:
            name: the worker's agent name.
            slots: how many tasks it may hold at once (its advertised capacity).
            draining: it finishes what it holds but takes nothing new.
            now: monotonic seconds.

        Returns:
            The outputs: owed withdrawals, then offers of pending tasks it can take.

        Raises:
            ConfigError: ``slots`` is below 1.
        """
        if slots < 1:
            raise ConfigError(f"worker {name}: slots must be >= 1, got {slots}")
        out: list[BoardOutput] = [
            self._withdraw(self._tasks[ctx], claim, f"Withdrawn: {reason}")
            for ctx, claim, reason in self._owed.pop(name, ())
            if (ctx, claim) not in self._told
        ]
        worker = self._workers.get(name)
        if worker is None:
            self._workers[name] = _Worker(name, slots, advertised_draining=draining)
        else:
            worker.slots = slots
            worker.alive = True
            worker.advertised_draining = draining
        return out + self._dispatch(now)

    def worker_evasive(self, name: str, *, now: float) -> list[BoardOutput]:
        """A worker went quiet: it keeps its tasks but is offered nothing new.

        Args:
            name: the worker.
            now: monotonic seconds.

        Returns:
            The outputs (none today; kept for symmetry with the other inputs).
        """
        worker = self._workers.get(name)
        if worker is not None:
            worker.alive = False
        return []

    def worker_gone(self, name: str, *, reason: str, now: float) -> list[BoardOutput]:
        """A worker expired, left or restarted: fence its claims and re-offer them.

        It cannot be told now; the withdrawals are owed until it comes back
        (:meth:`worker_up`).

        Args:
            name: the worker.
            reason: why (``expired``, ``goodbye``, ``restarted``...).
            now: monotonic seconds.

        Returns:
            The outputs.
        """
        self._workers.pop(name, None)
        return self._fence_holder(name, f"holder {name} {reason}", now, tell=False)

    def drain_worker(self, name: str, *, now: float) -> list[BoardOutput]:
        """Offer ``name`` nothing new; it finishes what it holds.

        Args:
            name: the worker.
            now: monotonic seconds.

        Returns:
            The outputs (none).
        """
        worker = self._workers.get(name)
        if worker is not None:
            worker.drained = True
        return []

    def resume_worker(self, name: str, *, now: float) -> list[BoardOutput]:
        """Undo :meth:`drain_worker` and :meth:`halt_worker` for ``name``.

        Args:
            name: the worker.
            now: monotonic seconds.

        Returns:
            The outputs (offers of pending tasks it can now take).
        """
        worker = self._workers.get(name)
        if worker is not None:
            worker.drained = worker.halted = False
        return self._dispatch(now)

    def halt_worker(self, name: str, *, now: float) -> list[BoardOutput]:
        """``name`` stops now: fence its claims and re-offer them to others.

        Args:
            name: the worker.
            now: monotonic seconds.

        Returns:
            The outputs.
        """
        worker = self._workers.get(name)
        if worker is not None:
            worker.halted = True
        return self._fence_holder(name, f"holder {name} halted", now, tell=True)

    def drain(self) -> None:
        """Stop offering tasks; tasks already held go on."""
        self.draining = True

    def resume(self, *, now: float) -> list[BoardOutput]:
        """Undo :meth:`drain`: offer pending tasks again.

        Args:
            now: monotonic seconds.

        Returns:
            The outputs.
        """
        self.draining = False
        return self._dispatch(now)

    def halt(self, reason: str, *, now: float) -> list[BoardOutput]:
        """Stop everything: drain, and cancel every open task.

        Args:
            reason: why, in words.
            now: monotonic seconds.

        Returns:
            The outputs.
        """
        self.draining = True
        out: list[BoardOutput] = []
        for task in list(self._tasks.values()):
            if not task.finished:
                out += self._cancel(task, f"halted: {reason}", now)
        return out

    def tick(self, *, now: float) -> list[BoardOutput]:
        """Advance time: fence offers nobody accepted within ``offer_timeout``.

        Args:
            now: monotonic seconds.

        Returns:
            The outputs.
        """
        out: list[BoardOutput] = []
        for task in list(self._tasks.values()):
            if (
                task.state is TaskState.OFFERED
                and task.offered_at is not None
                and now - task.offered_at >= self.offer_timeout
            ):
                out += self._fence(
                    task, f"offer not accepted within {self.offer_timeout:g}s", now, tell=True
                )
        return out + self._dispatch(now)

    # -- internals ---------------------------------------------------------------------------

    def _require(self, context: str) -> Task:
        task = self._tasks.get(context)
        if task is None:
            raise TaskError(f"no task {context} on this board; see tasks() for known ones")
        return task

    def _store(self, old: Task, new: Task, reason: str) -> list[BoardOutput]:
        ctx = new.context
        self._tasks[ctx] = new
        if old.held and old.holder is not None:
            self._load[old.holder] -= 1
        if new.held and new.holder is not None:
            self._load[new.holder] += 1
        if new.state is not TaskState.PENDING:
            self._fresh.pop(ctx, None)
            self._requeued.pop(ctx, None)
        elif old.state is not TaskState.PENDING:
            self._requeued[ctx] = self._order[ctx]
        if new.state is old.state:
            return []
        return [TaskChanged(new, old.state, reason)]

    def _classify(self, task: Task, activity: Activity) -> TaskEvent | None:
        """Turn an activity about ``task`` into an event, by type and sender."""
        actor = activity.actor
        attempt = attempt_of(activity)
        claimant = actor == task.holder or any(c.worker == actor for c in task.fenced)
        kind = (_HOLDER_EVENTS if claimant else _REVIEWER_EVENTS).get(activity.type)
        if (
            kind is EventKind.PROGRESS
            and activity.type == "Announce"
            and DONE_TAG in (activity.tag or ())
            and not task.review
        ):
            kind = EventKind.COMPLETE
        if kind is None:
            return None
        return TaskEvent(kind, actor, attempt, _text_of(activity))

    def _refuse(
        self, task: Task, activity: Activity, event: TaskEvent, reason: str
    ) -> list[BoardOutput]:
        actor = event.actor
        out: list[BoardOutput] = [
            ResultRefused(task.context, actor, event.attempt, activity.type, reason)
        ]
        fenced_claim = next(
            (c for c in sorted(task.fenced, reverse=True) if c.worker == actor), None
        )
        if event.kind in _WORKER_EVENTS and fenced_claim is not None:
            key = (task.context, fenced_claim)
            if key not in self._reported:
                self._reported.add(key)
                summary = f"Refused {activity.type} from {actor}: {reason}"
                out.append(Send(CHANNEL_LOG, self._announce(task.context, summary)))
            if key not in self._told:
                out.append(self._withdraw(task, fenced_claim, f"Stop work: {reason}"))
        return out

    def _announce(self, context: str, summary: str) -> Activity:
        return as2.announce(self.owner, summary, context=context)

    def _withdraw(self, task: Task, claim: Claim, summary: str, *,
                  cancel: bool = False) -> Send:
        self._told.add((task.context, claim))
        activity = cancel_activity(self.owner, task.context, summary, attempt=claim.attempt,
                                   cancel=cancel)
        return Send(DIRECT_PREFIX + claim.worker, activity)

    def _cancel(self, task: Task, reason: str, now: float) -> list[BoardOutput]:
        claim = task.claim
        new = apply(task, TaskEvent(EventKind.CANCEL, self.owner, text=reason), now)
        out = self._store(task, new, reason)
        if claim is not None:
            out.append(self._withdraw(task, claim, f"Cancelled: {reason}", cancel=True))
        return out + self._dispatch(now)

    def _fence_holder(self, name: str, reason: str, now: float, *, tell: bool) -> list[BoardOutput]:
        out: list[BoardOutput] = []
        for task in list(self._tasks.values()):
            if task.held and task.holder == name:
                out += self._fence(task, reason, now, tell=tell)
        return out + self._dispatch(now)

    def _fence(self, task: Task, reason: str, now: float, *, tell: bool) -> list[BoardOutput]:
        claim = task.claim
        assert claim is not None
        new = apply(task, TaskEvent(EventKind.FENCE, self.owner, text=reason), now)
        out = self._store(task, new, f"fenced {claim.worker} attempt {claim.attempt}: {reason}")
        if tell:
            out.append(self._withdraw(task, claim, f"Withdrawn: {reason}"))
        else:
            self._owed.setdefault(claim.worker, []).append((task.context, claim, reason))
        return out + self._after_claim_ended(new, now)

    def _after_claim_ended(self, task: Task, now: float) -> list[BoardOutput]:
        """A pending task lost its claim: give up on it, or leave it for dispatch."""
        if task.attempt >= self.max_attempts:
            kind = EventKind.GIVE_UP
            reason = f"gave up after {task.attempt} attempts; last: {task.note}"
        elif self._workers and all(w in task.declined_by for w in self._workers):
            kind = EventKind.ALL_DECLINED
            reasons = "; ".join(f"{w}: {r}" for w, r in sorted(task.declined_by.items()))
            reason = f"declined by every worker ({reasons})"
        else:
            return []
        new = apply(task, TaskEvent(kind, self.owner, text=reason), now)
        return self._store(task, new, reason)

    def _pick(self, task: Task, planned: Counter[str]) -> _Worker | None:
        """The worker to offer ``task`` to: open, with a free slot (counting the offers
        ``planned`` in this pass), not among those who declined it; preferring one that
        has not held it, then the least loaded, then by name."""
        previous = {c.worker for c in task.fenced}
        best: tuple[bool, int, str] | None = None
        chosen: _Worker | None = None
        for w in self._workers.values():
            load = self._load[w.name] + planned[w.name]
            if not w.open or load >= w.slots or w.name in task.declined_by:
                continue
            key = (w.name in previous, load, w.name)
            if best is None or key < best:
                best, chosen = key, w
        return chosen

    def _dispatch(self, now: float) -> list[BoardOutput]:
        if self.draining or not (self._fresh or self._requeued):
            return []
        load = self._load
        free = 0
        for w in self._workers.values():
            if w.open and w.slots > load[w.name]:
                free += w.slots - load[w.name]
        # Plan first, then apply: the queue indexes change as offers are stored, and
        # planning reads them without copying the whole queue on every event.
        planned: Counter[str] = Counter()
        plan: list[tuple[Task, _Worker]] = []
        requeued = sorted(self._requeued, key=self._requeued.__getitem__)
        for ctx in itertools.chain(requeued, self._fresh):
            if free <= 0:
                break  # nobody can take anything more: stop scanning the queue
            task = self._tasks[ctx]
            worker = self._pick(task, planned)
            if worker is not None:
                plan.append((task, worker))
                planned[worker.name] += 1
                free -= 1
        out: list[BoardOutput] = []
        for task, worker in plan:
            attempt = task.attempt + 1
            new = apply(task, TaskEvent(EventKind.OFFER, worker.name, attempt), now)
            out += self._store(task, new, f"offered to {worker.name} (attempt {attempt})")
            offer = as2.offer(
                self.owner,
                task.summary,
                task.content,
                target=worker.name,
                context=task.context,
                tag=list(task.tag) or None,
            )
            if task.parent is not None:
                offer = offer.replace(extra={PARENT_FIELD: task.parent})
            out.append(Send(DIRECT_PREFIX + worker.name, with_attempt(offer, attempt)))
        return out
