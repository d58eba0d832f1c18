"""The task lifecycle and the architect's board: pure, no sockets, explicit time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from porter_mesh.core import as2
from porter_mesh.core.as2 import Activity
from porter_mesh.core.profile_examples import profile_examples
from porter_mesh.core.tasks import (
    ATTEMPT_FIELD,
    BoardOutput,
    Claim,
    EventKind,
    ResultRefused,
    Send,
    Task,
    TaskBoard,
    TaskChanged,
    TaskEvent,
    TaskState,
    apply,
    attempt_of,
    cancel_activity,
    is_task_delete,
    with_attempt,
)
from porter_mesh.errors import ConfigError, TaskError
from tests.fuzzing import examples

CTX = "urn:porter:task:a3f9"


def sends(outputs: Sequence[BoardOutput], channel: str | None = None) -> list[Send]:
    return [o for o in outputs if isinstance(o, Send) and (channel is None or o.channel == channel)]


def refusals(outputs: Sequence[BoardOutput]) -> list[ResultRefused]:
    return [o for o in outputs if isinstance(o, ResultRefused)]


def report(kind: str, actor: str, attempt: int | None, ctx: str = CTX, **kw: Any) -> Activity:
    data: dict[str, Any] = {"type": kind, "actor": actor, "summary": f"{kind} by {actor}",
                            "context": ctx, **kw}
    if attempt is not None:
        data[ATTEMPT_FIELD] = attempt
    return Activity.from_dict(data)


def board_with(*workers: tuple[str, int], **kw: Any) -> TaskBoard:
    board = TaskBoard("architect", **kw)
    for name, slots in workers:
        board.worker_up(name, slots=slots, now=0.0)
    return board


# -- the profile's own thread --------------------------------------------------------------


def test_profile_example_thread_drives_a_task_to_done() -> None:
    ex = profile_examples()
    board = board_with(("worker-backend", 1))
    assign = ex["Admin assigns a task"]
    ctx, out = board.submit(
        assign["summary"], assign["object"]["content"], context=CTX, tag=assign["tag"], now=1.0
    )
    (offer,) = sends(out)
    assert offer.channel == "task:worker-backend"
    wire = offer.activity.to_dict()
    assert wire.pop(ATTEMPT_FIELD) == 1
    assert wire == assign  # the board's Offer is the profile's example, plus the attempt

    steps = [
        ("Worker accepts", TaskState.ACCEPTED),
        ("Worker invokes a command", TaskState.IN_PROGRESS),
        ("Worker creates files", TaskState.IN_PROGRESS),
        ("Worker stores knowledge", TaskState.IN_PROGRESS),
        ("Status announcement", TaskState.IN_PROGRESS),
        ("Worker requests review", TaskState.IN_REVIEW),
        ("Reviewer gives feedback", TaskState.CHANGES_REQUESTED),
        ("Worker updates after feedback", TaskState.IN_PROGRESS),
        ("Worker requests review", TaskState.IN_REVIEW),
        ("Reviewer approves", TaskState.DONE),
    ]
    for now, (name, expected) in enumerate(steps, start=2):
        out = board.handle(Activity.from_dict(ex[name]), now=float(now))
        assert not refusals(out), name
        task = board.task(ctx)
        assert task is not None and task.state is expected, name
    task = board.task(ctx)
    assert task is not None and task.note.startswith("LGTM")
    assert board.load("worker-backend") == 0


def test_offer_carries_attempt_through_json_round_trip() -> None:
    board = board_with(("w1", 1))
    _, out = board.submit("do it", now=0.0)
    (offer,) = sends(out)
    back = Activity.from_json(offer.activity.to_json())
    assert attempt_of(back) == 1
    assert attempt_of(with_attempt(as2.accept("w1", "ok", context=CTX), 7)) == 7
    assert attempt_of(report("Accept", "w1", None)) is None
    bad = Activity.from_dict({"type": "Accept", "actor": "w", "summary": "s", "attempt": True})
    assert attempt_of(bad) is None


# -- pairing rules ---------------------------------------------------------------------------


def test_slots_are_honoured_and_freed() -> None:
    board = board_with(("w1", 2))
    contexts = [board.submit(f"task {i}", now=0.0)[0] for i in range(3)]
    held = [board.task(c) for c in contexts]
    assert [t.state for t in held if t] == [TaskState.OFFERED, TaskState.OFFERED,
                                            TaskState.PENDING]
    assert board.load("w1") == 2
    board.complete(contexts[0], "enough", now=1.0)
    third = board.task(contexts[2])
    assert third is not None and third.state is TaskState.OFFERED and third.holder == "w1"
    assert board.load("w1") == 2


def test_least_loaded_worker_first() -> None:
    board = board_with(("w1", 3), ("w2", 3))
    holders = []
    for i in range(4):
        ctx, _ = board.submit(f"t{i}", now=0.0)
        task = board.task(ctx)
        assert task is not None
        holders.append(task.holder)
    assert holders == ["w1", "w2", "w1", "w2"]


def test_offer_timeout_reoffers_to_another_worker_and_fences() -> None:
    board = board_with(("w1", 1), ("w2", 1), offer_timeout=10.0)
    ctx, _ = board.submit("job", context=CTX, now=0.0)
    assert board.next_deadline() == 10.0
    assert board.tick(now=9.9) == []
    out = board.tick(now=10.0)
    withdrawal, offer = sends(out)
    assert withdrawal.channel == "task:w1" and is_task_delete(withdrawal.activity)
    assert attempt_of(withdrawal.activity) == 1
    assert offer.channel == "task:w2" and attempt_of(offer.activity) == 2
    task = board.task(ctx)
    assert task is not None and task.claim == Claim("w2", 2)
    assert Claim("w1", 1) in task.fenced

    # The slow worker's late Accept and results are refused, visibly, and change nothing.
    late = board.handle(report("Accept", "w1", 1), now=11.0)
    (refused,) = refusals(late)
    assert refused.actor == "w1" and refused.attempt == 1 and "fenced" in refused.reason
    (notice,) = sends(late, "log")
    assert notice.activity.type == "Announce"
    assert "Refused Accept from w1" in notice.activity.summary
    assert sends(late, "task:w1") == []  # already told to stop when fenced
    assert board.task(ctx) == task
    again = board.handle(report("Create", "w1", 1), now=12.0)
    assert len(refusals(again)) == 1 and sends(again) == []  # reported once per claim
    assert board.task(ctx) == task

    board.handle(report("Accept", "w2", 2), now=13.0)
    task = board.task(ctx)
    assert task is not None and task.state is TaskState.ACCEPTED


def test_expired_holder_is_fenced_and_told_when_it_reappears() -> None:
    board = board_with(("w1", 1), ("w2", 1))
    ctx, _ = board.submit("job", context=CTX, now=0.0)
    board.handle(report("Accept", "w1", 1), now=1.0)
    out = board.worker_gone("w1", reason="expired", now=2.0)
    assert [s.channel for s in sends(out)] == ["task:w2"]  # no message to the dead
    task = board.task(ctx)
    assert task is not None and task.claim == Claim("w2", 2)
    late = board.handle(report("Create", "w1", 1, object={"type": "Document", "url": "a.py"}),
                        now=3.0)
    assert len(refusals(late)) == 1
    told = sends(late, "task:w1")
    assert len(told) == 1 and is_task_delete(told[0].activity)
    assert board.task(ctx) == task
    # Told once: coming back on the roster after that repeats nothing.
    assert board.owed_withdrawals("w1") == []
    assert sends(board.worker_up("w1", slots=1, now=4.0)) == []


def test_expired_holder_is_told_to_stop_when_it_comes_back() -> None:
    """A paused worker expires; its claim is fenced and the task goes to another. The
    withdrawal cannot reach it then, and is sent as soon as it is on the roster again."""
    board = board_with(("w1", 1), ("w2", 1))
    ctx, _ = board.submit("job", context=CTX, now=0.0)
    board.handle(report("Accept", "w1", 1), now=1.0)
    out = board.worker_gone("w1", reason="expired", now=2.0)
    assert [s.channel for s in sends(out)] == ["task:w2"]
    assert board.owed_withdrawals("w1") == [Claim("w1", 1)]
    back = board.worker_up("w1", slots=1, now=3.0)
    (told,) = sends(back)  # nothing to offer it: w2 holds the only task
    assert told.channel == "task:w1" and is_task_delete(told.activity)
    assert told.activity.context == ctx and attempt_of(told.activity) == 1
    assert told.activity.actor == "architect" and "holder w1 expired" in told.activity.summary
    assert board.owed_withdrawals("w1") == []
    assert sends(board.worker_up("w1", slots=1, now=4.0)) == []  # once
    # Its stale report, should one still come, is refused without another withdrawal.
    late = board.handle(report("Invoke", "w1", 1), now=5.0)
    assert len(refusals(late)) == 1 and sends(late, "task:w1") == []
    task = board.task(ctx)
    assert task is not None and task.claim == Claim("w2", 2)


def test_returning_worker_hears_the_withdrawal_before_its_new_offer() -> None:
    board = board_with(("w1", 2))
    first, _ = board.submit("one", now=0.0)
    second, _ = board.submit("two", now=0.0)
    board.handle(report("Accept", "w1", 1, ctx=first), now=1.0)
    assert sends(board.worker_gone("w1", reason="expired", now=2.0)) == []  # nobody else
    back = board.worker_up("w1", slots=2, now=3.0)
    assert [(s.activity.type, s.activity.context, attempt_of(s.activity))
            for s in sends(back)] == [
        ("Delete", first, 1), ("Delete", second, 1),  # both claims it lost
        ("Offer", first, 2), ("Offer", second, 2),  # then the tasks again, new attempts
    ]


def test_withdrawal_is_owed_only_to_the_gone() -> None:
    """A worker that is still there is told at once, and owed nothing."""
    board = board_with(("w1", 1), ("w2", 1), offer_timeout=5.0)
    board.submit("job", context=CTX, now=0.0)
    out = board.tick(now=5.0)
    assert [s.channel for s in sends(out)] == ["task:w1", "task:w2"]
    assert board.owed_withdrawals("w1") == []
    halted = board.halt_worker("w2", now=6.0)
    assert "task:w2" in [s.channel for s in sends(halted)]
    assert board.owed_withdrawals("w2") == []


def test_reoffer_to_the_same_worker_fences_by_attempt() -> None:
    board = board_with(("w1", 1), offer_timeout=5.0)
    ctx, _ = board.submit("job", context=CTX, now=0.0)
    out = board.tick(now=5.0)
    assert [(s.channel, attempt_of(s.activity)) for s in sends(out)] == [
        ("task:w1", 1), ("task:w1", 2)]  # withdrawal of attempt 1, then offer of attempt 2
    assert refusals(board.handle(report("Accept", "w1", 1), now=6.0))
    # Without an attempt number the report is ambiguous: w1 held a fenced claim.
    (ambiguous,) = refusals(board.handle(report("Accept", "w1", None), now=6.5))
    assert "no attempt number" in ambiguous.reason
    assert not refusals(board.handle(report("Accept", "w1", 2), now=7.0))
    task = board.task(ctx)
    assert task is not None and task.state is TaskState.ACCEPTED


def test_report_without_attempt_counts_for_a_first_claim() -> None:
    board = board_with(("w1", 1))
    ctx, _ = board.submit("job", now=0.0)
    assert not refusals(board.handle(report("Accept", "w1", None, ctx=ctx), now=1.0))
    task = board.task(ctx)
    assert task is not None and task.state is TaskState.ACCEPTED


def test_reject_reoffers_elsewhere_then_all_declined() -> None:
    board = board_with(("w1", 1), ("w2", 1))
    ctx, _ = board.submit("job", context=CTX, now=0.0)
    out = board.handle(report("Reject", "w1", 1, object={"type": "Note", "content": "busy"}),
                       now=1.0)
    assert [s.channel for s in sends(out)] == ["task:w2"]
    out = board.handle(report("Reject", "w2", 2), now=2.0)
    task = board.task(ctx)
    assert task is not None and task.state is TaskState.REJECTED
    assert "w1: Reject by w1 -- busy" in task.note and "declined by every worker" in task.note
    assert any(isinstance(o, TaskChanged) and o.task.state is TaskState.REJECTED for o in out)


def test_gives_up_after_max_attempts() -> None:
    board = board_with(("w1", 1), ("w2", 1), offer_timeout=1.0, max_attempts=3)
    ctx, _ = board.submit("job", now=0.0)
    for now in (1.0, 2.0, 3.0):
        board.tick(now=now)
    task = board.task(ctx)
    assert task is not None and task.state is TaskState.FAILED
    assert "gave up after 3 attempts" in task.note
    assert board.load("w1") == board.load("w2") == 0


def test_work_by_someone_who_never_held_it_is_not_a_result() -> None:
    board = board_with(("w1", 1))
    ctx, _ = board.submit("job", context=CTX, now=0.0)
    assert board.handle(report("Create", "stranger", None), now=1.0) == []
    assert board.handle(report("Accept", "architect", 1), now=1.0) == []  # own echo
    assert board.handle(report("Accept", "w1", 1, ctx="urn:porter:task:other"), now=1.0) == []
    task = board.task(ctx)
    assert task is not None and task.state is TaskState.OFFERED


# -- review ----------------------------------------------------------------------------------


def _in_review(board: TaskBoard) -> str:
    ctx, _ = board.submit("job", context=CTX, now=0.0)
    board.handle(report("Accept", "w1", 1), now=1.0)
    board.handle(report("Offer", "w1", 1), now=2.0)
    task = board.task(ctx)
    assert task is not None and task.state is TaskState.IN_REVIEW
    return ctx


def test_holder_cannot_approve_itself() -> None:
    board = board_with(("w1", 1))
    ctx = _in_review(board)
    assert board.handle(report("Accept", "w1", 1), now=3.0) == []
    task = board.task(ctx)
    assert task is not None and task.state is TaskState.IN_REVIEW


def test_review_of_a_fenced_attempt_is_refused() -> None:
    board = board_with(("w1", 1), ("w2", 1))
    ctx = _in_review(board)
    board.halt_worker("w1", now=3.0)
    task = board.task(ctx)
    assert task is not None and task.claim == Claim("w2", 2)
    (refused,) = refusals(board.handle(report("Accept", "reviewer", 1), now=4.0))
    assert "no longer applies" in refused.reason
    assert board.task(ctx) == task


def test_review_note_keeps_state_and_records_note() -> None:
    board = board_with(("w1", 1))
    ctx = _in_review(board)
    board.handle(as2.note("reviewer", "nit", "rename x", context=CTX), now=3.0)
    task = board.task(ctx)
    assert task is not None and task.state is TaskState.IN_REVIEW and "rename x" in task.note


def test_done_without_review_by_tagged_announce() -> None:
    board = board_with(("w1", 1))
    ctx, _ = board.submit("job", review=False, now=0.0)
    board.handle(report("Accept", "w1", 1, ctx=ctx), now=1.0)
    board.handle(report("Announce", "w1", 1, ctx=ctx, tag=["done"]), now=2.0)
    task = board.task(ctx)
    assert task is not None and task.state is TaskState.DONE
    # With review required, the same Announce is only progress.
    ctx2, _ = board.submit("job2", now=3.0)
    board.handle(report("Announce", "w1", 1, ctx=ctx2, tag=["done"]), now=4.0)
    task2 = board.task(ctx2)
    assert task2 is not None and task2.state is TaskState.IN_PROGRESS


def test_results_after_done_are_refused() -> None:
    board = board_with(("w1", 1))
    ctx = _in_review(board)
    board.handle(report("Accept", "reviewer", 1), now=3.0)
    (refused,) = refusals(board.handle(report("Update", "w1", 1), now=4.0))
    assert refused.context == ctx
    assert "already done" in refused.reason


# -- cancel, drain, halt ----------------------------------------------------------------------


def test_cancel_tells_the_holder_and_refuses_later_results() -> None:
    board = board_with(("w1", 1))
    ctx, _ = board.submit("job", context=CTX, now=0.0)
    board.handle(report("Accept", "w1", 1), now=1.0)
    out = board.cancel(ctx, "not needed", now=2.0)
    (stop,) = sends(out)
    assert stop.channel == "task:w1" and is_task_delete(stop.activity)
    assert "not needed" in stop.activity.summary
    task = board.task(ctx)
    assert task is not None and task.state is TaskState.CANCELLED and board.load("w1") == 0
    assert refusals(board.handle(report("Create", "w1", 1), now=3.0))
    with pytest.raises(TaskError, match="already cancelled"):
        board.cancel(ctx, "again", now=4.0)
    with pytest.raises(TaskError, match="no task"):
        board.cancel("urn:porter:task:nope", "x", now=4.0)


def test_human_can_cancel_with_a_delete_of_the_task() -> None:
    board = board_with(("w1", 1))
    ctx, _ = board.submit("job", context=CTX, now=0.0)
    out = board.handle(cancel_activity("porter-ui", ctx, "stop that"), now=1.0)
    task = board.task(ctx)
    assert task is not None and task.state is TaskState.CANCELLED
    assert [s.channel for s in sends(out)] == ["task:w1"]
    # Anyone else's Delete of the task is not a cancel.
    ctx2, _ = board.submit("job2", now=2.0)
    assert board.handle(cancel_activity("w1", ctx2, "meh"), now=3.0) == []


def test_draining_worker_keeps_its_task_but_gets_no_new_ones() -> None:
    board = board_with(("w1", 2))
    first, _ = board.submit("one", now=0.0)
    board.drain_worker("w1", now=1.0)
    second, out = board.submit("two", now=2.0)
    assert sends(out) == []
    t1, t2 = board.task(first), board.task(second)
    assert t1 is not None and t1.state is TaskState.OFFERED
    assert t2 is not None and t2.state is TaskState.PENDING
    out = board.resume_worker("w1", now=3.0)
    assert [s.channel for s in sends(out)] == ["task:w1"]


def test_advertised_draining_is_honoured() -> None:
    board = TaskBoard("architect")
    board.worker_up("w1", slots=1, draining=True, now=0.0)
    _, out = board.submit("job", now=0.0)
    assert sends(out) == []
    out = board.worker_up("w1", slots=1, draining=False, now=1.0)
    assert [s.channel for s in sends(out)] == ["task:w1"]


def test_evasive_worker_keeps_tasks_gets_none_new() -> None:
    board = board_with(("w1", 2))
    first, _ = board.submit("one", now=0.0)
    board.worker_evasive("w1", now=1.0)
    _, out = board.submit("two", now=1.0)
    assert sends(out) == []
    t1 = board.task(first)
    assert t1 is not None and t1.holder == "w1"


def test_halted_worker_loses_its_claims() -> None:
    board = board_with(("w1", 1), ("w2", 1))
    ctx, _ = board.submit("job", context=CTX, now=0.0)
    out = board.halt_worker("w1", now=1.0)
    assert [s.channel for s in sends(out)] == ["task:w1", "task:w2"]
    task = board.task(ctx)
    assert task is not None and task.claim == Claim("w2", 2)
    # Still halted after a heartbeat; only resume_worker reopens it.
    board.worker_up("w1", slots=1, now=2.0)
    _, out = board.submit("job2", now=2.0)
    assert sends(out) == []


def test_board_drain_resume_and_halt() -> None:
    board = board_with(("w1", 2))
    board.submit("one", now=0.0)
    board.drain()
    _, out = board.submit("two", now=1.0)
    assert sends(out) == []
    assert [s.channel for s in sends(board.resume(now=2.0))] == ["task:w1"]
    out = board.halt("shutting down", now=3.0)
    assert {t.state for t in board.tasks()} == {TaskState.CANCELLED}
    assert len(sends(out)) == 2
    assert board.draining


# -- the pure transition function and bad input ---------------------------------------------


def test_apply_refuses_transitions_not_in_the_diagram() -> None:
    task = Task(CTX, "job")
    with pytest.raises(TaskError, match=r"accept by w1 is not allowed .* state pending"):
        apply(task, TaskEvent(EventKind.ACCEPT, "w1", 1), 0.0)
    with pytest.raises(TaskError, match="attempt number above 0"):
        apply(task, TaskEvent(EventKind.OFFER, "w1", None), 0.0)
    offered = apply(task, TaskEvent(EventKind.OFFER, "w1", 1), 0.0)
    with pytest.raises(TaskError, match="needs a review"):
        apply(apply(offered, TaskEvent(EventKind.ACCEPT, "w1", 1), 0.0),
              TaskEvent(EventKind.COMPLETE, "w1", 1), 0.0)
    done = apply(offered, TaskEvent(EventKind.CANCEL, "x"), 0.0)
    for kind in EventKind:
        with pytest.raises(TaskError):
            apply(done, TaskEvent(kind, "w1", 2), 0.0)


def test_bad_settings_and_submissions() -> None:
    with pytest.raises(ConfigError):
        TaskBoard("")
    with pytest.raises(ConfigError):
        TaskBoard("a", offer_timeout=0)
    with pytest.raises(ConfigError):
        TaskBoard("a", max_attempts=0)
    board = TaskBoard("a")
    with pytest.raises(ConfigError, match="slots"):
        board.worker_up("w", slots=0, now=0.0)
    with pytest.raises(TaskError, match="summary"):
        board.submit("  ", now=0.0)
    with pytest.raises(TaskError, match="not a task URN"):
        board.submit("x", context="task-1", now=0.0)
    board.submit("x", context=CTX, now=0.0)
    with pytest.raises(TaskError, match="already exists"):
        board.submit("y", context=CTX, now=0.0)
    with pytest.raises(TaskError, match="only a held task"):
        board.complete(CTX, "n", now=0.0)


# -- properties over random event sequences ---------------------------------------------------

SLOTS = {"w1": 1, "w2": 2, "w3": 1}
WORKERS = sorted(SLOTS)
REPORT_TYPES = ["Accept", "Reject", "Create", "Invoke", "Offer", "Announce"]

_report = st.tuples(st.just("report"), st.integers(0, 5), st.integers(0, 9),
                    st.sampled_from(REPORT_TYPES), st.booleans())
# Reports (including stale ones) and time passing are weighted up, so that most
# sequences fence claims and then hear from them.
op = st.one_of(
    st.tuples(st.just("submit"), st.booleans()),
    st.tuples(st.just("up"), st.sampled_from(WORKERS)),
    st.tuples(st.just("gone"), st.sampled_from(WORKERS)),
    st.tuples(st.just("evasive"), st.sampled_from(WORKERS)),
    st.tuples(st.just("drain"), st.sampled_from(WORKERS)),
    st.tuples(st.just("halt"), st.sampled_from(WORKERS)),
    st.tuples(st.just("resume"), st.sampled_from(WORKERS)),
    st.tuples(st.just("tick"), st.floats(min_value=0.0, max_value=15.0)),
    st.tuples(st.just("tick"), st.just(10.0)),
    _report,
    _report,
    _report,
    st.tuples(st.just("review"), st.integers(0, 5), st.sampled_from(["Accept", "Reject"]),
              st.booleans()),
    st.tuples(st.just("cancel"), st.integers(0, 5)),
)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, min_size=1, max_size=60))
def test_random_sequences_keep_the_pairing_invariants(ops: list[tuple[Any, ...]]) -> None:
    board = TaskBoard("architect", offer_timeout=10.0, max_attempts=4)
    now = 0.0
    contexts: list[str] = []
    issued: dict[str, list[Claim]] = {}
    finished: dict[str, TaskState] = {}

    def record(outputs: list[BoardOutput]) -> None:
        for o in outputs:
            if isinstance(o, Send) and o.activity.type == "Offer":
                ctx = o.activity.context
                assert ctx is not None
                attempt = attempt_of(o.activity)
                assert attempt is not None
                previous = issued.setdefault(ctx, [])
                # Attempts count up by one per offer: a claim is never reissued.
                assert attempt == (previous[-1].attempt + 1 if previous else 1)
                assert o.channel == f"task:{o.activity.target}"
                previous.append(Claim(o.activity.target or "", attempt))

    for item in ops:
        name = item[0]
        if name == "submit":
            ctx, out = board.submit("job", review=item[1], now=now)
            contexts.append(ctx)
            record(out)
        elif name == "up":
            record(board.worker_up(item[1], slots=SLOTS[item[1]], now=now))
        elif name == "gone":
            record(board.worker_gone(item[1], reason="expired", now=now))
        elif name == "evasive":
            record(board.worker_evasive(item[1], now=now))
        elif name == "drain":
            record(board.drain_worker(item[1], now=now))
        elif name == "halt":
            record(board.halt_worker(item[1], now=now))
        elif name == "resume":
            record(board.resume_worker(item[1], now=now))
        elif name == "tick":
            now += item[1]
            record(board.tick(now=now))
        elif name == "cancel" and contexts:
            ctx = contexts[item[1] % len(contexts)]
            task = board.task(ctx)
            assert task is not None
            if not task.finished:
                record(board.cancel(ctx, "changed plans", now=now))
        elif name in ("report", "review") and contexts:
            ctx = contexts[item[1] % len(contexts)]
            claims = issued.get(ctx, [])
            before = board.task(ctx)
            assert before is not None
            if name == "report":
                if not claims:
                    continue
                claim = claims[item[2] % len(claims)]
                kind = item[3]
                extra: dict[str, Any] = {"tag": ["done"]} if kind == "Announce" else {}
                activity = report(kind, claim.worker, claim.attempt if item[4] else None,
                                  ctx=ctx, **extra)
            else:
                attempt = before.attempt if item[3] else max(1, before.attempt - 1)
                activity = report(item[2], "reviewer", attempt, ctx=ctx)
                claim = None
            out = board.handle(activity, now=now)
            record(out)
            if claim is not None and claim != before.claim:
                # The key property: a claim that is not the live one never counts.
                assert refusals(out), (claim, before)
                assert board.task(ctx) == before
            if refusals(out):
                assert board.task(ctx) == before

        for ctx in contexts:
            task = board.task(ctx)
            assert task is not None
            claims = issued.get(ctx, [])
            # Terminal states are final.
            if ctx in finished:
                assert task.state is finished[ctx]
            if task.finished:
                finished[ctx] = task.state
            if task.held:
                # The live claim is the latest offer; every earlier one is fenced.
                assert claims and task.claim == claims[-1]
                assert set(claims[:-1]) <= task.fenced
            else:
                assert set(claims) - task.fenced <= ({claims[-1]} if claims else set())
        for worker, slots in SLOTS.items():
            assert board.load(worker) <= slots
            held = sum(1 for t in board.tasks() if t.held and t.holder == worker)
            assert board.load(worker) == held
