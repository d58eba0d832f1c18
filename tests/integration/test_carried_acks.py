"""Acknowledgements carried by direct replies (porter_mesh/core/session/acks.py), between
real nodes over real sockets."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os

import pytest

from porter_mesh.core.advert import PeerAdvert
from porter_mesh.core.as2 import Activity
from porter_mesh.node.node import Message, Node

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]
_ids = itertools.count()
TRIPS = 50


class EarlierNode(Node):
    """A node that, like one of the previous version, does not announce that it reads
    carried acknowledgements: it must be sent ``ack`` messages only."""

    def advert(self) -> PeerAdvert:
        return dataclasses.replace(super().advert(), carried_acks=False)


def request(i: int) -> Activity:
    return Activity.from_dict({"type": "Announce", "actor": "ping", "summary": f"q{i}",
                               "context": "urn:porter:task:t1"})


async def round_trips(echo_type: type[Node]) -> tuple[dict[str, int], dict[str, int]]:
    """``TRIPS`` requests from ``ping``, each answered at once by ``echo``'s handler;
    returns both nodes' counters once every message of both is acknowledged."""
    mesh = f"ca{os.getpid()}-{next(_ids)}"
    echo = echo_type(name="echo", mesh=mesh, discovery=False, channels=())
    replies: list[asyncio.Future[None]] = []

    def answer(msg: Message) -> None:
        if msg.direct:
            replies.append(echo.async_send_nowait(msg.sender, msg.activity))

    echo.add_handler(answer)
    async with echo:
        ping = Node(name="ping", mesh=mesh, discovery=False, channels=(),
                    seeds=(f"127.0.0.1:{echo.router_port}",))
        async with ping:
            await ping.wait_for_peers(["echo"], 20)
            await echo.wait_for_peers(["ping"], 20)
            for i in range(TRIPS):
                sent = ping.async_send_nowait("echo", request(i))
                reply = await ping.receive(timeout=20)
                assert reply.activity.summary == f"q{i}"
                # Settled already by the ack the reply carried: awaiting it does not
                # yield, so the next request is queued before the flush that would send
                # the ack of this reply alone (the test's timeout bounds a hang).
                await sent
            # The last reply has no request after it to ride on: its ack goes alone.
            await asyncio.wait_for(asyncio.gather(*replies), 20)
            assert len(replies) == TRIPS
            return ping.stats(), echo.stats()


def test_a_reply_carries_the_ack_of_its_request_and_the_next_request_that_of_the_reply(
) -> None:
    ping, echo = asyncio.run(round_trips(Node))
    # Every request settled by the reply that carried its ack (none resent)...
    assert ping.get("ack.carried", 0) == TRIPS
    assert ping.get("retries", 0) == 0
    # ... every reply but the last by the next request; the last by an ack alone.
    assert echo.get("ack.carried", 0) == TRIPS - 1
    assert echo.get("retries", 0) == 0
    assert ping.get("outbox") == echo.get("outbox") == 0
    assert ping["received.direct"] == echo["received.direct"] == TRIPS


def test_a_node_that_does_not_announce_carried_acks_gets_ack_messages() -> None:
    ping, echo = asyncio.run(round_trips(EarlierNode))
    # Nothing is carried to the earlier node; it still settles every reply, at once.
    assert echo.get("ack.carried", 0) == 0
    assert echo.get("retries", 0) == 0
    assert ping.get("outbox") == echo.get("outbox") == 0
