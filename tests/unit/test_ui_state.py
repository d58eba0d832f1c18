"""The dashboard's pure state: the task tracker over the profile's lifecycles, and the
message log's paging, filters, persistence and bounds (real files, no sockets)."""

from __future__ import annotations

import itertools
import pathlib
import subprocess
import sys
from typing import Any

import orjson
import pytest

from porter_mesh.core.as2 import Activity
from porter_mesh.gateways.ui.state import (
    LOG_FILE,
    MessageFilter,
    MessageLog,
    TaskTracker,
    message_record,
)

CTX = "urn:porter:task:a3f9"
_ids = itertools.count(1)


def rec(sender: str, kind: str, channel: str, *, context: str | None = CTX,
        to: str | None = None, target: str | None = None, attempt: int | None = None,
        tag: list[str] | None = None, obj: Any = None, summary: str | None = None
        ) -> dict[str, Any]:
    """A record as the dashboard makes it; ``to`` makes it a direct message."""
    data: dict[str, Any] = {"type": kind, "actor": sender,
                            "summary": summary or f"{kind} by {sender}"}
    for key, value in (("context", context), ("target", target), ("attempt", attempt),
                       ("tag", tag), ("object", obj)):
        if value is not None:
            data[key] = value
    n = next(_ids)
    return message_record(record_id=f"m{n}:0", ts=float(n), channel=channel, sender=sender,
                          recipient=to, direct=to is not None,
                          activity=Activity.from_dict(data), seq=n)


def direct(sender: str, kind: str, to: str, **kw: Any) -> dict[str, Any]:
    return rec(sender, kind, f"task:{to}", to=to, **kw)


# The demo's story (agents/scripted.py; tests/integration/test_demo.py): the architect
# offers, the worker accepts, works, asks for review, is sent back once, fixes, is approved.
DEMO_STORY = [
    direct("architect", "Offer", "worker-1", target="worker-1", attempt=1,
           summary="Add GET /users endpoint"),
    direct("worker-1", "Accept", "architect", attempt=1),
    rec("worker-1", "Invoke", "log", attempt=1),
    rec("worker-1", "Create", "log", attempt=1),
    rec("worker-1", "Remember", "log", attempt=1,
        obj={"type": "Note", "about": "api-design", "content": "paginated"}),
    rec("worker-1", "Offer", "review", attempt=1),
    rec("reviewer", "Reject", "review", attempt=1,
        obj={"type": "Note", "content": "limit must be 1-100"}),
    rec("worker-1", "Update", "log", attempt=1),
    rec("worker-1", "Create", "log", attempt=1),
    rec("worker-1", "Invoke", "log", attempt=1),
    rec("worker-1", "Offer", "review", attempt=1),
    rec("reviewer", "Accept", "review", attempt=1),
    rec("worker-1", "Announce", "log", attempt=1),
    rec("architect", "Announce", "log"),
]

# The human offers the task itself and reviews it from the card.
HUMAN_STORY = [
    direct("porter-ui", "Offer", "w1", target="w1", summary="Fix the login page"),
    direct("w1", "Accept", "porter-ui"),
    rec("w1", "Create", "log"),
    rec("w1", "Offer", "review", summary="Ready for review"),
    rec("porter-ui", "Reject", "review", target="w1",
        obj={"type": "Note", "content": "add a test"}),
    rec("w1", "Update", "log"),
    rec("w1", "Offer", "review", summary="Added the test"),
    rec("porter-ui", "Accept", "review", target="w1"),
]

# Declined by the first worker, re-offered (attempt 2) to another who takes it.
DECLINED = [
    direct("architect", "Offer", "w1", target="w1", attempt=1),
    direct("w1", "Reject", "architect", attempt=1,
           obj={"type": "Note", "content": "Busy: all my slots are taken"}),
    direct("architect", "Offer", "w2", target="w2", attempt=2),
    direct("w2", "Accept", "architect", attempt=2),
]

