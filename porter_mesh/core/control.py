"""The control protocol: the mesh's own messages, in one table, with the codec of each body.

Besides AS2 activities, nodes exchange messages of their own: heartbeats, introductions,
acknowledgements, goodbyes, operator commands, status requests and knowledge sync. Such a
message is an ordinary mesh message (see :mod:`porter_mesh.core.envelope`) whose envelope
has the ``k`` (kind) field set and whose channel is ``control``; its payload is the
*body* of that kind, almost always a msgpack map with short string keys
(:func:`encode_control`). :data:`KINDS` is the one table of the kinds this version
speaks: for each, how it travels, what its body holds and the functions that encode and
decode it.

How a kind travels (:class:`Route`):

* ``broadcast``: published on the PUB socket under the topic ``control``, with the
  sender's next sequence number of the ``control`` channel (so loss is counted);
* ``direct``: sent from the sender's DEALER to the receiver's ROUTER, sequence 0, not
  acknowledged (the kinds that need an answer carry it in the reply);
* ``reply``: the answer to a direct message, sent back on the same connection (ROUTER
  to the asker's DEALER), sequence 0.

Bodies, as encoded (``[...]`` is a msgpack array, ``{...}`` a map; keys in this order):

==============  ===========================================================================
kind            body
==============  ===========================================================================
``hb``          ``{"s": {channel: last seq sent, ...}, "d": draining}`` (all channels but
                ``control``; ``d`` a boolean)
``hello``       ``{"a": TXT map of the sender's advert, "x": [address, ...], "p": [[TXT
                map, [address, ...]], ...]}`` (the peers the sender knows), or ``{"o": 1}``
                from an observer, which wants the roster but joins none
``welcome``     the answer to ``hello``: the same map as a hello (never ``{"o": 1}``)
``ack``         ``{"f": [seq, ...]}``: the first sequence number of each acknowledged
                direct message (a batch is acknowledged by its first sequence); the
                same body with ``"e": incarnation`` is also a *carried* acknowledgement,
                the third frame of a direct message (:mod:`.session.acks`)
``bye``         ``{}``
``drain``       ``{"to": agent}`` or ``{}`` (everyone): finish current work, take no more
``halt``        ``{"to": agent}`` or ``{}`` (everyone): stop now
``unsupported`` ``{"k": kind}``: the answer to a direct request of a kind the receiver
                does not run
``stats``       empty payload (zero bytes)
``stats-reply`` the node's view as a JSON object (UTF-8), not msgpack
``sync``        knowledge sync, a msgpack map tagged ``"t"``
                (:func:`porter_mesh.core.knowledge.encode_sync`)
==============  ===========================================================================

TXT maps are the discovery record's keys and values (:func:`~porter_mesh.core.advert.
encode_txt`), addresses are IP address strings. Every decoder here takes untrusted bytes
and raises :class:`~porter_mesh.errors.FrameError` with a ``reason`` to count for
anything malformed; keys a body does not define are ignored, so later versions can add
some. A node ignores kinds it does not know on ``control`` broadcasts and answers a
direct request of an unknown kind with ``unsupported``, so a new kind needs no protocol
version bump.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

import msgpack
import orjson

from porter_mesh.core.advert import PeerAdvert, decode_txt, encode_txt
from porter_mesh.core.constants import MAX_MESSAGE_BYTES
from porter_mesh.core.knowledge import decode_sync, encode_sync
from porter_mesh.errors import FrameError, ProtocolError

__all__ = [
    "KINDS",
    "KIND_ACK",
    "KIND_BYE",
    "KIND_DRAIN",
    "KIND_HALT",
    "KIND_HEARTBEAT",
    "KIND_HELLO",
    "KIND_SPANS",
    "KIND_SPANS_KEEP",
    "KIND_SPANS_KEPT",
    "KIND_SPANS_REPLY",
    "KIND_STATS",
    "KIND_STATS_REPLY",
    "KIND_SYNC",
    "KIND_UNSUPPORTED",
    "KIND_WELCOME",
    "MAX_CONTROL_BYTES",
    "MAX_INTRODUCED_PEERS",
    "MAX_KEPT_SPANS",
    "MAX_KIND_CHARS",
    "NODE_KINDS",
    "Ack",
    "Bye",
    "Command",
    "Heartbeat",
    "Introduction",
    "KindSpec",
    "ObserverHello",
    "Route",
    "SpansRequest",
    "StatsReply",
    "StatsRequest",
    "Unsupported",
    "decode_ack",
    "decode_bye",
    "decode_command",
    "decode_control",
    "decode_heartbeat",
    "decode_hello",
    "decode_spans_keep",
    "decode_spans_kept",
    "decode_spans_reply",
    "decode_spans_request",
    "decode_stats_reply",
    "decode_stats_request",
    "decode_unsupported",
    "decode_welcome",
    "encode_ack",
    "encode_bye",
    "encode_command",
    "encode_control",
    "encode_heartbeat",
    "encode_hello",
    "encode_spans_keep",
    "encode_spans_kept",
    "encode_spans_reply",
    "encode_spans_request",
    "encode_stats_reply",
    "encode_stats_request",
    "encode_unsupported",
    "encode_welcome",
    "span_record_problem",
]

#: Largest control payload: one ZeroMQ frame.
MAX_CONTROL_BYTES: Final = MAX_MESSAGE_BYTES
#: Longest ``kind`` tag.
MAX_KIND_CHARS: Final = 32
#: Peers read from one hello or welcome; more are ignored (a mesh is far smaller, and a
#: hostile peer must not make us parse an unbounded roster).
MAX_INTRODUCED_PEERS: Final = 1024

#: Heartbeat on ``control``: liveness, draining, and the last sequence sent per channel.
KIND_HEARTBEAT: Final = "hb"
#: Acknowledgement of direct messages (the first sequence of each).
KIND_ACK: Final = "ack"
#: Introduction over DEALER -> ROUTER: our advert plus the peers we know (peer exchange).
KIND_HELLO: Final = "hello"
#: The answer to a hello, with the same content.
KIND_WELCOME: Final = "welcome"
#: Graceful leave, broadcast on ``control``.
KIND_BYE: Final = "bye"
#: Finish current work, accept nothing new.
KIND_DRAIN: Final = "drain"
#: Stop immediately.
KIND_HALT: Final = "halt"
#: The answer to a direct request of a kind this node does not run.
KIND_UNSUPPORTED: Final = "unsupported"
#: A request for the node's own view (roster, counters, queues...).
KIND_STATS: Final = "stats"
#: The answer to ``stats``: the view as JSON.
KIND_STATS_REPLY: Final = "stats-reply"
#: Knowledge-graph synchronisation (records, range pulls, catch-up chunks, digests).
KIND_SYNC: Final = "sync"
#: A request for the recent spans of some traces (``porter-mesh trace``).
KIND_SPANS: Final = "spans"
#: The answer to ``spans``: the span records found, and the ring's counters.
KIND_SPANS_REPLY: Final = "spans-reply"
#: Finished spans handed to a peer to keep (a command's seat, before it leaves).
KIND_SPANS_KEEP: Final = "spans-keep"
#: The answer to ``spans-keep``: how many were kept.
KIND_SPANS_KEPT: Final = "spans-kept"


class Route(enum.Enum):
    """How a control kind travels (see the module docstring)."""

    BROADCAST = "broadcast"
    DIRECT = "direct"
    REPLY = "reply"


# -- the msgpack map every body but stats/stats-reply is ------------------------------

_packb = msgpack.packb
_unpackb = msgpack.unpackb


def _refuse_ext(code: int, data: bytes) -> Any:
    raise FrameError(
        f"control payload uses msgpack extension type {code}, which the mesh does not use",
        reason="bad-control",
    )


def _too_large(size: int) -> FrameError:
    return FrameError(
        f"control payload of {size} bytes is over the {MAX_CONTROL_BYTES}-byte limit; "
        "send less per message (split it)",
        reason="too-large",
    )


def encode_control(body: Mapping[str, Any]) -> bytes:
    """Encode the body of a control message (``kind`` set) as a msgpack map.

    Args:
        body: a mapping with string keys and msgpack-native values (None, bool, int,
            float, str, bytes, lists/tuples and str-keyed dicts of those).

    Returns:
        The payload bytes.

    Raises:
        FrameError: ``reason="bad-control"`` when the body is not a str-keyed mapping or
            holds a value msgpack cannot encode; ``reason="too-large"`` past
            :data:`MAX_CONTROL_BYTES`.
    """
    if type(body) is not dict and not isinstance(body, Mapping):
        raise FrameError(
            f"control body must be a mapping, got {type(body).__name__}", reason="bad-control"
        )
    for key in body:  # a loop, not all(): every ack and heartbeat passes here
        if type(key) is not str:
            raise FrameError("control body keys must all be strings", reason="bad-control")
    try:
        data: bytes = _packb(body if type(body) is dict else dict(body))
    except (TypeError, ValueError, OverflowError) as exc:
        raise FrameError(
            f"control body cannot be encoded ({exc}); use plain str/int/float/bool/bytes/"
            f"None values, lists and str-keyed dicts",
            reason="bad-control",
        ) from None
    if len(data) > MAX_CONTROL_BYTES:
        raise _too_large(len(data))
    return data


def decode_control(data: bytes) -> dict[str, Any]:
    """Decode the body of a control message.

    Args:
        data: the payload frame of a message whose envelope has ``kind`` set.

    Returns:
        The body: a dict with string keys (nested maps have string keys too; arrays are
        lists).

    Raises:
        FrameError: ``reason="too-large"``, ``"bad-msgpack"``, or ``"bad-control"`` when
            the value is not a str-keyed map or uses msgpack extension types.
    """
    try:
        if len(data) > MAX_CONTROL_BYTES:
            raise _too_large(len(data))
        body = _unpackb(data, ext_hook=_refuse_ext)
    except FrameError:
        raise
    except Exception as exc:
        raise FrameError(
            f"control payload is not one well-formed msgpack value with string map keys ({exc})",
            reason="bad-msgpack",
        ) from exc
    if type(body) is dict:
        for key in body:  # a loop, not all(): every ack and heartbeat passes here
            if type(key) is not str:
                break
        else:
            return body
    raise FrameError(
        f"control payload must be a msgpack map with string keys, got {type(body).__name__}",
        reason="bad-control",
    )


def _bad(reason: str, message: str) -> FrameError:
    return FrameError(message, reason=reason)


def _is_int(value: object) -> bool:
    return type(value) is int


# -- hb -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The body of ``hb``: the sender is alive.

    Attributes:
        last_seqs: per broadcast channel (``control`` excluded), the last sequence number
            sent, so that a receiver that missed the end of a stream counts the loss.
        draining: the sender takes no new work.
    """

    last_seqs: Mapping[str, int] = field(default_factory=dict)
    draining: bool = False


