"""The wire codec: ZeroMQ frames <-> envelope + payload.

A mesh message is a ZeroMQ multipart message:

* PUB/SUB: ``[topic, envelope, payload]``, where ``topic`` is the channel in UTF-8 plus
  one NUL byte, so that a subscription to ``task`` does not also match ``task:worker-1``
  (ZeroMQ subscriptions match prefixes);
* DEALER -> ROUTER: ``[envelope, payload]`` (the ROUTER strips the peer identity first).

The envelope is a msgpack map with short keys. Fields at their default are left out, and
keys this version does not know are ignored (never rejected), so that a newer sender can
add fields without a flag day:

=====  ===============  ========  ===========================================================
key    field            required  value
=====  ===============  ========  ===========================================================
``v``  ``version``      yes       :data:`~porter_mesh.core.constants.PROTOCOL_VERSION`
``i``  ``msg_id``       no        unique per sender; absent means the conventional id
                                  ``make_msg_id(e, c, s)`` (see below)
``f``  ``sender``       yes       agent name ("from")
``c``  ``channel``      yes       ``log``, ``task``, ``task:<agent>``, ``control``... (no NUL)
``s``  ``seq``          yes       sequence of the first activity carried, per (sender,
                                  channel, incarnation), from 1; 0 ("not sequenced") is
                                  allowed only for control payloads (``k`` set)
``e``  ``incarnation``  yes       random 63-bit number drawn at process start ("epoch")
``h``  ``hlc``          yes       hybrid-logical-clock timestamp (:mod:`.hlc`)
``t``  ``recipient``    no        agent name, direct messages only ("to")
``r``  ``ref``          no        ``msg_id`` of the message being answered
``n``  ``count``        no (1)    activities in the payload, 1..MAX_BATCH; activity ``i``
                                  has sequence ``seq + i``
``k``  ``kind``         no        absent for AS2 payloads; a short tag for the mesh's own
                                  control payloads (:mod:`.control`)
``p``  ``traceparent``  no        W3C ``traceparent`` of the span that sent the message, when
                                  it belongs to a traced task (:mod:`.tracecontext`)
``q``  ``tracestate``   no        W3C ``tracestate`` travelling with it (only with ``p``)
=====  ===============  ========  ===========================================================

Trace context travels as the exact strings received, so it crosses any number of hops
byte for byte; a node of an earlier version ignores ``p`` and ``q`` like any unknown key.

Keys are one character because CPython shares one-character strings, so decoding builds
no key objects.

The payload is the AS2 activity as JSON (the profile keeps AS2 as JSON on the wire); a
batch of ``n > 1`` activities is a JSON array of exactly ``n`` objects. When ``kind`` is
set, the payload is instead the body of that control kind, described with its codec
in :mod:`porter_mesh.core.control`.

The decoders take untrusted bytes: every malformed input raises
:class:`~porter_mesh.errors.FrameError` (or :class:`~porter_mesh.errors.ActivityError`
for a bad activity) with a ``reason`` tag for counting drops, never anything else.

The message id
--------------
Every :class:`Envelope` has a ``msg_id``, but the wire carries it only when it is not
the conventional ``"<incarnation hex>.<channel>.<seq>"`` (:func:`make_msg_id`), which
the receiver can work out from ``e``, ``c`` and ``s``. The encoder leaves ``i`` out when
the id equals that form, and the decoder fills it in eagerly, so a decoded envelope
always holds the id as a plain string and compares equal to the one that was sent.

Eager rather than lazy because the id is a ``NamedTuple`` field: a lazily computed one
would need a custom class (or a tuple whose item and attribute disagree), and envelopes
built with and without the id would no longer compare equal as tuples. The price is one
short string format per message on each side (the encoder formats the conventional id
to compare, the decoder to fill it in): measured, about a sixth of a bare orjson round
trip of the profile's Announce example each, and about 0.15x of it would be saved on the
receive path by a lazy id, which the node reads only in log lines. Carrying the id
instead would cost as much (a variable-length field that the fixed layout below could
not skip) and 25-30 bytes per envelope.

Layout and templates (performance)
----------------------------------
These functions sit on every message. The encoder writes a fixed layout: the map
header, the fields that are constant for a stream (``v``, ``f``, ``c``, ``e``, ``t``),
the optional per-message fields that are present (``k``, ``r``, ``n``, ``i``), and last
``s`` and ``h``, both as msgpack *uint 64* (``0xcf`` and 8 big-endian bytes) whatever
their value. A msgpack map may list its pairs in any order and an integer may use a
wider format than it needs, so this is an ordinary msgpack map that any decoder reads.

The fixed layout lets both directions skip msgpack for the usual message:

* *Encoding.* The bytes of the constant part are built once per (sender, channel,
  incarnation, recipient) and kept in a small cache; an envelope with only the required
  fields is then that prefix plus one ``struct`` call for ``seq`` and ``hlc``.
* *Decoding.* Everything before the last 19 bytes (the value of ``s``, the key of ``h``
  and its value) is the same for every message of a stream. The first message of a
  stream is decoded in full; when re-encoding the result gives back exactly the
  received bytes (which proves they have this module's layout and nothing unknown), that
  prefix and the fields it decodes to are cached. Later messages whose prefix is in the
  cache are read with one ``struct`` call, a check of the ``h`` key and a range check of
  ``seq``. Anything else (another encoder's layout, an unknown key, a ``ref``, a
  non-conventional id, a prefix not yet seen) takes the full path: msgpack, then one
  boolean expression over the fields, and only when that fails a slower pass that works
  out which field is wrong.

Both caches hold at most :data:`_CACHE_MAX` entries and start over when full, so a
flood of distinct streams costs only cache misses. ``bench/bench_codec.py`` measures
all of this against bare orjson.
"""

