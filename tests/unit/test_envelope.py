"""The wire codec: envelopes, topics, frames, payloads and control bodies."""

from __future__ import annotations

import contextlib
from typing import Any

import msgpack
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from porter_mesh.core import envelope as envelope_module
from porter_mesh.core.as2 import Activity, parse_activity
from porter_mesh.core.constants import MAX_BATCH, MAX_MESSAGE_BYTES, PROTOCOL_VERSION
from porter_mesh.core.envelope import (
    KIND_ACK,
    KIND_HEARTBEAT,
    MAX_ENVELOPE_BYTES,
    MAX_KIND_CHARS,
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
    encode_topic,
    make_msg_id,
    new_incarnation,
)
from porter_mesh.core.profile_examples import profile_examples
from porter_mesh.errors import ActivityError, FrameError

INC = 0x5EED_1234_ABCD_0042
HLC = 1_778_000_000_000 << 16 | 3
ANNOUNCE: dict[str, Any] = profile_examples()["Status announcement"]


def envelope(**changes: Any) -> Envelope:
    base = Envelope(
        version=PROTOCOL_VERSION,
        msg_id=make_msg_id(INC, "log", 7),
        sender="worker-backend",
        channel="log",
        seq=7,
        incarnation=INC,
        hlc=HLC,
    )
    return base._replace(**changes)


def raw_map(**changes: Any) -> dict[Any, Any]:
    """The wire map of ``envelope()``, with keys changed or (value ``...``) removed."""
    m: dict[Any, Any] = msgpack.unpackb(encode_envelope(envelope()))
    for key, value in changes.items():
        if value is ...:
            m.pop(key, None)
        else:
            m[key] = value
    return m


def reason(exc_info: pytest.ExceptionInfo[FrameError]) -> str:
    return exc_info.value.reason


# -- envelope ------------------------------------------------------------------------

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_round_trip_minimal_envelope_uses_short_keys_and_omits_defaults() -> None:
    env = envelope()
    data = encode_envelope(env)
    # The conventional message id is derived by the receiver, not sent.
    assert set(msgpack.unpackb(data)) == {"v", "f", "c", "s", "e", "h"}
    assert len(data) < 70
    assert decode_envelope(data) == env
    assert decode_envelope(data).msg_id == make_msg_id(INC, "log", 7)


def test_round_trip_full_envelope() -> None:
    env = envelope(recipient="reviewer", ref="abc.task.3", count=5, kind=None, channel="task:x")
    data = encode_envelope(env)
    assert set(msgpack.unpackb(data)) >= {"t", "r", "n"}
    assert decode_envelope(data) == env
    ctl = envelope(kind=KIND_HEARTBEAT, seq=0)
    assert msgpack.unpackb(encode_envelope(ctl))["k"] == "hb"
    assert decode_envelope(encode_envelope(ctl)) == ctl


def test_unknown_keys_are_ignored() -> None:
    data = msgpack.packb(raw_map(zz=[1, 2], extra={"a": 1}, **{"7": None}))
    assert decode_envelope(data) == envelope()
    data = msgpack.packb({**raw_map(), 42: "int key", (1, 2): "array key"})
    assert decode_envelope(data) == envelope()


def test_make_msg_id_is_unique_and_parseable() -> None:
    ids = {make_msg_id(INC, ch, s) for ch in ("log", "task", "a.b") for s in range(1, 50)}
    assert len(ids) == 3 * 49
    assert make_msg_id(255, "task:w.1", 12) == "ff.task:w.1.12"
    inc = new_incarnation()
    assert 0 < inc < 2**63


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "bad-msgpack"),
        (b"\xc1", "bad-msgpack"),  # never-used msgpack byte
        (b"\x81\xa1v", "bad-msgpack"),  # truncated
        (msgpack.packb({"v": 1}) + b"\x00", "bad-msgpack"),  # trailing bytes
        (b"\x81\xa2\xff\xfe\x01", "bad-msgpack"),  # key that is not UTF-8
        (msgpack.packb([1, "i", "w", "log", 1, 1, 1]), "not-a-map"),
        (msgpack.packb(7), "not-a-map"),
        (b"x" * (MAX_ENVELOPE_BYTES + 1), "too-large"),
    ],
)
def test_malformed_frames(data: bytes, why: str) -> None:
    with pytest.raises(FrameError) as info:
        decode_envelope(data)
    assert reason(info) == why


