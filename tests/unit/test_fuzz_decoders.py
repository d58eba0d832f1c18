"""Every decoder that reads bytes from the network, fuzzed: no crash, bounded time and
memory per message, and each refusal a package error with a reason that can be counted.

The decoders are the envelope codec (envelope, topic, broadcast and direct frames,
payload batches, control bodies), each control kind's body codec, the AS2 parser (one
activity, a JSON array), the knowledge sync codec (sync messages, records) and the
discovery TXT decoder. Inputs are random bytes, mutations of valid encodings (bit flips,
cuts, splices, inserted hostile msgpack length headers), structured msgpack and JSON
with the right keys and wrong values, and a fixed set of hand-made hostile inputs (huge
declared lengths, deep nesting, oversize).
"""

from __future__ import annotations

import contextlib
import json
import re
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from porter_mesh.core import constants as C
from porter_mesh.core import control as K
from porter_mesh.core.advert import TXT_KEYS, PeerAdvert, decode_txt, encode_txt
from porter_mesh.core.as2 import Activity, activities_from_json_array, parse_activity
from porter_mesh.core.envelope import (
    Envelope,
    decode_broadcast,
    decode_control,
    decode_direct,
    decode_envelope,
    decode_payload,
    decode_topic,
    encode_broadcast,
    encode_control,
    encode_direct,
    encode_envelope,
    encode_payload,
)
from porter_mesh.core.knowledge import (
    CatchupChunk,
    CatchupRequest,
    Digest,
    Observation,
    PullReply,
    PullRequest,
    Record,
    Records,
    Retraction,
    decode_record,
    decode_sync,
    encode_record,
    encode_sync,
)
from porter_mesh.errors import KnowledgeError, ProtocolError
from tests.fuzzing import examples