from __future__ import annotations

import secrets
import struct
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

import msgpack
import orjson

from porter_mesh.core.as2 import (
    Activity,
    activities_from_json_array,
    activities_to_json_array,
    activity_from_decoded,
    parse_activity,
)
from porter_mesh.core.constants import (
    MAX_ACTIVITY_BYTES,
    MAX_BATCH,
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
)
from porter_mesh.core.control import (
    KIND_ACK,
    KIND_DRAIN,
    KIND_HALT,
    KIND_HEARTBEAT,
    KIND_SYNC,
    MAX_CONTROL_BYTES,
    MAX_KIND_CHARS,
    decode_control,
    encode_control,
)
from porter_mesh.core.tracecontext import (
    MAX_TRACESTATE_CHARS,
    valid_traceparent,
    valid_tracestate,
)
from porter_mesh.errors import FrameError

# The control kinds and their body codec live in porter_mesh.core.control; they are
# re-exported here for the modules that read them with the rest of the wire codec.
__all__ = [
    "KIND_ACK",
    "KIND_DRAIN",
    "KIND_HALT",
    "KIND_HEARTBEAT",
    "KIND_SYNC",
    "MAX_CONTROL_BYTES",
    "MAX_ENVELOPE_BYTES",
    "MAX_KIND_CHARS",
    "Envelope",
    "decode_broadcast",
    "decode_control",
    "decode_direct",
    "decode_envelope",
    "decode_payload",
    "decode_topic",
    "encode_broadcast",
    "encode_control",
    "encode_direct",
    "encode_envelope",
    "encode_payload",
    "encode_topic",
    "make_msg_id",
    "new_incarnation",
]

#: Largest encoded envelope. Real ones are about 70 bytes; anything near this limit is
#: garbage or an attack, and the cap also bounds every string field inside.
MAX_ENVELOPE_BYTES: Final = 4096
_I63: Final = (1 << 63) - 1
_U64: Final = (1 << 64) - 1

_packb = msgpack.packb
_unpackb = msgpack.unpackb
_loads = orjson.loads
_tuple_new = tuple.__new__
_JSONDecodeError = orjson.JSONDecodeError

# The end of every envelope this module writes: key "s", its value as uint 64, key "h",
# its value as uint 64. _TAIL reads and writes the 19 bytes after _SEQ_KEY; it takes seq
# as signed, which is the same 8 bytes for every valid seq (< 2**63) and refuses larger.
_SEQ_KEY: Final = b"\xa1s\xcf"
_HLC_KEY: Final = b"\xa1h\xcf"
_TAIL: Final = struct.Struct(">q3sQ")
_TAIL_SIZE: Final = _TAIL.size
#: Entries per template cache (streams: sender x channel x incarnation, few in a mesh).
_CACHE_MAX: Final = 1024
#: Only envelopes up to this size are cached for decoding (real ones are about 70 bytes).
_CACHED_ENVELOPE_MAX: Final = 256