# w1 accepted, went silent and was fenced: the task goes to w2 and w1 is told to stop
# (a Delete naming attempt 1), which must not withdraw w2's claim.
FENCED = [
    direct("architect", "Offer", "w1", target="w1", attempt=1),
    direct("w1", "Accept", "architect", attempt=1),
    direct("architect", "Delete", "w1", obj=CTX, attempt=1, summary="Withdrawn: w1 expired"),
    direct("architect", "Offer", "w2", target="w2", attempt=2),
    direct("w2", "Accept", "architect", attempt=2),
    direct("architect", "Delete", "w1", obj=CTX, attempt=1, summary="Stop work: fenced"),
]

CANCELLED = [
    direct("architect", "Offer", "w1", target="w1", attempt=1),
    direct("w1", "Accept", "architect", attempt=1),
    direct("porter-ui", "Delete", "architect", obj=CTX, summary="No longer needed"),
]

NO_REVIEW = [
    direct("architect", "Offer", "w1", target="w1", attempt=1),
    direct("w1", "Accept", "architect", attempt=1),
    rec("w1", "Announce", "log", attempt=1, tag=["done"]),
]

# A review request sent straight to the human's inbox.
DIRECT_REVIEW = [
    direct("architect", "Offer", "w1", target="w1", attempt=1),
    direct("w1", "Accept", "architect", attempt=1),
    direct("w1", "Offer", "porter-ui", target="porter-ui", attempt=1,
           obj={"type": "Document", "url": "src/app.py"}, summary="Please review"),
]

# The dashboard opened late: the Offer is older than its history. Not a task card.
MIDWAY = [rec("w3", "Create", "log", summary="Added the route"),
          rec("w3", "Offer", "review")]

# A question with a task context and no Offer (a ghost card before): not a task.
GHOST = [rec("porter-ui-ab12", "Question", "log", summary="anyone?")]

# The holder asks its requester, and the human answers from another seat.
INPUT_REQUIRED = [
    direct("porter-ui", "Offer", "w1", target="w1", summary="Set up storage"),
    direct("w1", "Accept", "porter-ui"),
    direct("w1", "Question", "porter-ui", summary="Which database?"),
    direct("porter-ui-cd34", "Note", "w1", summary="Postgres"),
]


@pytest.mark.parametrize(("story", "path", "holder", "attempt", "offered_by", "review_from"), [
    (DEMO_STORY, ["submitted", "working", "in-review", "changes-requested", "working",
                  "in-review", "completed"], "worker-1", 1, "architect", None),
    (HUMAN_STORY, ["submitted", "working", "in-review", "changes-requested", "working",
                   "in-review", "completed"], "w1", 0, "porter-ui", None),
    (HUMAN_STORY[:4], ["submitted", "working", "in-review"], "w1", 0, "porter-ui", "w1"),
    (HUMAN_STORY[:7], ["submitted", "working", "in-review", "changes-requested", "working",
                       "in-review"], "w1", 0, "porter-ui", "w1"),
    (DEMO_STORY[:6], ["submitted", "working", "in-review"], "worker-1", 1, "architect", None),
    (DECLINED, ["submitted", "working"], "w2", 2, "architect", None),
    (FENCED, ["submitted", "working", "submitted", "working"], "w2", 2, "architect", None),
    (CANCELLED, ["submitted", "working", "cancelled"], "w1", 1, "architect", None),
    (NO_REVIEW, ["submitted", "working", "completed"], "w1", 1, "architect", None),
    (DIRECT_REVIEW, ["submitted", "working", "in-review"], "w1", 1, "architect", "w1"),
    (INPUT_REQUIRED, ["submitted", "working", "input-required", "working"], "w1", 0,
     "porter-ui", None),
])
def test_tracker_follows_the_lifecycle(story: list[dict[str, Any]], path: list[str],
                                       holder: str | None, attempt: int,
                                       offered_by: str | None, review_from: str | None) -> None:
    tracker = TaskTracker()
    touched = [tracker.observe(r) for r in story]
    assert all(t is not None and t["context"] == CTX for t in touched)
    task = tracker.task(CTX)
    assert task is not None
    assert [step["state"] for step in task["path"]] == path
    assert task["state"] == path[-1]
    assert task["holder"] == holder
    assert task["attempt"] == attempt
    assert task["offered_by"] == offered_by
    review = task["review"]
    assert (review["from"] if review else None) == review_from
    if review is not None:
        assert review["to"] == "porter-ui"
        assert review["activity_id"] == next(r["id"] for r in reversed(story)
                                             if r["type"] == "Offer")
    assert task["updated"] == story[-1]["ts"]


