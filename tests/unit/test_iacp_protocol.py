"""The IACP bridge's pure half: the line codec and the forager session, without sockets."""

from __future__ import annotations

import json
from typing import Any

import pytest

from porter_mesh.core import as2
from porter_mesh.core import constants as C
from porter_mesh.core.tasks import cancel_activity, with_attempt
from porter_mesh.errors import ConfigError, ProtocolError
from porter_mesh.gateways.iacp.protocol import (
    AssignState,
    BridgeSettings,
    Close,
    Dropped,
    Event,
    ForagerSession,
    IdMint,
    Leave,
    LineError,
    LineSplitter,
    LineTooLong,
    Lookup,
    MeshSend,
    Output,
    Owed,
    Phase,
    Register,
    SendLine,
    SetDraining,
    Store,
    assign_from_record,
    assign_to_record,
    decode_line,
    encode_message,
)

CTX = "urn:porter:task:a3f9"
WALL = 1_312_284_100.0


def line(kind: str, ref: str | None = None, body: dict[str, Any] | None = None,
         sender: str = "forager-07", v: str = "1.1", **extra: Any) -> bytes:
    msg: dict[str, Any] = {"v": v, "id": "m-4f91c2", "from": sender, "to": "queen",
                           "kind": kind, "ts": 1312284180, **extra}
    if ref is not None:
        msg["ref"] = ref
    if body is not None:
        msg["body"] = body
    return json.dumps(msg).encode()


def of(outs: list[Output], kind: type) -> list[Any]:
    return [o for o in outs if isinstance(o, kind)]


def sent(outs: list[Output], kind: str | None = None) -> list[Any]:
    return [o.message for o in of(outs, SendLine) if kind is None or o.message.kind == kind]


