"""The A2A gateway's translation table, pure: activities in, states and artifacts out."""

from __future__ import annotations

import ast
import pathlib

import pytest

from porter_mesh.core import as2
from porter_mesh.core import constants as C
from porter_mesh.core.lifecycle import Status, TaskRecord, follow
from porter_mesh.gateways.a2a import mapping
from porter_mesh.gateways.a2a.mapping import (
    Ask,
    a2a_state,
    answer_for,
    approves,
    ask_of,
    cancel_for,
    mesh_context,
    offer_for,
    translate,
)

ME = "porter-ui-a2a"
W = "w1"
TID = "3a90a318-11de-4cf8-890c-74d6a226e181"
CTX = f"urn:porter:task:{TID}"


def started() -> TaskRecord:
    offer = offer_for(ME, W, "Write a haiku\nabout the mesh", TID)
    record = follow(None, offer, sender=ME, channel=C.DIRECT_PREFIX + W, now=1.0)
    assert record is not None
    return record


def step(record: TaskRecord, activity: as2.Activity, *, channel: str = C.CHANNEL_LOG,
         sender: str = W) -> mapping.Step:
    out = translate(record, activity, channel=channel, sender=sender, requester=ME, now=2.0)
    assert out is not None, activity.to_dict()
    return out


def test_the_offer_names_the_task_and_the_agent() -> None:
    offer = offer_for(ME, W, "Write a haiku\nabout the mesh", TID)
    assert offer.type == "Offer" and offer.context == CTX and offer.target == W
    assert offer.summary == "Write a haiku"
    assert offer.object.content == "Write a haiku\nabout the mesh"  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="no text"):
        offer_for(ME, W, "   ", TID)
    with pytest.raises(ValueError, match="cannot name a mesh task"):
        mesh_context("a/b")


def test_accept_is_working_and_files_are_artifacts() -> None:
    record = started()
    accepted = step(record, as2.accept(W, "Starting", context=CTX),
                    channel=C.DIRECT_PREFIX + ME)
    assert accepted.changed and a2a_state(accepted.record, ME) == "TASK_STATE_WORKING"
    wrote = step(accepted.record, as2.create(W, "Wrote tasks/x.md",
                                             as2.document("tasks/x.md"), context=CTX))
    assert not wrote.changed
    assert [(a.name, a.path) for a in wrote.artifacts] == [("tasks/x.md", "tasks/x.md")]
    ran = step(wrote.record, as2.invoke(W, "Ran: wc -w", "wc -w x", "3 x", context=CTX))
    assert ran.artifacts[0].name == "command" and ran.artifacts[0].text == "3 x"


def test_a_review_asked_of_the_requester_waits_on_the_client() -> None:
    record = step(started(), as2.accept(W, "Starting", context=CTX),
                  channel=C.DIRECT_PREFIX + ME).record
    review = as2.offer(W, "Ready for review", target=C.HUMAN_AGENT, context=CTX,
                       object=as2.collection([as2.document("tasks/x.md")]))
    asked = step(record, review, channel=C.CHANNEL_REVIEW)
    assert a2a_state(asked.record, ME) == "TASK_STATE_INPUT_REQUIRED"
    assert asked.artifacts and "approve" in asked.text
    ask = ask_of(asked.record, ME)
    assert ask == Ask("review", W, None)
    channel, approval = answer_for(ME, ask, "LGTM!", TID)
    assert channel == C.CHANNEL_REVIEW and approval.type == "Accept"
    done = step(asked.record, approval, channel=channel, sender=ME)
    assert done.record.status is Status.COMPLETED
    assert a2a_state(done.record, ME) == "TASK_STATE_COMPLETED"
    _, back = answer_for(ME, ask, "Add a title", TID)
    assert back.type == "Reject" and back.object.content == "Add a title"  # type: ignore[union-attr]
    changes = step(asked.record, back, channel=C.CHANNEL_REVIEW, sender=ME)
    assert changes.record.status is Status.CHANGES_REQUESTED
    assert a2a_state(changes.record, ME) == "TASK_STATE_WORKING"
    # Nothing after the end counts.
    assert translate(done.record, as2.announce(W, "Done", context=CTX), channel="log",
                     sender=W, requester=ME, now=3.0) is None


def test_a_review_by_another_agent_is_working() -> None:
    record = step(started(), as2.accept(W, "Starting", context=CTX),
                  channel=C.DIRECT_PREFIX + ME).record
    asked = step(record, as2.offer(W, "Ready", target="reviewer", context=CTX),
                 channel=C.CHANNEL_REVIEW)
    assert asked.record.status is Status.IN_REVIEW
    assert a2a_state(asked.record, ME) == "TASK_STATE_WORKING"
    assert ask_of(asked.record, ME) is None


def test_a_question_is_input_required_and_answered_directly() -> None:
    record = step(started(), as2.accept(W, "Starting", context=CTX),
                  channel=C.DIRECT_PREFIX + ME).record
    asked = step(record, as2.question(W, "Which language?", target=ME, context=CTX),
                 channel=C.DIRECT_PREFIX + ME)
    assert a2a_state(asked.record, ME) == "TASK_STATE_INPUT_REQUIRED"
    ask = ask_of(asked.record, ME)
    assert ask is not None and ask.kind == "question"
    channel, answer = answer_for(ME, ask, "Python", TID)
    assert channel == C.DIRECT_PREFIX + W and answer.type == "Note"
    assert step(asked.record, answer, channel=channel, sender=ME).record.status \
        is Status.WORKING


def test_reject_cancel_and_approvals() -> None:
    rejected = step(started(), as2.reject(W, "Busy", context=CTX),
                    channel=C.DIRECT_PREFIX + ME)
    assert a2a_state(rejected.record, ME) == "TASK_STATE_REJECTED"
    cancel = cancel_for(ME, TID)
    assert "cancel" in (cancel.tag or ())
    cancelled = step(started(), cancel, channel=C.DIRECT_PREFIX + W, sender=ME)
    assert a2a_state(cancelled.record, ME) == "TASK_STATE_CANCELED"
    assert approves("Approve.") and approves(" lgtm ") and not approves("approve, but fix x")


def test_mapping_imports_no_sdk_and_no_io() -> None:
    tree = ast.parse(pathlib.Path(mapping.__file__).read_text())
    modules = {n.module.split(".")[0] for n in ast.walk(tree)
               if isinstance(n, ast.ImportFrom) and n.module}
    modules |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    assert not modules & {"a2a", "asyncio", "zmq", "socket", "starlette", "httpx"}, modules