def encode_heartbeat(beat: Heartbeat) -> bytes:
    """Encode a ``hb`` body: ``{"s": {channel: seq}, "d": draining}``."""
    return encode_control({"s": dict(beat.last_seqs), "d": beat.draining})


def decode_heartbeat(data: bytes) -> Heartbeat:
    """Decode a ``hb`` body.

    Raises:
        FrameError: ``reason="bad-heartbeat"`` when ``s`` is not a map of channel names
            to sequence numbers (>= 0) or ``d`` is not a boolean; the reasons of
            :func:`decode_control` for a payload that is no msgpack map.
    """
    body = decode_control(data)
    seqs = body.get("s", {})
    draining = body.get("d", False)
    if not isinstance(seqs, dict) or not all(
        isinstance(ch, str) and _is_int(seq) and seq >= 0 for ch, seq in seqs.items()
    ):
        raise _bad("bad-heartbeat", "heartbeat 's' must map channel names to sequence numbers")
    if type(draining) is not bool:
        raise _bad("bad-heartbeat", f"heartbeat 'd' must be a boolean, not {draining!r:.40}")
    return Heartbeat(seqs, draining)


# -- ack ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ack:
    """The body of ``ack``: the direct messages received (journaled first when the
    receiver keeps a journal), each named by its first sequence number.

    Attributes:
        firsts: the first sequence number of each message acknowledged.
        incarnation: the incarnation of the sender acknowledged to; set in a *carried*
            acknowledgement (the third frame of a direct message, see
            :mod:`porter_mesh.core.session.acks`), which travels on a connection that a
            restarted peer may have taken over. None in an ``ack`` message, whose
            connection names the sender's incarnation already.
    """

    firsts: tuple[int, ...]
    incarnation: int | None = None