@pytest.mark.parametrize("key", ["v", "f", "c", "s", "e", "h"])
def test_missing_required_key(key: str) -> None:
    with pytest.raises(FrameError) as info:
        decode_envelope(msgpack.packb(raw_map(**{key: ...})))
    assert reason(info) == "missing-key"
    assert repr(key) in str(info.value)


@pytest.mark.parametrize("version", [0, 1, 3, "2", True, 2.0])
def test_unknown_version(version: object) -> None:
    with pytest.raises(FrameError) as info:
        decode_envelope(msgpack.packb(raw_map(v=version)))
    assert reason(info) == "bad-version"
    assert "version" in str(info.value)


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("i", "", "msg_id"),
        ("i", 5, "msg_id"),
        ("f", b"bytes", "sender"),
        ("f", "", "sender"),
        ("c", "lo\0g", "channel"),
        ("c", None, "channel"),
        ("s", -1, "seq"),
        ("s", 1.5, "seq"),
        ("s", True, "seq"),
        ("s", 2**63, "seq"),
        ("e", -5, "incarnation"),
        ("e", 2**63, "incarnation"),
        ("h", -1, "hlc"),
        ("h", "now", "hlc"),
        ("t", "", "recipient"),
        ("t", 3, "recipient"),
        ("r", [1], "ref"),
        ("n", 0, "count"),
        ("n", MAX_BATCH + 1, "count"),
        ("n", None, "count"),
        ("k", "", "kind"),
        ("k", "x" * (MAX_KIND_CHARS + 1), "kind"),
        ("p", "", "traceparent"),
        ("p", TRACEPARENT.upper(), "traceparent"),
        ("p", "00-" + "0" * 32 + TRACEPARENT[35:], "traceparent"),
        ("p", TRACEPARENT[:36] + "0" * 16 + "-01", "traceparent"),
        ("p", TRACEPARENT + "-extra", "traceparent"),
        ("p", "ff" + TRACEPARENT[2:], "traceparent"),
        ("p", 5, "traceparent"),
    ],
)
def test_bad_field_values(key: str, value: object, field: str) -> None:
    with pytest.raises(FrameError) as info:
        decode_envelope(msgpack.packb(raw_map(**{key: value})))
    assert reason(info) == "bad-field"
    assert repr(field) in str(info.value)


def test_seq_zero_only_for_control_messages() -> None:
    with pytest.raises(FrameError) as info:
        decode_envelope(msgpack.packb(raw_map(s=0)))
    assert "control" in str(info.value)
    with pytest.raises(FrameError):
        encode_envelope(envelope(seq=0))
    ctl = envelope(seq=0, kind=KIND_ACK)
    assert decode_envelope(encode_envelope(ctl)) == ctl


def test_sequence_range_overflow() -> None:
    with pytest.raises(FrameError) as info:
        decode_envelope(msgpack.packb(raw_map(s=2**63 - 2, n=3)))
    assert "2**63" in str(info.value)


def test_encode_refuses_what_a_peer_would_refuse() -> None:
    with pytest.raises(FrameError) as info:
        encode_envelope(envelope(seq=-1))
    assert reason(info) == "bad-field"
    with pytest.raises(FrameError):
        encode_envelope(envelope(version=99))
    with pytest.raises(FrameError):
        encode_envelope(("not", "an", "envelope"))  # type: ignore[arg-type]
    with pytest.raises(FrameError) as info:
        encode_envelope(envelope(sender="w" * MAX_ENVELOPE_BYTES))
    assert reason(info) == "too-large"
    # Range errors on the fast path (the stream's template is cached by now) too.
    encode_envelope(envelope())
    for field, value in [("seq", 2**63), ("hlc", 2**64), ("hlc", -1), ("seq", 1.0)]:
        with pytest.raises(FrameError) as info:
            encode_envelope(envelope(**{field: value}))
        assert repr(field) in str(info.value)