@pytest.mark.parametrize("story", [MIDWAY, GHOST])
def test_only_an_offer_starts_a_card(story: list[dict[str, Any]]) -> None:
    tracker = TaskTracker()
    assert [tracker.observe(r) for r in story] == [None] * len(story)
    assert tracker.tasks() == []


def test_an_input_required_card_shows_the_question() -> None:
    tracker = TaskTracker()
    tracker.observe_all(INPUT_REQUIRED[:3])
    card = tracker.task(CTX)
    assert card is not None
    assert (card["state"], card["question"]) == ("input-required", "Which database?")
    tracker.observe(INPUT_REQUIRED[3])
    card = tracker.task(CTX)
    assert card is not None and (card["state"], card["question"]) == ("working", None)


def test_a_sub_task_card_names_its_parent() -> None:
    tracker = TaskTracker()
    tracker.observe(direct("w1", "Offer", "w2", context="urn:porter:task:sub",
                           summary="Part of it"))
    card = tracker.task("urn:porter:task:sub")
    assert card is not None and card["parent"] is None
    sub = rec("w1", "Offer", "task:w3", to="w3", context="urn:porter:task:sub2")
    sub["activity"]["parent"] = CTX
    tracker.observe(sub)
    card = tracker.task("urn:porter:task:sub2")
    assert card is not None and card["parent"] == CTX


def test_task_card_details() -> None:
    tracker = TaskTracker()
    tracker.observe_all(DEMO_STORY[:7])
    task = tracker.task(CTX)
    assert task is not None
    assert task["title"] == "Add GET /users endpoint"
    assert "limit must be 1-100" in task["note"]
    assert [s["by"] for s in task["path"]] == ["architect", "worker-1", "worker-1", "reviewer"]
    assert task["path"][0]["ts"] == DEMO_STORY[0]["ts"]
    direct_review = TaskTracker()
    direct_review.observe_all(DIRECT_REVIEW)
    card = direct_review.task(CTX)
    assert card is not None and card["review"] is not None
    assert card["review"]["channel"] == "task:porter-ui"
    assert card["review"]["attempt"] == 1
    assert card["review"]["summary"] == "Please review"


def test_tracker_ignores_what_is_not_a_task_and_orders_cards() -> None:
    tracker = TaskTracker(max_tasks=3)
    assert tracker.observe(rec("w1", "Announce", "log", context=None)) is None
    assert tracker.observe(rec("w1", "Announce", "log", context="thread-7")) is None
    for i in range(5):
        tracker.observe(direct("architect", "Offer", "w1", context=f"urn:porter:task:t{i}"))
    tracker.observe(direct("w1", "Accept", "architect", context="urn:porter:task:t2"))
    assert [t["context"] for t in tracker.tasks()] == [
        "urn:porter:task:t2", "urn:porter:task:t4", "urn:porter:task:t3"]
    assert tracker.task("urn:porter:task:t0") is None  # forgotten: the least recent


def test_record_shape_and_inbox() -> None:
    to_me = direct("w1", "Accept", "porter-ui")
    assert to_me["inbox"] and to_me["direct"] and to_me["recipient"] == "porter-ui"
    targeted = rec("w1", "Question", "task", target="porter-ui")
    assert targeted["inbox"] and targeted["recipient"] is None
    mine = direct("porter-ui", "Offer", "w1", target="w1")
    assert not mine["inbox"]
    assert set(to_me) == {"id", "ts", "channel", "sender", "recipient", "direct", "type",
                          "summary", "context", "activity", "seq", "inbox"}
    fallback = message_record(record_id="x:0", ts=1.0, channel="log", sender="w9",
                              recipient=None, direct=False,
                              activity=Activity.fallback("plain text"), seq=3)
    assert fallback["summary"] == "plain text" and fallback["type"] == "Note"


