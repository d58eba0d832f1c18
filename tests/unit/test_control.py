"""The control protocol's table and body codecs (porter_mesh.core.control).

The bytes each encoder writes are compared with the msgpack of the dict the node builds
for the same body today, so an implementation written from the table (or from
docs/protocol.md) interoperates with the running node.
"""

from __future__ import annotations

import ast
import pathlib
from typing import Any

import msgpack
import orjson
import pytest

import porter_mesh.node.node as node_module
from porter_mesh.core import control as K
from porter_mesh.core import envelope
from porter_mesh.core.advert import PeerAdvert, encode_txt
from porter_mesh.core.constants import PROTOCOL_VERSION
from porter_mesh.core.knowledge import PullRequest, decode_sync
from porter_mesh.errors import FrameError

ME = PeerAdvert(name="architect", role="architect", mesh="default", pub_port=5601,
                router_port=5602, version=PROTOCOL_VERSION, incarnation=2**63 + 17,
                addresses=("127.0.0.1", "fd00::5"), slots=0, tools=("bash", "read_file"))
PEER = PeerAdvert(name="worker-1", role="worker", mesh="default", pub_port=6601,
                  router_port=6602, version=PROTOCOL_VERSION, incarnation=99,
                  addresses=("127.0.0.2",), slots=2)


def node_hello_body(me: PeerAdvert, peers: list[PeerAdvert]) -> dict[str, Any]:
    """The hello map as docs/protocol.md writes it (a hello and a welcome carry it)."""
    return {"a": encode_txt(me), "x": list(me.addresses),
            "p": [[encode_txt(p), list(p.addresses)] for p in peers]}


