"""The human user's seat on the mesh for one command: reach the recipients, then go.

``send`` and ``request`` join as ``porter-ui`` (:func:`~porter_mesh.cli.common.seat_config`)
and hand their activity to :func:`deliver`. A direct channel (``task:<agent>``) waits
for that agent and for its acknowledgement. A broadcast waits, up to ``wait`` seconds,
until every node the seat knows of, agents and watchers (``tail``, the dashboard) alike,
has subscribed to the seat's PUB (:meth:`Node.subscribers`) and introduced itself
(:meth:`Node.introduced`: its welcome names the peers it knows, who are then waited
for in turn, so a node mDNS has not answered for yet is not missed), then publishes: a
watcher that runs when the command runs sees the message. The outcome says who was
reached and who was not, so that the command can exit 1 naming them.

A peer that refuses the seat's connection because of keys (the mesh is secured and the
command has none, or its key is not trusted) ends the wait at once:
:class:`~porter_mesh.errors.PeerRefusedError` is raised, and the command prints its one
line, which names the keys to make or trust, with exit status 2 (a setting to fix).

With tracing on (the ``[otel]`` extra), an Offer the seat sends is the root of its task's
trace: the seat's ``send`` span (:class:`~porter_mesh.tracing.seat.SeatSpans`), handed
to the recipients to keep once they have it, since the seat's own ring leaves with it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from porter_mesh.cli.common import names
from porter_mesh.core import constants as C
from porter_mesh.core.as2 import Activity
from porter_mesh.core.tracecontext import TraceContext
from porter_mesh.errors import DeliveryError, PeerRefusedError
from porter_mesh.node.node import Node
from porter_mesh.tracing.seat import SeatSpans

#: Seconds between looks at the roster and the refusals while waiting.
_POLL = 0.02


def raise_refusal(node: Node, names: Iterable[str] | None = None) -> None:
    """Raise the :class:`PeerRefusedError` of a peer that refused ``node`` (one of
    ``names``; any peer or seed when None), if there is one."""
    refusals = node.refusals()
    for name in refusals if names is None else names:
        refused = refusals.get(name)
        if refused is not None:
            raise PeerRefusedError(str(refused), recipient=refused.recipient,
                                   reason=refused.reason)


async def wait_for_peers(node: Node, want: list[str] | int, wait: float) -> None:
    """:meth:`Node.wait_for_peers`, ended at once by a refusal (raised).

    Raises:
        TimeoutError: not found within ``wait`` seconds.
        PeerRefusedError: a peer or seed refused the connection.
    """
    found = asyncio.ensure_future(node.wait_for_peers(want, wait))
    try:
        while not found.done():
            raise_refusal(node)
            await asyncio.wait([found], timeout=_POLL)
        found.result()
    finally:
        found.cancel()


def not_found(node: Node, name: str | None, wait: float) -> str:
    """What a command says when :func:`wait_for_peers` found nobody (``name`` None) or
    not the agent ``name`` within ``wait`` seconds."""
    mesh = node.config.mesh
    if name is None:
        return (f"nobody on mesh {mesh!r} within {wait:g}s; nothing sent (check --mesh, or "
                f"start the agents first)")
    seen = names(p.name for p in node.peers())
    return (f"no agent {name!r} found on mesh {mesh!r} within {wait:g}s (seen: {seen}); "
            f"check the name and mesh")


async def wait_for_audience(node: Node, deadline: float,
                            only: str | None = None) -> set[str]:
    """Wait, until ``deadline`` (:func:`time.monotonic`), for every node ``node`` knows of
    (or only the node named ``only``) to have subscribed to its PUB and introduced itself;
    return those that did not in time.

    Every node subscribes to control: who has not, has not connected to us yet. Other
    commands' seats are not waited for: they come and go, and a peer may still list one
    that has just left.

    Raises:
        PeerRefusedError: one of them refused the connection.
    """
    while True:
        if only is not None:
            known = {only}
        else:
            known = {p.name for p in node.peers() if p.advert.role != C.ROLE_SEAT}
        # A peer's welcome brings the peers it knows: until it has come, someone that
        # mDNS has not answered for yet may be missing from ``known``.
        missing = known - (node.subscribers(C.CHANNEL_CONTROL) & node.introduced())
        raise_refusal(node, missing)
        if not missing or time.monotonic() >= deadline:
            return missing
        await asyncio.sleep(_POLL)


@dataclass
class Outcome:
    """What became of one activity.

    Attributes:
        channel: where it went.
        reached: the nodes that received it (acknowledged, or subscribed when published).
        missed: known nodes that could not be reached within the wait.
        elsewhere: connected nodes that do not subscribe to ``channel``.
        problem: why nothing was sent, when nothing was.
    """

    channel: str
    reached: set[str] = field(default_factory=set)
    missed: set[str] = field(default_factory=set)
    elsewhere: set[str] = field(default_factory=set)
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None and not self.missed

    def line(self) -> str:
        """The one line ``send`` prints."""
        if self.problem is not None:
            return self.problem
        if self.channel.startswith(C.DIRECT_PREFIX):
            return f"delivered to {names(self.reached)}"
        total = len(self.reached) + len(self.missed)
        text = f"published on {self.channel} to {len(self.reached)} of {total} subscriber(s)"
        if self.missed:
            text += f"; not reached: {names(self.missed)}"
        if self.elsewhere:
            text += f" ({names(self.elsewhere)} not subscribed to {self.channel})"
        return text

    def as_dict(self, activity: Activity) -> dict[str, Any]:
        return {"channel": self.channel, "type": activity.type, "context": activity.context,
                "ok": self.ok, "reached": sorted(self.reached), "missed": sorted(self.missed),
                "not_subscribed": sorted(self.elsewhere), "problem": self.problem}


#: Most seconds a seat waits for its spans to be taken before it leaves.
HAND_OVER_SECONDS = 5.0


async def deliver(node: Node, channel: str, activity: Activity, *, wait: float,
                  timeout: float, trace: TraceContext | None = None,
                  spans: SeatSpans | None = None) -> Outcome:
    """Send ``activity`` on ``channel`` from ``node``, waiting for its recipients first.

    Args:
        wait: seconds to look for the recipient(s) and for their subscriptions.
        timeout: seconds for a direct message's acknowledgement.
        trace: W3C trace context to continue (``--traceparent``): the recipients' spans
            become its children.
        spans: the seat's spans: the message gets a ``send`` span (the parent of the
            recipients' spans), handed to the recipients to keep when it is the root
            (no ``request`` span is open above it).
    """
    if spans is None:
        return await _deliver(node, channel, activity, wait=wait, timeout=timeout,
                              trace=trace)
    sent_trace, span = spans.sending(channel, activity)
    try:
        outcome = await _deliver(node, channel, activity, wait=wait, timeout=timeout,
                                 trace=sent_trace)
    except BaseException as exc:
        spans.sent(span, f"{type(exc).__name__}: {exc}")
        raise
    spans.sent(span, outcome.problem)
    if span is not None and spans.root is None and outcome.reached:
        await spans.hand_over(node, outcome.reached, min(timeout, HAND_OVER_SECONDS))
    return outcome


async def _deliver(node: Node, channel: str, activity: Activity, *, wait: float,
                   timeout: float, trace: TraceContext | None) -> Outcome:
    outcome = Outcome(channel)
    if channel.startswith(C.DIRECT_PREFIX):
        recipient = channel[len(C.DIRECT_PREFIX):]
        try:
            await wait_for_peers(node, [recipient], wait)
        except TimeoutError:
            outcome.missed.add(recipient)
            outcome.problem = not_found(node, recipient, wait)
            return outcome
        try:
            await node.send(recipient, activity, timeout=timeout, trace=trace)
        except PeerRefusedError:
            raise
        except DeliveryError as exc:
            outcome.missed.add(recipient)
            outcome.problem = str(exc)
            return outcome
        outcome.reached.add(recipient)
        return outcome
    deadline = time.monotonic() + wait
    try:
        await wait_for_peers(node, 1, wait)
    except TimeoutError:
        outcome.problem = not_found(node, None, wait)
        return outcome
    missing = await wait_for_audience(node, deadline)
    await node.publish(channel, activity, trace=trace)
    outcome.reached = set(node.subscribers(channel))
    outcome.missed = missing
    outcome.elsewhere = set(node.subscribers(C.CHANNEL_CONTROL)) - outcome.reached
    return outcome
