"""The agent tools over a MeshPort: AS2 mapping against the profile, inbox text, context.

The mesh side is an in-memory double of the :class:`MeshPort` protocol (the port the
node implements); it records what the tools send and hands them queued messages. The
tools' own parts (workspace, command runner, task board) are real. End-to-end tests
over real nodes live with the node.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from porter_mesh.core import as2
from porter_mesh.core.as2 import Activity
from porter_mesh.core.profile_examples import profile_examples
from porter_mesh.core.tasks import (
    ATTEMPT_FIELD,
    ResultRefused,
    Send,
    TaskBoard,
    TaskState,
    cancel_activity,
)
from porter_mesh.errors import (
    ConfigError,
    QueryError,
    TaskWithdrawn,
    ToolError,
    UnknownPeerError,
)
from porter_mesh.tools import (
    MESSAGING_SECTION,
    InboxItem,
    MeshPort,
    QueryResult,
    RosterEntry,
    Toolbox,
)
from tests.fuzzing import examples

EX = profile_examples()


class MemoryPort:
    """A MeshPort kept in memory: a test double of the node's port."""

    def __init__(self, name: str, roster: list[RosterEntry] | None = None) -> None:
        self._name = name
        self.sent: list[tuple[str, Activity]] = []
        self.inbox: list[InboxItem] = []
        self.remembered: list[Activity] = []
        self.queries: list[str] = []
        self.answer: Callable[[str], QueryResult] = lambda q: QueryResult((), ())
        self.team = roster or []
        self.unknown: set[str] = set()

    @property
    def agent_name(self) -> str:
        return self._name

    def send(self, channel: str, activity: Activity) -> None:
        if channel.startswith("task:") and channel[5:] in self.unknown:
            raise UnknownPeerError(f"no peer {channel[5:]}", recipient=channel[5:])
        self.sent.append((channel, activity))

    def drain_inbox(self, channel: str | None = None, limit: int | None = None) -> list[InboxItem]:
        taken = [i for i in self.inbox if channel is None or i.channel == channel]
        taken = taken[:limit] if limit is not None else taken
        self.inbox = [i for i in self.inbox if i not in taken]
        return taken

    def roster(self) -> list[RosterEntry]:
        return list(self.team)

    def remember(self, activity: Activity) -> None:
        self.remembered.append(activity)

    def recall(self, sparql: str) -> QueryResult:
        self.queries.append(sparql)
        return self.answer(sparql)

    def deliver(self, channel: str, activity: Activity, sender: str | None = None) -> None:
        self.inbox.append(InboxItem(channel, sender or activity.actor, activity, time.time()))

    def last(self) -> tuple[str, dict[str, Any]]:
        channel, activity = self.sent[-1]
        return channel, activity.to_dict()


MESSAGING_TOOLS = ["send_message", "read_messages", "memory_write", "memory_query"]


def toolbox(name: str, role: str, tmp_path: Path | None = None, **kw: Any) -> Toolbox:
    """A toolbox over a fresh MemoryPort; without a workspace, only the messaging tools."""
    port = MemoryPort(name)
    assert isinstance(port, MeshPort)
    if tmp_path is None:
        kw.setdefault("tools", MESSAGING_TOOLS)
    return Toolbox(port, tmp_path, role=role, **kw)


def port_of(box: Toolbox) -> MemoryPort:
    assert isinstance(box.port, MemoryPort)
    return box.port


def text_of(example: dict[str, Any]) -> str:
    return example["summary"] + "\n" + example["object"]["content"]


# -- send_message against the profile's examples ---------------------------------------------


def test_offer_on_a_direct_channel_is_the_profile_example() -> None:
    ex = EX["Admin assigns a task"]
    box = toolbox("architect", "architect")
    reply = box.call("send_message", {"channel": "task:worker-backend", "message": text_of(ex),
                                      "context": "a3f9", "tag": ex["tag"]})
    assert reply == "Sent Offer on task:worker-backend about task urn:porter:task:a3f9."
    assert port_of(box).last() == ("task:worker-backend", ex)
    assert box.context == ex["context"]