def encode_ack(ack: Ack) -> bytes:
    """Encode an ``ack`` body: ``{"f": [seq, ...]}``, with ``"e": incarnation`` when
    the acknowledgement is carried."""
    if ack.incarnation is None:
        return encode_control({"f": list(ack.firsts)})
    return encode_control({"f": list(ack.firsts), "e": ack.incarnation})


def decode_ack(data: bytes) -> Ack:
    """Decode an ``ack`` body.

    Raises:
        FrameError: ``reason="bad-ack"`` when ``f`` is not an array of sequence numbers
            (>= 1) or ``e`` is present and not an incarnation (0 .. 2**63-1); the
            reasons of :func:`decode_control`.
    """
    body = decode_control(data)
    firsts = body.get("f")
    # Loops and type() tests rather than all() and helpers: one ack (or a carried one)
    # comes with every direct message.
    if type(firsts) is not list:
        raise _bad("bad-ack", "ack 'f' must be an array of sequence numbers >= 1")
    for seq in firsts:
        if type(seq) is not int or seq < 1:
            raise _bad("bad-ack", "ack 'f' must be an array of sequence numbers >= 1")
    incarnation = body.get("e")
    if incarnation is not None and not (type(incarnation) is int
                                        and 0 <= incarnation < 1 << 63):
        raise _bad("bad-ack", "ack 'e' must be an incarnation, an integer in [0, 2**63)")
    return Ack(tuple(firsts), incarnation)