class Envelope(NamedTuple):
    """The routing header of one mesh message (see the module docstring for the wire keys).

    A ``NamedTuple`` rather than a frozen dataclass because one is built per message and
    construction is several times cheaper.

    Attributes:
        version: protocol version, :data:`~porter_mesh.core.constants.PROTOCOL_VERSION`.
        msg_id: unique per sender; :func:`make_msg_id` builds the conventional form,
            which the wire leaves out (the decoder derives it).
        sender: the sending agent's name.
        channel: the channel (``"log"``, ``"task"``, ``"task:<agent>"``, ``"control"``...).
        seq: per (sender, channel, incarnation) sequence of the first activity carried,
            from 1; 0 for control messages (``kind`` set) that are not sequenced.
        incarnation: the sender's random 63-bit process incarnation.
        hlc: hybrid-logical-clock timestamp of the send event.
        recipient: the addressed agent, for direct messages only.
        ref: ``msg_id`` of the message this one answers.
        count: number of activities in the payload (1..MAX_BATCH); activity ``i`` has
            sequence ``seq + i``.
        kind: ``None`` for AS2 payloads; a short tag (``KIND_*``) for control payloads.
        traceparent: the W3C ``traceparent`` of the sending span, for a traced task.
        tracestate: the W3C ``tracestate`` that travels with it (only with a
            ``traceparent``).
    """

    version: int
    msg_id: str
    sender: str
    channel: str
    seq: int
    incarnation: int
    hlc: int
    recipient: str | None = None
    ref: str | None = None
    # The field shadows tuple.count on purpose: the wire name reads better than a
    # workaround, and nothing here needs tuple.count.
    count: int = 1  # type: ignore[assignment]
    kind: str | None = None
    traceparent: str | None = None
    tracestate: str | None = None


def make_msg_id(incarnation: int, channel: str, seq: int) -> str:
    """Build the conventional message id ``"<incarnation hex>.<channel>.<seq>"``.

    Unique per sender because (incarnation, channel, seq) is; it needs no extra state
    and tells a reader at a glance where a message came from. The first and last dots
    delimit the parts (hex and decimal digits contain no dots), so a channel containing
    dots is still unambiguous. An envelope whose id has this form does not carry it on
    the wire: the receiver derives it.

    Args:
        incarnation: the sender's incarnation.
        channel: the channel (stream) the sequence belongs to.
        seq: the message's sequence number.

    Returns:
        The message id.
    """
    return f"{incarnation:x}.{channel}.{seq}"


def new_incarnation() -> int:
    """Draw a random non-zero 63-bit incarnation for a process start.

    Returns:
        An integer in ``[1, 2**63)``.
    """
    return secrets.randbits(63) or 1


# -- envelope --------------------------------------------------------------------------


def _valid(env: Envelope) -> bool:
    """Whether every field of ``env`` has the right type and range.

    One boolean expression, cheapest tests first. Exact ``type() is`` tests keep
    ``bool`` (an ``int`` subclass) out.
    """
    version, msg_id, sender, channel, seq, inc, hlc, recipient, ref, count, kind, tp, ts = env
    return (
        version == PROTOCOL_VERSION
        and type(version) is int
        and type(msg_id) is str
        and type(sender) is str
        and type(channel) is str
        and type(seq) is int
        and type(inc) is int
        and type(hlc) is int
        and type(count) is int
        and msg_id != ""
        and sender != ""
        and channel != ""
        and 0 <= inc <= _I63
        and 0 <= hlc <= _U64
        and 1 <= count <= MAX_BATCH
        and 0 <= seq <= _I63 - count + 1
        and "\0" not in channel
        and (recipient is None or (type(recipient) is str and recipient != ""))
        and (ref is None or (type(ref) is str and ref != ""))
        and ((kind is None and seq != 0) or (type(kind) is str and 0 < len(kind) <= MAX_KIND_CHARS))
        and (tp is None or valid_traceparent(tp))
        and (ts is None or (tp is not None and valid_tracestate(ts)))
    )