def test_offer_without_context_mints_a_task_id() -> None:
    box = toolbox("architect", "architect")
    box.call("send_message", {"channel": "task", "message": "Do a thing"})
    _, sent = port_of(box).last()
    assert sent["type"] == "Offer" and sent["context"].startswith("urn:porter:task:")
    assert "target" not in sent
    first = sent["context"]
    box.call("send_message", {"channel": "task:w1", "message": "Another thing"})
    assert port_of(box).last()[1]["context"] != first


def test_worker_accept_is_the_profile_example() -> None:
    box = toolbox("worker-backend", "worker")
    box.call("send_message", {"channel": "task", "message": "Starting work on GET /users",
                              "type": "Accept", "context": "urn:porter:task:a3f9"})
    assert port_of(box).last() == ("task", EX["Worker accepts"])


def test_status_on_log_is_the_profile_announcement() -> None:
    ex = EX["Status announcement"]
    box = toolbox("worker-backend", "worker")
    box.context = ex["context"]
    box.call("send_message", {"channel": "log", "message": text_of(ex)})
    assert port_of(box).last() == ("log", ex)


def test_question_is_inferred_and_targeted() -> None:
    ex = EX["Agent asks a question"]
    box = toolbox("worker-frontend", "worker")
    box.call("send_message", {"channel": "task:architect", "message": text_of(ex),
                              "context": "b7c2"})
    assert port_of(box).last() == ("task:architect", ex)


def test_review_verdicts_are_the_profile_examples() -> None:
    box = toolbox("reviewer", "reviewer")
    box.context = "urn:porter:task:a3f9"
    feedback = EX["Reviewer gives feedback"]
    box.call("send_message", {"channel": "review", "message": text_of(feedback),
                              "type": "Reject", "tag": feedback["tag"]})
    assert port_of(box).last() == ("review", feedback)
    box.call("send_message", {"channel": "review", "type": "Accept",
                              "message": "LGTM -- validation and tests look good"})
    assert port_of(box).last() == ("review", EX["Reviewer approves"])
    box.call("send_message", {"channel": "review", "message": "Nit: rename x\nUse `limit`."})
    _, note = port_of(box).last()
    assert note["type"] == "Note" and note["content"] == "Use `limit`."


def test_default_types_follow_channel_and_role() -> None:
    worker = toolbox("w1", "worker")
    worker.call("send_message", {"channel": "review", "message": "Ready for review"})
    assert port_of(worker).last()[1]["type"] == "Offer"
    worker.call("send_message", {"channel": "task:architect", "message": "Done with it"})
    assert port_of(worker).last()[1]["type"] == "Announce"
    human = Toolbox(MemoryPort("porter-ui"), role="architect")
    human.call("send_message", {"channel": "log", "message": "hello team"})
    assert port_of(human).last()[1]["type"] == "Announce"


def test_long_first_line_is_cut_for_the_summary() -> None:
    box = toolbox("w1", "worker")
    long = "word " * 100
    box.call("send_message", {"channel": "log", "message": long})
    _, sent = port_of(box).last()
    assert len(sent["summary"]) <= 160 and sent["summary"].endswith("...")
    assert sent["object"]["content"] == long.strip()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"channel": "control", "message": "halt"}, "reserved for the mesh"),
        ({"channel": "random", "message": "hi"}, "unknown channel"),
        ({"channel": "task:", "message": "hi"}, "direct channel"),
        ({"channel": "task:w1", "message": "hi"}, "your own inbox"),
        ({"channel": "log", "message": "   "}, "message is empty"),
        ({"channel": "log", "message": "x", "context": "urn:porter:task:bad id"},
         "not a valid task id"),
        ({"channel": "log"}, "missing required argument"),
    ],
)
def test_bad_messages_are_refused_with_a_reason(args: dict[str, Any], match: str) -> None:
    box = toolbox("w1", "worker")
    with pytest.raises(ToolError, match=match):
        box.call("send_message", args)
    assert port_of(box).sent == []


def test_unknown_recipient_lists_who_is_online() -> None:
    port = MemoryPort("architect", [RosterEntry("w1", "worker", "alive")])
    port.unknown.add("w9")
    box = Toolbox(port, role="architect")
    with pytest.raises(ToolError, match="w9 is not on the mesh; online now: w1"):
        box.call("send_message", {"channel": "task:w9", "message": "hi"})


# -- read_messages ------------------------------------------------------------------------------