def wire_fields(env: Envelope) -> dict[str, Any]:
    """What a plain msgpack decoder must read from ``encode_envelope(env)``."""
    m: dict[str, Any] = {
        "v": env.version,
        "f": env.sender,
        "c": env.channel,
        "s": env.seq,
        "e": env.incarnation,
        "h": env.hlc,
    }
    optional = {"t": env.recipient, "r": env.ref, "k": env.kind,
                "p": env.traceparent, "q": env.tracestate}
    m.update({key: value for key, value in optional.items() if value is not None})
    if env.count != 1:
        m["n"] = env.count
    if env.msg_id != make_msg_id(env.incarnation, env.channel, env.seq):
        m["i"] = env.msg_id
    return m


SHAPES = [
    envelope(),
    envelope(seq=2**63 - 1, hlc=0),
    envelope(seq=1, hlc=2**64 - 1, incarnation=0),
    envelope(channel="task:reviewer", recipient="reviewer", count=MAX_BATCH, seq=2**63 - MAX_BATCH),
    envelope(channel="control", kind=KIND_ACK, seq=0, ref="ab.task:w.3", recipient="w"),
    envelope(msg_id="custom-id-1"),
    envelope(msg_id=make_msg_id(INC + 1, "log", 7)),  # conventional form, wrong stream
    envelope(sender="wörker-ü", channel="journal-ß"),
]


@pytest.mark.parametrize("env", SHAPES)
def test_encoding_is_a_plain_msgpack_map(env: Envelope) -> None:
    data = encode_envelope(env)
    assert msgpack.unpackb(data) == wire_fields(env)  # any msgpack decoder reads it
    assert decode_envelope(data) == env
    # ... and this decoder reads what any msgpack encoder writes (other order, other
    # integer widths, the conventional id present or not).
    foreign = msgpack.packb(dict(reversed(wire_fields(env).items())))
    assert foreign != data
    assert decode_envelope(foreign) == env
    assert decode_envelope(msgpack.packb({**wire_fields(env), "i": env.msg_id})) == env


def numbered(seq: int, hlc: int = HLC) -> Envelope:
    """The envelope of message ``seq`` of the stream, with its conventional id."""
    return envelope(seq=seq, hlc=hlc, msg_id=make_msg_id(INC, "log", seq))


def test_stream_prefix_is_cached_and_later_messages_decode_the_same() -> None:
    envelope_module._prefixes.clear()
    first = encode_envelope(numbered(1))
    assert decode_envelope(first) == numbered(1)
    assert list(envelope_module._prefixes) == [first[:-19]]
    for seq, hlc in [(2, HLC + 1), (2**63 - 1, 0), (1000, 2**64 - 1)]:
        data = encode_envelope(numbered(seq, hlc))
        assert data[:-19] == first[:-19]
        assert decode_envelope(data) == numbered(seq, hlc)
        assert decode_envelope(data).msg_id == make_msg_id(INC, "log", seq)
    assert len(envelope_module._prefixes) == 1


def test_cached_prefix_with_a_bad_tail_is_refused_or_read_in_full() -> None:
    envelope_module._prefixes.clear()
    data = encode_envelope(envelope())
    decode_envelope(data)  # caches the prefix
    assert data[:-19] in envelope_module._prefixes
    zero = data[:-19] + (0).to_bytes(8, "big") + data[-11:]
    with pytest.raises(FrameError) as info:
        decode_envelope(zero)  # seq 0 without kind
    assert "control" in str(info.value)
    big = data[:-19] + (2**63).to_bytes(8, "big") + data[-11:]
    with pytest.raises(FrameError) as info:
        decode_envelope(big)
    assert repr("seq") in str(info.value)
    renamed = data[:-11] + b"\xa1x" + data[-9:]  # "h" renamed "x": h is missing
    with pytest.raises(FrameError) as info:
        decode_envelope(renamed)
    assert reason(info) == "missing-key"
    with pytest.raises(FrameError) as info:
        decode_envelope(data[:-1])  # truncated
    assert reason(info) == "bad-msgpack"
    # Not bytes: read in full, same result.
    assert decode_envelope(bytearray(data)) == decode_envelope(memoryview(data)) == envelope()


