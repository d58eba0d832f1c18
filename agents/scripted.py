"""Deterministic brains that need no model: they read messages and call the same tools an
LLM would, following the profile's story of a task.

Each brain is an event loop over the agent's inbox. It calls ``read_messages`` (as a
model would) and decides from the structured items the tapped port kept. Every action
goes through :meth:`Toolbox.call`, so the wire traffic is what the tools produce for an
LLM-driven agent; the two exceptions are the architect's board outputs and a worker's
review request, which names its reviewer as ``target``.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from agents.context import AgentContext
from porter_mesh.core import as2
from porter_mesh.core import constants as C
from porter_mesh.core.advert import is_human, key_name
from porter_mesh.core.as2 import Activity
from porter_mesh.core.lifecycle import Status, same_party
from porter_mesh.core.tasks import (
    ATTEMPT_FIELD,
    ResultRefused,
    Send,
    TaskBoard,
    TaskChanged,
    TaskState,
    attempt_of,
    is_task_delete,
)
from porter_mesh.errors import PorterError, TaskWithdrawn
from porter_mesh.tools.port import InboxItem

#: The profile's example query: what has the team learned?
LEARNED_QUERY = (
    "SELECT ?about ?finding WHERE { ?obs <https://porter.chapeaux.io/vocab#about> ?about ; "
    "<https://porter.chapeaux.io/vocab#finding> ?finding }"
)

#: The line of the architect's closing Announce after which the recalled rows follow.
LEARNED_HEADING = "What the team learned:"

TASK_SUMMARY = "Add GET /users endpoint"
TASK_CONTENT = (
    "Add a GET /users endpoint to the API router. Return JSON array of User objects from "
    "the database. Include pagination via ?page=&limit= query params."
)


def _items(ctx: AgentContext) -> list[InboxItem]:
    """Read messages through the tool, and return what it read."""
    ctx.toolbox.call("read_messages", {})
    return ctx.port.take()


def _call(ctx: AgentContext, tool: str, **args: object) -> str:
    result = ctx.toolbox.call(tool, args)
    first = result.splitlines()[0] if result else ""
    ctx.say(f"{tool}: {first[:100]}")
    return result


# ---------------------------------------------------------------------------- architect


@dataclass
class ArchitectBrain:
    """Offers the task, follows it through the board, and recalls what was learned.

    Options: ``workers`` (how many workers to wait for), ``reviewer`` (its name),
    ``offer_timeout`` (seconds), ``team_timeout`` (seconds to wait for the team),
    ``task_timeout`` (seconds for the whole task), ``serve`` (no story: delegate each
    task the human offers to a worker as a sub-task, until stopped).
    """

    holders: set[str] = field(default_factory=set)

    def run(self, ctx: AgentContext) -> int:
        opts = ctx.options
        if opts.get("serve"):
            return self._serve(ctx)
        want_workers = int(opts.get("workers", 2))
        reviewer = str(opts.get("reviewer", "reviewer"))
        board = TaskBoard(ctx.name, offer_timeout=float(opts.get("offer_timeout", 300.0)))
        go = opts.get("go")
        if go is not None:
            ctx.say("waiting for the go signal")
            while not go.wait(0.2):
                if ctx.stop.is_set():
                    return 0
        if not self._wait_for_team(ctx, board, want_workers, reviewer,
                                   float(opts.get("team_timeout", 20.0))):
            return 3
        context, outs = board.submit(TASK_SUMMARY, TASK_CONTENT, now=time.monotonic(),
                                     tag=("api", "backend"))
        self._carry_out(ctx, outs)
        deadline = time.monotonic() + float(opts.get("task_timeout", 60.0))
        announced = False
        while not ctx.stop.is_set():
            if time.monotonic() > deadline:
                ctx.say(f"task {context} did not finish in time")
                return 4
            ctx.wait_for_messages(0.2)
            now = time.monotonic()
            self._sync_roster(ctx, board, now)
            for item in _items(ctx):
                act = item.activity
                if act.context != context:
                    continue
                task = board.task(context)
                if task is not None and task.state is TaskState.DONE:
                    # The holder's closing Announce; the board has nothing more to judge.
                    if act.type == "Announce" and item.sender in self.holders:
                        announced = True
                    continue
                if (act.type == "Announce" and task is not None
                        and task.state is TaskState.IN_REVIEW and item.sender == task.holder):
                    # The holder's closing Announce overtook the reviewer's verdict: they
                    # come from different senders, so nothing orders them.
                    announced = True
                self._carry_out(ctx, board.handle(act, now=now))
                task = board.task(context)
                if task is not None and task.claim is not None:
                    self.holders.add(task.claim.worker)
            self._carry_out(ctx, board.tick(now=now))
            task = board.task(context)
            if task is not None and task.state in (TaskState.FAILED, TaskState.REJECTED,
                                                   TaskState.CANCELLED):
                ctx.say(f"task {context} ended {task.state.value}")
                return 5
            if task is not None and task.state is TaskState.DONE and announced:
                break
        if ctx.stop.is_set():
            return 0
        rows = _call(ctx, "memory_query", query=LEARNED_QUERY)
        ctx.say("the team learned:\n" + rows)
        _call(ctx, "send_message", channel=C.CHANNEL_LOG,
              message=f"Task done: {TASK_SUMMARY}\n{LEARNED_HEADING}\n{rows}",
              type="Announce", context=context)
        return 0

    def _serve(self, ctx: AgentContext) -> int:
        """No story: take each task the human offers and delegate it to a worker as a
        sub-task through the board, until told to stop. A cancel of the human's task
        is carried out by the agent program (it cascades to the sub-task's holder); the
        board is told too, so that it offers the sub-task to nobody else."""
        board = TaskBoard(ctx.name, offer_timeout=float(ctx.options.get("offer_timeout",
                                                                        300.0)))
        parents: dict[str, str] = {}  # the board's sub-task -> the human's task
        while not ctx.stop.is_set():
            ctx.wait_for_messages(0.2)
            now = time.monotonic()
            self._sync_roster(ctx, board, now)
            for item in _items(ctx):
                act = item.activity
                if (act.type == "Offer" and item.channel == C.DIRECT_PREFIX + ctx.name
                        and is_human(item.sender) and act.context is not None
                        and act.context not in parents.values()):
                    _call(ctx, "send_message", channel=C.DIRECT_PREFIX + item.sender,
                          message=f"Taking it: {act.summary}", type="Accept",
                          context=act.context)
                    sub, outs = board.submit(act.summary, _content_of(act) or None, now=now,
                                             parent=act.context)
                    parents[sub] = act.context
                    self._carry_out(ctx, outs)
                elif is_task_delete(act) and act.context in parents.values():
                    for sub, parent in parents.items():
                        task = board.task(sub)
                        if parent != act.context or task is None or task.finished:
                            continue
                        outs = board.cancel(sub, f"cancelled with {parent}", now=now)
                        told = ctx.toolbox.ledger.get(sub)
                        if told is not None and told.final:
                            # Its holder was told already, by the cancel's cascade.
                            outs = [o for o in outs if not isinstance(o, Send)]
                        self._carry_out(ctx, outs)
                else:
                    self._carry_out(ctx, board.handle(act, now=now))
            self._carry_out(ctx, board.tick(now=now))
        return 0

    def _wait_for_team(self, ctx: AgentContext, board: TaskBoard, workers: int,
                       reviewer: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not ctx.stop.is_set():
            roster = ctx.port.roster()
            found = [r for r in roster if r.role == "worker"]
            if len(found) >= workers and any(r.name == reviewer for r in roster):
                self._sync_roster(ctx, board, time.monotonic())
                ctx.say(f"team ready: {', '.join(sorted(r.name for r in roster))}")
                return True
            if time.monotonic() > deadline:
                ctx.say(f"team incomplete after {timeout}s: "
                        f"{', '.join(r.name for r in roster) or 'nobody'}")
                return False
            ctx.wait_for_messages(0.2)
            ctx.port.inner.drain_inbox()  # chatter before the task is not ours
        return False

    def _withdraw(self, ctx: AgentContext, out: Send) -> None:
        """Send a withdrawal without waiting for it: its recipient may be paused, and the
        node keeps it in flight until it is acknowledged (see TaskBoard.worker_up)."""
        who = out.channel[len(C.DIRECT_PREFIX):]
        what = f"withdrawal of {out.activity.context} (attempt {attempt_of(out.activity)})"

        def done(error: BaseException | None) -> None:
            ctx.say(f"{what} {'acknowledged by ' + who if error is None else 'lost: '}"
                    f"{error or ''}")

        ctx.port.inner.node.send_nowait(
            who, out.activity, timeout=float(ctx.options.get("withdraw_timeout", 600.0)),
            on_done=done)
        ctx.say(f"sent {what} to {who}")

    def _sync_roster(self, ctx: AgentContext, board: TaskBoard, now: float) -> None:
        live = {r.name: r for r in ctx.port.roster() if r.role == "worker"}
        known = board.workers()
        for name, entry in live.items():
            if name not in known:
                slots = int(ctx.options.get("slots", 1))
                self._carry_out(ctx, board.worker_up(name, slots=slots, now=now))
            elif entry.state == "evasive":
                self._carry_out(ctx, board.worker_evasive(name, now=now))
        for name in known:
            if name not in live:
                self._carry_out(ctx, board.worker_gone(name, reason="expired", now=now))

    def _carry_out(self, ctx: AgentContext, outs: list[Send | TaskChanged | ResultRefused]) -> None:
        for out in outs:
            if isinstance(out, Send):
                try:
                    if is_task_delete(out.activity) and out.channel.startswith(C.DIRECT_PREFIX):
                        self._withdraw(ctx, out)
                    else:
                        ctx.port.send(out.channel, out.activity)
                    ctx.toolbox.sent(out.channel, out.activity)
                except PorterError as exc:
                    ctx.say(f"could not send {out.activity.type} on {out.channel}: {exc}")
            elif isinstance(out, TaskChanged):
                claim = out.task.claim
                holder = f" ({claim.worker}, attempt {claim.attempt})" if claim else ""
                ctx.say(f"task {out.task.context}: {out.previous.value} -> "
                        f"{out.task.state.value}{holder}: {out.reason}")
            else:
                ctx.say(f"refused {out.activity_type} from {out.actor} "
                        f"(attempt {out.attempt}): {out.reason}")


# ---------------------------------------------------------------------------- worker

USER_MODEL = '''"""The User type returned by the API."""

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class User:
    id: int
    name: str
    email: str

    def to_json(self) -> dict[str, object]:
        return asdict(self)
'''

USERS_ROUTE = '''"""GET /users: a page of users as JSON."""

from src.models.user import User

USERS = [User(i, f"user{i}", f"user{i}@example.org") for i in range(1, 43)]


def get_users(page: int = 1, limit: int = 10) -> dict[str, object]:
    start = (page - 1) * limit
    data = [u.to_json() for u in USERS[start:start + limit]]
    return {"data": data, "page": page, "limit": limit, "total": len(USERS)}
'''

VALIDATION = '''def validate(page: int, limit: int) -> None:
    """Pagination must be sane: 1 <= limit <= 100 and page >= 1."""
    if not 1 <= limit <= 100:
        raise ValueError("limit must be between 1 and 100")
    if page < 1:
        raise ValueError("page must be >= 1")


def get_users(page: int = 1, limit: int = 10) -> dict[str, object]:
    validate(page, limit)
'''

USERS_TEST = '''"""Pagination edge cases for GET /users (runs with plain python)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from src.routes.users import get_users  # noqa: E402


def expect_error(**params: int) -> None:
    try:
        get_users(**params)
    except ValueError:
        return
    raise AssertionError(f"no error for {params}")


page = get_users(page=2, limit=10)
assert page["total"] == 42 and len(page["data"]) == 10 and page["data"][0]["id"] == 11
assert len(get_users(page=5, limit=10)["data"]) == 2
for bad in ({"limit": 0}, {"limit": 101}, {"limit": -5}, {"page": 0}):
    expect_error(**bad)
print("6 tests passed, 0 failures")
'''

DESIGN_DECISION = "GET /users returns paginated JSON with {data, page, limit, total} envelope"


#: Activity types that ask a worker for something; one it cannot act on is rejected.
_REQUESTS = frozenset({"Offer", "Invoke", "Question", "Create", "Update"})


def _cannot_act(act: Activity, context: str | None) -> str | None:
    """Why a worker cannot act on a request sent to it, or None when it can."""
    if act.type == "Offer" and context is None:
        return ("Cannot take an Offer without a task context: send it with context "
                "urn:porter:task:<id>")
    if act.type != "Offer":
        return (f"I take tasks as an Offer with a context; I cannot act on a {act.type} "
                f"(send it as an Offer, or ask on 'log')")
    return None


def _why_not_now(ctx: AgentContext, held: int, slots: int) -> str | None:
    """Why a worker holding ``held`` tasks refuses a new one now, or None when it can
    take it: draining comes first, since a freed slot would not change the answer."""
    if ctx.toolbox.draining:
        return ("Draining: I finish the tasks I hold and take no new ones; offer it to "
                "another worker")
    if held >= slots:
        return "Busy: all my slots are taken"
    return None


@dataclass(frozen=True)
class Held:
    """A task a worker holds: who offered it, the claim's attempt, and what it asks."""

    offered_by: str
    attempt: int | None
    summary: str
    content: str
    asking: str | None = None  # the question put to the requester, until answered

    @property
    def story(self) -> bool:
        """The profile's story task (GET /users), which the worker knows how to do."""
        return self.summary == TASK_SUMMARY


def _content_of(act: Activity) -> str:
    obj = act.object
    if isinstance(obj, str):
        return obj
    return (obj.content or "") if obj is not None else (act.content or "")


@dataclass
class WorkerBrain:
    """Takes offered tasks (up to ``slots``), does them, asks for review, fixes, announces.

    The profile's story task gets the story's work (a route, a model, validation and a
    test); any other task (one a person sends from the dashboard) gets a written brief of
    what was asked, revised with each review's reason. A task offered by the human
    (``porter-ui`` or a command-line seat) is reviewed by the human, from any of its
    seats; any other by the ``reviewer`` option.

    Options: ``slots`` (tasks held at once), ``reviewer`` (the reviewer's agent name),
    ``fail_after`` (fault injection for tests: ``"accept"`` makes the process SIGKILL
    itself right after accepting a task).
    ``work_command`` (for tests: a shell command run first on every accepted task),
    ``delegate_to`` (an agent offered a sub-task of every accepted task, first),
    ``ask`` (a question put to the requester of every task other than the story's; the
    worker waits for the answer, and takes it up again after a restart, from its
    ledger).

    A task withdrawn from it (the tools raise :class:`TaskWithdrawn`) is dropped at once:
    the attempt stops where it is and reports nothing.
    """

    held: dict[str, Held] = field(default_factory=dict)  # by context

    def run(self, ctx: AgentContext) -> int:
        slots = int(ctx.options.get("slots", 1))
        self._resume(ctx)
        while not ctx.stop.is_set():
            if not ctx.wait_for_messages(0.5):
                continue
            for item in _items(ctx):
                try:
                    self._handle(ctx, item, slots)
                except PorterError as exc:
                    ctx.say(f"could not act on {item.activity.type} from {item.sender}: {exc}")
        return 0

    def _resume(self, ctx: AgentContext) -> None:
        """Take up the tasks the ledger says this worker holds (it restarted): one that
        waits on a question keeps waiting for the answer, one under way starts over."""
        for record in ctx.toolbox.ledger.held():
            if ctx.toolbox.resume_task(record.context) is None:
                continue
            asking = record.question or None if record.status is Status.INPUT_REQUIRED \
                else None
            task = Held(record.requester, record.attempt, record.title, record.title,
                        asking=asking)
            self.held[record.context] = task
            ctx.say(f"resumed task {record.context} ({record.status.value})")
            if record.status in (Status.SUBMITTED, Status.WORKING):
                self._attempt(ctx, record.context,
                              functools.partial(self._begin, ctx, record.context, task))

    def _reviewer(self, ctx: AgentContext, task: Held) -> str:
        if is_human(task.offered_by):
            return C.HUMAN_AGENT
        return str(ctx.options.get("reviewer", "reviewer"))

    def _handle(self, ctx: AgentContext, item: InboxItem, slots: int) -> None:
        act = item.activity
        ctx_id = act.context
        mine = item.channel == C.DIRECT_PREFIX + ctx.name or act.target == ctx.name
        if (item.channel == C.DIRECT_PREFIX + ctx.name and act.type in _REQUESTS
                and ctx_id not in self.held):
            problem = _cannot_act(act, ctx_id)
            if problem is not None:
                # Said, not dropped: the sender learns why at once. A request that named
                # no task is answered about no task, not in the task this worker holds.
                _call(ctx, "send_message", channel=C.DIRECT_PREFIX + item.sender,
                      message=problem, type="Reject", context=ctx_id or "")
                return
        if ctx_id is None:
            return
        task = self.held.get(ctx_id)
        if act.type == "Offer" and mine and item.channel != C.CHANNEL_REVIEW:
            if task is not None:
                return  # a repeated offer of a task already taken
            busy = _why_not_now(ctx, len(self.held), slots)
            if busy is not None:
                _call(ctx, "send_message", channel=C.DIRECT_PREFIX + item.sender,
                      message=busy, type="Reject", context=ctx_id)
                return
            offered = Held(item.sender, attempt_of(act), act.summary, _content_of(act))
            self.held[ctx_id] = task = offered
            _call(ctx, "send_message", channel=C.DIRECT_PREFIX + item.sender,
                  message=f"Starting work on {task.summary}", type="Accept", context=ctx_id)
            if ctx.options.get("fail_after") == "accept":
                ctx.say("fault injection: dying right after accepting")
                os.kill(os.getpid(), signal.SIGKILL)
            self._attempt(ctx, ctx_id, lambda: self._begin(ctx, ctx_id, offered))
        elif is_task_delete(act) and mine:
            ctx.say(f"task {ctx_id} withdrawn: {act.summary}")
            self.held.pop(ctx_id, None)
        elif (task is not None and task.asking is not None and mine
              and act.type in ("Note", "Question") and same_party(item.sender, task.offered_by)):
            answer = _content_of(act) or act.summary
            ctx.say(f"answer to {task.asking!r} on {ctx_id}: {answer}")
            task = replace(task, asking=None)
            self.held[ctx_id] = task
            self._attempt(ctx, ctx_id, lambda: self._write_brief(
                ctx, ctx_id, task, revision=None, answer=answer))
        elif (task is not None and key_name(item.sender) == self._reviewer(ctx, task)
              and (item.channel == C.CHANNEL_REVIEW or mine)):
            if act.type == "Reject":
                if task.story:
                    self._attempt(ctx, ctx_id, lambda: self._fix(ctx, ctx_id, task))
                else:
                    revision = _content_of(act) or act.summary
                    self._attempt(ctx, ctx_id, lambda: self._write_brief(
                        ctx, ctx_id, task, revision=revision))
            elif act.type == "Accept":
                done = ("All tests passing\n6 tests passing, 0 failures." if task.story
                        else f"Done: {task.summary}\nApproved by {item.sender}.")
                _call(ctx, "send_message", channel=C.CHANNEL_LOG, message=done,
                      type="Announce", context=ctx_id)
                self.held.pop(ctx_id, None)

    def _attempt(self, ctx: AgentContext, ctx_id: str, step: Callable[[], None]) -> None:
        """Work on a task; a withdrawal stops the work where it is."""
        try:
            step()
        except TaskWithdrawn as exc:
            ctx.say(f"stopped attempt {exc.attempt} of task {exc.context}, withdrawn: "
                    f"{exc.reason}; reporting nothing")
            self.held.pop(ctx_id, None)

    def _begin(self, ctx: AgentContext, ctx_id: str, task: Held) -> None:
        """Delegate a part when told to (the tools name the task as its parent), run the
        test's work command if any, then do the task."""
        delegate = ctx.options.get("delegate_to")
        if delegate and not ctx.toolbox.ledger.open_children(ctx_id):
            _call(ctx, "send_message", channel=C.DIRECT_PREFIX + str(delegate),
                  message=f"Part of: {task.summary}"[:150], type="Offer")
        work = ctx.options.get("work_command")
        if work:
            _call(ctx, "bash", command=str(work))
        question = ctx.options.get("ask")
        if question and not task.story:
            # Wait on the requester: the answer comes back as a message (see _handle).
            _call(ctx, "send_message", channel=C.DIRECT_PREFIX + task.offered_by,
                  message=str(question), type="Question", context=ctx_id)
            self.held[ctx_id] = replace(task, asking=str(question))
            return
        if task.story:
            self._first_pass(ctx, ctx_id, task)
        else:
            self._write_brief(ctx, ctx_id, task, revision=None)

    def _first_pass(self, ctx: AgentContext, ctx_id: str, task: Held) -> None:
        _call(ctx, "bash", command="mkdir -p src/routes src/models tests && "
              "touch src/__init__.py src/routes/__init__.py src/models/__init__.py && "
              "echo 'project layout ready'")
        _call(ctx, "write_file", path="src/models/user.py", content=USER_MODEL)
        _call(ctx, "write_file", path="src/routes/users.py", content=USERS_ROUTE)
        _call(ctx, "memory_write", about="api-design", finding=DESIGN_DECISION)
        self._ask_review(ctx, ctx_id, task, "Ready for review: GET /users endpoint",
                         ["src/routes/users.py", "src/models/user.py"])

    def _fix(self, ctx: AgentContext, ctx_id: str, task: Held) -> None:
        _call(ctx, "edit_file", path="src/routes/users.py",
              old='def get_users(page: int = 1, limit: int = 10) -> dict[str, object]:\n',
              new=VALIDATION)
        _call(ctx, "write_file", path="tests/test_users.py", content=USERS_TEST)
        result = _call(ctx, "bash", command="python3 tests/test_users.py")
        ctx.say("test run: " + result.splitlines()[-1] if result else "test run: no output")
        self._ask_review(ctx, ctx_id, task, "Added pagination validation and tests",
                         ["src/routes/users.py", "tests/test_users.py"])

    def _write_brief(self, ctx: AgentContext, ctx_id: str, task: Held,
                     revision: str | None, answer: str | None = None) -> None:
        """Another task than the story's: write down what was asked (with the
        requester's answer to the worker's question, and after a review that sent it
        back, the reviewer's reason), so the reviewer has a file to read."""
        path = f"tasks/{ctx_id.rsplit(':', 1)[-1]}.md"
        text = f"# {task.summary}\n\n{task.content or task.summary}\n"
        if answer is not None:
            text += f"\n## Answer from {task.offered_by}\n\n{answer}\n"
        if revision is not None:
            text += f"\n## Changes requested\n\n{revision}\n"
        _call(ctx, "write_file", path=path, content=text)
        _call(ctx, "bash", command=f"wc -w {path}")
        what = "Revised after review" if revision is not None else "Ready for review"
        self._ask_review(ctx, ctx_id, task, f"{what}: {task.summary}"[:120], [path])

    def _ask_review(self, ctx: AgentContext, ctx_id: str, task: Held, summary: str,
                    files: list[str]) -> None:
        """An Offer on ``review`` naming its reviewer as ``target``, with the changed
        files as Documents (the profile's review request). ``send_message`` has no field
        for a target on a broadcast channel, so this one goes through the port itself,
        with the claim's attempt echoed as the tools would."""
        reviewer = self._reviewer(ctx, task)
        request = as2.offer(
            ctx.name, summary, target=reviewer, context=ctx_id,
            object=as2.collection([as2.document(f) for f in files]),
            extra={ATTEMPT_FIELD: task.attempt} if task.attempt is not None else None)
        ctx.port.send(C.CHANNEL_REVIEW, request)
        ctx.toolbox.sent(C.CHANNEL_REVIEW, request)
        ctx.say(f"review of {ctx_id} asked from {reviewer}: {summary}")


# ---------------------------------------------------------------------------- reviewer

REVIEW_REJECT = (
    "Missing input validation on pagination params\n"
    "The ?limit= param accepts any value including negative numbers. Add validation: "
    "limit must be 1-100, page must be >= 1. Also add a test for invalid query params."
)


@dataclass
class ReviewerBrain:
    """Reviews what workers offer on ``review``: reads the route, runs the tests."""

    def run(self, ctx: AgentContext) -> int:
        while not ctx.stop.is_set():
            if not ctx.wait_for_messages(0.5):
                continue
            for item in _items(ctx):
                act = item.activity
                if act.type != "Offer" or item.channel != C.CHANNEL_REVIEW or not act.context:
                    continue
                if act.target is not None and act.target != ctx.name:
                    continue  # a review asked of someone else (the human, say)
                try:
                    self._review(ctx, act)
                except PorterError as exc:
                    ctx.say(f"review of {act.context} failed: {exc}")
        return 0

    def _review(self, ctx: AgentContext, act: Activity) -> None:
        route = _call(ctx, "read_file", path="src/routes/users.py")
        has_validation = "def validate" in route and "raise ValueError" in route
        has_test = "test_users.py" in _call(ctx, "bash", command="ls tests")
        if not (has_validation and has_test):
            _call(ctx, "send_message", channel=C.CHANNEL_REVIEW, type="Reject",
                  message=REVIEW_REJECT, context=act.context, tag=["validation", "testing"])
            return
        result = _call(ctx, "bash", command="python3 tests/test_users.py")
        if "[exit status 0]" in result:
            _call(ctx, "send_message", channel=C.CHANNEL_REVIEW, type="Accept",
                  message="LGTM -- validation and tests look good", context=act.context)
        else:
            _call(ctx, "send_message", channel=C.CHANNEL_REVIEW, type="Reject",
                  message="Tests fail\n" + result[-500:], context=act.context)


BRAINS = {"architect": ArchitectBrain, "worker": WorkerBrain, "reviewer": ReviewerBrain}
