"""An agent's task ledger: what it keeps, and its file surviving a restart (real files)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from porter_mesh.core.as2 import Activity
from porter_mesh.core.lifecycle import Status
from porter_mesh.tools.ledger import TaskLedger

TOP = "urn:porter:task:top"


def act(kind: str, actor: str, context: str = TOP, **extra: object) -> Activity:
    return Activity.from_dict({"type": kind, "actor": actor, "summary": f"{kind} by {actor}",
                               "context": context, **extra})


def test_it_keeps_what_the_agent_holds_or_offered_and_finds_sub_tasks() -> None:
    ledger = TaskLedger("w1", clock=lambda: 5.0)
    assert ledger.saw(act("Offer", "porter-ui"), sender="porter-ui", channel="task:w1")
    # Someone else's task, seen on a broadcast: not kept.
    other = act("Offer", "arch", "urn:porter:task:x")
    assert ledger.saw(other, sender="arch", channel="task:w2") is None
    sub = act("Offer", "w1", "urn:porter:task:sub", parent=TOP)
    ledger.saw(sub, sender="w1", channel="task:w2")
    assert [r.context for r in ledger.open_children(TOP)] == ["urn:porter:task:sub"]
    assert [r.context for r in ledger.held()] == [TOP]
    view = ledger.view()
    assert view["agent"] == "w1"
    assert [t["state"] for t in view["tasks"]] == ["submitted", "submitted"]
    assert view["tasks"][0]["created"] == 5.0


def test_the_file_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "tasks.json"
    ledger = TaskLedger("w1", path=path)
    ledger.saw(act("Offer", "porter-ui"), sender="porter-ui", channel="task:w1")
    ledger.saw(act("Accept", "w1"), sender="w1", channel="task:porter-ui")
    ledger.saw(act("Question", "w1"), sender="w1", channel="task:porter-ui")
    again = TaskLedger("w1", path=path)
    record = again.get(TOP)
    assert record is not None
    assert (record.status, record.question) == (Status.INPUT_REQUIRED, "Question by w1")
    assert record == ledger.get(TOP)
    # The answer after the restart brings it back to work.
    answered = again.saw(act("Note", "porter-ui-ab"), sender="porter-ui-ab", channel="task:w1")
    assert answered is not None and answered.status is Status.WORKING


def test_an_unreadable_file_starts_empty_and_a_failed_write_is_said_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bad = tmp_path / "tasks.json"
    bad.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="porter_mesh.tools"):
        assert TaskLedger("w1", path=bad).records() == []
    assert "unreadable" in caplog.text
    # A file where its directory should be: every write fails; the ledger goes on.
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    ledger = TaskLedger("w1", path=blocker / "tasks.json")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="porter_mesh.tools"):
        ledger.saw(act("Offer", "porter-ui"), sender="porter-ui", channel="task:w1")
        ledger.saw(act("Accept", "w1"), sender="w1", channel="task:porter-ui")
    record = ledger.get(TOP)
    assert record is not None and record.status is Status.WORKING
    assert caplog.text.count("could not keep the task ledger") == 1


def test_it_forgets_finished_tasks_first() -> None:
    ledger = TaskLedger("w1", limit=2)
    for i in range(2):
        ctx = f"urn:porter:task:t{i}"
        ledger.saw(act("Offer", "arch", ctx), sender="arch", channel="task:w1")
    ledger.saw(act("Reject", "w1", "urn:porter:task:t0"), sender="w1", channel="task:arch")
    ledger.saw(act("Offer", "arch", "urn:porter:task:t2"), sender="arch", channel="task:w1")
    assert [r.context for r in ledger.records()] == ["urn:porter:task:t1",
                                                     "urn:porter:task:t2"]