def _show(value: object) -> str:
    """A short repr of an untrusted value for an error message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _text(value: Any) -> bool:
    return type(value) is str and value != ""


def _u(limit: int) -> Any:
    return lambda value: type(value) is int and 0 <= value <= limit


# (field, wire key, test, what is expected): walked only to explain a failed fast check.
_FIELD_RULES: Final[tuple[tuple[str, str, Any, str], ...]] = (
    ("msg_id", "i", _text, "a non-empty string"),
    ("sender", "f", _text, "a non-empty string (the agent name)"),
    ("channel", "c", lambda v: _text(v) and "\0" not in v, "a non-empty string without NUL"),
    ("seq", "s", _u(_I63), "an integer in [0, 2**63)"),
    ("incarnation", "e", _u(_I63), "an integer in [0, 2**63)"),
    ("hlc", "h", _u(_U64), "an integer in [0, 2**64)"),
    ("recipient", "t", lambda v: v is None or _text(v), "absent or a non-empty string"),
    ("ref", "r", lambda v: v is None or _text(v), "absent or a non-empty string"),
    (
        "count",
        "n",
        lambda v: type(v) is int and 1 <= v <= MAX_BATCH,
        f"an integer in [1, {MAX_BATCH}]",
    ),
    (
        "kind",
        "k",
        lambda v: v is None or (_text(v) and len(v) <= MAX_KIND_CHARS),
        f"absent or a non-empty string of at most {MAX_KIND_CHARS} characters",
    ),
    (
        "traceparent",
        "p",
        lambda v: v is None or valid_traceparent(v),
        "absent or a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)",
    ),
    (
        "tracestate",
        "q",
        lambda v: v is None or valid_tracestate(v),
        f"absent or printable ASCII of at most {MAX_TRACESTATE_CHARS} characters",
    ),
)


def _invalid(env: Envelope, doing: str) -> FrameError:
    """Explain why ``env`` failed :func:`_valid` (slow path, errors only)."""
    version = env.version
    if type(version) is not int or version != PROTOCOL_VERSION:
        return FrameError(
            f"{doing}: envelope version {version!r} is not supported (this node speaks "
            f"version {PROTOCOL_VERSION}); upgrade the older side",
            reason="bad-version",
        )
    for field, key, test, expected in _FIELD_RULES:
        value = getattr(env, field)
        if not test(value):
            return FrameError(
                f"{doing}: envelope field {field!r} (key {key!r}) must be {expected}, "
                f"got {type(value).__name__} {_show(value)}",
                reason="bad-field",
            )
    if env.tracestate is not None and env.traceparent is None:
        return FrameError(
            f"{doing}: tracestate (key 'q') travels only with a traceparent (key 'p')",
            reason="bad-field",
        )
    if env.kind is None and env.seq == 0:
        return FrameError(
            f"{doing}: seq 0 (not sequenced) is allowed only for control messages (kind "
            f"set); AS2 messages are numbered from 1",
            reason="bad-field",
        )
    return FrameError(
        f"{doing}: sequence range seq={env.seq} count={env.count} passes 2**63-1",
        reason="bad-field",
    )


def _too_large_envelope(size: int) -> FrameError:
    return FrameError(
        f"envelope encodes to {size} bytes, over the {MAX_ENVELOPE_BYTES}-byte limit; "
        f"shorten the agent/channel names or ids",
        reason="too-large",
    )


def _pack_entries(entries: dict[str, Any]) -> bytes:
    """The key/value pairs of a msgpack map, without its header (at most 15 entries)."""
    try:
        packed: bytes = _packb(entries)
    except UnicodeEncodeError as exc:
        raise FrameError(
            f"cannot encode envelope: a text field is not valid Unicode ({exc}); remove "
            f"lone surrogates",
            reason="bad-field",
        ) from None
    return packed[1:]  # a fixmap header is one byte


# An encoding template per stream: (conventional id prefix; the whole envelope up to
# _SEQ_KEY when no optional per-message field is present, and a struct's pack writing it
# followed by the tail; the prefix without _SEQ_KEY with a map header for 0..6 optional
# per-message fields).
_Template = tuple[str, bytes, Callable[..., bytes], tuple[bytes, ...]]
_templates: dict[tuple[Any, ...], _Template] = {}


def _template(env: Envelope) -> _Template:
    """Check the per-stream fields of ``env`` and build (and cache) their encoding."""
    version, _, sender, channel, _, inc, _, recipient, _, _, _, _, _ = env
    if not (
        version == PROTOCOL_VERSION
        and type(version) is int
        and _text(sender)
        and _text(channel)
        and "\0" not in channel
        and type(inc) is int
        and 0 <= inc <= _I63
        and (recipient is None or _text(recipient))
    ):
        raise _invalid(env, "cannot encode envelope")
    entries = {"v": version, "f": sender, "c": channel, "e": inc}
    if recipient is not None:
        entries["t"] = recipient
    body = _pack_entries(entries)
    size = 1 + len(body) + len(_SEQ_KEY) + _TAIL_SIZE
    if size > MAX_ENVELOPE_BYTES:
        raise _too_large_envelope(size)
    # Header byte: fixmap (0x80) with the constant entries, "s", "h" and the extras.
    heads = tuple(bytes((0x80 | (len(entries) + 2 + extra),)) + body for extra in range(7))
    plain = heads[0] + _SEQ_KEY
    # One struct writing the prefix and the tail saves a concatenation per message.
    pack_plain = struct.Struct(f">{len(plain)}s{_TAIL.format[1:]}").pack
    template = (f"{inc:x}.{channel}.", plain, pack_plain, heads)
    if len(_templates) >= _CACHE_MAX:
        _templates.clear()  # streams are few; a flood of new ones only restarts the cache
    _templates[(sender, channel, inc, recipient)] = template
    return template


def encode_envelope(env: Envelope) -> bytes:
    """Encode an envelope for the wire.

    Args:
        env: the envelope.

    Returns:
        The msgpack bytes (a map; see the module docstring for the layout).

    Raises:
        FrameError: ``reason="bad-version"`` / ``"bad-field"`` when a field has the wrong
            type or range (a bug in the caller: the peer would refuse the frame);
            ``reason="too-large"`` when the encoding passes :data:`MAX_ENVELOPE_BYTES`.
    """
    if type(env) is not Envelope:
        raise FrameError(
            f"cannot encode {type(env).__name__} as an envelope; build an Envelope",
            reason="bad-field",
        )
    version, msg_id, sender, channel, seq, inc, hlc, recipient, ref, count, kind, tp, ts = env
    template = _templates.get((sender, channel, inc, recipient))
    # A cache hit means sender, channel, incarnation and recipient equal values already
    # checked; the identity and type tests keep True from passing for 1.
    if template is None or version is not PROTOCOL_VERSION or type(inc) is not int:
        template = _template(env)
    id_prefix, plain, pack_plain, heads = template
    if (
        type(seq) is int
        and type(hlc) is int
        and seq > 0
        and kind is None
        and ref is None
        and count == 1
        and tp is None
        and ts is None
        and msg_id == f"{id_prefix}{seq}"
    ):
        # The usual message: the cached prefix and the two numbers. The struct checks
        # the upper bound of seq (signed 64-bit) and the range of hlc (unsigned).
        try:
            return pack_plain(plain, seq, _HLC_KEY, hlc)
        except struct.error:
            pass  # out of range: _valid below says which
    if not _valid(env):
        raise _invalid(env, "cannot encode envelope")
    extras: dict[str, Any] = {}
    if kind is not None:
        extras["k"] = kind
    if ref is not None:
        extras["r"] = ref
    if count != 1:
        extras["n"] = count
    if msg_id != f"{id_prefix}{seq}":
        extras["i"] = msg_id
    if tp is not None:
        extras["p"] = tp
    if ts is not None:
        extras["q"] = ts
    data = heads[len(extras)] + _pack_entries(extras) + _SEQ_KEY + _TAIL.pack(seq, _HLC_KEY, hlc)
    if len(data) > MAX_ENVELOPE_BYTES:
        raise _too_large_envelope(len(data))
    return data


# A decoding template per stream prefix (the envelope bytes but the last _TAIL_SIZE):
# (version, id prefix, sender, channel, incarnation, recipient, count, kind, lowest and
# highest valid seq).
_prefixes: dict[bytes, tuple[Any, ...]] = {}


def decode_envelope(data: bytes) -> Envelope:
    """Decode and validate an envelope received from the network.

    Args:
        data: the envelope frame.

    Returns:
        The envelope, ``msg_id`` filled in when the wire left it out. Keys this version
        does not know are ignored.

    Raises:
        FrameError: ``reason`` is ``"too-large"`` (over :data:`MAX_ENVELOPE_BYTES`),
            ``"bad-msgpack"`` (not one well-formed msgpack value), ``"not-a-map"``,
            ``"missing-key"``, ``"bad-version"`` or ``"bad-field"``.
    """
    try:
        template = _prefixes.get(data[:-_TAIL_SIZE])
    except TypeError:  # not bytes (bytearray, memoryview, garbage): the full path says
        template = None
    if template is not None:
        seq, key, hlc = _TAIL.unpack_from(data, -_TAIL_SIZE)
        version, id_prefix, sender, channel, inc, recipient, count, kind, low, high = template
        if key == _HLC_KEY and low <= seq <= high:
            env: Envelope = _tuple_new(
                Envelope,
                (version, f"{id_prefix}{seq}", sender, channel, seq, inc, hlc,
                 recipient, None, count, kind, None, None),
            )  # fmt: skip
            return env
    return _decode_full(data)


def _decode_full(data: bytes) -> Envelope:
    """Decode any msgpack envelope; cache the stream's prefix when it has our layout."""
    try:
        size = len(data)
        if size > MAX_ENVELOPE_BYTES:
            raise FrameError(
                f"envelope frame of {size} bytes is over the {MAX_ENVELOPE_BYTES}-byte limit",
                reason="too-large",
            )
        # Unknown keys may be of any type (a future version's business), hence
        # strict_map_key=False; tuples keep array-valued keys hashable.
        m = _unpackb(data, use_list=False, strict_map_key=False)
    except FrameError:
        raise
    except Exception as exc:  # msgpack raises many types (ValueError, TypeError, ...).
        raise FrameError(
            f"envelope frame is not one well-formed msgpack value ({exc}); the sender "
            f"does not speak this protocol",
            reason="bad-msgpack",
        ) from exc
    if type(m) is not dict:
        raise FrameError(f"envelope is a msgpack {type(m).__name__}, not a map", reason="not-a-map")
    get = m.get
    msg_id = get("i")
    try:
        env: Envelope = _tuple_new(
            Envelope,
            (
                m["v"],
                "-" if msg_id is None else msg_id,  # stands in for the derived id
                m["f"],
                m["c"],
                m["s"],
                m["e"],
                m["h"],
                get("t"),
                get("r"),
                get("n", 1),
                get("k"),
                get("p"),
                get("q"),
            ),
        )
    except KeyError as exc:
        raise FrameError(
            f"envelope lacks the required key {exc.args[0]!r}; required: v, f, c, s, e, h",
            reason="missing-key",
        ) from None
    if not _valid(env):
        raise _invalid(env, "refused envelope")
    if msg_id is not None:
        return env
    version, _, sender, channel, seq, inc, hlc, recipient, ref, count, kind, tp, ts = env
    env = _tuple_new(
        Envelope,
        (version, f"{inc:x}.{channel}.{seq}", sender, channel, seq, inc, hlc,
         recipient, ref, count, kind, tp, ts),
    )  # fmt: skip
    # A traced envelope's prefix holds its trace context, which changes per message:
    # caching it would only churn the cache.
    if ref is None and tp is None and type(data) is bytes and size <= _CACHED_ENVELOPE_MAX:
        _remember_prefix(env, data)
    return env