def node_control_body(target: str | None, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """What Node.async_control builds for drain and halt."""
    payload = dict(body or {})
    if target is not None:
        payload["to"] = target
    return payload


# -- the bytes equal what the node sends -----------------------------------------------


def test_heartbeat_bytes_equal_the_nodes() -> None:
    seqs = {"log": 7, "task": 0, "review": 2**40}
    for draining in (False, True):
        assert K.encode_heartbeat(K.Heartbeat(seqs, draining)) == msgpack.packb(
            {"s": seqs, "d": draining})
    assert K.decode_heartbeat(msgpack.packb({"s": seqs, "d": True})) == K.Heartbeat(seqs, True)


def test_ack_bytes_equal_the_nodes() -> None:
    assert K.encode_ack(K.Ack((1, 5, 2**62))) == msgpack.packb({"f": [1, 5, 2**62]})
    assert K.decode_ack(msgpack.packb({"f": [3]})) == K.Ack((3,))


def test_a_carried_ack_names_the_incarnation_it_is_for() -> None:
    carried = K.Ack((4, 9), 2**62)
    assert K.encode_ack(carried) == msgpack.packb({"f": [4, 9], "e": 2**62})
    assert K.decode_ack(K.encode_ack(carried)) == carried
    for bad in (-1, 2**63, "x", True):
        with pytest.raises(FrameError, match="ack 'e'") as info:
            K.decode_ack(msgpack.packb({"f": [4], "e": bad}))
        assert info.value.reason == "bad-ack"


def test_hello_and_welcome_bytes_equal_the_nodes() -> None:
    for peers in ([], [PEER]):
        expected = msgpack.packb(node_hello_body(ME, peers))
        intro = K.Introduction(ME, tuple(peers))
        assert K.encode_hello(intro) == expected
        assert K.encode_welcome(intro) == expected
        assert K.decode_hello(expected) == intro
        assert K.decode_welcome(expected) == intro
    assert K.encode_hello(K.ObserverHello()) == msgpack.packb({"o": 1})
    assert K.decode_hello(msgpack.packb({"o": 1})) == K.ObserverHello()


def test_bye_drain_halt_unsupported_bytes_equal_the_nodes() -> None:
    assert K.encode_bye(K.Bye()) == msgpack.packb({})
    assert K.decode_bye(msgpack.packb({"later": 1})) == K.Bye()
    for target in (None, "worker-1"):
        wire = msgpack.packb(node_control_body(target))
        assert K.encode_command(K.Command(target)) == wire
        assert K.decode_command(wire) == K.Command(target)
    assert K.encode_unsupported(K.Unsupported("sync")) == msgpack.packb({"k": "sync"})
    assert K.decode_unsupported(msgpack.packb({"k": "stats"})) == K.Unsupported("stats")


def test_stats_bodies_equal_the_nodes() -> None:
    view = {"name": "worker-1", "peers": [{"name": "architect"}], "counters": {"sent": 3}}
    assert K.encode_stats_request(K.StatsRequest()) == b""  # views.py sends b""
    assert K.decode_stats_request(b"anything later") == K.StatsRequest()
    assert K.encode_stats_reply(K.StatsReply(view)) == orjson.dumps(view)
    assert K.decode_stats_reply(orjson.dumps(view)) == K.StatsReply(view)


def test_sync_uses_the_knowledge_codec() -> None:
    spec = K.KINDS[K.KIND_SYNC]
    request = PullRequest("worker-1", 1, 9)
    assert spec.decode(spec.encode(request)) == decode_sync(spec.encode(request)) == request


# -- refusals ---------------------------------------------------------------------------


@pytest.mark.parametrize(("decode", "body", "reason"), [
    (K.decode_heartbeat, {"s": [1, 2]}, "bad-heartbeat"),
    (K.decode_heartbeat, {"s": {"log": -1}}, "bad-heartbeat"),
    (K.decode_heartbeat, {"s": {"log": "7"}}, "bad-heartbeat"),
    (K.decode_heartbeat, {"s": {}, "d": 1}, "bad-heartbeat"),
    (K.decode_ack, {}, "bad-ack"),
    (K.decode_ack, {"f": [0]}, "bad-ack"),
    (K.decode_ack, {"f": ["1"]}, "bad-ack"),
    (K.decode_hello, {}, "bad-hello"),
    (K.decode_hello, {"a": {"n": "x"}, "x": ["127.0.0.1"]}, "bad-hello"),
    (K.decode_hello, {"a": encode_txt(ME), "x": ["not-an-ip"]}, "bad-hello"),
    (K.decode_welcome, {"a": encode_txt(ME), "x": [], "p": [["x"]]}, "bad-hello"),
    (K.decode_welcome, {"o": 1}, "bad-hello"),
    (K.decode_command, {"to": 5}, "bad-control"),
    (K.decode_unsupported, {"k": ""}, "bad-control"),
    (K.decode_unsupported, {"k": "x" * 33}, "bad-control"),
])
def test_malformed_bodies_are_refused_with_a_reason(decode: Any, body: dict[str, Any],
                                                   reason: str) -> None:
    with pytest.raises(FrameError) as caught:
        decode(msgpack.packb(body))
    assert caught.value.reason == reason


@pytest.mark.parametrize("decode", [K.decode_heartbeat, K.decode_ack, K.decode_hello,
                                    K.decode_bye, K.decode_command, K.decode_unsupported])
@pytest.mark.parametrize(("data", "reason"), [
    (b"\xc1", "bad-msgpack"), (msgpack.packb([1, 2]), "bad-control"),
    (msgpack.packb({1: 2}), "bad-msgpack"), (b"\x81" + b"\xa1a" + b"\xd4\x01\x00",
                                             "bad-control"),
])
def test_a_payload_that_is_no_map_is_refused(decode: Any, data: bytes, reason: str) -> None:
    with pytest.raises(FrameError) as caught:
        decode(data)
    assert caught.value.reason == reason


def test_stats_reply_must_be_a_json_object() -> None:
    for data in (b"[1]", b"{", b"\xff"):
        with pytest.raises(FrameError) as caught:
            K.decode_stats_reply(data)
        assert caught.value.reason == "bad-json"


def test_an_introduction_reads_at_most_the_peer_limit() -> None:
    body = node_hello_body(ME, [PEER] * (K.MAX_INTRODUCED_PEERS + 5))
    intro = K.decode_welcome(msgpack.packb(body))
    assert isinstance(intro, K.Introduction)
    assert len(intro.peers) == K.MAX_INTRODUCED_PEERS


def test_an_advert_told_again_is_the_one_decoded_before_and_a_bad_one_is_still_refused() -> None:
    data = msgpack.packb(node_hello_body(ME, [PEER]))
    first, again = K.decode_welcome(data), K.decode_welcome(data)
    assert first == again == K.Introduction(ME, (PEER,))
    assert again.peers[0] is first.peers[0]  # not checked a second time
    # The same peer at another address is another advert.
    moved = K.decode_welcome(msgpack.packb(node_hello_body(
        ME, [PeerAdvert(**{**_fields(PEER), "addresses": ("127.0.0.9",)})])))
    assert moved.peers[0].addresses == ("127.0.0.9",)
    # Entries that cannot be keys are decoded as they are, and refused as before: a
    # value that is a list, a TXT that is a list, a bad port told twice.
    bad_port = {**encode_txt(PEER), "rp": "0"}
    for entry in ([{**encode_txt(PEER), "n": ["worker-1"]}, ["127.0.0.2"]],
                  [list(encode_txt(PEER).items()), ["127.0.0.2"]],
                  [bad_port, ["127.0.0.2"]], [bad_port, ["127.0.0.2"]]):
        body = {**node_hello_body(ME, []), "p": [entry]}
        with pytest.raises(FrameError) as caught:
            K.decode_welcome(msgpack.packb(body))
        assert caught.value.reason == "bad-hello"


def _fields(advert: PeerAdvert) -> dict[str, Any]:
    return {name: getattr(advert, name) for name in advert.__dataclass_fields__}


# -- the table --------------------------------------------------------------------------


def _node_kind_tags() -> set[str]:
    """The tags the node speaks: the ``KIND_*`` names its modules import from the table."""
    tags: set[str] = set()
    for path in pathlib.Path(node_module.__file__).parent.glob("*.py"):
        for stmt in ast.parse(path.read_text()).body:
            if isinstance(stmt, ast.ImportFrom) and stmt.module == "porter_mesh.core.control":
                tags |= {getattr(K, alias.name) for alias in stmt.names
                         if alias.name.startswith("KIND_")}
    return tags


def test_the_table_holds_every_kind_the_node_speaks() -> None:
    tags = _node_kind_tags()
    assert {"hb", "ack", "hello", "welcome", "bye", "stats"} <= tags  # the parse works
    # Registered on top of the node: knowledge sync, and the spans of porter-mesh trace.
    assert tags | {K.KIND_SYNC, K.KIND_SPANS, K.KIND_SPANS_REPLY, K.KIND_SPANS_KEEP,
                   K.KIND_SPANS_KEPT} == set(K.KINDS)


def test_every_kind_constant_is_in_the_table_once() -> None:
    constants = {v for n, v in vars(K).items() if n.startswith("KIND_")}
    assert constants == set(K.KINDS)
    for tag, spec in K.KINDS.items():
        assert spec.kind == tag and spec.routes and spec.meaning
        assert 0 < len(tag) <= K.MAX_KIND_CHARS


def test_node_kinds_are_the_ones_the_node_refuses_to_lend() -> None:
    assert {"hb", "ack", "hello", "welcome", "bye"} == K.NODE_KINDS


def test_the_envelope_module_re_exports_the_same_names() -> None:
    for name in ("KIND_ACK", "KIND_DRAIN", "KIND_HALT", "KIND_HEARTBEAT", "KIND_SYNC",
                 "MAX_CONTROL_BYTES", "MAX_KIND_CHARS", "encode_control", "decode_control"):
        assert getattr(envelope, name) is getattr(K, name)
    assert not hasattr(envelope, "KIND_CAPABILITY")  # never sent by anyone


@pytest.mark.parametrize("tag", sorted(K.KINDS))
def test_every_kind_round_trips_through_its_table_entry(tag: str) -> None:
    samples: dict[str, object] = {
        "hb": K.Heartbeat({"log": 1}, False), "ack": K.Ack((1,)),
        "hello": K.Introduction(ME, (PEER,)), "welcome": K.Introduction(ME),
        "bye": K.Bye(), "drain": K.Command("worker-1"), "halt": K.Command(),
        "unsupported": K.Unsupported("sync"), "stats": K.StatsRequest(),
        "stats-reply": K.StatsReply({"name": "a"}), "sync": PullRequest("a", 1, 2),
        "spans": K.SpansRequest(("ab" * 16,), "urn:porter:task:t1"),
        "spans-reply": {"agent": "a", "spans": [{"name": "x"}], "ring": {"spans": 1}},
        "spans-keep": [SPAN], "spans-kept": {"kept": 1},
    }
    spec = K.KINDS[tag]
    assert spec.decode(spec.encode(samples[tag])) == samples[tag]


SPAN = {"trace_id": "ab" * 16, "span_id": "cd" * 8, "parent_id": None,
        "name": "send task:w1", "kind": "producer", "service": "porter-ui-1",
        "start_ns": 1, "end_ns": 2, "status": "unset", "status_message": "",
        "attributes": {"porter.task.context": "urn:porter:task:t1", "n": [1, 2]}}


def test_spans_handed_to_keep_are_checked() -> None:
    bad_records = [
        {**SPAN, "trace_id": "AB" * 16}, {**SPAN, "span_id": "0" * 16},
        {**SPAN, "parent_id": "x"}, {**SPAN, "name": ""}, {**SPAN, "kind": "weird"},
        {**SPAN, "start_ns": 3}, {**SPAN, "end_ns": "2"}, {**SPAN, "status": "fine"},
        {**SPAN, "attributes": {"a": {"nested": 1}}}, {**SPAN, "attributes": [1]},
        {**SPAN, "status_message": 5}, "not a record",
    ]
    for record in bad_records:
        assert K.span_record_problem(record) is not None, record
        with pytest.raises(FrameError) as info:
            K.decode_spans_keep(K.encode_spans_keep([record]))
        assert info.value.reason == "bad-json"
    for bad in (b'{"spans": []}', orjson.dumps({"spans": [SPAN] * (K.MAX_KEPT_SPANS + 1)}),
                b'{"kept": "1"}'):
        with pytest.raises(FrameError):
            (K.decode_spans_kept if b"kept" in bad else K.decode_spans_keep)(bad)
    assert K.decode_spans_keep(K.encode_spans_keep([SPAN])) == [SPAN]


def test_spans_requests_are_checked() -> None:
    for bad in (b"[]", b'{"trace_ids": "x"}', b'{"trace_ids": ["short"]}',
                b'{"trace_ids": [], "context": 5}',
                orjson.dumps({"trace_ids": ["a" * 32] * (K.MAX_SPAN_QUERY_IDS + 1)}), b"{"):
        with pytest.raises(FrameError) as info:
            K.decode_spans_request(bad)
        assert info.value.reason == "bad-json", bad
    with pytest.raises(FrameError):
        K.decode_spans_reply(b'{"spans": 3}')
    assert K.decode_spans_request(b'{"trace_ids": ["' + b"AB" * 16 + b'"]}').trace_ids == (
        "ab" * 16,)
