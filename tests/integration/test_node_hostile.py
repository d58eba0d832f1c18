"""Hostile input from raw pyzmq sockets: the node drops it, counts it, keeps serving."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator

import msgpack
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from porter_mesh.core import constants as C
from porter_mesh.core import speedups
from porter_mesh.core.as2 import Activity
from porter_mesh.core.envelope import Envelope, encode_envelope
from porter_mesh.node.sync import SyncNode

pytestmark = [pytest.mark.network, pytest.mark.timeout(60)]
_ids = itertools.count()
ANNOUNCE = Activity.from_dict({"type": "Announce", "actor": "good", "summary": "still here"})


@pytest.fixture
def pair() -> Iterator[tuple[SyncNode, SyncNode]]:
    """A victim node and a well-behaved peer joined through a static seed."""
    mesh = f"h{os.getpid()}-{next(_ids)}"
    victim = SyncNode(name="victim", mesh=mesh, discovery=False, max_message_bytes=64 * 1024)
    good = SyncNode(name="good", mesh=mesh, discovery=False,
                    seeds=(f"127.0.0.1:{victim.node.router_port}",))
    try:
        victim.wait_for_peers(["good"], 10)
        good.wait_for_peers(["victim"], 10)
        yield victim, good
    finally:
        good.close()
        victim.close()


@pytest.fixture
def raw() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def still_serves(victim: SyncNode, good: SyncNode) -> None:
    """The victim still accepts and acknowledges a direct message from a real peer."""
    good.send("victim", ANNOUNCE, timeout=10)
    msgs = [victim.receive(10)]
    assert any(m.activity == ANNOUNCE and m.sender == "good" for m in msgs)


def dropped(stats: dict[str, int]) -> int:
    return sum(v for k, v in stats.items() if k.startswith("dropped."))


def envelope(*, version: int | None = None, **fields: object) -> bytes:
    """A well-formed envelope from the codec, or one with a version the codec refuses
    to write (patched into the msgpack map under its wire key ``v``)."""
    values: dict[str, object] = {
        "version": C.PROTOCOL_VERSION, "msg_id": "x.1", "sender": "good",
        "channel": "task:victim", "seq": 1, "incarnation": 1,
        "hlc": time.time_ns() // 1_000_000 << 16, "recipient": "victim"}
    values.update(fields)
    data = encode_envelope(Envelope(**values))  # type: ignore[arg-type]
    if version is None:
        return data
    raw = msgpack.unpackb(data)
    raw["v"] = version
    return msgpack.packb(raw)


def test_garbage_frames_are_dropped_and_counted(pair: tuple[SyncNode, SyncNode],
                                                raw: zmq.Context[zmq.Socket[bytes]]) -> None:
    victim, good = pair
    dealer = raw.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{victim.node.router_port}")
    bad_messages = [
        [b"\xff\xfe garbage"],                                      # one frame
        [b"not msgpack \xc1", b"{}"],                               # bad envelope bytes
        [msgpack.packb([1, 2, 3]), b"{}"],                          # envelope not a map
        [envelope(version=99), b"{}"],                              # unknown version
        [envelope(), b'{"type": "Announce"}'],                      # invalid activity
        [b"a", b"b", b"c", b"d", b"e"],                             # wrong frame count
    ]
    for frames in bad_messages:
        dealer.send_multipart(frames)
    victim.wait_for_stats(lambda st: dropped(st) >= len(bad_messages), 10)
    still_serves(victim, good)
    dealer.close(0)


@pytest.mark.parametrize("path", ["compiled", "pure"])
def test_bad_broadcast_batches_are_dropped_and_counted(path: str,
                                                       pair: tuple[SyncNode, SyncNode]) -> None:
    """A real peer's broadcasts whose batch is bad are dropped for the same counted
    reasons on the compiled hot path and the pure one (the nodes run in this process,
    so the switch reaches them); the good broadcasts around them arrive."""
    if path == "compiled" and not speedups.available():
        print("skipped: the compiled extension is not built here")
        pytest.skip("the compiled extension is not built here")
    was = speedups.in_use()
    speedups.use_compiled(path == "compiled")
    try:
        victim, good = pair
        good._call(good.node.wait_for_subscribers(C.CHANNEL_LOG, 1, 10), 20)
        one = ANNOUNCE.to_json()
        payloads = [
            (b"[" + one + b"," + one[:-3] + b"]", 2),                 # malformed batch
            (b"[" + one + b',{"type": "Announce"}]', 2),             # an invalid activity
            (b"[" + b",".join([one] * 3) + b"]", 2),                 # count and array differ
            (b"[" + one + b"," + one + b"]", 2),                      # a good batch last
        ]
        node = good.node

        def publish_raw() -> None:  # as the node sends any batch: sequenced, enveloped
            node._carry_out([node._sending.broadcast(C.CHANNEL_LOG, payload, count=n)
                             for payload, n in payloads])

        good.call_in_loop(publish_raw)
        got = [victim.receive(10), victim.receive(10)]
        assert [m.activity for m in got] == [ANNOUNCE, ANNOUNCE]
        reasons = {"dropped.bad-json": 1, "dropped.missing-field": 1, "dropped.bad-count": 1}
        victim.wait_for_stats(lambda st: dropped(st) >= 3, 10)
        stats = victim.stats()
        assert {k: stats.get(k, 0) for k in reasons} == reasons, stats
        still_serves(victim, good)
    finally:
        speedups.use_compiled(was)


def test_oversized_message_disconnects_only_that_peer(
        pair: tuple[SyncNode, SyncNode], raw: zmq.Context[zmq.Socket[bytes]]) -> None:
    victim, good = pair
    monitor_target = raw.socket(zmq.DEALER)
    mon = monitor_target.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    monitor_target.connect(f"tcp://127.0.0.1:{victim.node.router_port}")
    monitor_target.send_multipart([envelope(), b"x" * (256 * 1024)])  # over the 64 KiB limit
    assert mon.poll(10_000), "the node did not drop the connection of the oversized sender"
    event = recv_monitor_message(mon)
    assert event["event"] == zmq.EVENT_DISCONNECTED
    still_serves(victim, good)
    monitor_target.disable_monitor()
    mon.close(0)
    monitor_target.close(0)


def test_flood_from_unknown_peer_does_not_starve_others(
        pair: tuple[SyncNode, SyncNode], raw: zmq.Context[zmq.Socket[bytes]]) -> None:
    victim, good = pair
    dealer = raw.socket(zmq.DEALER)
    dealer.setsockopt(zmq.SNDHWM, 0)
    dealer.connect(f"tcp://127.0.0.1:{victim.node.router_port}")
    frames = [envelope(sender="stranger"), ANNOUNCE.to_json()]
    for _ in range(20_000):  # bounded flood
        dealer.send_multipart(frames)
    still_serves(victim, good)
    victim.wait_for_stats(lambda st: st.get("dropped.unknown-peer", 0) >= 1, 10)
    dealer.close(0)


def test_send_many_completes_once_every_message_is_acknowledged(
        pair: tuple[SyncNode, SyncNode]) -> None:
    victim, good = pair
    burst = [Activity.from_dict({"type": "Announce", "actor": "good", "summary": f"m{i}"})
             for i in range(300)]

    async def send() -> None:
        await good.node.async_send_many("victim", burst, timeout=10)

    good.run_coroutine(send(), 20)
    got = []
    while len(got) < 300:
        got.append(victim.receive(10).activity.summary)
    assert got == [f"m{i}" for i in range(300)]  # each its own message, in order, once
    assert victim.stats().get("received.direct", 0) == 300


def test_request_of_an_unhandled_kind_is_answered_unsupported(
        pair: tuple[SyncNode, SyncNode]) -> None:
    from porter_mesh.core.control import KIND_UNSUPPORTED
    from porter_mesh.core.envelope import decode_control

    _, good = pair
    answers: list[dict[str, object]] = []
    good.call_in_loop(lambda: good.node.register_kind(
        KIND_UNSUPPORTED, lambda env, payload, reply: answers.append(decode_control(payload))))
    good.call_in_loop(lambda: good.node.async_send_kind("victim", "sync", b"\x80"))
    good.wait_for_stats(lambda _: bool(answers), 10)
    assert answers == [{"k": "sync"}]
