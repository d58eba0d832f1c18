"""The roster's numbers without a socket: what of a node's view reaches the dashboard,
and when each peer is asked for it."""

from __future__ import annotations

from typing import Any

from porter_mesh.gateways.ui.stats import StatsSchedule, stats_record

LLM_VIEW: dict[str, Any] = {
    "name": "w1", "role": "worker", "lost": 3, "dropped": 1, "uptime": 12.5,
    "queues": {"inbox": 2, "outbox": 0, "subscribers": 1},
    "knowledge": {"observations": 7, "retractions": 1, "origins": 2, "digest": "ab",
                  "data_dir": "/home/someone/secret"},
    "peers": [{"name": "boss"}], "counters": {"sent": 5},
    "agent": {"brain": "llm", "model": "m-7b", "model_calls": 12, "tokens_in": 3400,
              "tokens_out": 812, "tool_calls": 9, "errors": 0, "retries": 1,
              "model_errors": 0, "failed_turns": 0},
}


def test_an_llm_agents_view_keeps_its_loss_queues_knowledge_and_metrics() -> None:
    assert stats_record(LLM_VIEW) == {
        "lost": 3, "dropped": 1, "queues": {"inbox": 2, "outbox": 0, "subscribers": 1},
        "knowledge": {"observations": 7, "retractions": 1},
        "agent": {"brain": "llm", "model": "m-7b", "model_calls": 12, "tokens_in": 3400,
                  "tokens_out": 812, "tool_calls": 9, "errors": 0, "retries": 1},
    }


def test_a_scripted_agent_has_no_metrics_and_a_bare_node_no_agent_section() -> None:
    scripted = stats_record({"lost": 0, "dropped": 0, "knowledge": None,
                             "agent": {"brain": "scripted"}})
    assert scripted["agent"] == {"brain": "scripted"}
    assert scripted["knowledge"] is None
    bare = stats_record({"lost": 0, "dropped": 0})
    assert "agent" not in bare
    assert bare["queues"] == {"inbox": None, "outbox": None, "subscribers": None}


def test_values_of_the_wrong_type_are_none_and_long_text_is_cut() -> None:
    record = stats_record({
        "lost": "many", "dropped": -1, "queues": [1, 2], "knowledge": "big",
        "agent": {"brain": ["llm"], "model": "m" * 10_000, "model_calls": True,
                  "tokens_in": 1.5, "tool_calls": 2, "extra": "<script>"}})
    assert record == {
        "lost": None, "dropped": None,
        "queues": {"inbox": None, "outbox": None, "subscribers": None}, "knowledge": None,
        "agent": {"brain": None, "model": "m" * 200, "model_calls": None, "tokens_in": None,
                  "tool_calls": 2}}


def test_the_schedule_asks_newcomers_at_once_then_every_interval() -> None:
    s = StatsSchedule(interval=3.0, max_backoff=60.0)
    assert s.sync(["a", "b"], now=100.0) == []
    assert s.due(100.0) == ["a", "b"]
    assert s.due(100.0, busy={"a"}) == ["b"]
    assert s.due(100.0, limit=1) == ["a"]
    s.answered("a", 100.5)
    assert s.due(101.0) == ["b"]
    assert s.due(103.5) == ["b", "a"]  # the longest overdue first
    assert s.next_at("a") == 103.5


def test_the_schedule_backs_off_silent_and_unsupported_peers() -> None:
    s = StatsSchedule(interval=3.0, max_backoff=60.0)
    s.sync(["quiet", "old"], now=0.0)
    waits = []
    now = 0.0
    for _ in range(6):
        s.failed("quiet", now)
        at = s.next_at("quiet")
        assert at is not None
        waits.append(at - now)
        now = at
    assert waits == [6.0, 12.0, 24.0, 48.0, 60.0, 60.0]
    s.answered("quiet", now)
    assert s.next_at("quiet") == now + 3.0  # an answer ends the back-off
    s.failed("old", 0.0, unsupported=True)
    assert s.next_at("old") == 60.0
    s.reset("old", 5.0)  # it restarted: perhaps it answers now
    assert s.due(5.0) == ["old"]


def test_the_schedule_follows_the_roster() -> None:
    s = StatsSchedule()
    s.sync(["a", "b"], now=0.0)
    s.failed("b", 0.0)
    assert s.sync(["a", "c"], now=1.0) == ["b"]
    assert s.next_at("b") is None and s.next_at("c") == 1.0
    s.answered("b", 2.0)  # an answer after it left does not bring it back
    s.failed("b", 2.0)
    assert s.next_at("b") is None
    s.sync(["a", "b", "c"], now=3.0)
    assert s.next_at("b") == 3.0  # back as a newcomer, without its old failures
    s.failed("b", 3.0)
    assert s.next_at("b") == 3.0 + 2 * s.interval