def test_foreign_layouts_and_one_off_fields_are_not_cached() -> None:
    envelope_module._prefixes.clear()
    decode_envelope(msgpack.packb(raw_map()))  # msgpack's own layout
    decode_envelope(encode_envelope(envelope(ref="ab.log.1")))  # a ref is per message
    decode_envelope(encode_envelope(envelope(msg_id="one-off")))  # so is a custom id
    decode_envelope(msgpack.packb({**raw_map(), "zz": 1}))  # unknown key
    assert envelope_module._prefixes == {}


def test_caches_are_bounded() -> None:
    for i in range(envelope_module._CACHE_MAX + 10):
        decode_envelope(encode_envelope(envelope(sender=f"w{i}")))
    assert 0 < len(envelope_module._prefixes) <= envelope_module._CACHE_MAX
    assert 0 < len(envelope_module._templates) <= envelope_module._CACHE_MAX


@pytest.mark.parametrize("field", ["sender", "channel", "recipient", "ref", "kind", "msg_id"])
def test_text_that_is_not_unicode_is_refused(field: str) -> None:
    with pytest.raises(FrameError) as info:
        encode_envelope(envelope(**{field: "lone \udc80"}))
    assert reason(info) == "bad-field"


def test_bool_is_not_an_int_even_for_a_cached_stream() -> None:
    encode_envelope(envelope(incarnation=1))  # caches the stream of incarnation 1
    for changes in ({"incarnation": True}, {"version": True}, {"seq": True}, {"hlc": True}):
        with pytest.raises(FrameError):
            encode_envelope(envelope(**{"incarnation": 1, **changes}))


# -- topics and frames -------------------------------------------------------------------


def test_topic_round_trip_and_prefix_safety() -> None:
    assert encode_topic("task") == b"task\0"
    assert decode_topic(encode_topic("task:worker-1")) == "task:worker-1"
    assert decode_topic(encode_topic("journal-ü")) == "journal-ü"
    # A SUB socket subscribed to b"task\0" must not see task:<agent> traffic.
    assert not encode_topic("task:worker-1").startswith(encode_topic("task"))


@pytest.mark.parametrize("channel", ["", "a\0b", "\udc80", 5])
def test_encode_topic_refuses_bad_channels(channel: object) -> None:
    with pytest.raises(FrameError) as info:
        encode_topic(channel)  # type: ignore[arg-type]
    assert reason(info) == "bad-channel"


@pytest.mark.parametrize("topic", [b"task", b"\0", b"ta\0sk\0", b"\xff\0", b"", "task\0", None])
def test_decode_topic_refuses_bad_topics(topic: object) -> None:
    with pytest.raises(FrameError) as info:
        decode_topic(topic)  # type: ignore[arg-type]
    assert reason(info) == "bad-topic"


def test_broadcast_and_direct_frames() -> None:
    env = envelope()
    payload = encode_payload([Activity.from_dict(ANNOUNCE)])
    frames = encode_broadcast(env, payload)
    assert frames[0] == b"log\0"
    assert decode_broadcast(frames) == (env, payload)
    direct = envelope(channel="task:reviewer", recipient="reviewer")
    assert decode_direct(encode_direct(direct, payload)) == (direct, payload)


def test_broadcast_frame_errors() -> None:
    frames = encode_broadcast(envelope(), b"{}")
    with pytest.raises(FrameError) as info:
        decode_broadcast(frames[:2])
    assert reason(info) == "frame-count"
    with pytest.raises(FrameError) as info:
        decode_broadcast([b"task\0", frames[1], frames[2]])
    assert reason(info) == "topic-mismatch"
    with pytest.raises(FrameError) as info:
        decode_direct(frames)
    assert reason(info) == "frame-count"


