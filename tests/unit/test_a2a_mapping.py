"""The A2A gateway's translation table, pure: activities in, states and artifacts out."""

from __future__ import annotations

import ast
import pathlib

import pytest

from porter_mesh.core import as2
from porter_mesh.core import constants as C
from porter_mesh.core.lifecycle import Status, TaskRecord, attempt_of, follow
from porter_mesh.core.tasks import Send, TaskBoard, TaskState
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


# -- out: a joined agent's work goes to review --------------------------------------------

J = "worker-1"


def test_a_joined_agent_s_result_is_a_review_request_the_board_takes() -> None:
    board = TaskBoard("architect", offer_timeout=60.0)
    board.worker_up(J, slots=1, now=0.0)
    context, outs = board.submit("Add GET /users endpoint", "the story", now=0.0)
    offer = next(o.activity for o in outs if isinstance(o, Send))
    attempt = attempt_of(offer)
    assert attempt == 1
    board.handle(mapping.stamped(as2.accept(J, "Starting", context=context), attempt), now=1.0)
    request = mapping.review_request(J, "reviewer", context, attempt,
                                     summary="Add GET /users endpoint",
                                     files=("src/routes/users.py",), words="GET /users works")
    assert request.target == "reviewer" and attempt_of(request) == 1
    assert [d.url for d in request.object.items] == ["src/routes/users.py"]  # type: ignore[union-attr]
    assert request.result is not None and request.result.content == "GET /users works"
    board.handle(request, now=2.0)
    task = board.task(context)
    assert task is not None and task.state is TaskState.IN_REVIEW
    # A verdict then closes it, and the worker's Announce carries the same attempt.
    board.handle(as2.accept("reviewer", "LGTM", context=context), now=3.0)
    assert board.task(context).state is TaskState.DONE  # type: ignore[union-attr]
    done = mapping.done_announce(J, context, attempt, words="GET /users works",
                                 reviewer="reviewer")
    assert "done" in (done.tag or ()) and attempt_of(done) == 1
    assert done.summary == "Done: GET /users works"


def test_only_the_reviewer_s_verdict_for_this_attempt_counts() -> None:
    def judge(activity: as2.Activity, *, sender: str = "reviewer",
              channel: str = C.CHANNEL_REVIEW) -> mapping.Verdict | None:
        return mapping.verdict_of(activity, channel=channel, sender=sender, worker=J,
                                  reviewer="reviewer", attempt=2)

    reject = as2.reject("reviewer", "Missing validation", "limit must be 1-100", context=CTX)
    verdict = judge(reject)
    assert verdict == mapping.Verdict(False, "Missing validation\nlimit must be 1-100")
    assert "limit must be 1-100" in mapping.revision_text(verdict)
    assert judge(as2.accept("reviewer", "LGTM", context=CTX)) == mapping.Verdict(True, "LGTM")
    assert judge(as2.accept("reviewer", "LGTM", context=CTX),
                 channel=C.DIRECT_PREFIX + J) is not None
    assert judge(mapping.stamped(reject, 2)) is not None
    assert judge(mapping.stamped(reject, 1)) is None  # a fenced attempt's verdict
    assert judge(reject, sender="w2") is None  # not the reviewer
    assert judge(reject, channel=C.CHANNEL_LOG) is None
    assert judge(as2.accept("reviewer", "LGTM", context=CTX, target="w2")) is None
    assert judge(as2.offer("reviewer", "do it", context=CTX)) is None


def test_the_human_reviews_what_the_human_offered() -> None:
    assert mapping.reviewer_of("porter-ui-cli7", "reviewer") == C.HUMAN_AGENT
    assert mapping.reviewer_of("architect", "reviewer") == "reviewer"
    # Any of the human's seats may answer for porter-ui.
    assert mapping.verdict_of(as2.accept("porter-ui-x", "ok", context=CTX),
                              channel=C.CHANNEL_REVIEW, sender="porter-ui-x", worker=J,
                              reviewer=C.HUMAN_AGENT, attempt=None) is not None