# -- hello / welcome ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Introduction:
    """The body of ``hello`` and of ``welcome``: who the sender is and whom it knows.

    Attributes:
        advert: the sender's own discovery record, with the addresses it is reached at.
        peers: the peers on the sender's roster (peer exchange, for networks without
            multicast), each with its addresses.
    """

    advert: PeerAdvert
    peers: tuple[PeerAdvert, ...] = ()


@dataclass(frozen=True, slots=True)
class ObserverHello:
    """The body of an observer's ``hello`` (``{"o": 1}``): it joins no roster and
    carries no advert, but wants a welcome that tells it who is there."""


def _txt_and_addresses(advert: PeerAdvert) -> list[Any]:
    return [encode_txt(advert), list(advert.addresses)]


def encode_hello(hello: Introduction | ObserverHello) -> bytes:
    """Encode a ``hello`` body: ``{"a": TXT, "x": [address...], "p": [[TXT, [address...]]...]}``,
    or ``{"o": 1}`` for an observer."""
    if isinstance(hello, ObserverHello):
        return encode_control({"o": 1})
    me, peers = hello.advert, hello.peers
    return encode_control({"a": encode_txt(me), "x": list(me.addresses),
                           "p": [_txt_and_addresses(p) for p in peers]})


def encode_welcome(welcome: Introduction) -> bytes:
    """Encode a ``welcome`` body (the same map as a hello's)."""
    return encode_hello(welcome)


@functools.lru_cache(maxsize=4096)
def _known_advert(txt: tuple[tuple[Any, Any], ...], addresses: tuple[Any, ...]) -> PeerAdvert:
    return decode_txt(dict(txt), addresses=addresses)