def _remember_prefix(env: Envelope, data: bytes) -> None:
    """Cache the prefix of ``data`` if it is exactly what :func:`encode_envelope` writes.

    Then every envelope with that prefix and a well-formed tail decodes to the same
    fields but ``seq`` and ``hlc``; nothing else can share the prefix by accident.
    """
    try:
        if encode_envelope(env) != data:
            return
    except FrameError:
        return
    version, _, sender, channel, _, inc, _, recipient, _, count, kind, _, _ = env
    if len(_prefixes) >= _CACHE_MAX:
        _prefixes.clear()
    _prefixes[data[:-_TAIL_SIZE]] = (
        version,
        f"{inc:x}.{channel}.",
        sender,
        channel,
        inc,
        recipient,
        count,
        kind,
        1 if kind is None else 0,
        _I63 - count + 1,
    )


# -- topic -----------------------------------------------------------------------------

_topics: dict[str, bytes] = {}
_TOPIC_CACHE_MAX: Final = 4096


def encode_topic(channel: str) -> bytes:
    """Encode a channel as a PUB/SUB topic: its UTF-8 bytes and one NUL.

    Args:
        channel: a non-empty channel name without NUL.

    Returns:
        The topic bytes (also what a subscriber passes to ``SUBSCRIBE``).

    Raises:
        FrameError: ``reason="bad-channel"`` for an empty channel, a NUL inside, or a
            string that cannot be encoded as UTF-8.
    """
    if type(channel) is str:
        topic = _topics.get(channel)
        if topic is not None:
            return topic
    if type(channel) is not str or channel == "" or "\0" in channel:
        raise FrameError(
            f"channel {channel!r} must be a non-empty string without NUL", reason="bad-channel"
        )
    try:
        topic = channel.encode() + b"\0"
    except UnicodeEncodeError as exc:
        raise FrameError(
            f"channel {channel!r} cannot be encoded as UTF-8 ({exc})", reason="bad-channel"
        ) from None
    if len(_topics) >= _TOPIC_CACHE_MAX:
        # Channels are few; a flood of distinct ones only resets the cache.
        _topics.clear()
    _topics[channel] = topic
    return topic


