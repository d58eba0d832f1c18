"""Acknowledgements carried by direct replies (porter_mesh/core/session/acks.py), between
real nodes over real sockets."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os

import pytest
import zmq

from porter_mesh.core.advert import PeerAdvert
from porter_mesh.core.as2 import Activity
from porter_mesh.core.constants import PROTOCOL_VERSION
from porter_mesh.core.control import Ack, encode_ack
from porter_mesh.core.envelope import Envelope, encode_direct, encode_payload, make_msg_id
from porter_mesh.core.hlc import HybridClock
from porter_mesh.node.inbox import wall_ms
from porter_mesh.node.node import Message, Node
from tests.integration.harness import seeded_by

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
    async with echo, seeded_by(echo, "ping") as ping:
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


async def forged_carried_acks() -> None:
    """``a`` has a message to ``b`` in flight (``b`` has no handler yet, so it
    acknowledges nothing); a DEALER speaking for ``b`` then carries ``a`` an
    acknowledgement of it, first naming another incarnation of ``a``, then ``a``'s."""
    mesh = f"ca{os.getpid()}-{next(_ids)}"
    async with Node(name="b", mesh=mesh, discovery=False, channels=(), inbox_size=0) as b:
        a = Node(name="a", mesh=mesh, discovery=False, channels=(),
                 seeds=(f"127.0.0.1:{b.router_port}",))
        async with a:
            await a.wait_for_peers(["b"], 20)
            sent = a.async_send_nowait("b", request(0), timeout=60)
            clock = HybridClock()
            ctx = zmq.Context()
            sock = ctx.socket(zmq.DEALER)
            try:
                sock.connect(f"tcp://127.0.0.1:{a.router_port}")

                def carry(seq: int, incarnation: int) -> None:
                    env = Envelope(PROTOCOL_VERSION, make_msg_id(b.incarnation, "task:a", seq),
                                   "b", "task:a", seq, b.incarnation, clock.now(wall_ms()), "a")
                    sock.send_multipart([*encode_direct(env, encode_payload([request(seq)])),
                                         encode_ack(Ack((1,), incarnation))])

                carry(1, a.incarnation ^ 1)  # an acknowledgement for another process
                await a.wait_for_stats(lambda st: st.get("ack.carried-stale", 0) == 1, 20)
                await a.wait_for_stats(lambda st: st.get("received.direct", 0) == 1, 20)
                assert not sent.done()
                assert a.stats()["outbox"] == 1
                carry(2, a.incarnation)
                await asyncio.wait_for(sent, 20)
                assert a.stats().get("ack.carried") == 1
                assert a.stats()["received.direct"] == 2  # both messages delivered
            finally:
                sock.close(linger=0)
                ctx.term()


def test_a_carried_ack_settles_only_sends_of_the_incarnation_it_names() -> None:
    asyncio.run(forged_carried_acks())