def _advert(txt: Any, addresses: Any) -> PeerAdvert:
    """One advert of an introduction. Every hello and welcome lists the peers its sender
    knows, so a node of an N-node mesh is told the same N adverts some 2N times as it
    joins: an entry seen before is the advert decoded then (adverts are immutable), and
    only a new one is checked again. A malformed entry (not hashable) is decoded, and
    refused, as it is."""
    try:
        key = (tuple(txt.items()), tuple(addresses))
        hash(key)
    except (AttributeError, TypeError):
        return decode_txt(txt, addresses=addresses)
    return _known_advert(*key)


def _introduction(body: dict[str, Any]) -> Introduction:
    try:
        advert = _advert(body["a"], body["x"])
        peers = tuple(_advert(txt, addresses)
                      for txt, addresses in body.get("p", [])[:MAX_INTRODUCED_PEERS])
    except (ProtocolError, KeyError, TypeError, ValueError) as exc:
        raise _bad("bad-hello", f"bad introduction: {exc}") from None
    return Introduction(advert, peers)


def decode_hello(data: bytes) -> Introduction | ObserverHello:
    """Decode a ``hello`` body.

    Returns:
        :class:`ObserverHello` when ``o`` is set, else the :class:`Introduction`
        (at most :data:`MAX_INTRODUCED_PEERS` peers; the rest are ignored).

    Raises:
        FrameError: ``reason="bad-hello"`` when the advert, an address or a peer is
            malformed; the reasons of :func:`decode_control`.
    """
    body = decode_control(data)
    if body.get("o"):
        return ObserverHello()
    return _introduction(body)


def decode_welcome(data: bytes) -> Introduction:
    """Decode a ``welcome`` body (see :func:`decode_hello`; never an observer's).

    Raises:
        FrameError: as :func:`decode_hello`.
    """
    return _introduction(decode_control(data))


# -- bye, drain, halt, unsupported ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bye:
    """The body of ``bye`` (empty): the sender leaves the mesh now."""


def encode_bye(bye: Bye | None = None) -> bytes:
    """Encode a ``bye`` body: ``{}``."""
    return encode_control({})


def decode_bye(data: bytes) -> Bye:
    """Decode a ``bye`` body (any map; its keys are ignored).

    Raises:
        FrameError: the reasons of :func:`decode_control`.
    """
    decode_control(data)
    return Bye()


@dataclass(frozen=True, slots=True)
class Command:
    """The body of the operator's commands ``drain`` and ``halt``.

    Attributes:
        target: the one agent meant; ``None`` for every node that receives it.
    """

    target: str | None = None


def encode_command(command: Command) -> bytes:
    """Encode a ``drain`` or ``halt`` body: ``{"to": agent}``, or ``{}`` for everyone."""
    return encode_control({} if command.target is None else {"to": command.target})


def decode_command(data: bytes) -> Command:
    """Decode a ``drain`` or ``halt`` body.

    Raises:
        FrameError: ``reason="bad-control"`` when ``to`` is present and not a string;
            the reasons of :func:`decode_control`.
    """
    target = decode_control(data).get("to")
    if target is not None and not isinstance(target, str):
        raise _bad("bad-control", f"command 'to' must be an agent name, not {target!r:.40}")
    return Command(target)


@dataclass(frozen=True, slots=True)
class Unsupported:
    """The body of ``unsupported``: the receiver does not run ``kind``."""

    kind: str


def encode_unsupported(answer: Unsupported) -> bytes:
    """Encode an ``unsupported`` body: ``{"k": kind}``."""
    return encode_control({"k": answer.kind})


def decode_unsupported(data: bytes) -> Unsupported:
    """Decode an ``unsupported`` body.

    Raises:
        FrameError: ``reason="bad-control"`` when ``k`` is not a kind tag (1 to
            :data:`MAX_KIND_CHARS` characters); the reasons of :func:`decode_control`.
    """
    kind = decode_control(data).get("k")
    if not isinstance(kind, str) or not 0 < len(kind) <= MAX_KIND_CHARS:
        raise _bad("bad-control", f"unsupported 'k' must be a kind tag, not {kind!r:.40}")
    return Unsupported(kind)


