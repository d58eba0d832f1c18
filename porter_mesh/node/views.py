"""A node's own view of the mesh (:func:`node_view`), and asking peers for theirs (``stats``).

Every node answers ``stats`` with :meth:`~porter_mesh.node.node.Node.view` (a
``stats-reply`` holding the view as JSON); a node of an older porter-mesh answers
``unsupported`` instead. :class:`ViewClient` sends the request and pairs the answer with
the asker: ``porter-mesh stats`` and ``porter-mesh peers`` use it on an observer node,
the dashboard on its ``porter-ui`` node. It keeps at most one request in flight per
peer: a second ``ask`` while one waits shares its answer.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

from porter_mesh.core import constants as C
from porter_mesh.core.control import KIND_STATS, KIND_STATS_REPLY
from porter_mesh.core.envelope import Envelope
from porter_mesh.errors import PorterError
from porter_mesh.node.api import NodeAPI
from porter_mesh.node.node import Node, Reply

__all__ = ["ViewClient", "ViewUnsupported", "node_view"]


def node_view(node: NodeAPI) -> dict[str, Any]:
    """``node``'s own view of the mesh (see :meth:`Node.view`)."""
    from porter_mesh import __version__

    now = time.monotonic()
    stats = node.stats()
    peers = [{
        "name": p.name, "role": p.advert.role, "state": p.state.value,
        "draining": p.draining, "last_heard": round(now - p.last_heard, 2),
        "lost": node.lost_by.get(p.name, 0), "dropped": node.dropped_by.get(p.name, 0),
    } for p in sorted(node.peers(), key=lambda p: p.name)]
    counters = node.counters
    out: dict[str, Any] = {
        "name": node.name, "role": node.config.role, "mesh": node.config.mesh,
        "version": __version__, "protocol": C.PROTOCOL_VERSION,
        "incarnation": f"{node.incarnation:x}",
        "uptime": round(node.uptime, 1), "draining": node.draining,
        "peers": peers,
        "lost": sum(v for k, v in counters.items() if k.startswith("lost.")),
        "dropped": sum(v for k, v in counters.items() if k.startswith("dropped.")),
        "queues": {"inbox": stats["inbox"], "outbox": stats["outbox"],
                   "subscribers": node.subscriber_count(C.CHANNEL_CONTROL)},
        "counters": dict(counters),
    }
    storage = node.storage()
    if storage is not None:
        out["storage"] = storage
    for section, provide in list(node.view_sections.items()):
        try:
            out[section] = provide()
        except Exception as exc:  # one broken section must not hide the rest
            out[section] = {"error": str(exc)}
    return out


class ViewUnsupported(PorterError):
    """The peer does not answer ``stats`` (it runs an older porter-mesh)."""


class ViewClient:
    """Asks peers for their view (``stats``) through ``node``.

    Registers the node's ``stats-reply`` kind and its ``unsupported`` answers to
    ``stats`` (other protocols keep their own ``unsupported`` answers). Use it on the
    node's loop. Another request whose answer is one JSON object (``spans``) uses the
    same client with its own ``kind`` and ``reply_kind``.
    """

    def __init__(self, node: Node, *, kind: str = KIND_STATS,
                 reply_kind: str = KIND_STATS_REPLY) -> None:
        self.node = node
        self.kind = kind
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        node.register_kind(reply_kind, self._on_reply)
        node.register_unsupported(kind, self._on_unsupported)

    def _on_reply(self, env: Envelope, payload: bytes, reply: Reply) -> None:
        fut = self._waiting.get(env.sender)
        if fut is None or fut.done():
            return
        try:
            view = orjson.loads(payload)
        except orjson.JSONDecodeError:
            fut.set_exception(PorterError(f"{env.sender} answered {self.kind} with something "
                                          "that is not JSON"))
            return
        if isinstance(view, dict):
            fut.set_result(view)
        else:
            fut.set_exception(PorterError(f"{env.sender} answered {self.kind} with a "
                                          f"{type(view).__name__}, not an object"))

    def _on_unsupported(self, env: Envelope, payload: bytes, reply: Reply) -> None:
        fut = self._waiting.get(env.sender)
        if fut is not None and not fut.done():
            fut.set_exception(ViewUnsupported(f"{env.sender} does not answer {self.kind} (it "
                                              "runs an older porter-mesh)"))

    def in_flight(self, peer: str) -> bool:
        """Whether a request to ``peer`` is waiting for its answer."""
        return peer in self._waiting

    async def ask(self, peer: str, timeout: float, payload: bytes = b"") -> dict[str, Any]:
        """The view of ``peer`` (``payload``: the request's body, empty for ``stats``).
        While a request to it is in flight, a second ``ask`` waits for that request's
        answer (or its deadline) instead of sending another.

        Raises:
            TimeoutError: no answer within ``timeout`` seconds.
            ViewUnsupported: it runs a porter-mesh that does not answer ``stats``.
            PorterError: it answered something that is not a view, or is not connected.
        """
        fut = self._waiting.get(peer)
        if fut is None:
            loop = asyncio.get_running_loop()
            self.node.async_send_kind(peer, self.kind, payload)
            fut = loop.create_future()
            self._waiting[peer] = fut
            timer = loop.call_later(timeout, _expire, fut,
                                    f"{peer}: no answer to {self.kind} within {timeout}s")
            fut.add_done_callback(lambda done: self._settled(peer, done, timer))
        return await asyncio.shield(fut)

    async def ask_all(self, peers: list[str], timeout: float, payload: bytes = b""
                      ) -> dict[str, dict[str, Any] | BaseException]:
        """The view of each of ``peers``, or why there is none, asked all at once."""
        answers = await asyncio.gather(*(self.ask(p, timeout, payload) for p in peers),
                                       return_exceptions=True)
        return dict(zip(peers, answers, strict=True))

    def _settled(self, peer: str, fut: asyncio.Future[dict[str, Any]],
                 timer: asyncio.TimerHandle) -> None:
        timer.cancel()
        if self._waiting.get(peer) is fut:
            del self._waiting[peer]
        if not fut.cancelled():
            fut.exception()  # retrieved here: every asker may have given up already


def _expire(fut: asyncio.Future[dict[str, Any]], message: str) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError(message))