#: CPU seconds one message may take to be decoded or refused (the thread's own CPU time,
#: so other processes on a shared machine do not count). Real figures are microseconds to
#: a few milliseconds; the bound only catches a decoder that blows up on some input.
BOUND_S = 0.5
#: A reason is a short machine-readable tag, as counted in ``dropped.<reason>``.
REASON_RE = re.compile(r"[a-z][a-z0-9.-]{0,40}")
FUZZ = settings(max_examples=examples(100), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

T0 = "2026-01-31T12:00:00.000000Z"
ANNOUNCE = Activity.from_dict({
    "type": "Announce", "actor": "worker-1", "summary": "All tests passing",
    "context": "urn:porter:task:a3f9",
    "object": {"type": "Note", "content": "14 tests passing, 0 failures."},
})
OFFER = Activity.from_dict({"type": "Offer", "actor": "architect", "summary": "Build it",
                            "object": {"type": "Note", "content": "GET /users"},
                            "target": "worker-1"})


def _env(kind: str | None = None, count: int = 1) -> Envelope:
    return Envelope(C.PROTOCOL_VERSION, "1f.3", "worker-1", "control" if kind else "log",
                    0 if kind else 3, 0x1F, 1_700_000_000_000 << 16, None, None, count, kind)


def _obs(i: int) -> Observation:
    return Observation(f"urn:porter:file:f{i}.ts", f"finding {i}", "worker-1", T0)


RECORDS = (Record("worker-1", 1, _obs(1)), Record("worker-1", 2, _obs(2)),
           Record("reviewer", 1, Retraction(_obs(1).id, "reviewer", T0)))
SYNC_SEEDS = [encode_sync(m) for m in (
    Records(RECORDS), PullRequest("worker-1", 3, 9), PullReply("worker-1", 1, 2, RECORDS[:2]),
    CatchupRequest({"worker-1": 5}, ("reviewer", 1), 1, 100),
    CatchupChunk(RECORDS[:1], 1, 3, ("worker-1", 2)), Digest(3, (b"\x01" * 16,) * 256),
)]
ENVELOPE_SEEDS = [encode_envelope(_env()), encode_envelope(_env("heartbeat")),
                  encode_envelope(_env(count=2))]
CONTROL_SEEDS = [encode_control({"s": {"log": 4}, "d": False}),
                 encode_control({"a": {"n": "w", "m": "x"}, "x": ["127.0.0.1"], "p": []})]
HELLO_SEED = K.encode_hello(K.Introduction(
    PeerAdvert(name="worker-1", role="worker", mesh="default", pub_port=1, router_port=2,
               version=C.PROTOCOL_VERSION, incarnation=7, addresses=("127.0.0.1",)),
    (PeerAdvert(name="reviewer", role="reviewer", mesh="default", pub_port=3, router_port=4,
                version=C.PROTOCOL_VERSION, incarnation=8, addresses=("::1",)),)))
PAYLOAD_SEEDS = [encode_payload([ANNOUNCE]), encode_payload([ANNOUNCE, OFFER, ANNOUNCE])]
ACTIVITY_SEEDS = [ANNOUNCE.to_json(), OFFER.to_json()]
RECORD_SEEDS = [encode_record(r) for r in RECORDS]
TOPIC_SEEDS = [b"log\x00", b"task:worker-1\x00"]

Decoder = Callable[[bytes], object]
#: name -> (decoder, valid seeds, exception types a refusal may raise)
DECODERS: dict[str, tuple[Decoder, list[bytes], tuple[type[Exception], ...]]] = {
    "envelope": (decode_envelope, ENVELOPE_SEEDS, (ProtocolError,)),
    "control": (decode_control, CONTROL_SEEDS, (ProtocolError,)),
    "topic": (decode_topic, TOPIC_SEEDS, (ProtocolError,)),
    "payload-1": (lambda b: decode_payload(b, 1), PAYLOAD_SEEDS, (ProtocolError,)),
    "payload-3": (lambda b: decode_payload(b, 3), PAYLOAD_SEEDS, (ProtocolError,)),
    "activity": (parse_activity, ACTIVITY_SEEDS, (ProtocolError,)),
    "activity-array": (activities_from_json_array, PAYLOAD_SEEDS, (ProtocolError,)),
    "sync": (decode_sync, SYNC_SEEDS, (KnowledgeError,)),
    "control-hb": (K.decode_heartbeat, [CONTROL_SEEDS[0]], (ProtocolError,)),
    "control-hello": (K.decode_hello, [HELLO_SEED], (ProtocolError,)),
    "control-welcome": (K.decode_welcome, [HELLO_SEED], (ProtocolError,)),
    "control-ack": (K.decode_ack, [K.encode_ack(K.Ack((1, 65)))], (ProtocolError,)),
    "control-command": (K.decode_command, [K.encode_command(K.Command("w"))],
                        (ProtocolError,)),
    "control-unsupported": (K.decode_unsupported, [K.encode_unsupported(K.Unsupported("x"))],
                            (ProtocolError,)),
    "control-stats-reply": (K.decode_stats_reply, [K.encode_stats_reply(K.StatsReply({"a": 1}))],
                            (ProtocolError,)),
    "record": (decode_record, RECORD_SEEDS, (KnowledgeError,)),
}


def refused_cleanly(name: str, data: Any, call: Callable[[], object]) -> None:
    """Run one decode: it returns, or raises the decoder's own error with a message and
    (for protocol errors) a countable reason, within the time bound."""
    allowed = DECODERS[name][2] if name in DECODERS else (ProtocolError,)
    started = time.thread_time()
    try:
        call()
    except allowed as exc:
        assert str(exc), f"{name}: empty message for {data!r:.200}"
        if isinstance(exc, ProtocolError):
            assert REASON_RE.fullmatch(exc.reason), f"{name}: reason {exc.reason!r}"
    except Exception as exc:  # the property: nothing else escapes
        pytest.fail(f"{name}: {type(exc).__name__} escaped for {data!r:.300}: {exc}")
    elapsed = time.thread_time() - started
    assert elapsed < BOUND_S, f"{name}: {elapsed:.3f}s for {data!r:.200}"


# -- mutations of valid encodings ---------------------------------------------------------

#: msgpack headers that declare 2**32-1 elements or bytes, followed by almost nothing.
HOSTILE_HEADERS = [b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff",
                   b"\xdb\xff\xff\xff\xff", b"\xdc\xff\xff", b"\xde\xff\xff",
                   b"\xcf\xff\xff\xff\xff\xff\xff\xff\xff", b"\xd3\x80" + b"\x00" * 7,
                   b"\xcb\x7f\xf8\x00\x00\x00\x00\x00\x00", b"\xc7\xff\x01", b"\xd4\xff\x00"]


@st.composite
def mutated(draw: st.DrawFn, seeds: Sequence[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "cut", "insert", "splice", "hostile", "set"]))
        at = draw(st.integers(0, max(0, len(data))))
        if op == "flip" and data:
            i = min(at, len(data) - 1)
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "cut":
            data = data[:at]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "splice":
            other = draw(st.sampled_from(seeds))
            data = data[:at] + other[draw(st.integers(0, len(other))):]
        elif op == "hostile":
            data[at:at] = draw(st.sampled_from(HOSTILE_HEADERS))
        elif op == "set" and data:
            data[min(at, len(data) - 1)] = draw(st.integers(0, 255))
    return bytes(data)