def test_inbox_as_text() -> None:
    box = toolbox("worker-backend", "worker")
    port = port_of(box)
    port.deliver("task:worker-backend", Activity.from_dict(EX["Admin assigns a task"]))
    port.deliver("log", Activity.from_dict(EX["Worker invokes a command"]), "other")
    port.deliver("control", as2.announce("architect", "heartbeat"))
    port.deliver("log", as2.announce("worker-backend", "my own echo"))
    port.deliver("task", as2.announce("porter-ui", "Please hurry", "The demo is at 3."))
    port.deliver("log", Activity.fallback("raw text\nsecond line"), "legacy-agent")
    port.deliver("review", Activity.from_dict({**EX["Worker creates files"], "actor": "w2"}))
    lines = box.call("read_messages", {}).splitlines()
    assert lines == [
        "[task:worker-backend] architect: Add GET /users endpoint -- Add a GET /users "
        "endpoint to the API router. Return JSON array of User objects from the database. "
        "Include pagination via ?page=&limit= query params. (Offer; task a3f9; tags api, "
        "backend)",
        "[log] worker-backend: Running database migration -- ran: deno task db:migrate => "
        "Migration complete: added users table (Invoke; task a3f9)",
        "[task] porter-ui (the human user): Please hurry -- The demo is at 3. (Announce)",
        "[log] legacy-agent: raw text | second line",
        "[review] w2: Added /users route and handler -- files: "
        "src/routes/users.ts, src/models/user.ts (Create; task a3f9)",
    ]
    assert box.call("read_messages", {}) == "No new messages."


def test_read_one_channel_leaves_the_rest() -> None:
    box = toolbox("w1", "worker")
    port = port_of(box)
    port.deliver("log", as2.announce("a", "on log"))
    port.deliver("review", as2.announce("a", "on review"))
    assert "on review" in box.call("read_messages", {"channel": "review"})
    assert len(port.inbox) == 1
    assert "on log" in box.call("read_messages", {"channel": "task:w1"}) + box.read_messages()
    with pytest.raises(ToolError, match="reserved"):
        box.call("read_messages", {"channel": "control"})


def test_inbox_limit_says_more_are_waiting() -> None:
    box = toolbox("w1", "worker", inbox_limit=2)
    for i in range(3):
        port_of(box).deliver("log", as2.announce("a", f"m{i}"))
    first = box.read_messages()
    assert "more are waiting" in first and "m2" not in first
    assert "m2" in box.read_messages()


def test_long_details_are_cut() -> None:
    box = toolbox("w1", "worker")
    port_of(box).deliver("log", as2.announce("a", "big", "x" * 5000))
    line = box.read_messages()
    assert "more characters]" in line and len(line) < 1500


# -- task context and attempts -------------------------------------------------------------------


def test_offer_sets_context_and_attempt_is_echoed() -> None:
    box = toolbox("w1", "worker")
    offer = as2.offer("architect", "Fix bug", "details", target="w1",
                      context="urn:porter:task:t1", extra={ATTEMPT_FIELD: 2})
    port_of(box).deliver("task:w1", offer)
    assert "attempt 2" in box.read_messages()
    assert box.context == "urn:porter:task:t1" and box.attempt_for("urn:porter:task:t1") == 2
    box.call("send_message", {"channel": "task:architect", "message": "On it", "type": "Accept"})
    _, sent = port_of(box).last()
    assert sent["context"] == "urn:porter:task:t1" and sent[ATTEMPT_FIELD] == 2
    # A withdrawal of another attempt is not ours; of ours, it forgets the task.
    stale = as2.delete("architect", "stop", "urn:porter:task:t1", context="urn:porter:task:t1",
                       extra={ATTEMPT_FIELD: 1})
    port_of(box).deliver("task:w1", stale)
    box.read_messages()
    assert box.context == "urn:porter:task:t1"
    current = stale.replace(extra={ATTEMPT_FIELD: 2})
    port_of(box).deliver("task:w1", current)
    assert "task withdrawn: stop working on it" in box.read_messages()
    assert box.context is None and box.attempt_for("urn:porter:task:t1") is None


def offer_to(box: Toolbox, ctx: str, attempt: int, sender: str = "architect") -> None:
    offer = as2.offer(sender, "Fix bug", "details", target=box.agent_name, context=ctx,
                      extra={ATTEMPT_FIELD: attempt})
    port_of(box).deliver(f"task:{box.agent_name}", offer)
    box.read_messages()