# -- stats, stats-reply ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StatsRequest:
    """The body of ``stats`` (no bytes at all): send me your view."""


def encode_stats_request(request: StatsRequest | None = None) -> bytes:
    """Encode a ``stats`` body: the empty payload."""
    return b""


def decode_stats_request(data: bytes) -> StatsRequest:
    """Decode a ``stats`` body; its bytes are ignored, so a later version may add some."""
    return StatsRequest()


@dataclass(frozen=True, slots=True)
class StatsReply:
    """The body of ``stats-reply``: the answering node's view, a JSON object."""

    view: Mapping[str, Any]


def encode_stats_reply(reply: StatsReply) -> bytes:
    """Encode a ``stats-reply`` body: the view as JSON (UTF-8)."""
    data: bytes = orjson.dumps(reply.view)
    return data


def decode_stats_reply(data: bytes) -> StatsReply:
    """Decode a ``stats-reply`` body.

    Raises:
        FrameError: ``reason="too-large"`` past :data:`MAX_CONTROL_BYTES`;
            ``reason="bad-json"`` when it is not one JSON object.
    """
    return StatsReply(_json_object(data, "stats reply"))


# -- spans / spans-reply ------------------------------------------------------------------

#: Most trace ids one ``spans`` request may name.
MAX_SPAN_QUERY_IDS: Final = 64


@dataclass(frozen=True, slots=True)
class SpansRequest:
    """The body of ``spans``: which traces to return.

    Attributes:
        trace_ids: 32-hex trace ids.
        context: a task context; every trace with a span about it is returned too.
    """

    trace_ids: tuple[str, ...] = ()
    context: str | None = None


