"""Gathering a task's trace from agents over real nodes on loopback, when one of them
answers with span records that are not records (a buggy or hostile peer): the trace of
the others is still drawn, and the bad answer is named, not raised."""

from __future__ import annotations

import asyncio
import itertools
import os
from pathlib import Path

import orjson
import pytest

from porter_mesh.core.control import KIND_SPANS, KIND_SPANS_REPLY
from porter_mesh.core.envelope import Envelope
from porter_mesh.node.node import Node, Reply
from porter_mesh.tracing.ring import SpanRing
from porter_mesh.tracing.views import SpanClient, gather_trace, hand_spans, serve_spans
from porter_mesh.tracing.waterfall import render_waterfall

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]

_meshes = itertools.count()
CONTEXT = "urn:porter:task:gather1"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _record(span_id: str, parent: str | None, name: str, start: int) -> dict[str, object]:
    return {"trace_id": TRACE, "span_id": span_id, "parent_id": parent, "name": name,
            "kind": "internal", "service": "honest", "start_ns": start,
            "end_ns": start + 1_000_000, "status": "ok", "status_message": "",
            "attributes": {"porter.task.context": CONTEXT}}


#: What a hostile peer answers: each entry breaks a field the waterfall reads.
BAD_SPANS: list[object] = [
    {"name": "no ids"},
    {**_record("00000000000000b1", None, "x", 5), "trace_id": 7},
    {**_record("00000000000000b2", None, "x", 5), "start_ns": "soon"},
    {**_record("00000000000000b3", None, "x", 5), "end_ns": None},
    {**_record("00000000000000b4", None, "x", 5), "name": ["a", "list"]},
    {**_record("00000000000000b5", None, "x", 5), "parent_id": {"no": "string"}},
    {**_record("00000000000000b6", None, "x", 5), "span_id": 12},
    "not even an object",
]


async def _scenario(tmp_path: Path) -> None:
    mesh = f"gather{os.getpid()}-{next(_meshes)}"

    def node(name: str, *seeds: Node) -> Node:
        return Node(name=name, mesh=mesh, discovery=False, data_dir=tmp_path / name,
                    seeds=tuple(f"127.0.0.1:{s.router_port}" for s in seeds))

    asker = node("asker")
    async with asker:
        honest, hostile = node("honest", asker), node("hostile", asker)
        ring = SpanRing()
        ring.add(_record("00000000000000a1", None, "invoke_agent honest", 1_000))
        ring.add(_record("00000000000000a2", "00000000000000a1", "execute_tool bash", 2_000))
        serve_spans(honest, ring)

        def lie(env: Envelope, payload: bytes, reply: Reply) -> None:
            reply(KIND_SPANS_REPLY, orjson.dumps({"agent": "hostile", "spans": BAD_SPANS,
                                                  "ring": {}}))

        hostile.register_kind(KIND_SPANS, lie)
        async with honest, hostile:
            await asker.wait_for_peers(["honest", "hostile"], 20)
            waterfall = await gather_trace(SpanClient(asker), ["honest", "hostile"], 10,
                                           context=CONTEXT)
    assert [row.name for row in waterfall.rows] == ["invoke_agent honest",
                                                    "execute_tool bash"]
    assert waterfall.trace_ids == [TRACE]
    assert waterfall.complete
    assert any(note.startswith("hostile:") and f"{len(BAD_SPANS)} span record(s)" in note
               for note in waterfall.notes), waterfall.notes
    render_waterfall(waterfall)  # draws without tripping on anything a peer sent


def test_a_peers_malformed_span_records_are_left_out_and_named(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path))


async def _flooded(tmp_path: Path) -> None:
    mesh = f"gather{os.getpid()}-{next(_meshes)}"
    agent = Node(name="agent", mesh=mesh, discovery=False, data_dir=tmp_path / "agent")
    async with agent:
        flooder = Node(name="flooder", mesh=mesh, discovery=False,
                       seeds=(f"127.0.0.1:{agent.router_port}",))
        ring = SpanRing(max_spans=64)
        own = _record("00000000000000a1", None, "invoke_agent agent", 1_000)
        ring.add(own)
        serve_spans(agent, ring)
        async with flooder:
            await flooder.wait_for_peers(["agent"], 20)
            # Four times the agent's ring in handed-over spans of another trace.
            for batch in range(16):
                records = [{**_record(f"{batch + 1:08x}{i + 1:08x}", None, "x", 5),
                            "trace_id": "ab" * 16, "attributes": {}} for i in range(16)]
                assert await hand_spans(flooder, ["agent"], records, 10) == {"agent"}
            waterfall = await gather_trace(SpanClient(flooder), ["agent"], 10,
                                           context=CONTEXT)
    assert agent.counters["spans.kept"] == 256
    assert [row.name for row in waterfall.rows] == ["invoke_agent agent"]
    assert ring.find(context=CONTEXT) == [own]


def test_a_flood_of_handed_spans_does_not_push_out_the_agents_own(tmp_path: Path) -> None:
    asyncio.run(asyncio.wait_for(_flooded(tmp_path), 50))
