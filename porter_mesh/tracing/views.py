"""Spans over the mesh: each agent answers ``spans`` from its ring; ``porter-mesh trace``
asks every agent (as ``stats`` does, through :class:`~porter_mesh.node.views.ViewClient`).

A node that leaves soon after its work (a command's seat: ``send``, ``request``) hands
its finished spans to the peers it sent to (``spans-keep``), which keep them in their
rings: the root of a task the command started outlives the command.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from porter_mesh.core.control import (
    KIND_SPANS,
    KIND_SPANS_KEEP,
    KIND_SPANS_KEPT,
    KIND_SPANS_REPLY,
    MAX_CONTROL_BYTES,
    MAX_KEPT_SPANS,
    MAX_SPAN_QUERY_IDS,
    SpansRequest,
    decode_spans_keep,
    decode_spans_request,
    encode_spans_keep,
    encode_spans_kept,
    encode_spans_reply,
    encode_spans_request,
)
from porter_mesh.core.envelope import Envelope
from porter_mesh.errors import FrameError
from porter_mesh.node.node import Node, Reply
from porter_mesh.node.views import ViewClient
from porter_mesh.tracing.ring import SpanRecord, SpanRing
from porter_mesh.tracing.waterfall import Waterfall, build_waterfall, record_problem

__all__ = ["SpanClient", "gather_trace", "hand_spans", "serve_spans"]

_log = logging.getLogger("porter_mesh.tracing")
# Room left in a reply for the ring's counters and the JSON around the spans.
_REPLY_BUDGET: Final = MAX_CONTROL_BYTES - 64 * 1024


def serve_spans(node: Node, ring: SpanRing) -> None:
    """Answer ``spans`` requests from ``ring`` (the node's recent spans).

    A reply that would pass one message's limit keeps the newest spans and says how
    many it left out (``truncated``). A malformed request is counted and answered with
    nothing.

    Spans handed over by a leaving seat (``spans-keep``) are kept beside ``ring``, in a ring
    of their own a quarter its size (counted in ``spans.kept``), and their receipt
    answered: a peer that hands over a flood of spans evicts only handed-over spans, never
    the node's own.
    """
    handed = SpanRing(max_spans=max(1, ring.max_spans // 4),
                      max_bytes=max(1, ring.max_bytes // 4))

    def on_request(env: Envelope, payload: bytes, reply: Reply) -> None:
        try:
            request = decode_spans_request(payload)
        except FrameError as exc:
            node.counters["dropped.bad-spans-request"] += 1
            _log.debug("bad spans request from %s: %s", env.sender, exc)
            return
        own = ring.find(trace_ids=request.trace_ids, context=request.context)
        # A seat's spans name the task's trace, not always its context: ask by both.
        traces = {*request.trace_ids, *(r["trace_id"] for r in own)}
        spans = handed.find(trace_ids=traces, context=request.context) + own
        body: dict[str, Any] = {"agent": node.name, "spans": spans, "ring": ring.stats()}
        data = encode_spans_reply(body)
        left_out = 0
        while len(data) > _REPLY_BUDGET and spans:
            cut = max(1, len(spans) // 4)
            spans, left_out = spans[cut:], left_out + cut
            body["spans"], body["truncated"] = spans, left_out
            data = encode_spans_reply(body)
        reply(KIND_SPANS_REPLY, data)

    def on_keep(env: Envelope, payload: bytes, reply: Reply) -> None:
        # A malformed one raises FrameError: the node counts it and logs it once.
        records = decode_spans_keep(payload)
        for record in records:
            handed.add(record)
        node.counters["spans.kept"] += len(records)
        reply(KIND_SPANS_KEPT, encode_spans_kept({"kept": len(records)}))

    node.register_kind(KIND_SPANS, on_request)
    node.register_kind(KIND_SPANS_KEEP, on_keep)
    node.view_sections["spans"] = ring.stats


async def hand_spans(node: Node, peers: list[str], records: list[SpanRecord],
                     timeout: float) -> set[str]:
    """Hand finished spans to ``peers`` to keep in their rings (use it on the node's loop).

    A peer without tracing, or of an earlier version, answers ``unsupported`` at once.

    Args:
        node: the node that made the spans (it is about to leave).
        peers: who keeps them.
        records: the span records (the newest :data:`MAX_KEPT_SPANS`).
        timeout: seconds to wait for the answers.

    Returns:
        The peers that kept them.
    """
    if not records or not peers:
        return set()
    client = ViewClient(node, kind=KIND_SPANS_KEEP, reply_kind=KIND_SPANS_KEPT)
    answers = await client.ask_all(peers, timeout,
                                   encode_spans_keep(records[-MAX_KEPT_SPANS:]))
    return {peer for peer, answer in answers.items() if not isinstance(answer, BaseException)}


class SpanClient:
    """Asks agents for their spans of some traces (use it on the node's loop)."""

    def __init__(self, node: Node) -> None:
        self._client = ViewClient(node, kind=KIND_SPANS, reply_kind=KIND_SPANS_REPLY)

    async def ask_all(self, peers: list[str], timeout: float, *,
                      trace_ids: tuple[str, ...] = (), context: str | None = None,
                      ) -> dict[str, dict[str, Any] | BaseException]:
        """Each agent's answer (``{"agent", "spans", "ring"}``), or why there is none."""
        payload = encode_spans_request(SpansRequest(trace_ids, context))
        return await self._client.ask_all(peers, timeout, payload)


def _drawable(answer: dict[str, Any]) -> tuple[list[SpanRecord], int, str | None]:
    """The span records of a peer's answer that a waterfall can draw, how many others
    it held, and what was wrong with the first of those (a peer's answer is its own:
    a record without the fields the drawing reads must not stop the others')."""
    spans = answer.get("spans")
    drawable: list[SpanRecord] = []
    left_out, first = 0, None
    for record in spans if isinstance(spans, list) else ():
        problem = record_problem(record)
        if problem is None:
            drawable.append(record)
        else:
            left_out += 1
            first = first or problem
    return drawable, left_out, first


async def gather_trace(client: SpanClient, agents: list[str], timeout: float, *,
                       trace_ids: tuple[str, ...] = (), context: str | None = None,
                       own: SpanRing | None = None) -> Waterfall:
    """A trace's waterfall from the agents' rings (``porter-mesh trace``, the dashboard).

    Asked by a task ``context``, the agents are asked a second time by the trace ids
    their first answers name, so that spans of the task's traces that do not name the
    task (the request that started it, on another agent) are included.

    Args:
        client: the span client of the asking node.
        agents: who to ask.
        timeout: seconds each may take to answer.
        trace_ids: 32-hex trace ids to draw.
        context: a task (``urn:porter:task:...``): every trace with a span about it.
        own: the asking node's own ring, read too (a long-lived seat's, the dashboard's).

    Returns:
        The waterfall; its notes name the agents that did not answer, the rings that
        dropped spans, and the replies that were cut to fit.
    """
    answers = await client.ask_all(agents, timeout, trace_ids=trace_ids, context=context)
    mine = own.find(trace_ids=trace_ids, context=context) if own is not None else []
    if context is not None:
        found = sorted({r["trace_id"] for a in answers.values()
                        if not isinstance(a, BaseException)
                        for r in _drawable(a)[0]}
                       | {r["trace_id"] for r in mine})[:MAX_SPAN_QUERY_IDS]
        if found:
            answers = await client.ask_all(agents, timeout, trace_ids=tuple(found))
            mine = own.find(trace_ids=found) if own is not None else []
    records: list[SpanRecord] = list(mine)
    notes: list[str] = []
    for name, answer in sorted(answers.items()):
        if isinstance(answer, BaseException):
            why = (f"no answer within {timeout}s" if isinstance(answer, TimeoutError)
                   else str(answer))
            notes.append(f"{name}: {why}; its spans are not shown")
            continue
        drawable, left_out, problem = _drawable(answer)
        records += drawable
        if left_out:
            notes.append(f"{name}: {left_out} span record(s) left out, not records "
                         f"(e.g. {problem}); its version may differ from this one's")
        ring = answer.get("ring") or {}
        if ring.get("dropped"):
            notes.append(f"{name}: its ring dropped {ring['dropped']} older span(s) "
                         f"(holds {ring.get('max_spans')} spans / {ring.get('max_bytes')}"
                         " bytes): this trace may be partial")
        if answer.get("truncated"):
            notes.append(f"{name}: {answer['truncated']} span(s) left out to fit one "
                         "reply; ask for one trace id")
    return build_waterfall(records, notes)