def encode_spans_request(request: SpansRequest) -> bytes:
    """Encode a ``spans`` body as a JSON object."""
    body: dict[str, Any] = {"trace_ids": list(request.trace_ids)}
    if request.context is not None:
        body["context"] = request.context
    data: bytes = orjson.dumps(body)
    return data


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    if len(data) > MAX_CONTROL_BYTES:
        raise _too_large(len(data))
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise _bad("bad-json", f"{what} is not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise _bad("bad-json", f"{what} must be a JSON object, not {type(value).__name__}")
    return value


def decode_spans_request(data: bytes) -> SpansRequest:
    """Decode a ``spans`` body.

    Raises:
        FrameError: ``reason="bad-json"`` for anything but an object with a list of at
            most :data:`MAX_SPAN_QUERY_IDS` 32-hex ids and an optional context string.
    """
    body = _json_object(data, "spans request")
    ids = body.get("trace_ids", [])
    context = body.get("context")
    if (not isinstance(ids, list) or len(ids) > MAX_SPAN_QUERY_IDS
            or not all(isinstance(t, str) and len(t) == 32 for t in ids)
            or not (context is None or (isinstance(context, str) and 0 < len(context) <= 512))):
        raise _bad("bad-json", "spans request must hold trace_ids (up to "
                   f"{MAX_SPAN_QUERY_IDS} ids of 32 hex digits) and an optional context")
    return SpansRequest(tuple(t.lower() for t in ids), context)


def encode_spans_reply(reply: Mapping[str, Any]) -> bytes:
    """Encode a ``spans-reply`` body: ``{"spans": [...], "ring": {...}}`` as JSON."""
    data: bytes = orjson.dumps(reply)
    return data


def decode_spans_reply(data: bytes) -> dict[str, Any]:
    """Decode a ``spans-reply`` body.

    Raises:
        FrameError: ``reason="too-large"`` or ``"bad-json"`` (not an object with a
            ``spans`` list).
    """
    body = _json_object(data, "spans reply")
    if not isinstance(body.get("spans"), list):
        raise _bad("bad-json", "spans reply must hold a list 'spans'")
    return body


# -- spans-keep / spans-kept ----------------------------------------------------------

#: Most span records one ``spans-keep`` may hand over.
MAX_KEPT_SPANS: Final = 16
_SPAN_KINDS: Final = frozenset({"internal", "server", "client", "producer", "consumer"})
_SPAN_STATUSES: Final = frozenset({"unset", "ok", "error"})
_HEX = frozenset("0123456789abcdef")


def _hex_id(value: object, digits: int) -> bool:
    return (isinstance(value, str) and len(value) == digits and set(value) <= _HEX
            and value != "0" * digits)


def _attribute(value: object) -> bool:
    if isinstance(value, list):
        return len(value) <= 64 and all(_attribute(v) and not isinstance(v, list)
                                        for v in value)
    if isinstance(value, str):
        return len(value) <= 1024
    return isinstance(value, bool | int | float)


def span_record_problem(record: object) -> str | None:
    """What is wrong with a span record from a peer (``None`` when it is one).

    A record is what an agent's ring keeps (:data:`porter_mesh.tracing.ring.SpanRecord`):
    ``trace_id`` (32 lowercase hex), ``span_id`` (16), ``parent_id`` (16 or null),
    ``name``, ``kind``, ``service``, ``start_ns`` <= ``end_ns``, ``status``,
    ``status_message`` and ``attributes`` (at most 64 scalars or lists of scalars).
    """
    if not isinstance(record, dict):
        return f"a span record must be an object, not {type(record).__name__}"
    if not (_hex_id(record.get("trace_id"), 32) and _hex_id(record.get("span_id"), 16)):
        return "trace_id must be 32 and span_id 16 lowercase hex digits"
    parent = record.get("parent_id")
    if parent is not None and not _hex_id(parent, 16):
        return "parent_id must be null or 16 lowercase hex digits"
    for key in ("name", "service"):
        value = record.get(key)
        if not isinstance(value, str) or not 0 < len(value) <= 256:
            return f"{key} must be a string of 1-256 characters"
    if record.get("kind") not in _SPAN_KINDS or record.get("status") not in _SPAN_STATUSES:
        return f"kind must be one of {sorted(_SPAN_KINDS)}, status one of {sorted(_SPAN_STATUSES)}"
    start, end = record.get("start_ns"), record.get("end_ns")
    if not (type(start) is int and type(end) is int and 0 < start <= end):
        return "start_ns and end_ns must be integers, 0 < start_ns <= end_ns"
    message = record.get("status_message", "")
    if not isinstance(message, str) or len(message) > 1024:
        return "status_message must be a string of at most 1024 characters"
    attributes = record.get("attributes", {})
    if (not isinstance(attributes, dict) or len(attributes) > 64
            or not all(isinstance(k, str) and len(k) <= 256 and _attribute(v)
                       for k, v in attributes.items())):
        return "attributes must map at most 64 names to scalars or lists of scalars"
    return None


def encode_spans_keep(spans: Sequence[Mapping[str, Any]]) -> bytes:
    """Encode a ``spans-keep`` body: ``{"spans": [record, ...]}`` as JSON."""
    data: bytes = orjson.dumps({"spans": list(spans)})
    return data


def decode_spans_keep(data: bytes) -> list[dict[str, Any]]:
    """Decode a ``spans-keep`` body.

    Raises:
        FrameError: ``reason="bad-json"`` unless it holds a list ``spans`` of at most
            :data:`MAX_KEPT_SPANS` valid span records (:func:`span_record_problem`);
            ``"too-large"`` past :data:`MAX_CONTROL_BYTES`.
    """
    spans = _json_object(data, "spans-keep").get("spans")
    if not isinstance(spans, list) or not 0 < len(spans) <= MAX_KEPT_SPANS:
        raise _bad("bad-json", f"spans-keep must hold a list 'spans' of 1-{MAX_KEPT_SPANS} "
                   "span records")
    for record in spans:
        problem = span_record_problem(record)
        if problem is not None:
            raise _bad("bad-json", f"spans-keep: {problem}")
    return spans


def encode_spans_kept(kept: Mapping[str, Any]) -> bytes:
    """Encode a ``spans-kept`` body: ``{"kept": n}`` as JSON."""
    data: bytes = orjson.dumps(kept)
    return data


def decode_spans_kept(data: bytes) -> dict[str, Any]:
    """Decode a ``spans-kept`` body.

    Raises:
        FrameError: ``reason="bad-json"`` unless it is an object with an integer ``kept``.
    """
    body = _json_object(data, "spans-kept")
    if not _is_int(body.get("kept")):
        raise _bad("bad-json", "spans-kept must hold an integer 'kept'")
    return body


# -- the table --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KindSpec:
    """One control kind: how it travels, what its body is and its codec.

    Attributes:
        kind: the tag carried in the envelope's ``k``.
        routes: how it may travel (a request and its reply may share a kind, as sync).
        meaning: one line for people.
        encode: body value -> payload bytes.
        decode: payload bytes -> body value; raises
            :class:`~porter_mesh.errors.FrameError` (``SyncError`` for sync).
        node_owned: handled by the node itself; a protocol on top cannot register it.
    """

    kind: str
    routes: frozenset[Route]
    meaning: str
    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], object]
    node_owned: bool = False


