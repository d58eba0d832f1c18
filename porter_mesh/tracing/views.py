"""Spans over the mesh: each agent answers ``spans`` from its ring; ``porter-mesh trace``
asks every agent (as ``stats`` does, through :class:`~porter_mesh.node.views.ViewClient`).
"""

from __future__ import annotations

import logging
from typing import Any, Final

from porter_mesh.core.control import (
    KIND_SPANS,
    KIND_SPANS_REPLY,
    MAX_CONTROL_BYTES,
    SpansRequest,
    decode_spans_request,
    encode_spans_reply,
    encode_spans_request,
)
from porter_mesh.core.envelope import Envelope
from porter_mesh.errors import FrameError
from porter_mesh.node.node import Node, Reply
from porter_mesh.node.views import ViewClient
from porter_mesh.tracing.ring import SpanRing

__all__ = ["SpanClient", "serve_spans"]

_log = logging.getLogger("porter_mesh.tracing")
# Room left in a reply for the ring's counters and the JSON around the spans.
_REPLY_BUDGET: Final = MAX_CONTROL_BYTES - 64 * 1024


def serve_spans(node: Node, ring: SpanRing) -> None:
    """Answer ``spans`` requests from ``ring`` (the node's recent spans).

    A reply that would pass one message's limit keeps the newest spans and says how
    many it left out (``truncated``). A malformed request is counted and answered with
    nothing.
    """

    def on_request(env: Envelope, payload: bytes, reply: Reply) -> None:
        try:
            request = decode_spans_request(payload)
        except FrameError as exc:
            node.counters["dropped.bad-spans-request"] += 1
            _log.debug("bad spans request from %s: %s", env.sender, exc)
            return
        spans = ring.find(trace_ids=request.trace_ids, context=request.context)
        body: dict[str, Any] = {"agent": node.name, "spans": spans, "ring": ring.stats()}
        data = encode_spans_reply(body)
        left_out = 0
        while len(data) > _REPLY_BUDGET and spans:
            cut = max(1, len(spans) // 4)
            spans, left_out = spans[cut:], left_out + cut
            body["spans"], body["truncated"] = spans, left_out
            data = encode_spans_reply(body)
        reply(KIND_SPANS_REPLY, data)

    node.register_kind(KIND_SPANS, on_request)
    node.view_sections["spans"] = ring.stats


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