def withdrawal(ctx: str, attempt: int | None, actor: str = "architect") -> Activity:
    return cancel_activity(actor, ctx, "Withdrawn: holder w1 expired", attempt=attempt)


def test_withdrawn_attempt_is_obeyed(tmp_path: Path) -> None:
    box = toolbox("w1", "worker", tmp_path)
    ctx = "urn:porter:task:t1"
    offer_to(box, ctx, 1)
    box.call("send_message", {"channel": "task:architect", "message": "On it",
                              "type": "Accept"})
    port = port_of(box)
    # Only the claim kept, and only from the agent that offered the task.
    assert not box.observe("task:w1", "architect", withdrawal(ctx, 2))
    assert not box.observe("task:w1", "w2", withdrawal(ctx, 1, actor="w2"))
    assert not box.observe("task", "architect", withdrawal(ctx, 1))  # not addressed to w1
    assert box.withdrawn(ctx) is None
    box.call("write_file", {"path": "a.txt", "content": "still mine"})
    assert box.observe("task:w1", "architect", withdrawal(ctx, 1))
    assert box.withdrawn(ctx) == "Withdrawn: holder w1 expired"
    sent_before = len(port.sent)
    for tool, args in [
        ("write_file", {"path": "a.txt", "content": "stale"}),
        ("edit_file", {"path": "a.txt", "old": "still", "new": "stale"}),
        ("bash", {"command": "touch stale"}),
        ("memory_write", {"about": "x", "finding": "stale"}),
        ("send_message", {"channel": "review", "message": "Please review"}),
        ("send_message", {"channel": "log", "message": "done", "context": ctx}),
    ]:
        with pytest.raises(TaskWithdrawn, match=r"attempt 1\) was withdrawn from you") as err:
            box.call(tool, args)
        assert err.value.context == ctx and err.value.attempt == 1
    assert len(port.sent) == sent_before and port.remembered == []  # nothing reported
    assert (tmp_path / "a.txt").read_text() == "still mine" and not (tmp_path / "stale").exists()
    # Reading still works.
    assert box.call("read_file", {"path": "a.txt"}) == "still mine"
    # The withdrawn claim offered again is stale; a new claim (attempt 3) is work again.
    offer_to(box, ctx, 1)
    with pytest.raises(TaskWithdrawn):
        box.call("write_file", {"path": "a.txt", "content": "stale"})
    offer_to(box, ctx, 3)
    assert box.withdrawn(ctx) is None and box.context == ctx
    box.call("send_message", {"channel": "task:architect", "message": "On it again",
                              "type": "Accept"})
    _, sent = port.last()
    assert sent[ATTEMPT_FIELD] == 3


def test_another_task_is_work_after_a_withdrawal(tmp_path: Path) -> None:
    box = toolbox("w1", "worker", tmp_path)
    offer_to(box, "urn:porter:task:t1", 1)
    port_of(box).deliver("task:w1", withdrawal("urn:porter:task:t1", 1))
    assert "task withdrawn: stop working on it" in box.read_messages()
    with pytest.raises(TaskWithdrawn):
        box.call("write_file", {"path": "a.txt", "content": "stale"})
    offer_to(box, "urn:porter:task:t2", 1)
    assert "Created a.txt" in box.call("write_file", {"path": "a.txt", "content": "new"})
    _, record = port_of(box).last()
    assert record["context"] == "urn:porter:task:t2"


def test_an_empty_context_is_about_no_task() -> None:
    """A reply to a message that named no task does not take the current task's context
    (a Reject of a stray Question must not read as giving up the task held)."""
    box = toolbox("w1", "worker")
    offer_to(box, "urn:porter:task:t9", 1)
    assert box.context == "urn:porter:task:t9"
    box.call("send_message", {"channel": "task:architect", "message": "not a task",
                              "type": "Reject", "context": ""})
    _, sent = port_of(box).last()
    assert "context" not in sent and box.context == "urn:porter:task:t9", sent
    box.call("send_message", {"channel": "task:architect", "message": "still on it",
                              "type": "Note"})
    _, sent = port_of(box).last()
    assert sent["context"] == "urn:porter:task:t9"