# -- structured values with the right keys and wrong values -------------------------------

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True),
    st.text(max_size=40), st.binary(max_size=40),
)
MSGPACK_VALUES = st.recursive(
    SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=6),
                                     st.dictionaries(st.text(max_size=6), inner, max_size=6)),
    max_leaves=25)
ENVELOPE_KEYS = ["v", "i", "f", "c", "s", "e", "h", "t", "r", "n", "k", "zz"]
SYNC_KEYS = ["t", "o", "f", "l", "r", "vv", "c", "d", "n", "tot", "b", "e", "more", "zz"]
SYNC_TAGS = ["rec", "pull", "pulled", "cu", "cc", "dg", "be", "??"]


def _packable(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


@st.composite
def msgpack_maps(draw: st.DrawFn, keys: list[str], tags: list[str] | None = None) -> bytes:
    body = draw(st.dictionaries(st.sampled_from(keys), MSGPACK_VALUES, max_size=len(keys)))
    if tags is not None and draw(st.booleans()):
        body["t"] = draw(st.sampled_from(tags))
    return _packable(body)


# The standard library's encoder, because orjson refuses integers beyond 64 bits (which
# a hostile peer is free to send).
def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
              st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30)),
    lambda inner: st.one_of(st.lists(inner, max_size=5),
                            st.dictionaries(st.text(max_size=8), inner, max_size=5)),
    max_leaves=30)
AS2_KEYS = ["type", "actor", "summary", "content", "object", "target", "context", "tag",
            "items", "url", "name", "result", "instrument", "origin", "@context", "id"]


@st.composite
def activity_like(draw: st.DrawFn) -> bytes:
    body = draw(st.dictionaries(st.sampled_from(AS2_KEYS), JSON_VALUES, max_size=8))
    if draw(st.booleans()):
        body["type"] = draw(st.sampled_from(["Announce", "Offer", "Note", "Remember", "Zap"]))
    if draw(st.booleans()):
        body = [body] * draw(st.integers(0, 4))  # type: ignore[assignment]
    return _json(body)


# -- the properties -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(DECODERS))
@FUZZ
@given(data=st.data())
def test_random_and_mutated_bytes(name: str, data: st.DataObject) -> None:
    decoder, seeds, _ = DECODERS[name]
    raw = data.draw(st.one_of(st.binary(max_size=1024), mutated(seeds)))
    refused_cleanly(name, raw, lambda: decoder(raw))


@pytest.mark.parametrize("name", ["envelope", "control"])
@FUZZ
@given(data=st.data())
def test_envelope_shaped_msgpack(name: str, data: st.DataObject) -> None:
    raw = data.draw(msgpack_maps(ENVELOPE_KEYS))
    refused_cleanly(name, raw, lambda: DECODERS[name][0](raw))


#: The keys of every control body (porter_mesh.core.control).
CONTROL_KEYS = ["s", "d", "a", "x", "p", "o", "f", "to", "k"]


@pytest.mark.parametrize("name", sorted(n for n in DECODERS if n.startswith("control-")))
@FUZZ
@given(data=st.data())
def test_control_shaped_msgpack(name: str, data: st.DataObject) -> None:
    raw = data.draw(msgpack_maps(CONTROL_KEYS))
    refused_cleanly(name, raw, lambda: DECODERS[name][0](raw))


@pytest.mark.parametrize("name", ["sync", "record"])
@FUZZ
@given(data=st.data())
def test_sync_shaped_msgpack(name: str, data: st.DataObject) -> None:
    raw = data.draw(st.one_of(msgpack_maps(SYNC_KEYS, SYNC_TAGS),
                              st.lists(MSGPACK_VALUES, max_size=8).map(_packable)))
    refused_cleanly(name, raw, lambda: DECODERS[name][0](raw))


@pytest.mark.parametrize("name", ["activity", "activity-array", "payload-1", "payload-3"])
@FUZZ
@given(data=st.data())
def test_activity_shaped_json(name: str, data: st.DataObject) -> None:
    raw = data.draw(st.one_of(activity_like(), JSON_VALUES.map(_json)))
    refused_cleanly(name, raw, lambda: DECODERS[name][0](raw))


FRAMES = st.lists(st.one_of(st.binary(max_size=200), st.sampled_from(
    TOPIC_SEEDS + ENVELOPE_SEEDS + PAYLOAD_SEEDS + CONTROL_SEEDS)), max_size=5)


@FUZZ
@given(frames=st.one_of(FRAMES, mutated([b"|".join(encode_broadcast(_env(), PAYLOAD_SEEDS[0]))])
                        .map(lambda b: b.split(b"|"))))
def test_broadcast_frames(frames: list[bytes]) -> None:
    refused_cleanly("broadcast", frames, lambda: decode_broadcast(frames))