def decode_topic(topic: bytes) -> str:
    """Decode a PUB/SUB topic frame back to the channel name.

    Args:
        topic: the topic frame.

    Returns:
        The channel.

    Raises:
        FrameError: ``reason="bad-topic"`` when the trailing NUL is missing, a NUL
            appears inside, the channel is empty or is not UTF-8.
    """
    if type(topic) is not bytes or len(topic) < 2 or topic[-1] != 0 or 0 in topic[:-1]:
        raise FrameError(
            f"topic frame {_show(topic)} is not a channel name followed by one NUL byte",
            reason="bad-topic",
        )
    try:
        return topic[:-1].decode()
    except UnicodeDecodeError:
        raise FrameError(
            f"topic frame {_show(topic)} is not valid UTF-8", reason="bad-topic"
        ) from None


# -- frames ----------------------------------------------------------------------------


def encode_broadcast(env: Envelope, payload: bytes) -> list[bytes]:
    """Build the PUB/SUB frames ``[topic, envelope, payload]``.

    Args:
        env: the envelope; its channel becomes the topic.
        payload: the encoded payload (:func:`encode_payload` or :func:`encode_control`).

    Returns:
        The three frames.

    Raises:
        FrameError: as :func:`encode_envelope` and :func:`encode_topic`.
    """
    header = encode_envelope(env)
    return [encode_topic(env.channel), header, payload]