# -- payloads -----------------------------------------------------------------------------


def test_single_payload_round_trip() -> None:
    activity = Activity.from_dict(ANNOUNCE)
    payload = encode_payload([activity])
    assert orjson.loads(payload) == ANNOUNCE
    assert decode_payload(payload, 1) == [activity]
    (relayed,) = decode_payload(payload, 1)  # no JSON cached yet: serialised, then cached
    again = encode_payload([relayed])
    assert again == payload and relayed.to_json() is again


def test_batch_payload_round_trip() -> None:
    batch = [Activity.from_dict({**ANNOUNCE, "summary": f"step {i}"}) for i in range(10)]
    payload = encode_payload(batch)
    assert isinstance(orjson.loads(payload), list)
    assert decode_payload(payload, 10) == batch
    # Activities decoded from the wire (no cached JSON yet) encode the same way.
    assert encode_payload(decode_payload(payload, 10)) == payload


def test_plain_text_payload_falls_back_to_note() -> None:
    (note,) = decode_payload(b"hello there", 1)
    assert note.type == "Note"
    assert note.content == "hello there"


def test_payload_errors() -> None:
    activity = Activity.from_dict(ANNOUNCE)
    with pytest.raises(FrameError) as info:
        encode_payload([])
    assert reason(info) == "bad-count"
    with pytest.raises(FrameError):
        encode_payload([activity] * (MAX_BATCH + 1))
    with pytest.raises(FrameError):
        encode_payload(["not an activity"])  # type: ignore[list-item]
    with pytest.raises(ActivityError):
        encode_payload([activity, "not an activity"])  # type: ignore[list-item]
    batch = encode_payload([activity] * 3)
    with pytest.raises(FrameError) as info:
        decode_payload(batch, 4)
    assert reason(info) == "bad-count"
    for count in (0, MAX_BATCH + 1, "3"):
        with pytest.raises(FrameError):
            decode_payload(batch, count)  # type: ignore[arg-type]
    with pytest.raises(ActivityError):
        decode_payload(b"not json at all", 2)
    with pytest.raises(ActivityError):
        decode_payload(b'{"type": "Announce"}', 1)  # JSON but not a valid activity
    for count in (1, 2):
        with pytest.raises(ActivityError) as too_big:
            decode_payload(b" " * (MAX_MESSAGE_BYTES + 1), count)
        assert too_big.value.reason == "too-large"


# -- control bodies --------------------------------------------------------------------


def test_control_round_trip() -> None:
    body = {"last": {"log": 12, "task": 3}, "slots": 2, "tags": ["a"], "blob": b"\x00\x01"}
    assert decode_control(encode_control(body)) == body


def test_control_errors() -> None:
    with pytest.raises(FrameError) as info:
        encode_control({1: "int key"})  # type: ignore[dict-item]
    assert reason(info) == "bad-control"
    with pytest.raises(FrameError):
        encode_control({"x": object()})
    with pytest.raises(FrameError):
        encode_control(["not", "a", "map"])  # type: ignore[arg-type]
    for data, why in [
        (msgpack.packb([1, 2]), "bad-control"),
        (msgpack.packb({b"k": 1}), "bad-control"),
        (msgpack.packb({"k": msgpack.ExtType(5, b"x")}), "bad-control"),
        (b"\xc1", "bad-msgpack"),
        (msgpack.packb({1: 2}), "bad-msgpack"),
    ]:
        with pytest.raises(FrameError) as info:
            decode_control(data)
        assert reason(info) == why, data


# -- properties ------------------------------------------------------------------------