def mesh(outs: list[Output], channel: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    return [(o.channel, o.activity.to_dict()) for o in of(outs, MeshSend)
            if channel is None or o.channel == channel]


def session(**settings: Any) -> ForagerSession:
    return ForagerSession(BridgeSettings(**settings), IdMint(0xa1), peer="127.0.0.1:5000",
                          now=0.0)


def joined(s: ForagerSession, slots: int = 1) -> ForagerSession:
    outs = s.receive_line(line("hb", body={"slots": slots, "tools": ["crawl"]}), now=0.0,
                          wall=WALL)
    assert of(outs, Register) == [Register("forager-07", slots, ("crawl",))]
    outs = s.joined(now=0.0, wall=WALL)
    assert sent(outs, "hb") and s.phase is Phase.JOINED
    return s


def offered(s: ForagerSession, ctx: str = CTX, attempt: int = 1, now: float = 0.0,
            sender: str = "architect") -> list[Output]:
    act = with_attempt(as2.offer(sender, "crawl index 3", "the third shard", target=s.name,
                                 context=ctx), attempt)
    return s.on_activity("task:forager-07", sender, act, now=now, wall=WALL)


# ----------------------------------------------------------------------------- codec


def test_the_articles_example_decodes_and_unknown_fields_are_ignored() -> None:
    msg = decode_line(line("task.result", ref="q-00a1", body={"status": "ok"}, extra=1))
    assert (msg.sender, msg.kind, msg.ref, msg.body) == ("forager-07", "task.result", "q-00a1",
                                                         {"status": "ok"})
    out = json.loads(encode_message(msg))
    assert out == {"v": "1.1", "id": "m-4f91c2", "from": "forager-07", "to": "queen",
                   "kind": "task.result", "ts": 1312284180, "ref": "q-00a1",
                   "body": {"status": "ok"}}


@pytest.mark.parametrize(("raw", "reason"), [
    (b"not json", "bad-json"),
    (b"[1, 2]", "not-object"),
    (b'{"v": "1.1", "kind": "hb"}', "missing-field"),
    (line("hb", ts="yesterday"), "bad-field"),
    (line("hb", body=[1]), "bad-field"),
    (line("hb", v="1.0"), "version"),
    (line("hb", v="2.0"), "version"),
])
def test_bad_lines_are_named(raw: bytes, reason: str) -> None:
    with pytest.raises(LineError) as err:
        decode_line(raw)
    assert err.value.reason == reason


def test_the_splitter_skips_a_long_line_without_keeping_it() -> None:
    split = LineSplitter(10)
    assert split.feed(b"short\n0123456789ab") == [b"short"]
    assert split.feed(b"cdef" * 100) == []
    assert split.feed(b"\nnext\r\n\n") == [LineTooLong(412), b"next"]
    assert split.feed(b"par") == [] and split.feed(b"t\n") == [b"part"]


# ----------------------------------------------------------------------------- session


def test_register_assign_accept_result_review_done() -> None:
    s = joined(session())
    outs = offered(s)
    (assign,) = sent(outs, "task.assign")
    assert assign.id == "q-0000a2" and assign.to == "forager-07" and assign.sender == "queen"
    assert assign.body["node"] == CTX and assign.body["content"] == "the third shard"
    outs = s.receive_line(line("task.accept", ref=assign.id), now=1.0, wall=WALL)
    assert [(ch, a["type"], a["attempt"]) for ch, a in mesh(outs)] == [
        ("task:architect", "Accept", 1)]
    outs = s.receive_line(line("task.result", ref=assign.id, body={
        "status": "ok", "artifacts": ["cm://index/3"]}), now=2.0, wall=WALL)
    (created,) = [a for _, a in mesh(outs, C.CHANNEL_LOG)]
    assert created["type"] == "Create"
    assert created["object"]["items"] == [{"type": "Document", "url": "cm://index/3"}]
    (request,) = [a for _, a in mesh(outs, C.CHANNEL_REVIEW)]
    assert (request["type"], request["target"], request["attempt"]) == ("Offer", "reviewer", 1)
    verdict = with_attempt(as2.accept("reviewer", "LGTM", context=CTX), 1)
    outs = s.on_activity(C.CHANNEL_REVIEW, "reviewer", verdict, now=3.0, wall=WALL)
    assert [a["type"] for _, a in mesh(outs, C.CHANNEL_LOG)] == ["Announce"]
    assert s.assign(assign.id).state is AssignState.DONE  # type: ignore[union-attr]


def test_a_review_reject_reassigns_with_the_reason() -> None:
    s = joined(session())
    (assign,) = sent(offered(s), "task.assign")
    s.receive_line(line("task.result", ref=assign.id), now=1.0, wall=WALL)
    verdict = as2.reject("reviewer", "Missing validation", "limit must be 1-100", context=CTX)
    outs = s.on_activity(C.CHANNEL_REVIEW, "reviewer", verdict, now=2.0, wall=WALL)
    (again,) = sent(outs, "task.assign")
    assert again.id != assign.id and again.body["revision"] == 1
    assert again.body["changes"] == "limit must be 1-100"


def test_a_result_without_accept_accepts_first_and_results_need_a_ref() -> None:
    s = joined(session())
    (assign,) = sent(offered(s), "task.assign")
    outs = s.receive_line(line("task.result"), now=1.0, wall=WALL)
    assert [(d.reason, d.bad_line) for d in of(outs, Dropped)] == [("missing-field", True)]
    outs = s.receive_line(line("task.result", ref=assign.id), now=1.0, wall=WALL)
    assert [a["type"] for _, a in mesh(outs)] == ["Accept", "Create", "Offer"]


def test_slots_bound_open_assigns() -> None:
    s = joined(session(), slots=2)
    assert sent(offered(s, "urn:porter:task:a1"), "task.assign")
    assert sent(offered(s, "urn:porter:task:a2"), "task.assign")
    outs = offered(s, "urn:porter:task:a3")
    assert not sent(outs) and mesh(outs)[0][1]["summary"] == "Busy: all 2 slot(s) taken"
    assert len(s.open_assigns) == 2


def test_an_unanswered_assign_is_fenced_and_its_late_result_refused() -> None:
    s = joined(session(assign_timeout=5.0, evasive_after=100.0, expire_after=200.0))
    (assign,) = sent(offered(s), "task.assign")
    s.receive_line(line("task.accept", ref=assign.id), now=1.0, wall=WALL)
    s.receive_line(line("hb"), now=5.5, wall=WALL)
    assert not of(s.tick(now=5.9, wall=WALL), MeshSend)  # the accept restarted the clock
    outs = s.tick(now=6.0, wall=WALL)
    (cancel,) = sent(outs, "task.cancel")
    assert cancel.ref == assign.id and "assign_timeout" in cancel.body["reason"]
    assert [(ch, a["type"]) for ch, a in mesh(outs)] == [("task:architect", "Reject")]
    outs = s.receive_line(line("task.result", ref=assign.id), now=7.0, wall=WALL)
    assert not mesh(outs) and [d.reason for d in of(outs, Dropped)] == ["fenced"]
    assert [e.kind for e in of(outs, Event)] == ["refused-late"]


def test_a_withdrawal_fences_and_cancels() -> None:
    s = joined(session())
    (assign,) = sent(offered(s), "task.assign")
    withdraw = cancel_activity("architect", CTX, "Withdrawn: holder halted", attempt=1)
    outs = s.on_activity("task:forager-07", "architect", withdraw, now=1.0, wall=WALL)
    assert [m.ref for m in sent(outs, "task.cancel")] == [assign.id] and not mesh(outs)


def test_an_activity_the_session_cannot_act_on_yet_is_owed_not_taken() -> None:
    s = session()
    assert of(offered(s), Owed)  # no hb yet
    s.receive_line(line("hb", body={"slots": 1}), now=0.0, wall=WALL)
    assert s.phase is Phase.JOINING
    outs = offered(s)
    assert [type(o) for o in outs] == [Owed] and "joining" in outs[0].reason
    s.joined(now=0.0, wall=WALL)
    assert sent(offered(s), "task.assign")  # the same Offer, offered again, is assigned
    s.on_control("halt", "architect", now=1.0, wall=WALL)
    assert of(offered(s, "urn:porter:task:b2"), Owed)  # closing: it waits for next time


def test_a_rollback_undoes_what_an_activity_changed() -> None:
    s = joined(session())
    point = s.checkpoint()
    (assign,) = sent(offered(s), "task.assign")
    assert [a.qid for a in s.carried()] == [assign.id]
    s.rollback(point)
    assert s.carried() == [] and s.open_assigns == []
    (again,) = sent(offered(s), "task.assign")  # not "the same offer again"
    assert again.id != assign.id


def test_a_new_session_carries_over_the_assigns_of_the_last_one() -> None:
    old = joined(session(), slots=2)
    (held,) = sent(offered(old), "task.assign")
    old.receive_line(line("task.accept", ref=held.id), now=1.0, wall=WALL)
    (waiting,) = sent(offered(old, "urn:porter:task:b7", sender="porter-ui"), "task.assign")
    old.receive_line(line("task.result", ref=waiting.id), now=2.0, wall=WALL)
    records = [json.loads(json.dumps(assign_to_record(a))) for a in old.carried()]
    assert [r["state"] for r in records] == ["accepted", "in-review"]

    new = joined(session())
    carried = [assign_from_record(r, now=50.0) for r in records]
    outs = new.restore(carried, now=50.0, wall=WALL)
    (again,) = sent(outs, "task.assign")  # the open one, under its own id
    assert again.id == held.id and again.body["node"] == CTX and again.body["attempt"] == 1
    assert [e.fields["state"] for e in of(outs, Event) if e.kind == "restored"] == [
        "accepted", "in-review"]
    outs = new.receive_line(line("task.result", ref=held.id), now=51.0, wall=WALL)
    assert [(a["type"], a["attempt"]) for _, a in mesh(outs)] == [("Create", 1), ("Offer", 1)]
    # The one in review takes its reviewer's verdict (the human's, for the human's task).
    verdict = as2.accept("porter-ui", "fine", context="urn:porter:task:b7")
    outs = new.on_activity(C.CHANNEL_REVIEW, "porter-ui", verdict, now=52.0, wall=WALL)
    assert [a["type"] for _, a in mesh(outs)] == ["Announce"]
    # A new attempt of the carried-over task supersedes it.
    outs = offered(new, attempt=2, now=53.0)
    assert [m.ref for m in sent(outs, "task.cancel")] == [held.id] and sent(outs, "task.assign")
    assert new.assign(held.id).state is AssignState.FENCED  # type: ignore[union-attr]


def test_a_session_not_joined_restores_nothing_and_bad_records_are_named() -> None:
    s = session()
    rec = {"qid": "q-1", "context": CTX, "attempt": 1, "offered_by": "architect",
           "summary": "x", "content": None, "tag": [], "revision": 0, "changes": None,
           "state": "sent"}
    assert s.restore([assign_from_record(rec, now=0.0)], now=0.0, wall=WALL) == []
    for bad in ({**rec, "state": "done"}, {**rec, "attempt": "1"}, {**rec, "tag": "x"},
                {k: v for k, v in rec.items() if k != "qid"}, {**rec, "revision": -1}):
        with pytest.raises(ProtocolError) as err:
            assign_from_record(bad, now=0.0)
        assert err.value.reason == "bad-record"


def test_silence_evasive_then_expired_then_back() -> None:
    s = joined(session(heartbeat=1.0, evasive_after=2.5, expire_after=6.0))
    assert sent(offered(s), "task.assign")
    outs = s.tick(now=2.5, wall=WALL)
    assert of(outs, SetDraining) == [SetDraining(True)]
    busy = offered(s, "urn:porter:task:b2", now=3.0)
    assert "not answering" in mesh(busy)[0][1]["summary"]
    outs = s.tick(now=6.0, wall=WALL)
    assert of(outs, Leave) and sent(outs, "task.cancel") and s.phase is Phase.GONE
    outs = s.receive_line(line("hb"), now=7.0, wall=WALL)
    assert of(outs, Register) and s.phase is Phase.JOINING


def test_drain_and_halt() -> None:
    s = joined(session())
    (assign,) = sent(offered(s), "task.assign")
    outs = s.on_control("drain", "porter-ui", now=1.0, wall=WALL)
    assert sent(outs, "ctl.drain") and of(outs, SetDraining) == [SetDraining(True)]
    assert not s.on_control("drain", "porter-ui", now=1.0, wall=WALL)  # said once
    assert mesh(offered(s, "urn:porter:task:b2"))[0][1]["summary"].startswith("Draining")
    outs = s.on_control("halt", "porter-ui", now=2.0, wall=WALL)
    assert sent(outs, "ctl.halt") and of(outs, Close) and s.phase is Phase.CLOSED
    assert s.assign(assign.id).state is AssignState.FENCED  # type: ignore[union-attr]


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_other_versions_are_refused_with_a_reason(version: str) -> None:
    s = session()
    outs = s.receive_line(line("hb", v=version), now=0.0, wall=WALL)
    (halt,) = sent(outs, "ctl.halt")
    assert f"IACP {version}" in halt.body["reason"] and halt.to == "forager-07"
    assert of(outs, Close) and s.phase is Phase.CLOSED


def test_a_flood_of_bad_lines_closes_the_connection() -> None:
    s = session(bad_line_limit=3, bad_line_window=10.0)
    for i in range(3):
        assert not of(s.receive_line(b"garbage", now=float(i), wall=WALL), Close)
    assert not of(s.receive_line(b"garbage", now=11.0, wall=WALL), Close)  # a new window
    assert not of(s.receive_line(b"garbage", now=12.0, wall=WALL), Close)
    s.receive_line(b"garbage", now=13.0, wall=WALL)
    assert of(s.receive_line(b"garbage", now=14.0, wall=WALL), Close)


def test_lines_before_the_first_hb_and_from_another_name_do_not_count() -> None:
    s = session()
    outs = s.receive_line(line("task.accept", ref="q-1"), now=0.0, wall=WALL)
    assert [d.reason for d in of(outs, Dropped)] == ["not-registered"]
    joined(s)
    outs = s.receive_line(line("hb", sender="forager-99"), now=1.0, wall=WALL)
    assert [d.reason for d in of(outs, Dropped)] == ["wrong-sender"]
    outs = s.receive_line(line("task.assign"), now=1.0, wall=WALL)
    assert [d.reason for d in of(outs, Dropped)] == ["wrong-direction"]


def test_a_bad_name_and_a_taken_name_are_refused() -> None:
    s = session()
    outs = s.receive_line(line("hb", sender="Forager 7"), now=0.0, wall=WALL)
    assert "cannot be an agent name" in sent(outs, "ctl.halt")[0].body["reason"]
    s = session()
    s.receive_line(line("hb"), now=0.0, wall=WALL)
    outs = s.refused("refused: forager-07 is already on mesh 'default'", wall=WALL)
    assert sent(outs, "ctl.halt")[0].body["reason"].startswith("refused: forager-07")


def test_tool_query_and_mem_sync() -> None:
    s = joined(session())
    outs = s.receive_line(line("tool.query", body={"tool": "index"}), now=1.0, wall=WALL)
    (lookup,) = of(outs, Lookup)
    (reply,) = sent(s.tool_reply(lookup.query, {"a": ["index"], "b": ["crawl"]}, wall=WALL))
    assert reply.kind == "tool.reply" and reply.body == {"tool": "index", "agents": ["a"]}
    (assign,) = sent(offered(s), "task.assign")
    outs = s.receive_line(line("mem.sync", ref=assign.id, body={
        "facts": [{"about": "shard-3", "finding": "40k pages"}]}), now=2.0, wall=WALL)
    (store,) = of(outs, Store)
    assert store.activity.type == "Remember" and store.activity.context == CTX


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError):
        BridgeSettings(heartbeat=10.0, evasive_after=5.0)
    with pytest.raises(ConfigError):
        BridgeSettings(assign_timeout=0)


def test_the_protocol_module_is_pure() -> None:
    import ast
    import pathlib

    from porter_mesh.gateways.iacp import protocol
    from tests.unit.test_core_is_pure import FORBIDDEN

    tree = ast.parse(pathlib.Path(protocol.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {m.split(".")[0] for m in imported} & FORBIDDEN
