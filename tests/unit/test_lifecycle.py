"""The task state vocabulary: following a task from the activities seen in its context."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from porter_mesh.core import as2
from porter_mesh.core.as2 import Activity
from porter_mesh.core.lifecycle import (
    CANCEL_TAG,
    CANCELLED_TAG,
    DONE_TAG,
    FAILED_TAG,
    FINAL_STATUSES,
    Status,
    TaskRecord,
    follow,
    is_cancel,
    parent_of,
)
from porter_mesh.core.tasks import TaskState, cancel_activity
from tests.fuzzing import examples

CTX = "urn:porter:task:t1"


def act(kind: str, actor: str, *, target: str | None = None, tag: list[str] | None = None,
        attempt: int | None = None, obj: Any = None, **extra: Any) -> Activity:
    data: dict[str, Any] = {"type": kind, "actor": actor, "summary": f"{kind} by {actor}",
                            "context": CTX}
    if target is not None:
        data["target"] = target
    if tag:
        data["tag"] = tag
    if attempt is not None:
        data["attempt"] = attempt
    if obj is not None:
        data["object"] = obj
    data.update(extra)
    return Activity.from_dict(data)


def run(steps: list[tuple[Activity, str, str]], start: TaskRecord | None = None
        ) -> TaskRecord | None:
    record = start
    for i, (activity, sender, channel) in enumerate(steps):
        record = follow(record, activity, sender=sender, channel=channel, now=float(i))
    return record


def offered(**extra: Any) -> TaskRecord:
    record = run([(act("Offer", "porter-ui-ab12", **extra), "porter-ui-ab12", "task:w1")])
    assert record is not None
    return record


def test_only_an_offer_starts_a_task() -> None:
    question = act("Question", "porter-ui-ab12")
    assert follow(None, question, sender="porter-ui-ab12", channel="log", now=0) is None
    note = act("Note", "w1")
    assert follow(None, note, sender="w1", channel="task:porter-ui", now=0) is None
    review = act("Offer", "w1", target="reviewer")
    assert follow(None, review, sender="w1", channel="review", now=0) is None
    record = offered()
    assert (record.status, record.requester, record.holder) == (
        Status.SUBMITTED, "porter-ui-ab12", "w1")
    # An Offer to anyone is held by whoever accepts it.
    anyone = follow(None, act("Offer", "arch"), sender="arch", channel="task", now=0)
    assert anyone is not None and anyone.holder is None
    taken = follow(anyone, act("Accept", "w2"), sender="w2", channel="task:arch", now=1)
    assert taken is not None and (taken.status, taken.holder) == (Status.WORKING, "w2")


def test_a_task_through_review_to_completed() -> None:
    record = run([
        (act("Accept", "w1"), "w1", "task:porter-ui-ab12"),
        (act("Invoke", "w1"), "w1", "log"),
    ], offered())
    assert record is not None and record.status is Status.WORKING
    record = run([(act("Offer", "w1", target="porter-ui"), "w1", "review")], record)
    assert record is not None
    assert (record.status, record.reviewer) == (Status.IN_REVIEW, "porter-ui")
    changes = run([(act("Reject", "porter-ui"), "porter-ui", "review")], record)
    assert changes is not None and changes.status is Status.CHANGES_REQUESTED
    again = run([(act("Update", "w1"), "w1", "log")], changes)
    assert again is not None and again.status is Status.WORKING
    done = run([(act("Accept", "porter-ui-cd34"), "porter-ui-cd34", "review")], record)
    assert done is not None and done.status is Status.COMPLETED


def test_a_verdict_from_someone_else_than_the_reviewer_does_not_count() -> None:
    record = run([(act("Accept", "w1"), "w1", "task:porter-ui-ab12"),
                  (act("Offer", "w1", target="reviewer"), "w1", "review"),
                  (act("Accept", "w2"), "w2", "review")], offered())
    assert record is not None and record.status is Status.IN_REVIEW


def test_input_required_and_its_answer() -> None:
    record = run([(act("Accept", "w1"), "w1", "task:porter-ui-ab12"),
                  (act("Question", "w1"), "w1", "task:porter-ui-ab12")], offered())
    assert record is not None and record.status is Status.INPUT_REQUIRED
    assert record.question.startswith("Question by w1")
    # A question to someone else is progress, not a wait on the requester.
    other = run([(act("Accept", "w1"), "w1", "task:porter-ui-ab12"),
                 (act("Question", "w1"), "w1", "task:w2")], offered())
    assert other is not None and other.status is Status.WORKING
    # The answer from any of the human's seats brings it back.
    answered = run([(act("Note", "porter-ui"), "porter-ui", "task:w1")], record)
    assert answered is not None
    assert (answered.status, answered.question) == (Status.WORKING, "")


@pytest.mark.parametrize(("tag", "status"), [(DONE_TAG, Status.COMPLETED),
                                             (FAILED_TAG, Status.FAILED),
                                             (CANCELLED_TAG, Status.CANCELLED)])
def test_the_holders_closing_announce(tag: str, status: Status) -> None:
    record = run([(act("Announce", "w1", tag=[tag]), "w1", "log")], offered())
    assert record is not None and record.status is status


def test_reject_of_a_direct_request_is_final_of_a_boards_claim_is_not() -> None:
    record = run([(act("Reject", "w1"), "w1", "task:porter-ui-ab12")], offered())
    assert record is not None and record.status is Status.REJECTED
    claim = run([(act("Reject", "w1", attempt=1), "w1", "task:porter-ui-ab12")],
                offered(attempt=1))
    assert claim is not None and (claim.status, claim.holder) == (Status.SUBMITTED, None)
    reoffer = act("Offer", "porter-ui-ab12", attempt=2)
    again = follow(claim, reoffer, sender="porter-ui-ab12", channel="task:w2", now=9)
    assert again is not None and (again.holder, again.attempt) == ("w2", 2)


def test_cancel_and_withdrawal() -> None:
    cancel = cancel_activity("porter-ui-ab12", CTX, "stop", cancel=True)
    assert is_cancel(cancel) and CANCEL_TAG in (cancel.tag or ())
    record = run([(cancel, "porter-ui-ab12", "task:w1")], offered())
    assert record is not None and record.status is Status.CANCELLED
    # Only the requester (or the human) cancels.
    stranger = cancel_activity("w9", CTX, "stop", cancel=True)
    kept = run([(stranger, "w9", "task:w1")], offered())
    assert kept is not None and kept.status is Status.SUBMITTED
    # A withdrawal of one claim hands the task back to its requester.
    withdrawal = cancel_activity("arch", CTX, "expired", attempt=1)
    assert not is_cancel(withdrawal)
    start = follow(None, act("Offer", "arch", attempt=1), sender="arch", channel="task:w1",
                   now=0)
    back = run([(withdrawal, "arch", "task:w1")], start)
    assert back is not None and back.status is Status.SUBMITTED and back.holder is None


def test_a_sub_task_names_its_parent() -> None:
    sub = act("Offer", "w1", parent="urn:porter:task:top")
    assert parent_of(sub) == "urn:porter:task:top"
    record = follow(None, sub, sender="w1", channel="task:w2", now=0)
    assert record is not None and record.parent == "urn:porter:task:top"
    assert parent_of(act("Offer", "w1", parent="not a task")) is None


def test_the_boards_states_map_onto_the_vocabulary() -> None:
    assert {s.status for s in TaskState} == set(Status) - {Status.INPUT_REQUIRED}
    assert {s.status for s in TaskState if s.value in ("done", "rejected", "cancelled",
                                                        "failed")} == FINAL_STATUSES


# -- the property test -----------------------------------------------------------------------

PARTIES = ["porter-ui", "porter-ui-ab12", "w1", "w2", "reviewer"]
TYPES = ["Offer", "Accept", "Reject", "Create", "Update", "Delete", "Invoke", "Announce",
         "Question", "Note"]
CHANNELS = ["log", "review", "task", "task:w1", "task:w2", "task:porter-ui-ab12"]


@st.composite
def activities(draw: st.DrawFn) -> tuple[Activity, str, str]:
    sender = draw(st.sampled_from(PARTIES))
    kind = draw(st.sampled_from(TYPES))
    data: dict[str, Any] = {"type": kind, "actor": sender, "summary": "s", "context": CTX}
    if kind == "Delete" and draw(st.booleans()):
        data["object"] = CTX  # a withdrawal or cancel of the task
    tags = draw(st.lists(st.sampled_from([CANCEL_TAG, CANCELLED_TAG, DONE_TAG, FAILED_TAG,
                                          "x"]), max_size=2))
    if tags:
        data["tag"] = tags
    attempt = draw(st.none() | st.integers(1, 4))
    if attempt is not None:
        data["attempt"] = attempt
    if draw(st.booleans()):
        data["target"] = draw(st.sampled_from(PARTIES))
    return Activity.from_dict(data), sender, draw(st.sampled_from(CHANNELS))


@settings(max_examples=examples(400), deadline=None)
@given(st.lists(activities(), max_size=25))
def test_property_state_stays_in_the_vocabulary_finals_are_final_fenced_is_inert(
        steps: list[tuple[Activity, str, str]]) -> None:
    record: TaskRecord | None = None
    for i, (activity, sender, channel) in enumerate(steps):
        new = follow(record, activity, sender=sender, channel=channel, now=float(i))
        if record is None:
            assert new is None or activity.type == "Offer"
        else:
            assert new is not None and isinstance(new.status, Status)
            if record.final:
                assert new.status is record.status
            attempt = activity.extra.get("attempt")
            if (record.attempt is not None and isinstance(attempt, int)
                    and attempt < record.attempt):
                assert new == record  # a fenced claim changes nothing
        record = new


def test_a_stale_attempt_changes_nothing() -> None:
    start = follow(None, act("Offer", "arch", attempt=2), sender="arch", channel="task:w1",
                   now=0)
    for stale in (act("Accept", "w1", attempt=1), act("Reject", "w1", attempt=1),
                  act("Announce", "w1", attempt=1, tag=[DONE_TAG])):
        assert follow(start, stale, sender="w1", channel="task:arch", now=1) == start


def test_board_cancel_is_tagged() -> None:
    activity = cancel_activity("arch", CTX, "no longer needed", attempt=3, cancel=True)
    assert is_cancel(activity)
    assert activity.extra.get("attempt") == 3
    assert as2.Activity.from_dict(activity.to_dict()) == activity


def test_the_boards_offers_of_a_sub_task_name_its_parent() -> None:
    from porter_mesh.core.tasks import Send, TaskBoard

    board = TaskBoard("arch")
    board.worker_up("w1", now=0)
    ctx, out = board.submit("part", now=0, parent="urn:porter:task:top")
    [offer] = [o for o in out if isinstance(o, Send)]
    assert parent_of(offer.activity) == "urn:porter:task:top"
    assert offer.activity.extra.get("attempt") == 1
    record = follow(None, offer.activity, sender="arch", channel=offer.channel, now=0)
    assert record is not None and (record.context, record.parent) == (
        ctx, "urn:porter:task:top")