names = st.text(min_size=1, max_size=40)
channels = st.text(st.characters(blacklist_characters="\0", codec="utf-8"), min_size=1, max_size=40)
envelopes = st.builds(
    Envelope,
    version=st.just(PROTOCOL_VERSION),
    msg_id=names,
    sender=names,
    channel=channels,
    seq=st.integers(1, 2**62),
    incarnation=st.integers(0, 2**63 - 1),
    hlc=st.integers(0, 2**64 - 1),
    recipient=st.none() | names,
    ref=st.none() | names,
    count=st.integers(1, MAX_BATCH),
    kind=st.none() | st.text(min_size=1, max_size=MAX_KIND_CHARS),
    traceparent=st.none(),
    tracestate=st.none(),
)
traceparents = st.builds(
    lambda t, s, f: f"00-{t:032x}-{s:016x}-{f:02x}",
    st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.integers(0, 255),
)
tracestates = st.none() | st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=512
)
traced = st.builds(
    lambda env, tp, ts: env._replace(traceparent=tp, tracestate=ts),
    envelopes, traceparents, tracestates,
)


conventional = envelopes.map(
    lambda env: env._replace(msg_id=make_msg_id(env.incarnation, env.channel, env.seq))
)


@given(envelopes | conventional | traced)
def test_any_valid_envelope_round_trips(env: Envelope) -> None:
    data = encode_envelope(env)
    assert msgpack.unpackb(data) == wire_fields(env)
    envelope_module._prefixes.clear()
    assert decode_envelope(data) == env  # read in full
    assert decode_envelope(data) == env  # through the prefix cache when cacheable
    assert decode_broadcast(encode_broadcast(env, b"p")) == (env, b"p")
    assert decode_direct(encode_direct(env, b"p")) == (env, b"p")


def decoded_in_full(data: bytes) -> Envelope | str:
    """What decode_envelope says with an empty prefix cache (the error reason if any)."""
    envelope_module._prefixes.clear()
    try:
        return decode_envelope(data)
    except FrameError as exc:
        return exc.reason


@given(conventional.filter(lambda env: env.ref is None), st.binary(min_size=19, max_size=19))
def test_cached_prefix_decodes_any_tail_as_msgpack_does(env: Envelope, tail: bytes) -> None:
    data = encode_envelope(env)
    for candidate in (data[:-19] + tail, data[:-11] + tail[8:], data[:-19] + tail[:8] + data[-11:]):
        expected = decoded_in_full(candidate)
        envelope_module._prefixes.clear()
        decode_envelope(data)  # caches the prefix when it is cacheable
        try:
            got: Envelope | str = decode_envelope(candidate)
        except FrameError as exc:
            got = exc.reason
        assert got == expected


@given(st.binary(max_size=300))
def test_random_bytes_never_crash_decoders(data: bytes) -> None:
    for decoder in (decode_envelope, decode_topic, decode_control):
        with contextlib.suppress(FrameError):
            decoder(data)
    with contextlib.suppress(FrameError, ActivityError):
        decode_payload(data, 1)