# ---------------------------------------------------------------------------- the log


def records(n: int, **kw: Any) -> list[dict[str, Any]]:
    return [rec(f"w{i % 3}", "Announce" if i % 2 else "Note", "log" if i % 4 else "task",
                summary=f"message number {i}", **kw) for i in range(n)]


def test_paging_backwards_returns_every_record_once(tmp_path: pathlib.Path) -> None:
    log = MessageLog(None, history=1000)
    made = records(95)
    for r in made:
        assert log.append(r) is not None
    seen: list[str] = []
    before = None
    pages = 0
    while True:
        page, more = log.page(limit=10, before=before)
        pages += 1
        seen[:0] = [e.id for e in page]
        if not more:
            break
        before = page[0].id
    assert seen == [r["id"] for r in made]
    assert pages == 10
    newest, more = log.page(limit=3)
    assert [e.id for e in newest] == [r["id"] for r in made[-3:]] and more
    assert [orjson.loads(e.json) for e in newest] == made[-3:]
    with pytest.raises(KeyError):
        log.page(limit=3, before="no-such-id")


@pytest.mark.parametrize(("where", "expected"), [
    (MessageFilter(channel="task"), lambda r: r["channel"] == "task"),
    (MessageFilter(type="Note"), lambda r: r["type"] == "Note"),
    (MessageFilter(agent="w1"), lambda r: r["sender"] == "w1"),
    (MessageFilter(text="NUMBER 1"), lambda r: "number 1" in r["summary"]),
    (MessageFilter(channel="log", type="Announce", agent="w2"),
     lambda r: r["channel"] == "log" and r["type"] == "Announce" and r["sender"] == "w2"),
    (MessageFilter(inbox=True), lambda r: r["inbox"]),
    (MessageFilter(context="urn:porter:task:other"), lambda r: r["context"] ==
     "urn:porter:task:other"),
])
def test_filters(where: MessageFilter, expected: Any) -> None:
    log = MessageLog(None)
    made = [*records(40), direct("w1", "Question", "porter-ui"),
            direct("porter-ui", "Offer", "w2", target="w2"),
            rec("w2", "Accept", "log", context="urn:porter:task:other")]
    for r in made:
        log.append(r)
    page, more = log.page(limit=1000, where=where)
    want = [r["id"] for r in made if expected(r)]
    assert want and [e.id for e in page] == want and not more
    page, more = log.page(limit=2, where=where)
    assert [e.id for e in page] == want[-2:] and more == (len(want) > 2)


def test_log_survives_restart_and_skips_a_torn_line(tmp_path: pathlib.Path) -> None:
    made = records(30)
    log = MessageLog(tmp_path, history=100)
    for r in made:
        log.append(r)
    log.flush()
    log.append(made[0])  # a duplicate id is not stored twice
    log.close()
    with open(tmp_path / LOG_FILE, "ab") as fh:
        fh.write(b'{"id": "torn", "chan')  # killed mid-write
    again = MessageLog(tmp_path, history=100)
    assert again.skipped == 1
    assert [r["id"] for r in again.records()] == [r["id"] for r in made]
    assert list(again.records()) == made
    again.append(rec("w1", "Note", "log"))
    again.close()
    assert len(list(MessageLog(tmp_path, history=100).records())) == 31


def test_memory_and_disk_are_bounded(tmp_path: pathlib.Path) -> None:
    made = records(57)
    log = MessageLog(tmp_path, history=10)
    for i, r in enumerate(made):
        log.append(r)
        if i % 4 == 0:
            log.flush()
    log.close()
    assert len(log) == 10
    assert [e.id for e in log] == [r["id"] for r in made[-10:]]
    assert log.get(made[0]["id"]) is None
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["messages.1.jsonl", LOG_FILE]
    lines = sum(len(p.read_bytes().splitlines()) for p in tmp_path.iterdir())
    assert 10 <= lines < 2 * 10 + 4
    reloaded = MessageLog(tmp_path, history=10)
    assert [r["id"] for r in reloaded.records()] == [r["id"] for r in made[-10:]]
    reloaded.close()