def decode_broadcast(frames: Sequence[bytes]) -> tuple[Envelope, bytes]:
    """Split and check PUB/SUB frames.

    Args:
        frames: the received multipart message.

    Returns:
        The envelope and the (still encoded) payload.

    Raises:
        FrameError: ``reason="frame-count"`` unless there are exactly three frames,
            ``reason="topic-mismatch"`` when the topic is not the envelope's channel, or
            any error of :func:`decode_envelope`.
    """
    if len(frames) != 3:
        raise FrameError(
            f"broadcast message has {len(frames)} frames, expected 3 (topic, envelope, payload)",
            reason="frame-count",
        )
    topic, header, payload = frames
    env = decode_envelope(header)
    expected = _topics.get(env.channel)
    if expected is None:
        expected = encode_topic(env.channel)
    if topic != expected:
        raise FrameError(
            f"topic {_show(topic)} does not match the envelope channel {env.channel!r}",
            reason="topic-mismatch",
        )
    return env, payload


def encode_direct(env: Envelope, payload: bytes) -> list[bytes]:
    """Build the DEALER-side frames ``[envelope, payload]`` of a direct message.

    Args:
        env: the envelope (normally with ``recipient`` set).
        payload: the encoded payload.

    Returns:
        The two frames.

    Raises:
        FrameError: as :func:`encode_envelope`.
    """
    return [encode_envelope(env), payload]