def test_offers_to_others_do_not_change_context() -> None:
    box = toolbox("w1", "worker")
    port_of(box).deliver("task", as2.offer("architect", "x", target="w2",
                                           context="urn:porter:task:zz"))
    box.read_messages()
    assert box.context is None


def test_reviewer_picks_up_review_requests() -> None:
    box = toolbox("reviewer", "reviewer")
    request = Activity.from_dict({**EX["Worker requests review"], ATTEMPT_FIELD: 3})
    port_of(box).deliver("review", request)
    box.read_messages()
    box.call("send_message", {"channel": "review", "message": "LGTM", "type": "Accept"})
    _, sent = port_of(box).last()
    assert sent["context"] == "urn:porter:task:a3f9" and sent[ATTEMPT_FIELD] == 3


def test_tools_and_board_fence_a_stale_worker_end_to_end(tmp_path: Path) -> None:
    """The architect's board and two workers' toolboxes, wired by hand."""
    board = TaskBoard("architect", offer_timeout=30.0)
    slow, fast = toolbox("slow", "worker", tmp_path), toolbox("fast", "worker", tmp_path)
    workers = {"slow": slow, "fast": fast}

    def carry(outputs: list[Any]) -> list[ResultRefused]:
        for o in outputs:
            if isinstance(o, Send) and o.channel.startswith("task:"):
                port_of(workers[o.channel[5:]]).deliver(o.channel, o.activity)
        return [o for o in outputs if isinstance(o, ResultRefused)]

    def feed(worker: Toolbox, now: float) -> list[ResultRefused]:
        refused: list[ResultRefused] = []
        for _, activity in port_of(worker).sent:
            refused += carry(board.handle(activity, now=now))
        port_of(worker).sent.clear()
        return refused

    carry(board.worker_up("slow", slots=1, now=0.0))
    ctx, out = board.submit("Write the report", now=0.0)
    carry(out)
    carry(board.worker_up("fast", slots=1, now=0.0))
    assert "Write the report" in slow.read_messages()
    carry(board.tick(now=30.0))  # slow never answered: fenced, re-offered to fast
    assert "Write the report" in fast.read_messages()
    fast.call("send_message", {"channel": "task:architect", "message": "On it",
                               "type": "Accept"})
    assert feed(fast, 31.0) == []

    # The slow worker wakes up and works anyway: its records carry attempt 1.
    slow.call("send_message", {"channel": "task:architect", "message": "Starting",
                               "type": "Accept"})
    slow.call("write_file", {"path": "report.md", "content": "stale"})
    refused = feed(slow, 32.0)
    assert [r.attempt for r in refused] == [1, 1]
    assert "withdrawn" in slow.read_messages()  # told at fence time

    fast.call("write_file", {"path": "report.md", "content": "fresh"})
    fast.call("send_message", {"channel": "review", "message": "Please review"})
    assert feed(fast, 33.0) == []
    task = board.task(ctx)
    assert task is not None and task.state is TaskState.IN_REVIEW and task.holder == "fast"


# -- memory -----------------------------------------------------------------------------------


def test_memory_write_is_a_remember() -> None:
    ex = EX["Worker stores knowledge"]
    box = toolbox("worker-backend", "worker")
    box.context = ex["context"]
    reply = box.call("memory_write", {"about": "api-design", "finding": ex["object"]["content"],
                                      "severity": "info"})
    assert reply.startswith("Remembered about api-design")
    (remembered,) = port_of(box).remembered
    data = remembered.to_dict()
    assert data["type"] == "Remember" and data["context"] == ex["context"]
    assert data["object"] == {**ex["object"], "severity": "info"}


def test_memory_query_with_the_profile_sparql() -> None:
    ex = EX["Recall (knowledge lifecycle)"]
    box = toolbox("architect", "architect")
    port = port_of(box)
    row = {"about": "urn:porter:file:server.ts", "finding": "depends on express module"}
    port.answer = lambda q: QueryResult(("about", "finding"), (row,))
    text = box.call("memory_query", {"sparql": ex["object"]["content"]})  # profile's name
    assert port.queries == [ex["object"]["content"]]
    assert text == ("1 row(s) (about, finding):\n"
                    "1. about=urn:porter:file:server.ts | finding=depends on express module")
    channel, recall = port.last()
    assert channel == "log" and recall["type"] == "Recall"
    assert recall["object"] == ex["object"] and recall["result"] == ex["result"]


