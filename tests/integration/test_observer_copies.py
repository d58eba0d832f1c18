"""Observers of direct messages (``porter-mesh tail``, the dashboard): a node republishes
a copy of each direct message it accepts once an observer's subscription has reached its
PUB, even when the loop has not read that subscription yet because the ROUTER's
descriptor was handled first in the same turn."""

from __future__ import annotations

import asyncio
import itertools
import os

import pytest
import zmq

from porter_mesh.core.as2 import Activity
from porter_mesh.node.node import Node
from tests.integration.harness import seeded_by

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]
_ids = itertools.count()
# Nothing but the test's own traffic may touch the PUB (a heartbeat sent would make the
# node read the waiting subscription on its own).
QUIET = {"heartbeat_interval": 30.0, "evasive_after": 60.0, "expire_after": 90.0,
         "recontact_max": 30.0, "busy_poll": 0.0}


def offer(i: int) -> Activity:
    return Activity.from_dict({"type": "Offer", "actor": "architect",
                               "summary": f"Add GET /users endpoint #{i}",
                               "context": f"urn:porter:task:obs{i}"})


async def copy_after_late_subscription() -> list[bytes] | None:
    """The frames an observer gets for a direct message accepted while its subscription
    waits unread at the receiver's PUB, or None when none comes within 5 s."""
    mesh = f"obs{os.getpid()}-{next(_ids)}"
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    try:
        async with Node(name="worker", mesh=mesh, discovery=False, channels=(),
                        **QUIET) as worker, seeded_by(worker, "architect", **QUIET) as arch:
            sub.connect(f"tcp://127.0.0.1:{worker.pub_port}")
            sub.subscribe(b"task:")
            # Hold the loop (no await) until the subscription is at the worker's PUB.
            # Polling it here takes its descriptor's edge, as a turn that runs the
            # ROUTER's reader first leaves it: the node has not read the subscription.
            pub = worker._ends.pub
            assert pub is not None
            assert pub.poll(10_000), "the observer's subscription never reached the PUB"
            await arch.send("worker", offer(1))
            received = await worker.receive(timeout=10)
            assert received.activity.summary == "Add GET /users endpoint #1"
            if not await asyncio.to_thread(sub.poll, 5_000):
                return None
            return sub.recv_multipart()
    finally:
        sub.close(linger=0)
        ctx.term()


def test_an_observer_that_just_subscribed_gets_the_copy() -> None:
    frames = asyncio.run(copy_after_late_subscription())
    assert frames is not None, "no copy of the direct message reached the observer"
    assert frames[0].startswith(b"task:worker")
    assert b"Add GET /users endpoint #1" in frames[-1]