def test_after_resumes_a_stream() -> None:
    log = MessageLog(None, history=5)
    made = records(8)
    for r in made:
        log.append(r)
    gap = log.after(made[4]["id"])
    assert gap is not None and [e.id for e in gap] == [r["id"] for r in made[5:]]
    assert log.after(made[-1]["id"]) == []
    assert log.after(made[0]["id"]) is None  # evicted: the client must reload
    assert log.after("never") is None


def test_a_task_from_a_command_line_seat_is_the_humans() -> None:
    seat = "porter-ui-3fa2c1"
    tracker = TaskTracker()
    for record in (direct(seat, "Offer", "w1", target="w1", summary="From the terminal"),
                   direct("w1", "Accept", seat),
                   rec("w1", "Offer", "review", summary="Ready for review")):
        tracker.observe(record)
    card = tracker.task(CTX)
    assert card is not None and card["offered_by"] == seat
    # On review without a target, for a task one of the human's seats offered: the human's.
    assert card["review"] is not None and card["review"]["to"] == "porter-ui"
    # A seat's own messages are not the dashboard's inbox; replies to it are the seat's.
    assert not direct(seat, "Offer", "w1", target="w1")["inbox"]
    assert not direct("w1", "Accept", seat)["inbox"]
    # Anyone else's name is not the human's.
    other = TaskTracker()
    for record in (direct("porter-uix", "Offer", "w1", target="w1"),
                   rec("w1", "Offer", "review")):
        other.observe(record)
    assert other.task(CTX)["review"] is None  # type: ignore[index]


#: Run in a child process: a file-size limit (RLIMIT_FSIZE) makes the log's write stop
#: short in the middle of a line and then fail, as a disk filling up does; raising the
#: limit again is space returning. The child prints what it saw as JSON.
_SHORT_WRITE = """
import json, logging, pathlib, resource, signal, sys
from porter_mesh.gateways.ui.state import LOG_FILE, MessageLog
logging.basicConfig()
from tests.unit.test_ui_state import records
directory = pathlib.Path(sys.argv[1])
made = records(40)
log = MessageLog(directory, history=20)
log.append(made[0])
assert log.flush()
size = (directory / LOG_FILE).stat().st_size
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG instead
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 40, hard))
for r in made[1:12]:
    log.append(r)
first = log.flush()
torn = (directory / LOG_FILE).stat().st_size
for r in made[12:]:  # more while the disk stays full: at most history are held
    log.append(r)
second = log.flush()
failing = log.status()
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
healed = log.flush()
log.close()
print(json.dumps({"first": first, "second": second, "healed": healed, "size": size,
                  "torn": torn, "failing": failing, "after": log.status(),
                  "ids": [r["id"] for r in made]}))
"""


def test_a_failed_write_keeps_the_records_and_resumes_to_the_byte(
        tmp_path: pathlib.Path) -> None:
    root = pathlib.Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _SHORT_WRITE, str(tmp_path)], cwd=root,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = orjson.loads(done.stdout)
    assert seen["torn"] == seen["size"] + 40  # the write stopped inside a line
    assert not seen["first"] and not seen["second"] and seen["healed"]
    failing = seen["failing"]
    assert not failing["ok"] and failing["failures"] == 2 and "too large" in failing["error"]
    # The batch cut short (11 records) is kept whole; of the 28 appended after it, the
    # newest 20 (the history) are held and 8 dropped.
    assert failing["unwritten"] == 11 + 20 and failing["dropped"] == 8, failing
    assert seen["after"]["ok"] and seen["after"]["unwritten"] == 0
    assert done.stderr.count("cannot write") == 1 and "is written again" in done.stderr
    # On disk: whole lines only, each record once, the torn one completed byte for byte.
    lines = b"".join((tmp_path / name).read_bytes() for name in
                     ("messages.1.jsonl", LOG_FILE)).splitlines()
    ids = [orjson.loads(line)["id"] for line in lines]
    assert ids == seen["ids"][:12] + seen["ids"][20:]