def decode_direct(frames: Sequence[bytes]) -> tuple[Envelope, bytes]:
    """Split and check direct-message frames (after the ROUTER identity was removed).

    Args:
        frames: ``[envelope, payload]``.

    Returns:
        The envelope and the (still encoded) payload.

    Raises:
        FrameError: ``reason="frame-count"`` unless there are exactly two frames, or any
            error of :func:`decode_envelope`.
    """
    if len(frames) != 2:
        raise FrameError(
            f"direct message has {len(frames)} frames, expected 2 (envelope, payload)",
            reason="frame-count",
        )
    header, payload = frames
    return decode_envelope(header), payload


# -- payloads --------------------------------------------------------------------------


def _too_large(what: str, size: int, limit: int) -> FrameError:
    return FrameError(
        f"{what} of {size} bytes is over the {limit}-byte limit; put large content in a "
        f"workspace file and reference its path",
        reason="too-large",
    )


def encode_payload(activities: Sequence[Activity]) -> bytes:
    """Encode one activity as its JSON object, or several as a JSON array.

    Args:
        activities: 1..MAX_BATCH activities; set the envelope's ``count`` to their number.

    Returns:
        The payload bytes.

    Raises:
        FrameError: ``reason="bad-count"`` for an empty or oversized batch or a value
            that is not an activity; ``reason="too-large"`` when the payload passes one
            frame's limit.
        ActivityError: a batch item is not an :class:`Activity`.
    """
    n = len(activities)
    if n == 1:
        activity = activities[0]
        if activity.__class__ is not Activity:
            raise FrameError(
                f"a payload carries Activity values, not {type(activity).__name__}; "
                f"build them with porter_mesh.core.as2",
                reason="bad-count",
            )
        data = activity.to_json()  # cached after the first call
    elif 1 < n <= MAX_BATCH:
        # Cached JSON joined, or one orjson call; it refuses non-Activity items itself.
        data = activities_to_json_array(activities)
    else:
        raise FrameError(
            f"a payload carries 1..{MAX_BATCH} activities, got {n}; split the batch",
            reason="bad-count",
        )
    if len(data) > MAX_MESSAGE_BYTES:
        raise _too_large("payload", len(data), MAX_MESSAGE_BYTES)
    return data


def decode_payload(payload: bytes, count: int) -> list[Activity]:
    """Decode and validate the activities of an AS2 payload.

    Args:
        payload: the payload frame.
        count: the envelope's ``count``.

    Returns:
        ``count`` activities. With ``count == 1`` a payload that is not JSON becomes a
        ``Note`` whose content is the raw text (the profile's fallback).

    Raises:
        FrameError: ``reason="bad-count"`` for a count outside 1..MAX_BATCH or an array
            of another length.
        ActivityError: when the JSON is not a valid activity (or array of them), or is
            too large (``reason="too-large"``: the AS2 layer enforces the size limits
            before parsing).
    """
    if count == 1:
        if type(payload) is bytes and len(payload) <= MAX_ACTIVITY_BYTES:
            # parse_activity's work for the usual payload, without its extra call.
            try:
                return [activity_from_decoded(_loads(payload))]
            except _JSONDecodeError:
                pass  # not JSON: parse_activity delivers the profile's fallback Note
        return [parse_activity(payload)]
    if type(count) is not int or not 1 < count <= MAX_BATCH:
        raise FrameError(f"activity count {count!r} is outside 1..{MAX_BATCH}", reason="bad-count")
    activities = activities_from_json_array(payload)
    if len(activities) != count:
        raise FrameError(
            f"payload holds {len(activities)} activities but the envelope says {count}",
            reason="bad-count",
        )
    return activities