def _spec(kind: str, routes: Sequence[Route], meaning: str, encode: Callable[[Any], bytes],
          decode: Callable[[bytes], object], *, node_owned: bool = False) -> KindSpec:
    return KindSpec(kind, frozenset(routes), meaning, encode, decode, node_owned)


_B, _D, _R = Route.BROADCAST, Route.DIRECT, Route.REPLY

#: Every control kind of this protocol version, by tag.
KINDS: Final[Mapping[str, KindSpec]] = MappingProxyType({spec.kind: spec for spec in (
    _spec(KIND_HEARTBEAT, [_B], "alive; last sequence per channel; draining",
          encode_heartbeat, decode_heartbeat, node_owned=True),
    _spec(KIND_HELLO, [_D], "introduce myself and the peers I know",
          encode_hello, decode_hello, node_owned=True),
    _spec(KIND_WELCOME, [_R], "answer a hello the same way",
          encode_welcome, decode_welcome, node_owned=True),
    _spec(KIND_ACK, [_R], "direct messages received", encode_ack, decode_ack,
          node_owned=True),
    _spec(KIND_BYE, [_B], "leaving the mesh now", encode_bye, decode_bye, node_owned=True),
    _spec(KIND_DRAIN, [_B], "finish current work, take no more",
          encode_command, decode_command),
    _spec(KIND_HALT, [_B], "stop now", encode_command, decode_command),
    _spec(KIND_UNSUPPORTED, [_R], "I do not run that kind",
          encode_unsupported, decode_unsupported),
    _spec(KIND_STATS, [_D], "send me your view", encode_stats_request, decode_stats_request),
    _spec(KIND_STATS_REPLY, [_R], "my view", encode_stats_reply, decode_stats_reply),
    _spec(KIND_SYNC, [_B, _D, _R], "knowledge-graph replication", encode_sync, decode_sync),
    _spec(KIND_SPANS, [_D], "send me your recent spans of these traces",
          encode_spans_request, decode_spans_request),
    _spec(KIND_SPANS_REPLY, [_R], "my recent spans", encode_spans_reply, decode_spans_reply),
    _spec(KIND_SPANS_KEEP, [_D], "keep these finished spans of mine (I am leaving)",
          encode_spans_keep, decode_spans_keep),
    _spec(KIND_SPANS_KEPT, [_R], "kept them", encode_spans_kept, decode_spans_kept),
)})

#: The kinds the node handles itself (a protocol on top may not take them).
NODE_KINDS: Final = frozenset(k for k, spec in KINDS.items() if spec.node_owned)