def test_memory_query_with_keywords() -> None:
    box = toolbox("architect", "architect")
    port = port_of(box)
    assert box.call("memory_query", {"query": 'Express "routing'}) == "No results."
    (query,) = port.queries
    assert "porter:about" in query and '"express"' in query and '"routing"' in query
    assert query.count("FILTER") == 2


def test_memory_query_errors_become_tool_errors() -> None:
    box = toolbox("architect", "architect")

    def refuse(q: str) -> QueryResult:
        raise QueryError("updates are refused; use SELECT", reason="update")

    port_of(box).answer = refuse
    with pytest.raises(ToolError, match="memory_query: updates are refused"):
        box.call("memory_query", {"query": "SELECT * WHERE { ?s ?p ?o }"})


def test_many_rows_are_numbered_and_cut() -> None:
    box = toolbox("architect", "architect")
    rows = tuple({"n": str(i)} for i in range(60))
    port_of(box).answer = lambda q: QueryResult(("n",), rows, truncated=True)
    text = box.memory_query("SELECT ?n WHERE {}")
    assert "60 row(s)" in text and "50. n=49" in text and "10 more row(s)" in text
    assert "row limit" in text


# -- files and bash records -----------------------------------------------------------------------


def test_file_tools_record_create_and_update(tmp_path: Path) -> None:
    box = toolbox("worker-backend", "worker", tmp_path)
    box.context = "urn:porter:task:a3f9"
    assert box.call("write_file", {"path": "src/a.ts", "content": "x"}) == (
        "Created src/a.ts (1 bytes).")
    _, create = port_of(box).last()
    assert create == {"type": "Create", "actor": "worker-backend", "summary": "Created src/a.ts",
                      "context": "urn:porter:task:a3f9",
                      "object": {"type": "Document", "url": "src/a.ts"}, "instrument": ["file"]}
    box.call("write_file", {"path": "src/a.ts", "content": "y = 1"})
    assert port_of(box).last()[1]["type"] == "Update"
    box.call("edit_file", {"path": "src/a.ts", "old": "1", "new": "2"})
    _, update = port_of(box).last()
    assert update["type"] == "Update" and update["object"]["url"] == "src/a.ts"
    assert box.call("read_file", {"path": "src/a.ts"}) == "y = 2"
    with pytest.raises(ToolError, match="outside the workspace"):
        box.call("read_file", {"path": "../x"})


def test_large_read_says_how_to_get_the_rest(tmp_path: Path) -> None:
    (tmp_path / "big.txt").write_text("a" * 300_000)
    box = toolbox("w1", "worker", tmp_path)
    text = box.read_file("big.txt")
    assert "[truncated: big.txt is 300000 bytes" in text and "tail -c +262145" in text


def test_bash_records_an_invoke(tmp_path: Path) -> None:
    box = toolbox("worker-1", "worker", tmp_path)
    box.context = "urn:porter:task:a3f9"
    text = box.call("bash", {"command": "echo 14 tests passed", "timeout": 30})
    assert text == "14 tests passed\n[exit status 0]"
    channel, invoke = port_of(box).last()
    assert channel == "log"
    assert invoke["type"] == "Invoke" and invoke["instrument"] == ["bash"]
    assert invoke["object"] == {"type": "Note", "content": "echo 14 tests passed"}
    assert invoke["result"]["content"] == text
    assert invoke["context"] == "urn:porter:task:a3f9"
    assert set(invoke) == set(EX["Invoke (execution lifecycle)"])


def test_bash_timeout_reaches_the_agent(tmp_path: Path) -> None:
    box = toolbox("w1", "worker", tmp_path, grace=0.2)
    text = box.call("bash", {"command": "sleep 30", "timeout": 0.3})
    assert "[timed out after 0.3s" in text
    assert "timed out" in port_of(box).last()[1]["summary"]


# -- roles, prompt, configuration ----------------------------------------------------------------


