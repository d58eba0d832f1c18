"""The roster's numbers: every agent's own view, asked for every few seconds.

Theory of operation
-------------------
The dashboard asks each peer on its roster for its view, the ``stats`` request that
``porter-mesh stats`` sends (:class:`~porter_mesh.node.views.ViewClient`), and keeps
the last answer, condensed by :func:`stats_record`, for the peer's record: what it lost
and dropped, its queue depths, the size of its knowledge replica and, for an agent
whose brain keeps them (the LLM brain), its model calls, tokens, tool calls, errors and
retries. A :class:`StatsSchedule` (pure: it is given ``now``) says who is due::

    joined (or restarted)  -> asked at once
    answered               -> asked again INTERVAL later
    no answer, bad answer  -> 2, 4, 8 ... times INTERVAL later, at most MAX_BACKOFF
    "unsupported"          -> MAX_BACKOFF later (an older porter-mesh)
    left                   -> forgotten

Each request has a deadline (TIMEOUT), at most one is in flight per peer and at most
MAX_IN_FLIGHT in all, so a large roster or a silent agent costs the mesh little. The
view is the agent's own account: every field is checked and anything else is dropped,
so a peer cannot put arbitrary data on the dashboard's roster.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Container, Iterable, Mapping
from typing import Any, Final

from porter_mesh.errors import PorterError
from porter_mesh.node.node import Node
from porter_mesh.node.views import ViewClient, ViewUnsupported
from porter_mesh.tracing.metrics import service_record

__all__ = ["AGENT_METRICS", "INTERVAL", "MAX_BACKOFF", "MAX_IN_FLIGHT", "TIMEOUT",
           "StatsPoller", "StatsSchedule", "stats_record"]

log = logging.getLogger("porter_mesh.gateways.ui")

#: Seconds between two requests to a peer that answers.
INTERVAL: Final = 3.0
#: Seconds a peer may take to answer one request.
TIMEOUT: Final = 2.0
#: The longest wait before asking a peer that did not answer (or cannot) again.
MAX_BACKOFF: Final = 60.0
#: Requests in flight at once, over every peer.
MAX_IN_FLIGHT: Final = 16
#: The counters of the view's ``agent`` section that the roster carries.
AGENT_METRICS: Final = ("model_calls", "tokens_in", "tokens_out", "tool_calls", "errors",
                        "retries")
_QUEUES: Final = ("inbox", "outbox", "subscribers")
_MAX_TEXT: Final = 200


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


def _text(value: Any) -> str | None:
    return value[:_MAX_TEXT] if isinstance(value, str) else None


def stats_record(view: Mapping[str, Any]) -> dict[str, Any]:
    """The roster's part of a node's view (:meth:`~porter_mesh.node.node.Node.view`).

    Returns:
        ``lost`` and ``dropped`` (totals), ``queues`` (``inbox``, ``outbox``,
        ``subscribers``), ``knowledge`` (``observations`` and ``retractions``, or
        ``None`` without a replica) and, when the view has an ``agent`` section,
        ``agent``: its ``brain`` and ``model`` and those of :data:`AGENT_METRICS` it
        reports; ``service``: its service metrics, checked
        (:func:`~porter_mesh.tracing.metrics.service_record`), when it reports them. A
        value of the wrong type is ``None``.
    """
    queues = view.get("queues")
    queues = queues if isinstance(queues, Mapping) else {}
    kg = view.get("knowledge")
    out: dict[str, Any] = {
        "lost": _count(view.get("lost")), "dropped": _count(view.get("dropped")),
        "queues": {key: _count(queues.get(key)) for key in _QUEUES},
        "knowledge": ({"observations": _count(kg.get("observations")),
                       "retractions": _count(kg.get("retractions"))}
                      if isinstance(kg, Mapping) else None),
    }
    brain = view.get("agent")
    if isinstance(brain, Mapping):
        agent: dict[str, Any] = {"brain": _text(brain.get("brain"))}
        if "model" in brain:
            agent["model"] = _text(brain.get("model"))
        agent.update({key: _count(brain[key]) for key in AGENT_METRICS if key in brain})
        out["agent"] = agent
    service = service_record(view.get("service"))
    if service is not None:
        out["service"] = service  # tasks, tools and model calls, for /metrics
    return out


class StatsSchedule:
    """When each peer is next asked for its view (pure: every call is given ``now``).

    Args:
        interval: seconds between requests to a peer that answers.
        max_backoff: the longest wait after failures, and the wait after "unsupported".
    """

    def __init__(self, *, interval: float = INTERVAL, max_backoff: float = MAX_BACKOFF
                 ) -> None:
        self.interval = interval
        self.max_backoff = max_backoff
        self._due: dict[str, float] = {}
        self._failures: dict[str, int] = {}

    def sync(self, peers: Iterable[str], now: float) -> list[str]:
        """Follow the roster: new ``peers`` are due at once, absent ones are forgotten.

        Returns:
            The names forgotten.
        """
        present = set(peers)
        gone = [name for name in self._due if name not in present]
        for name in gone:
            self.forget(name)
        for name in present:
            self._due.setdefault(name, now)
        return gone

    def due(self, now: float, *, busy: Container[str] = (), limit: int = MAX_IN_FLIGHT
            ) -> list[str]:
        """The peers to ask now (longest overdue first), ``busy`` ones aside, at most
        ``limit``."""
        ready = sorted((at, name) for name, at in self._due.items()
                       if at <= now and name not in busy)
        return [name for _, name in ready[:max(0, limit)]]

    def answered(self, peer: str, now: float) -> None:
        """``peer`` answered: ask again after the interval."""
        if peer in self._due:
            self._failures.pop(peer, None)
            self._due[peer] = now + self.interval

    def failed(self, peer: str, now: float, *, unsupported: bool = False) -> None:
        """``peer`` did not answer (or said it cannot: ``unsupported``): back off."""
        if peer not in self._due:
            return
        failures = self._failures.get(peer, 0) + 1
        self._failures[peer] = failures
        wait = (self.max_backoff if unsupported
                else min(self.max_backoff, self.interval * 2 ** failures))
        self._due[peer] = now + wait

    def reset(self, peer: str, now: float) -> None:
        """``peer`` (re)joined, perhaps as a newer porter-mesh: ask it at once."""
        self._failures.pop(peer, None)
        self._due[peer] = now

    def forget(self, peer: str) -> None:
        """``peer`` left the roster."""
        self._due.pop(peer, None)
        self._failures.pop(peer, None)

    def next_at(self, peer: str) -> float | None:
        """When ``peer`` is due (``None``: not on the schedule)."""
        return self._due.get(peer)


class StatsPoller:
    """Asks every peer of ``node`` for its view on :class:`StatsSchedule`'s terms and
    keeps the last :func:`stats_record` of each.

    Create it before the node starts (it registers the ``stats`` answers), then
    :meth:`astart` and :meth:`aclose` on the node's loop.

    Args:
        node: the node whose roster is asked.
        on_change: called (on the loop) when a peer's stats changed.
        interval, timeout, max_backoff: see :data:`INTERVAL`, :data:`TIMEOUT`,
            :data:`MAX_BACKOFF`.
    """

    def __init__(self, node: Node, on_change: Callable[[], None], *,
                 interval: float = INTERVAL, timeout: float = TIMEOUT,
                 max_backoff: float = MAX_BACKOFF) -> None:
        self.node = node
        self.client = ViewClient(node)
        self.schedule = StatsSchedule(interval=interval, max_backoff=max_backoff)
        self.timeout = timeout
        self.counters: collections.Counter[str] = collections.Counter()
        self._on_change = on_change
        self._stats: dict[str, dict[str, Any]] = {}
        self._asking: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None

    def stats(self, peer: str) -> dict[str, Any] | None:
        """The last stats of ``peer`` (with ``at``: when it answered, seconds since the
        epoch), or ``None`` when it has not answered."""
        return self._stats.get(peer)

    def joined(self, peer: str) -> None:
        """``peer`` joined or restarted: its old numbers are gone; ask it at once."""
        self._stats.pop(peer, None)
        self.schedule.reset(peer, time.monotonic())

    def left(self, peer: str) -> dict[str, Any] | None:
        """``peer`` left: forget it; its last stats, if any."""
        self.schedule.forget(peer)
        return self._stats.pop(peer, None)

    async def astart(self) -> None:
        """Start asking (the node should be started)."""
        self._task = asyncio.ensure_future(self._run())

    async def aclose(self) -> None:
        """Stop asking; the requests in flight are abandoned."""
        tasks = list(self._asking.values())
        if self._task is not None:
            tasks.append(self._task)
            self._task = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        step = min(1.0, self.schedule.interval / 2)
        while True:
            self.tick(time.monotonic())
            await asyncio.sleep(step)

    def tick(self, now: float) -> None:
        """Follow the roster and send the requests that are due."""
        me = self.node.name
        for name in self.schedule.sync((p.name for p in self.node.peers() if p.name != me),
                                       now):
            self._stats.pop(name, None)
        limit = MAX_IN_FLIGHT - len(self._asking)
        for name in self.schedule.due(now, busy=self._asking, limit=limit):
            self._asking[name] = asyncio.ensure_future(self._ask(name))

    async def _ask(self, peer: str) -> None:
        try:
            view = await self.client.ask(peer, self.timeout)
        except ViewUnsupported:
            self.counters["unsupported"] += 1
            self.schedule.failed(peer, time.monotonic(), unsupported=True)
            return
        except (TimeoutError, PorterError) as exc:
            self.counters["failed"] += 1
            log.debug("stats from %s: %s", peer, exc)
            self.schedule.failed(peer, time.monotonic())
            return
        finally:
            self._asking.pop(peer, None)
        self.counters["answered"] += 1
        if self.schedule.next_at(peer) is None:
            return  # it left while we waited
        self.schedule.answered(peer, time.monotonic())
        record = stats_record(view)
        old = self._stats.get(peer)
        self._stats[peer] = dict(record, at=round(time.time(), 3))
        if old is None or {k: v for k, v in old.items() if k != "at"} != record:
            self._on_change()