@FUZZ
@given(frames=st.one_of(FRAMES, mutated([b"|".join(encode_direct(_env(), PAYLOAD_SEEDS[0]))])
                        .map(lambda b: b.split(b"|"))))
def test_direct_frames(frames: list[bytes]) -> None:
    refused_cleanly("direct", frames, lambda: decode_direct(frames))


KEY = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"
GOOD_TXT = encode_txt(PeerAdvert(name="worker-1", role="worker", mesh="lab", pub_port=5601,
                                 router_port=5602, version=C.PROTOCOL_VERSION, incarnation=7,
                                 public_key=KEY, slots=2, tools=("bash", "read_file")))
TXT_VALUES = st.one_of(st.none(), st.binary(max_size=300), st.text(max_size=300))
TXT_KEY_SPACE = st.one_of(st.sampled_from(sorted(TXT_KEYS)), st.text(max_size=10),
                          st.binary(max_size=10))


@st.composite
def txt_records(draw: st.DrawFn) -> dict[Any, Any]:
    props: dict[Any, Any] = {k.encode(): v.encode() for k, v in GOOD_TXT.items()}
    for _ in range(draw(st.integers(0, 4))):
        key = draw(TXT_KEY_SPACE)
        props[key] = draw(TXT_VALUES)
    for key in draw(st.lists(st.sampled_from(sorted(GOOD_TXT)), max_size=3)):
        props.pop(key.encode(), None)
    if draw(st.booleans()):
        props = draw(st.dictionaries(TXT_KEY_SPACE, TXT_VALUES, max_size=80))
    return props


@FUZZ
@given(props=txt_records(),
       addresses=st.lists(st.one_of(st.sampled_from(["127.0.0.1", "::1", "10.0.0.5"]),
                                    st.text(max_size=50)), max_size=4))
def test_discovery_txt_records(props: dict[Any, Any], addresses: list[str]) -> None:
    refused_cleanly("txt", props, lambda: decode_txt(props, addresses=addresses))


def test_the_seeds_are_valid() -> None:
    """The mutations start from real encodings, so that they reach deep code paths."""
    for name, (decoder, seeds, _) in DECODERS.items():
        if name in ("payload-1", "payload-3", "activity-array"):
            continue
        for seed in seeds:
            decoder(seed)
    assert decode_payload(PAYLOAD_SEEDS[1], 3) and decode_payload(PAYLOAD_SEEDS[0], 1)
    assert decode_txt(GOOD_TXT, addresses=["127.0.0.1"]).name == "worker-1"


# -- hand-made hostile inputs: time and memory ----------------------------------------------

DEEP_JSON = b"[" * 200_000 + b"]" * 200_000
DEEP_OBJECT = b'{"type":"Note","actor":"a","summary":"s","object":' * 5000 + b"1" + b"}" * 5000
DEEP_MSGPACK = b"\x91" * 100_000 + b"\xc0"
HOSTILE: list[tuple[str, bytes]] = [
    *[(name, header + b"\x00" * 8) for name in ("envelope", "control", "sync", "record")
      for header in HOSTILE_HEADERS],
    *[(name, DEEP_MSGPACK) for name in ("envelope", "control", "sync", "record")],
    *[(name, DEEP_JSON) for name in ("activity", "activity-array", "payload-1")],
    *[(name, DEEP_OBJECT) for name in ("activity", "payload-1")],
    ("activity", b'"' + b"x" * (C.MAX_MESSAGE_BYTES + 10) + b'"'),
    ("payload-3", b"[" + b"{}," * 1_000_000 + b"{}]"),
    ("control", _packable({"s": {str(i): i for i in range(100_000)}})),
    ("sync", _packable({"t": "dg", "n": 1, "b": [b"\x00" * 16] * 500_000})),
    ("envelope", _packable({"v": 1, "f": "x" * 1_000_000, "c": "log", "s": 1, "e": 1,
                            "h": 1})),
]


@pytest.mark.parametrize(("name", "raw"), HOSTILE,
                         ids=[f"{n}-{i}" for i, (n, _) in enumerate(HOSTILE)])
def test_hostile_inputs_are_refused_in_bounded_time_and_memory(name: str, raw: bytes) -> None:
    decoder = DECODERS[name][0]
    refused_cleanly(name, raw[:60], lambda: decoder(raw))  # timed without the tracer
    tracemalloc.start()
    try:
        with contextlib.suppress(*DECODERS[name][2]):
            decoder(raw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Whatever a decoder allocates is in proportion to what it was given, never to what
    # a header claims.
    assert peak < 48 * len(raw) + 8 * 1024 * 1024, f"{name}: peak {peak >> 20} MiB"