def test_roles_limit_the_tools(tmp_path: Path) -> None:
    architect = toolbox("architect", "architect")
    with pytest.raises(ToolError, match="unknown tool 'bash'; your tools are: send_message"):
        architect.call("bash", {"command": "ls"})
    reviewer = toolbox("reviewer", "reviewer", tmp_path)
    with pytest.raises(ToolError, match="unknown tool 'write_file'"):
        reviewer.call("write_file", {"path": "a", "content": "b"})
    with pytest.raises(ConfigError, match="need a workspace"):
        Toolbox(MemoryPort("w1"), None, role="worker")
    with pytest.raises(ConfigError, match="unknown role"):
        Toolbox(MemoryPort("x"), role="janitor")


def test_system_prompt_has_messaging_and_team() -> None:
    port = MemoryPort("worker-1", [
        RosterEntry("architect", "architect", "alive"),
        RosterEntry("worker-1", "worker", "alive"),
        RosterEntry("worker-2", "worker", "evasive", draining=True),
        RosterEntry("porter-ui", "human", "alive"),
    ])
    prompt = Toolbox(port, role="worker", tools=["send_message"]).system_prompt()
    assert prompt.startswith(MESSAGING_SECTION)
    for line in (
        "## Messaging",
        "Use send_message to send messages to other agents or channels.",
        "Use read_messages to check for incoming messages.",
        "Channels: 'log' (status updates), 'task' (broadcast to workers),",
        "'task:<agent-name>' (direct to a specific agent), 'review', 'control'.",
        "You are worker-1 (worker).",
        "- architect: architect, alive",
        "- worker-2: worker, evasive, draining (takes no new tasks)",
        "- porter-ui: the human user, alive",
    ):
        assert line in prompt.splitlines(), line
    assert "- worker-1" not in prompt
    assert "porter-ui come from the human user" in prompt


def test_lonely_roster() -> None:
    prompt = Toolbox(MemoryPort("solo"), role="architect").system_prompt()
    assert "No teammates are online right now." in prompt


def test_draining_agent_cannot_take_new_tasks() -> None:
    box = toolbox("w1", "worker")
    box.call("send_message", {"channel": "task:architect", "message": "taking it",
                              "type": "Accept", "context": "t1"})
    box.drain()
    with pytest.raises(ToolError, match="you are draining"):
        box.call("send_message", {"channel": "task:architect", "message": "taking it",
                                  "type": "Accept", "context": "t2"})
    # The task already held can still be talked about, and reviews still approved.
    box.call("send_message", {"channel": "task:architect", "message": "still on it",
                              "type": "Accept", "context": "t1"})
    box.call("send_message", {"channel": "review", "message": "LGTM", "type": "Accept",
                              "context": "t3"})
    box.call("send_message", {"channel": "task:architect", "message": "no", "type": "Reject",
                              "context": "t2"})


def test_only_own_direct_channel_is_readable() -> None:
    box = toolbox("w1", "worker")
    with pytest.raises(ToolError, match="only your own direct channel, task:w1"):
        box.call("read_messages", {"channel": "task:w2"})


_text = st.text(max_size=12)
_args = st.dictionaries(
    st.sampled_from(["channel", "message", "type", "context", "tag", "about", "finding",
                     "severity", "query", "sparql", "path", "content", "old", "new", "x"]),
    st.one_of(st.none(), st.booleans(), st.integers(), _text, st.lists(_text, max_size=2),
              st.sampled_from(["log", "task", "review", "control", "task:w2", "task:w1",
                               "..", "/etc/passwd", "a/b.txt", "Offer", "Note", "info"])),
    max_size=5,
)


@settings(max_examples=examples(300), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["send_message", "read_messages", "memory_write", "memory_query",
                        "read_file", "write_file", "edit_file", "nope"]), _args)
def test_arbitrary_calls_give_text_or_a_tool_error(tmp_path: Path, name: str,
                                                   args: dict[str, Any]) -> None:
    """What a confused model may send: only text results or ToolError come back."""
    box = Toolbox(MemoryPort("w1"), tmp_path, role="worker",
                  tools=[*MESSAGING_TOOLS, "read_file", "write_file", "edit_file"])
    try:
        result = box.call(name, args)
    except ToolError as exc:
        assert str(exc)
        return
    assert isinstance(result, str) and result
    for sent_channel, _ in port_of(box).sent:
        assert sent_channel != "control"
    outside = tmp_path.parent
    assert all(p.is_relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert not (outside / "passwd").exists()