@given(st.lists(st.binary(max_size=60), max_size=5))
def test_random_frame_lists_never_crash(frames: list[bytes]) -> None:
    for decoder in (decode_broadcast, decode_direct):
        with contextlib.suppress(FrameError):
            decoder(frames)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text()
    | st.binary(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(st.dictionaries(st.text(max_size=8), msgpack_values, max_size=6))
def test_unknown_keys_of_any_kind_decode(extra: dict[str, Any]) -> None:
    known = raw_map()
    optional = {"i", "t", "r", "n", "k", "p", "q"}
    m = {**{k: v for k, v in extra.items() if k not in optional}, **known}
    assert decode_envelope(msgpack.packb(m)) == envelope()


WIRE_KEYS = ["v", "i", "f", "c", "s", "e", "h", "t", "r", "n", "k", "p", "q", "x"]


@given(st.dictionaries(st.sampled_from(WIRE_KEYS), msgpack_values))
def test_random_maps_decode_or_raise_frame_error(m: dict[str, Any]) -> None:
    try:
        env = decode_envelope(msgpack.packb(m))
    except FrameError:
        return
    assert decode_envelope(encode_envelope(env)) == env


@given(st.dictionaries(st.text(max_size=8), msgpack_values, max_size=6))
def test_control_bodies_round_trip(body: dict[str, Any]) -> None:
    decoded = decode_control(encode_control(body))
    assert decoded.keys() == body.keys()


def test_decoded_payload_is_an_activity() -> None:
    (activity,) = decode_payload(orjson.dumps(ANNOUNCE), 1)
    assert activity == parse_activity(orjson.dumps(ANNOUNCE))
    assert activity.to_dict() == ANNOUNCE
    assert KIND_ACK == "ack"


# -- trace context ---------------------------------------------------------------------


def test_trace_context_round_trips_byte_for_byte() -> None:
    for channel, recipient in (("log", None), ("task:reviewer", "reviewer")):
        env = envelope(channel=channel, recipient=recipient,
                       msg_id=make_msg_id(INC, channel, 7),
                       traceparent=TRACEPARENT, tracestate="rojo=00f067aa0ba902b7,congo=t61")
        data = encode_envelope(env)
        wire = msgpack.unpackb(data)
        assert wire["p"] == TRACEPARENT
        assert wire["q"] == "rojo=00f067aa0ba902b7,congo=t61"
        for _ in range(2):  # a traced stream is never read through the prefix cache
            decoded = decode_envelope(data)
            assert decoded == env
            assert encode_envelope(decoded) == data
    # A later traceparent version may append fields; they travel as received.
    later = "cc" + TRACEPARENT[2:] + "-what-the-future-holds"
    env = envelope(traceparent=later)
    assert decode_envelope(encode_envelope(env)).traceparent == later


def test_untraced_envelopes_keep_their_size() -> None:
    # The fixed layout of the usual message is unchanged: no trace key, no extra byte.
    assert "p" not in msgpack.unpackb(encode_envelope(envelope()))
    traced_size = len(encode_envelope(envelope(traceparent=TRACEPARENT)))
    assert len(encode_envelope(envelope())) + 59 == traced_size  # "p" and a str 8


def test_tracestate_needs_a_traceparent() -> None:
    with pytest.raises(FrameError) as info:
        decode_envelope(msgpack.packb(raw_map(q="a=b")))
    assert reason(info) == "bad-field"
    assert "traceparent" in str(info.value)
    with pytest.raises(FrameError):
        encode_envelope(envelope(tracestate="a=b"))
    with pytest.raises(FrameError) as info:
        decode_envelope(msgpack.packb(raw_map(p=TRACEPARENT, q="x" * 513)))
    assert "'tracestate'" in str(info.value)


def _previous_codec() -> Any:
    """The envelope codec as it was before trace context (the last commit without it),
    loaded from git: what a node of the previous version runs."""
    import importlib.util
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    try:
        source = subprocess.run(
            ["git", "-C", str(root), "show", f"{_BEFORE_TRACING}:porter_mesh/core/envelope.py"],
            capture_output=True, check=True, timeout=30,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"skipped: no git history with the previous codec here ({exc})", file=sys.stderr)
        pytest.skip("the previous envelope codec is not in this checkout's git history")
    spec = importlib.util.spec_from_loader("previous_envelope", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, "previous_envelope.py", "exec"), module.__dict__)
    return module


#: The last commit whose envelope codec knows nothing of trace context.
_BEFORE_TRACING = "852cd80"


def test_a_node_of_the_previous_version_reads_traced_envelopes() -> None:
    old = _previous_codec()
    assert "traceparent" not in old.Envelope._fields
    for env in (
        envelope(traceparent=TRACEPARENT, tracestate="rojo=1"),
        envelope(channel="task:r", recipient="r", msg_id=make_msg_id(INC, "task:r", 7),
                 traceparent=TRACEPARENT, ref="abc.task.1"),
    ):
        data = encode_envelope(env)
        got = old.decode_envelope(data)
        assert tuple(got) == tuple(env)[:len(old.Envelope._fields)]
        # ...twice, so that a cached prefix would show too.
        assert tuple(old.decode_envelope(data)) == tuple(got)
        # And what it sends (no trace context) this version reads.
        assert decode_envelope(old.encode_envelope(got)) == env._replace(
            traceparent=None, tracestate=None)
