"""Knowledge records, their identity, the replica state and the sync messages (pure).

Theory of operation
-------------------
The knowledge graph is replicated as a set of immutable **records**. A record is either
an :class:`Observation` (a fact: ``about``, ``finding``, who found it, when, optional
task context and severity) or a :class:`Retraction` (the permanent withdrawal of one
observation). Each record is written once by its **origin** (the agent that made it),
which numbers its records ``1, 2, 3 ...``: the pair ``(origin, seq)`` is the record's
place in the replication log, and is the only ordering the mesh ever uses. Timestamps
are data, never order, so clock skew between machines can neither reorder nor lose a
record.

Identity is content-derived. An observation's id is the SHA-256 of a canonical,
length-prefixed encoding of *all* its fields (about, finding, discoveredBy, context,
severity, generatedAtTime); its RDF subject is ``urn:porter:obs:<hex id>``. The same
observation received twice (by broadcast and again by a pull) is therefore stored once,
and a record whose content does not hash to the id it carries is refused as forged or
corrupted. ``generatedAtTime`` is part of the identity on purpose: stating a fact again
later is a new observation, so a retraction (which is permanent) never forbids a fact
from being learned again.

**Signatures and the chain.** A record may carry its author's Ed25519 signature over
:func:`record_signing_bytes`: a tag, the kind, the origin, the seq, the content id
(which hashes every content field) and ``prev``, the :func:`record_link` of the
author's record ``seq - 1`` (a BLAKE2b-256 of that record's signed bytes and its
signature). One signature therefore binds the record to its place in its origin's log
and, through ``prev``, every earlier record of that log, signatures included. A run of
records ``a..b`` from one origin is proved by one check: record ``b``'s signature, then
``prev`` of each record against the link of the one below it, down to ``a``
(:func:`authenticate`). A record whose link does not match is checked on its own. This
module carries signatures and links and says what is signed; making and checking
signatures needs keys, which belong to the adapters (a secured mesh checks every record
before it is stored, whatever path brought it). Neither is part of a record's identity:
Ed25519 signatures are deterministic, and the content id is what replicas compare.

Merge is set union and therefore idempotent and commutative: a record already held is a
duplicate, a new record is appended, and the graph an observer sees is *observations
held* minus *observations retracted*. A retraction that arrives before its observation
leaves a tombstone, so the observation, when it comes, is not resurrected. Two records
that claim the same ``(origin, seq)`` with different content are a conflict: a forged or
broken peer; the whole message carrying it is refused (:class:`SyncError`) and nothing
is changed.

:class:`ReplicaState` holds what replication needs in memory, 24 bytes per record: per
origin, an array of *locators* (where the adapter stored the record, e.g. a journal
offset) indexed by ``seq``, and a 16-byte record key per slot. From it come the
**version vector** (per origin, the highest ``seq`` up to which nothing is missing), the
gaps to pull, the ranges to serve, and the **digest**. Changes happen in two steps so
that a refused message leaves no trace: :meth:`ReplicaState.plan` validates a batch and
says what it would change, and, once the adapter has made the new records durable,
:meth:`ReplicaState.apply` commits the plan.

Anti-entropy uses range digests over bucketed record keys, as Zenoh's storage alignment
and negentropy do for immutable hash-identified items. Record keys (the first 16 bytes
of the content id) are spread over :data:`DIGEST_BUCKETS` buckets by their first byte;
a bucket's fingerprint hashes its count and the sum of its keys modulo 2**128, so adding
a record updates one bucket in O(1) and two replicas compare in one 4 KiB message. Only
differing buckets are then listed (``(origin, seq, key)`` entries), and what is missing
is pulled by ordinary ``(origin, first, last)`` range requests. The version vector
repairs ordinary loss cheaply; the digest catches what it cannot see (a hole above the
contiguous point that nobody announced, or a replica that diverged).

Sync messages are msgpack maps with a one-letter-ish ``"t"`` tag; ``encode_*`` and
:func:`decode_sync` are plain functions. Decoding checks every field, every limit and
every record's hash before anything is applied.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import gc
import hashlib
import re
import struct
import sys
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any, Final, TypeAlias

import msgpack

from porter_mesh.core.advert import AGENT_NAME_RE
from porter_mesh.core.constants import MAX_MESSAGE_BYTES, PORTER_VOCAB, PROV_NS
from porter_mesh.errors import KnowledgeError, SyncError

__all__ = [
    "DIGEST_BUCKETS",
    "LINK_BYTES",
    "MAX_ABOUT_CHARS",
    "MAX_CATCHUP_RECORDS",
    "MAX_CONTEXT_CHARS",
    "MAX_ENTRIES",
    "MAX_FINDING_CHARS",
    "MAX_PULL_SPAN",
    "MAX_RECORDS_PER_MESSAGE",
    "MAX_SEQ",
    "MAX_SEQ_AHEAD",
    "MAX_SEVERITY_CHARS",
    "OBS_IRI_PREFIX",
    "SIGNATURE_BYTES",
    "BucketEntries",
    "CatchupChunk",
    "CatchupRequest",
    "Digest",
    "MergePlan",
    "Observation",
    "PullReply",
    "PullRequest",
    "Record",
    "RecordKind",
    "Records",
    "ReplicaState",
    "Retraction",
    "SyncMessage",
    "authenticate",
    "decode_record",
    "decode_sync",
    "encode_record",
    "encode_sync",
    "format_timestamp",
    "observation_id_from_iri",
    "observation_iri",
    "pull_requests_for",
    "record_from_journal",
    "record_link",
    "record_signing_bytes",
    "sign_record",
]

# --- vocabulary -------------------------------------------------------------------------

RDF_TYPE: Final = "http://www.w3.org/1999/02/22-rdf-syntax-ns#type"
XSD_DATETIME: Final = "http://www.w3.org/2001/XMLSchema#dateTime"
OBSERVATION_CLASS: Final = PORTER_VOCAB + "Observation"
P_ABOUT: Final = PORTER_VOCAB + "about"
P_FINDING: Final = PORTER_VOCAB + "finding"
P_DISCOVERED_BY: Final = PORTER_VOCAB + "discoveredBy"
P_CONTEXT: Final = PORTER_VOCAB + "context"
P_SEVERITY: Final = PORTER_VOCAB + "severity"
P_GENERATED_AT: Final = PROV_NS + "generatedAtTime"
#: Subject IRI of an observation: this prefix and the hex of its id.
OBS_IRI_PREFIX: Final = "urn:porter:obs:"

# --- limits -----------------------------------------------------------------------------

MAX_ABOUT_CHARS: Final = 2048
MAX_FINDING_CHARS: Final = 16384
MAX_CONTEXT_CHARS: Final = 256
MAX_SEVERITY_CHARS: Final = 32
#: Largest sequence number (so that it fits every msgpack integer and a JSON double).
MAX_SEQ: Final = (1 << 53) - 1
#: A record may claim at most this many sequence numbers beyond the highest one already
#: held from its origin (plus the size of the batch carrying it). A replica further
#: behind than this catches up by a chunked catch-up, which brings records in order.
MAX_SEQ_AHEAD: Final = 1 << 16
#: Most sequence numbers one pull may ask for.
MAX_PULL_SPAN: Final = 4096
#: Most records one message may carry (the byte limit, MAX_MESSAGE_BYTES, also applies:
#: observations of typical size, some 200 bytes, fill it at about 20k). Large chunks make
#: a catch-up fast: the store indexes big batches for a fraction of the cost of small ones.
MAX_RECORDS_PER_MESSAGE: Final = 16384
#: Most records a catch-up request may ask for per chunk.
MAX_CATCHUP_RECORDS: Final = MAX_RECORDS_PER_MESSAGE
#: Most (origin, seq, key) entries in one bucket listing.
MAX_ENTRIES: Final = 16384
#: Buckets of the anti-entropy digest (fixed by the protocol: both sides must agree).
DIGEST_BUCKETS: Final = 256
#: Most origins a version vector may name.
MAX_ORIGINS: Final = 4096

_ID_BYTES: Final = 32
_KEY_BYTES: Final = 16
_FP_BYTES: Final = 16
_KEY_MOD: Final = 1 << (8 * _KEY_BYTES)
_SEVERITY_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,32}")
# The time of day is checked by the pattern itself (23:59:60 allows a leap second); the
# date, whose validity depends on month and year, by _real_date (cached: records made on
# the same day share it).
_TIMESTAMP_RE: Final = re.compile(
    r"(\d{4}-\d\d-\d\d)T(?:[01]\d|2[0-3]):[0-5]\d:(?:[0-5]\d|60)(?:\.\d{1,6})?Z")
_OBS_TAG: Final = b"porter-observation/1\n"
_RETRACT_TAG: Final = b"porter-retraction/1\n"
_SIGNED_TAG: Final = b"porter-record-signature/2\n"
#: Length of a record's Ed25519 signature.
SIGNATURE_BYTES: Final = 64
#: Length of a chain link (``Record.prev``, :func:`record_link`).
LINK_BYTES: Final = 32
# What the signed bytes hold in place of a link when a record states none (its author's
# first record, or a record signed alone): it matches no record's link.
_NO_LINK: Final = bytes(LINK_BYTES)


def _fail(message: str, *, local: bool) -> KnowledgeError:
    """A local caller's mistake is a KnowledgeError; a peer's is a SyncError."""
    return KnowledgeError(message) if local else SyncError(message)


_KNOWN_ORIGINS: set[str] = set()  # names already checked (bounded below)


def _check_origin(value: object, *, local: bool) -> str:
    if value.__class__ is str and value in _KNOWN_ORIGINS:
        return value
    if not isinstance(value, str) or not AGENT_NAME_RE.fullmatch(value):
        raise _fail(
            f"origin {value!r} is not an agent name (1-63 of a-z 0-9 - _)", local=local
        )
    if len(_KNOWN_ORIGINS) < MAX_ORIGINS:
        _KNOWN_ORIGINS.add(value)
    return value


def _check_seq(value: object, what: str, *, local: bool) -> int:
    if type(value) is not int or not 1 <= value <= MAX_SEQ:
        raise _fail(f"{what} must be an integer in 1..{MAX_SEQ}, got {value!r}", local=local)
    return value


@functools.lru_cache(maxsize=1024)
def _real_date(text: str) -> bool:
    try:
        date.fromisoformat(text)
    except ValueError:
        return False
    return True


def _check_timestamp(value: object, what: str, *, local: bool) -> str:
    match = _TIMESTAMP_RE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise _fail(
            f"{what} must be an xsd:dateTime in UTC such as 2026-01-31T12:00:00.000000Z, "
            f"got {value!r:.80}",
            local=local,
        )
    if not _real_date(match.group(1)):
        raise _fail(f"{what} {value!r} is not a real date", local=local)
    return value  # type: ignore[return-value]


def format_timestamp(epoch_seconds: float) -> str:
    """Format a POSIX time as the canonical ``generatedAtTime`` text.

    Args:
        epoch_seconds: seconds since the epoch (``time.time()``).

    Returns:
        ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` in UTC.
    """
    stamp = datetime.fromtimestamp(epoch_seconds, tz=UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def observation_iri(obs_id: bytes) -> str:
    """The RDF subject IRI of the observation with id ``obs_id``."""
    return OBS_IRI_PREFIX + obs_id.hex()


def observation_id_from_iri(text: str) -> bytes:
    """Parse an observation id from its IRI (``urn:porter:obs:<hex>``) or bare hex.

    Args:
        text: the IRI, or the 64 hex digits alone.

    Returns:
        The 32-byte id.

    Raises:
        KnowledgeError: ``text`` is neither.
    """
    hex_part = text[len(OBS_IRI_PREFIX):] if text.startswith(OBS_IRI_PREFIX) else text
    try:
        raw = bytes.fromhex(hex_part)
    except ValueError:
        raw = b""
    if len(raw) != _ID_BYTES:
        raise KnowledgeError(
            f"{text!r} is not an observation id: expected {OBS_IRI_PREFIX}<64 hex digits>"
        )
    return raw


# --- records ----------------------------------------------------------------------------


def _canonical_field(value: object, what: str, limit: int) -> bytes:
    """One text field of an observation's canonical bytes: 0x00, 4-byte length, UTF-8."""
    if type(value) is not str or not 0 < len(value) <= limit:
        raise KnowledgeError(f"{what} must be a string of 1-{limit} characters, got {value!r:.80}")
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError:
        raise KnowledgeError(f"{what} is not valid Unicode text") from None
    return b"\x00" + len(data).to_bytes(4, "big") + data


_KNOWN_SEVERITIES: set[str] = set()  # severities already checked (bounded below)
#: The 0x00 and 4-byte length that stand before each present field's UTF-8.
_HEAD: Final = struct.Struct(">xI").pack
#: An absent optional field in the canonical bytes.
_ABSENT: Final = b"\xff"


def _observation_id(
    about: object, finding: object, by: object, at: object, context: object, severity: object,
) -> bytes:
    """Check an observation's fields and return its id (SHA-256 of the canonical bytes).

    This runs for every record decoded from a peer, so it is straight-line code; the
    checks and the errors are those of :class:`Observation`.

    Raises:
        KnowledgeError: a field is missing, too long or malformed.
    """
    canonical = None
    if (
        type(about) is str and type(finding) is str and type(by) is str and type(at) is str
        and 0 < len(about) <= MAX_ABOUT_CHARS and 0 < len(finding) <= MAX_FINDING_CHARS
        and 0 < len(by) <= 64 and 0 < len(at) <= 64
        and (context is None or (type(context) is str and 0 < len(context) <= MAX_CONTEXT_CHARS))
        and (severity is None
             or (type(severity) is str and 0 < len(severity) <= MAX_SEVERITY_CHARS))
    ):
        try:  # the usual case: every field well-formed text
            a, f, b, t = about.encode(), finding.encode(), by.encode(), at.encode()
            c = _ABSENT if context is None else _HEAD(len(enc := context.encode())) + enc
            s = _ABSENT if severity is None else _HEAD(len(enc := severity.encode())) + enc
            canonical = b"".join((_OBS_TAG, _HEAD(len(a)), a, _HEAD(len(f)), f,
                                  _HEAD(len(b)), b, c, s, _HEAD(len(t)), t))
        except UnicodeEncodeError:
            pass
    if canonical is None:  # find the first field at fault, in order, for its error
        for value, what, limit in (
            (about, "about", MAX_ABOUT_CHARS), (finding, "finding", MAX_FINDING_CHARS),
            (by, "discoveredBy", 64), (context, "context", MAX_CONTEXT_CHARS),
            (severity, "severity", MAX_SEVERITY_CHARS), (at, "generatedAtTime", 64),
        ):
            if value is not None or what not in ("context", "severity"):
                _canonical_field(value, what, limit)
        raise AssertionError("unreachable: a field failed the checks above")
    _check_origin(by, local=True)
    if severity is not None and severity not in _KNOWN_SEVERITIES:
        if not isinstance(severity, str) or not _SEVERITY_RE.fullmatch(severity):
            raise KnowledgeError(
                f"severity {severity!r} must be 1-{MAX_SEVERITY_CHARS} of A-Z a-z 0-9 _ -"
                " (for example info, low, medium, high, critical)"
            )
        if len(_KNOWN_SEVERITIES) < MAX_ORIGINS:
            _KNOWN_SEVERITIES.add(severity)
    _check_timestamp(at, "generatedAtTime", local=True)
    return hashlib.sha256(canonical).digest()


class RecordKind(enum.IntEnum):
    """What a record carries. The value is its tag on the wire."""

    OBSERVATION = 0
    RETRACTION = 1


@dataclass(frozen=True, slots=True)
class Observation:
    """One immutable fact in the knowledge graph.

    Attributes:
        about: what the finding is about (an IRI-like name such as
            ``urn:porter:file:server.ts``, stored as a plain literal).
        finding: the fact itself, in words.
        discovered_by: the agent that made the observation (its origin).
        generated_at: when, as canonical UTC ``xsd:dateTime`` text (see
            :func:`format_timestamp`). Data only: never used for ordering.
        context: the task it belongs to (``urn:porter:task:<id>``), if any.
        severity: a short token such as ``info`` or ``high``, if any.
        id: SHA-256 of the canonical content (computed, not given).

    Raises:
        KnowledgeError: a field is missing, too long or malformed.
    """

    about: str
    finding: str
    discovered_by: str
    generated_at: str
    context: str | None = None
    severity: str | None = None
    id: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", _observation_id(
            self.about, self.finding, self.discovered_by, self.generated_at, self.context,
            self.severity))

    @property
    def iri(self) -> str:
        """The RDF subject, ``urn:porter:obs:<hex id>``."""
        return observation_iri(self.id)


@dataclass(frozen=True, slots=True)
class Retraction:
    """The permanent withdrawal of one observation, replicated like any record.

    Attributes:
        target: the id of the observation withdrawn.
        retracted_by: the agent that withdrew it (its origin).
        retracted_at: when, as canonical UTC ``xsd:dateTime`` text (data only).
        id: SHA-256 of the canonical content (computed).

    Raises:
        KnowledgeError: a field is malformed.
    """

    target: bytes
    retracted_by: str
    retracted_at: str
    id: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.target, bytes) or len(self.target) != _ID_BYTES:
            raise KnowledgeError("a retraction's target must be a 32-byte observation id")
        _check_origin(self.retracted_by, local=True)
        _check_timestamp(self.retracted_at, "retractedAt", local=True)
        canonical = b"".join((
            _RETRACT_TAG,
            self.target,
            _canonical_field(self.retracted_by, "retractedBy", 64),
            _canonical_field(self.retracted_at, "retractedAt", 64),
        ))
        object.__setattr__(self, "id", hashlib.sha256(canonical).digest())


Body: TypeAlias = Observation | Retraction


@dataclass(frozen=True, slots=True)
class Record:
    """One entry of the replication log: a body placed at ``(origin, seq)``.

    Attributes:
        origin: the agent that wrote the record (``discovered_by`` / ``retracted_by``).
        seq: its place in the origin's log, from 1, never reused.
        body: the :class:`Observation` or :class:`Retraction`.
        key: the first 16 bytes of ``body.id``; what the digest is made of, and what
            tells two different records claiming the same slot apart.
        wire: the record's encoding, when it is already known (kept to avoid re-encoding
            what was read from disk); not part of equality.
        sig: the author's Ed25519 signature over :func:`record_signing_bytes`, or
            ``None`` (records made on an unsecured mesh); not part of equality.
        prev: the :func:`record_link` of the author's record ``seq - 1``, which the
            signature covers, or ``None`` (no link: a first record, an unsigned one);
            not part of equality.

    Raises:
        KnowledgeError: ``origin`` does not match the body's author, or ``seq`` is out of
            range.
    """

    origin: str
    seq: int
    body: Body
    key: bytes = field(init=False, repr=False)
    wire: bytes | None = field(default=None, compare=False, repr=False)
    sig: bytes | None = field(default=None, compare=False, repr=False)
    prev: bytes | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_seq(self.seq, "seq", local=True)
        if self.sig is not None and (
                not isinstance(self.sig, bytes) or len(self.sig) != SIGNATURE_BYTES):
            raise KnowledgeError(f"a record signature must be {SIGNATURE_BYTES} bytes")
        if self.prev is not None and (
                not isinstance(self.prev, bytes) or len(self.prev) != LINK_BYTES):
            raise KnowledgeError(f"a record's chain link must be {LINK_BYTES} bytes")
        author = (
            self.body.discovered_by
            if isinstance(self.body, Observation)
            else self.body.retracted_by
        )
        if author != self.origin:
            raise KnowledgeError(
                f"record origin {self.origin!r} differs from its author {author!r}: "
                "a record is written by the agent that made it"
            )
        object.__setattr__(self, "key", self.body.id[:_KEY_BYTES])

    @property
    def kind(self) -> RecordKind:
        """Whether the body is an observation or a retraction."""
        if isinstance(self.body, Observation):
            return RecordKind.OBSERVATION
        return RecordKind.RETRACTION


def record_signing_bytes(record: Record) -> bytes:
    """The bytes an author signs for ``record`` (and a replica checks the signature on).

    A tag, the origin (length-prefixed), the kind, the seq (8 bytes), the 32-byte
    content id and the 32-byte chain link ``prev`` (zeros when the record has none); the
    id is the SHA-256 of every content field, so the signature covers the content, the
    record's place in its origin's log and, through the link, the author's earlier
    records.

    Args:
        record: the record.

    Returns:
        The canonical bytes to sign.
    """
    kind = b"\x00" if record.body.__class__ is Observation else b"\x01"
    return b"".join((_signed_prefix(record.origin), kind, record.seq.to_bytes(8, "big"),
                     record.body.id, record.prev or _NO_LINK))


@functools.lru_cache(maxsize=MAX_ORIGINS)
def _signed_prefix(origin: str) -> bytes:
    """The tag and the length-prefixed origin: the same for all of an origin's records
    (kept, as every record proved by a chain is hashed over its signed bytes)."""
    raw = origin.encode("ascii")  # agent names are ASCII by their pattern
    return _SIGNED_TAG + len(raw).to_bytes(1, "big") + raw


def record_link(record: Record) -> bytes:
    """The link the author's next record carries as ``prev``.

    BLAKE2b-256 of :func:`record_signing_bytes` and the signature (empty when there is
    none). Covering the signature means a record proved by the chain also carries its
    author's own signature, so a replica never stores, nor serves alone later, a
    signature it has not proved; covering the signed bytes, which hold the record's own
    ``prev``, makes the chain reach every earlier record.

    Args:
        record: the author's record ``seq``.

    Returns:
        The 32-byte link.
    """
    return hashlib.blake2b(record_signing_bytes(record) + (record.sig or b""),
                           digest_size=LINK_BYTES).digest()


def sign_record(record: Record, prev: bytes | None, sign: Callable[[bytes], bytes]) -> Record:
    """``record`` chained to ``prev`` and signed by its author.

    Args:
        record: the author's new record (any signature or link it has is replaced).
        prev: the :func:`record_link` of the author's record ``seq - 1``, or ``None``
            for its first record.
        sign: the author's signer (64-byte Ed25519 signature of the given bytes).

    Returns:
        The record carrying ``prev`` and the signature.
    """
    chained = Record(record.origin, record.seq, record.body, prev=prev)
    return Record(record.origin, record.seq, record.body,
                  sig=sign(record_signing_bytes(chained)), prev=prev)


def authenticate(
    records: Sequence[Record],
    check: Callable[[Record], str | None],
    *,
    held: Callable[[Record], bool],
) -> dict[int, str]:
    """Prove who wrote each record of a batch, with one signature check per run.

    Records not ``held`` are taken per origin from the highest seq down. A record whose
    successor in the batch (same origin, ``seq + 1``) was proved, and whose link that
    successor names as its ``prev``, is proved by hashing alone: the successor's
    signature covers the link, and the link covers this record's signed bytes and
    signature. Any other record (the top of a run, the record below a broken link, a
    record beside a held one) is proved by its own signature, ``check``. So a genuine
    run costs one check, and a record altered inside it is refused alone: its successor
    no longer vouches for it, its own signature fails, and the records below it are
    checked afresh. A held record is neither checked nor used to vouch for others: its
    copy in the batch is not the one that was checked.

    The link a run's lowest record carries is not compared with the record held below
    it: proof runs downwards only, so that comparison would prove nothing more. Two
    records the author signed for one slot are a conflict, which the merge plan refuses.

    Args:
        records: the batch.
        check: checks one record's own signature; ``None`` when good, else the reason.
        held: whether a record is already held (same slot, same content).

    Returns:
        The refused records: index in ``records`` -> reason from ``check``.
    """
    order = sorted((i for i, record in enumerate(records) if not held(record)),
                   key=lambda i: (records[i].origin, records[i].seq), reverse=True)
    refused: dict[int, str] = {}
    proved: Record | None = None  # the last record proved, one seq above the next
    for i in order:
        record = records[i]
        if (proved is not None and proved.prev is not None
                and proved.seq == record.seq + 1 and proved.origin == record.origin
                and proved.prev == record_link(record)):
            proved = record
            continue
        reason = check(record)
        if reason is None:
            proved = record
        else:
            refused[i] = reason
            proved = None
    return refused


def encode_record(record: Record) -> bytes:
    """Encode one record (a msgpack array) for the journal or the wire.

    Args:
        record: the record.

    Returns:
        ``[0, origin, seq, id, about, finding, generatedAt, context, severity]`` or
        ``[1, origin, seq, id, target, retractedAt]`` packed with msgpack, with the
        signature appended as one more item when the record carries one, and after it
        the chain link when it carries that too.
    """
    if record.wire is not None:
        return record.wire
    body = record.body
    if isinstance(body, Observation):
        item: list[Any] = [
            0, record.origin, record.seq, body.id, body.about, body.finding,
            body.generated_at, body.context, body.severity,
        ]
    else:
        item = [1, record.origin, record.seq, body.id, body.target, body.retracted_at]
    if record.sig is not None:
        item.append(record.sig)
        if record.prev is not None:
            item.append(record.prev)
    return msgpack.packb(item, use_bin_type=True)


def _record_from_item(item: object, *, wire: bytes | None) -> Record:
    """Build a record from its decoded msgpack array; every problem is a SyncError."""
    if not isinstance(item, list) or not item:
        raise SyncError("a record must be a non-empty array")
    kind = item[0]
    sig: bytes | None = None
    prev: bytes | None = None
    try:
        if kind == RecordKind.OBSERVATION and len(item) in (9, 10, 11):
            _, origin, seq, claimed, about, finding, at, context, severity = item[:9]
            origin = _check_origin(origin, local=False)
            _check_seq(seq, "seq", local=False)
            body: Body = _new_observation(
                about, finding, origin, at, context, severity,
                _observation_id(about, finding, origin, at, context, severity))
            extra = item[9:]
        elif kind == RecordKind.RETRACTION and len(item) in (6, 7, 8):
            _, origin, seq, claimed, target, at = item[:6]
            origin = _check_origin(origin, local=False)
            _check_seq(seq, "seq", local=False)
            body = Retraction(target, origin, at)
            extra = item[6:]
        else:
            raise SyncError(
                f"a record must be [0, ...8 fields] or [1, ...5 fields], each optionally "
                f"followed by a signature and then a chain link; got kind {kind!r} with "
                f"{len(item) - 1} fields"
            )
        if extra:
            sig = extra[0]
            if not isinstance(sig, bytes) or len(sig) != SIGNATURE_BYTES:
                raise SyncError(f"record ({origin}, {seq}) refused: its signature must be "
                                f"{SIGNATURE_BYTES} bytes")
        if len(extra) == 2:
            prev = extra[1]
            if not isinstance(prev, bytes) or len(prev) != LINK_BYTES:
                raise SyncError(f"record ({origin}, {seq}) refused: its chain link must be "
                                f"{LINK_BYTES} bytes")
    except SyncError:
        raise
    except KnowledgeError as exc:  # a field rule from the dataclasses: the peer's fault
        raise SyncError(f"record refused: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise SyncError(f"record refused: malformed field ({exc})") from None
    if not isinstance(claimed, bytes) or claimed != body.id:
        raise SyncError(
            f"record ({origin}, {seq}) refused: its content does not hash to the id it "
            "carries (forged or corrupted)"
        )
    # Every rule of Record() was checked above (seq, signature and link sizes; the
    # author is the origin by construction), so the record is built without them.
    return _new_record(origin, seq, body, wire, sig, prev)


def decode_record(data: bytes) -> Record:
    """Decode one record encoded by :func:`encode_record`, checking every field.

    Args:
        data: the msgpack bytes.

    Returns:
        The record.

    Raises:
        SyncError: the bytes are not a valid record, or its content does not match its id.
    """
    try:
        item = msgpack.unpackb(data, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise SyncError(f"record is not valid msgpack: {exc}") from None
    return _record_from_item(item, wire=bytes(data))


def _build(cls: type[Any], **fields: Any) -> Any:
    """An instance of a frozen slots dataclass, fields set directly (no checks)."""
    obj = object.__new__(cls)
    for name, value in fields.items():
        object.__setattr__(obj, name, value)
    return obj


def _new_observation(about: str, finding: str, by: str, at: str, context: str | None,
                     severity: str | None, obs_id: bytes) -> Observation:
    """An :class:`Observation` whose fields were checked and id computed (no checks)."""
    obj = object.__new__(Observation)
    put = object.__setattr__
    put(obj, "about", about)
    put(obj, "finding", finding)
    put(obj, "discovered_by", by)
    put(obj, "generated_at", at)
    put(obj, "context", context)
    put(obj, "severity", severity)
    put(obj, "id", obs_id)
    return obj


def _new_record(origin: str, seq: int, body: Body, wire: bytes | None, sig: bytes | None,
                prev: bytes | None) -> Record:
    """A :class:`Record` whose fields were checked (no checks)."""
    obj = object.__new__(Record)
    put = object.__setattr__
    put(obj, "origin", origin)
    put(obj, "seq", seq)
    put(obj, "body", body)
    put(obj, "key", body.id[:_KEY_BYTES])
    put(obj, "wire", wire)
    put(obj, "sig", sig)
    put(obj, "prev", prev)
    return obj


def record_from_journal(data: bytes) -> Record:
    """Rebuild a record that this node itself checked and stored, without checking again.

    For serving pulls and catch-ups from the node's own journal, whose frames are
    checksummed: it skips field validation and hashing, about ten times cheaper than
    :func:`decode_record`. The receiving node checks everything anyway. Never use it on
    bytes from the network.

    Args:
        data: a record as :func:`encode_record` wrote it.

    Returns:
        The record, carrying ``data`` as its encoding.
    """
    item = msgpack.unpackb(data, raw=False)
    if item[0] == RecordKind.OBSERVATION:
        _, origin, seq, body_id, about, finding, at, context, severity = item[:9]
        extra = item[9:]
        body: Body = _new_observation(about, finding, origin, at, context, severity, body_id)
    else:
        _, origin, seq, body_id, target, at = item[:6]
        extra = item[6:]
        body = _build(Retraction, target=target, retracted_by=origin, retracted_at=at,
                      id=body_id)
    return _new_record(origin, seq, body, bytes(data), extra[0] if extra else None,
                       extra[1] if len(extra) == 2 else None)


# --- sync messages ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Records:
    """Records pushed to a peer: fresh Remembers (a group that shared its sync goes in
    one message), or what a digest showed it lacks."""

    records: tuple[Record, ...]


@dataclass(frozen=True, slots=True)
class PullRequest:
    """Ask a peer for ``origin``'s records ``first..last`` (inclusive).

    Raises:
        SyncError: the range is empty, inverted or longer than :data:`MAX_PULL_SPAN`.
    """

    origin: str
    first: int
    last: int

    def __post_init__(self) -> None:
        _check_origin(self.origin, local=False)
        _check_seq(self.first, "first", local=False)
        _check_seq(self.last, "last", local=False)
        if self.first > self.last:
            raise SyncError(f"pull range {self.first}..{self.last} is inverted (first > last)")
        if self.last - self.first + 1 > MAX_PULL_SPAN:
            raise SyncError(
                f"pull range {self.first}..{self.last} spans more than {MAX_PULL_SPAN} "
                "sequence numbers; split it, or use a catch-up"
            )


@dataclass(frozen=True, slots=True)
class PullReply:
    """The records a peer holds in the range asked for (holes are simply absent)."""

    origin: str
    first: int
    last: int
    records: tuple[Record, ...]

    def __post_init__(self) -> None:
        PullRequest(self.origin, self.first, self.last)  # same range rules
        for record in self.records:
            if record.origin != self.origin or not self.first <= record.seq <= self.last:
                raise SyncError(
                    f"pull reply for {self.origin} {self.first}..{self.last} carries "
                    f"record ({record.origin}, {record.seq}) outside that range"
                )


@dataclass(frozen=True, slots=True)
class CatchupRequest:
    """Ask for every record after ``vv``, in chunks (a snapshot when ``vv`` is empty).

    Attributes:
        vv: the requester's version vector (origin -> highest contiguous seq held).
        cursor: where the previous chunk stopped (``(origin, seq)``), or ``None`` to start.
        done: records received so far in this catch-up (echoed for progress).
        limit: most records wanted in the chunk.
    """

    vv: Mapping[str, int]
    cursor: tuple[str, int] | None = None
    done: int = 0
    limit: int = MAX_CATCHUP_RECORDS

    def __post_init__(self) -> None:
        _check_vv(self.vv)
        if self.cursor is not None:
            _check_cursor(self.cursor)
        _check_count(self.done, "done")
        if type(self.limit) is not int or not 1 <= self.limit <= MAX_CATCHUP_RECORDS:
            raise SyncError(f"catch-up limit must be 1..{MAX_CATCHUP_RECORDS}, got {self.limit!r}")


@dataclass(frozen=True, slots=True)
class CatchupChunk:
    """One chunk of a catch-up. Progress is ``done`` of ``total`` records.

    Attributes:
        records: the records, ordered by origin then seq.
        done: records sent so far including these.
        total: records the catch-up will send in all (an estimate that can grow if the
            sender receives more meanwhile).
        cursor: where to resume, or ``None`` when this is the last chunk.
    """

    records: tuple[Record, ...]
    done: int
    total: int
    cursor: tuple[str, int] | None

    def __post_init__(self) -> None:
        _check_count(self.done, "done")
        _check_count(self.total, "total")
        if self.done > self.total:
            raise SyncError(f"catch-up chunk says done={self.done} > total={self.total}")
        if self.cursor is not None:
            _check_cursor(self.cursor)


@dataclass(frozen=True, slots=True)
class Digest:
    """A replica's anti-entropy summary: record count and one fingerprint per bucket,
    and the version vector it was taken at (``vv``: absent from an older sender)."""

    count: int
    fingerprints: tuple[bytes, ...]
    vv: Mapping[str, int] | None = None

    def __post_init__(self) -> None:
        _check_count(self.count, "count")
        if self.vv is not None:
            _check_vv(self.vv)
        if len(self.fingerprints) != DIGEST_BUCKETS or any(
            not isinstance(fp, bytes) or len(fp) != _FP_BYTES for fp in self.fingerprints
        ):
            raise SyncError(
                f"a digest must carry {DIGEST_BUCKETS} fingerprints of {_FP_BYTES} bytes"
            )

    @property
    def top(self) -> bytes:
        """One hash over all buckets: equal tops mean equal replicas."""
        return hashlib.sha256(b"".join(self.fingerprints)).digest()[:_FP_BYTES]


@dataclass(frozen=True, slots=True)
class BucketEntries:
    """The records a replica holds in some digest buckets, as ``(origin, seq, key)``.

    Attributes:
        buckets: the bucket numbers listed.
        entries: ``(origin, seq, key)`` of every record held in those buckets.
        more: ``True`` when the listing was cut at :data:`MAX_ENTRIES` (ask again later).
    """

    buckets: tuple[int, ...]
    entries: tuple[tuple[str, int, bytes], ...]
    more: bool = False

    def __post_init__(self) -> None:
        if len(self.buckets) > DIGEST_BUCKETS or any(
            type(b) is not int or not 0 <= b < DIGEST_BUCKETS for b in self.buckets
        ):
            raise SyncError(f"bucket numbers must be 0..{DIGEST_BUCKETS - 1}")
        if len(self.entries) > MAX_ENTRIES:
            raise SyncError(f"a bucket listing carries at most {MAX_ENTRIES} entries")
        wanted = set(self.buckets)
        for origin, seq, key in self.entries:
            _check_origin(origin, local=False)
            _check_seq(seq, "seq", local=False)
            if not isinstance(key, bytes) or len(key) != _KEY_BYTES:
                raise SyncError(f"an entry key must be {_KEY_BYTES} bytes")
            if key[0] % DIGEST_BUCKETS not in wanted:
                raise SyncError("a bucket listing carries an entry from a bucket not listed")


SyncMessage: TypeAlias = (
    Records | PullRequest | PullReply | CatchupRequest | CatchupChunk | Digest | BucketEntries
)


def _check_count(value: object, what: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_SEQ:
        raise SyncError(f"{what} must be an integer in 0..{MAX_SEQ}, got {value!r}")
    return value


def _check_cursor(cursor: object) -> None:
    if not isinstance(cursor, tuple) or len(cursor) != 2:
        raise SyncError("a catch-up cursor must be [origin, seq]")
    _check_origin(cursor[0], local=False)
    _check_seq(cursor[1], "cursor seq", local=False)


def _check_vv(vv: object) -> None:
    if not isinstance(vv, Mapping):
        raise SyncError("a version vector must be a map of origin -> seq")
    if len(vv) > MAX_ORIGINS:
        raise SyncError(f"a version vector names at most {MAX_ORIGINS} origins")
    for origin, seq in vv.items():
        _check_origin(origin, local=False)
        _check_count(seq, f"version vector entry for {origin}")


def _pack_records(packer: msgpack.Packer, records: Sequence[Record]) -> bytes:
    return packer.pack_array_header(len(records)) + b"".join(encode_record(r) for r in records)


def encode_sync(message: SyncMessage) -> bytes:
    """Encode a sync message as a msgpack map.

    Args:
        message: any of the sync message dataclasses.

    Returns:
        The bytes to carry as a control payload.

    Raises:
        SyncError: the encoding would exceed MAX_MESSAGE_BYTES or
            MAX_RECORDS_PER_MESSAGE (the caller should have made smaller chunks).
    """
    packer = msgpack.Packer(use_bin_type=True)  # one per call: a Packer is not reentrant
    records: Sequence[Record] = ()
    if isinstance(message, Records):
        head: dict[str, Any] = {"t": "rec"}
        records = message.records
    elif isinstance(message, PullRequest):
        head = {"t": "pull", "o": message.origin, "f": message.first, "l": message.last}
    elif isinstance(message, PullReply):
        head = {"t": "pulled", "o": message.origin, "f": message.first, "l": message.last}
        records = message.records
    elif isinstance(message, CatchupRequest):
        head = {"t": "cu", "vv": dict(message.vv), "c": _cursor_out(message.cursor),
                "d": message.done, "n": message.limit}
    elif isinstance(message, CatchupChunk):
        head = {"t": "cc", "d": message.done, "tot": message.total,
                "c": _cursor_out(message.cursor)}
        records = message.records
    elif isinstance(message, Digest):
        head = {"t": "dg", "n": message.count, "b": list(message.fingerprints)}
        if message.vv is not None:
            head["v"] = dict(message.vv)
    else:
        head = {"t": "be", "b": list(message.buckets),
                "e": [list(e) for e in message.entries], "more": message.more}
    if len(records) > MAX_RECORDS_PER_MESSAGE:
        raise SyncError(f"{len(records)} records exceed {MAX_RECORDS_PER_MESSAGE} per message")
    carries = isinstance(message, Records | PullReply | CatchupChunk)
    out = packer.pack_map_header(len(head) + (1 if carries else 0))
    out += b"".join(packer.pack(k) + packer.pack(v) for k, v in head.items())
    if carries:
        out += packer.pack("r") + _pack_records(packer, records)
    if len(out) > MAX_MESSAGE_BYTES:
        raise SyncError(f"sync message of {len(out)} bytes exceeds {MAX_MESSAGE_BYTES}")
    return out


def _cursor_out(cursor: tuple[str, int] | None) -> list[Any] | None:
    return None if cursor is None else [cursor[0], cursor[1]]


def _cursor_in(value: object) -> tuple[str, int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise SyncError("a catch-up cursor must be [origin, seq] or nil")
    return (value[0], value[1])


class _RawRecords(list[tuple[object, bytes]]):
    """The ``"r"`` array of a message: each item decoded, with its encoding."""


_MAP_HEADERS: Final = frozenset((*range(0x80, 0x90), 0xDE, 0xDF))
_NOT_A_MAP: Final = ("a sync message must be a msgpack map with a 't' type tag, and this is "
                     "not a map")


def _unpack_message(data: bytes) -> dict[str, Any]:
    """Unpack a sync message map; each record is kept with its msgpack encoding.

    The message is unpacked in one call, then each record is packed again, which gives
    the canonical bytes the journal stores (the bytes a sender that writes with
    :func:`encode_record` sent). This path carries every record a node merges, and
    unpacking record by record, to slice out the bytes as they came, cost about three
    times as much (1.2 against 3.8 us per record measured).
    """
    try:
        msg = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        if not data or data[0] not in _MAP_HEADERS:
            raise SyncError(_NOT_A_MAP) from None
        if isinstance(exc, msgpack.ExtraData):
            raise SyncError("sync message has trailing bytes after its map") from None
        raise SyncError(f"sync message is not valid msgpack: {exc}") from None
    if not isinstance(msg, dict):
        raise SyncError(_NOT_A_MAP)
    if "r" in msg:
        items = msg["r"]
        if not isinstance(items, list):
            raise SyncError("'r' must be an array of records")
        if len(items) > MAX_RECORDS_PER_MESSAGE:
            raise SyncError(f"{len(items)} records in one message exceed the limit of "
                            f"{MAX_RECORDS_PER_MESSAGE}")
        pack = msgpack.Packer(use_bin_type=True).pack
        try:
            msg["r"] = _RawRecords([(item, pack(item)) for item in items])
        except Exception as exc:  # an ext type or a value msgpack cannot write back
            raise SyncError(f"a record is not valid msgpack: {exc}") from None
    return msg


@contextlib.contextmanager
def bulk_allocation() -> Iterator[None]:
    """Pause the cyclic garbage collector while a batch of records is built or merged.

    A batch of 16,384 records allocates some 65,000 objects that live on (records,
    bodies, plans), none of them in a cycle; each 700 allocations start a collection
    that walks them again, and the full collections it leads to walk every object of
    the process. That was a third of the decoding's time. Reference counting still
    frees everything; the collector runs as usual after the batch. Nested use and
    other threads are safe: only the outermost caller that found the collector enabled
    enables it again.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _records_in(value: object) -> tuple[Record, ...]:
    if not isinstance(value, _RawRecords):
        raise SyncError("'r' must be an array of records")
    return tuple([_record_from_item(item, wire=raw) for item, raw in value])


def decode_sync(data: bytes) -> SyncMessage:
    """Decode and fully validate a sync message.

    Args:
        data: the bytes received.

    Returns:
        The message dataclass. Every record in it has had its content hash checked.

    Raises:
        SyncError: the message is too big, not msgpack, of an unknown type, missing a
            field, or breaks any rule (see the dataclasses' docstrings).
    """
    if len(data) > MAX_MESSAGE_BYTES:
        raise SyncError(f"sync message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    with bulk_allocation():
        return _decode_message(_unpack_message(data))


def _decode_message(msg: dict[str, Any]) -> SyncMessage:
    if not isinstance(msg.get("t"), str):
        raise SyncError("a sync message must be a map with a 't' type tag")
    kind = msg["t"]
    try:
        if kind == "rec":
            return Records(_records_in(msg["r"]))
        if kind == "pull":
            return PullRequest(msg["o"], msg["f"], msg["l"])
        if kind == "pulled":
            return PullReply(msg["o"], msg["f"], msg["l"], _records_in(msg["r"]))
        if kind == "cu":
            vv = msg["vv"]
            return CatchupRequest(vv, _cursor_in(msg.get("c")), msg.get("d", 0),
                                  msg.get("n", MAX_CATCHUP_RECORDS))
        if kind == "cc":
            return CatchupChunk(_records_in(msg["r"]), msg["d"], msg["tot"],
                                _cursor_in(msg.get("c")))
        if kind == "dg":
            fps = msg["b"]
            if not isinstance(fps, list):
                raise SyncError("digest 'b' must be an array of fingerprints")
            return Digest(msg["n"], tuple(fps), msg.get("v"))
        if kind == "be":
            buckets, entries = msg["b"], msg["e"]
            if not isinstance(buckets, list) or not isinstance(entries, list):
                raise SyncError("bucket listing 'b' and 'e' must be arrays")
            if len(entries) > MAX_ENTRIES:
                raise SyncError(f"a bucket listing carries at most {MAX_ENTRIES} entries")
            parsed: list[tuple[str, int, bytes]] = []
            for entry in entries:
                if not isinstance(entry, list) or len(entry) != 3:
                    raise SyncError("a bucket entry must be [origin, seq, key]")
                parsed.append((entry[0], entry[1], entry[2]))
            return BucketEntries(tuple(buckets), tuple(parsed), bool(msg.get("more", False)))
    except KeyError as exc:
        raise SyncError(f"sync message {kind!r} lacks field {exc.args[0]!r}") from None
    except TypeError as exc:
        raise SyncError(f"sync message {kind!r} has a malformed field ({exc})") from None
    raise SyncError(f"unknown sync message type {kind!r}; this node speaks rec, pull, pulled, "
                    "cu, cc, dg, be")


# --- replica state ----------------------------------------------------------------------


class _Slots:
    """One origin's log: locator and key per seq (seq 1 at index 0; -1 means absent)."""

    __slots__ = ("contiguous", "count", "keys", "locators")

    def __init__(self) -> None:
        self.locators = array("q")
        self.keys = bytearray()
        self.contiguous = 0
        self.count = 0

    @property
    def top(self) -> int:
        return len(self.locators)

    def locator(self, seq: int) -> int:
        return self.locators[seq - 1] if 0 < seq <= len(self.locators) else -1

    def key(self, seq: int) -> bytes:
        start = (seq - 1) * _KEY_BYTES
        return bytes(self.keys[start:start + _KEY_BYTES])

    def put(self, seq: int, key: bytes, locator: int) -> None:
        if seq == len(self.locators) + 1:  # the usual case: the next record of the log
            self.locators.append(locator)
            self.keys += key
            self.count += 1
            if self.contiguous == seq - 1:
                self.contiguous = seq
            return
        grow = seq - len(self.locators)
        if grow > 0:
            self.locators.extend(array("q", [-1]) * grow)
            self.keys.extend(bytes(grow * _KEY_BYTES))
        self.locators[seq - 1] = locator
        self.keys[(seq - 1) * _KEY_BYTES:seq * _KEY_BYTES] = key
        self.count += 1
        locs, top, c = self.locators, len(self.locators), self.contiguous
        while c < top and locs[c] != -1:
            c += 1
        self.contiguous = c

    def held_after(self, seq: int) -> int:
        """How many records with a sequence number above ``seq`` are held."""
        if seq <= self.contiguous:
            return self.count - seq
        return sum(1 for loc in self.locators[seq:] if loc != -1)


@dataclass(frozen=True, slots=True)
class MergePlan:
    """What merging a batch would change; produced by :meth:`ReplicaState.plan`.

    Attributes:
        accepted: the new records, in arrival order, to be made durable then applied.
        duplicates: how many records of the batch were already held (or repeated).
        add: observations to insert into the graph (new, and not retracted).
        remove: ids of observations to delete from the graph (newly retracted).
    """

    accepted: tuple[Record, ...]
    duplicates: int
    add: tuple[Observation, ...]
    remove: tuple[bytes, ...]


class ReplicaState:
    """In-memory replication state of one shard (see the module docstring).

    Args:
        max_seq_ahead: how far past the highest sequence held from an origin a record may
            claim to be (defends against forged sequence numbers).
    """

    def __init__(self, *, max_seq_ahead: int = MAX_SEQ_AHEAD) -> None:
        self._origins: dict[str, _Slots] = {}
        self._retracted: set[bytes] = set()
        self._observations = 0
        self._retractions = 0
        self._sums = [0] * DIGEST_BUCKETS
        self._counts = [0] * DIGEST_BUCKETS
        self._max_ahead = max_seq_ahead

    # -- reading --

    @property
    def record_count(self) -> int:
        """Records held (observations and retractions, duplicates counted once)."""
        return sum(s.count for s in self._origins.values())

    @property
    def observation_records(self) -> int:
        """Observation records held (including those later retracted)."""
        return self._observations

    @property
    def retraction_records(self) -> int:
        """Retraction records held."""
        return self._retractions

    @property
    def retracted(self) -> frozenset[bytes]:
        """Ids of every observation retracted (tombstones)."""
        return frozenset(self._retracted)

    def is_retracted(self, obs_id: bytes) -> bool:
        """Whether the observation ``obs_id`` has been retracted."""
        return obs_id in self._retracted

    def version_vector(self) -> dict[str, int]:
        """Per origin, the highest seq up to which every record is held."""
        return {o: s.contiguous for o, s in sorted(self._origins.items())}

    def top_seq(self, origin: str) -> int:
        """The highest seq held from ``origin`` (0 if none)."""
        slots = self._origins.get(origin)
        return slots.top if slots else 0

    def next_seq(self, origin: str) -> int:
        """The sequence number ``origin`` must use for its next record.

        One past the highest ever held from it: after a restart the journal supplies that,
        and after a loss of the data directory the origin's own records pulled back from
        peers do, so a sequence number is never reused while any replica remembers it.
        """
        return self.top_seq(origin) + 1

    def holds(self, origin: str, seq: int) -> bool:
        """Whether record ``(origin, seq)`` is held."""
        slots = self._origins.get(origin)
        return slots is not None and slots.locator(seq) != -1

    def holds_record(self, origin: str, seq: int, key: bytes) -> bool:
        """Whether ``(origin, seq)`` is held with the record key ``key`` (the same record)."""
        slots = self._origins.get(origin)
        return slots is not None and slots.locator(seq) != -1 and slots.key(seq) == key

    def locator(self, origin: str, seq: int) -> int | None:
        """Where the adapter stored record ``(origin, seq)``, or ``None``."""
        slots = self._origins.get(origin)
        if slots is None:
            return None
        loc = slots.locator(seq)
        return None if loc == -1 else loc

    def missing_ranges(self, *, limit: int = 64) -> list[PullRequest]:
        """Gaps below the highest seq held, per origin, as pull requests to send.

        Args:
            limit: most requests returned (ask again once they are answered).
        """
        out: list[PullRequest] = []
        for origin, slots in sorted(self._origins.items()):
            self._holes(origin, slots, slots.contiguous + 1, slots.top, out, limit)
        return out[:limit]

    def ranges_behind(
        self, remote_vv: Mapping[str, int], *, limit: int = 64
    ) -> list[PullRequest]:
        """Ranges a peer's version vector shows that this replica lacks.

        Args:
            remote_vv: the peer's version vector.
            limit: most requests returned.
        """
        out: list[PullRequest] = []
        for origin, high in sorted(remote_vv.items()):
            slots = self._origins.get(origin)
            top = slots.top if slots else 0
            if slots is not None:
                self._holes(origin, slots, slots.contiguous + 1, min(high, top), out, limit)
            first = top + 1
            while first <= high and len(out) < limit:
                last = min(first + MAX_PULL_SPAN - 1, high)
                out.append(PullRequest(origin, first, last))
                first = last + 1
            if len(out) >= limit:
                break
        return out[:limit]

    def lag(self, remote_vv: Mapping[str, int]) -> int:
        """About how many records a peer with ``remote_vv`` has that this replica lacks.

        A node uses it to choose between range pulls (small lag) and a catch-up.
        """
        total = 0
        for origin, high in remote_vv.items():
            slots = self._origins.get(origin)
            total += max(0, high - (slots.contiguous if slots else 0))
        return total

    @staticmethod
    def _holes(
        origin: str, slots: _Slots, first: int, last: int, out: list[PullRequest], limit: int
    ) -> None:
        locs = slots.locators
        seq = first
        while seq <= last and len(out) < limit:
            if locs[seq - 1] != -1:
                seq += 1
                continue
            start = seq
            while seq <= last and locs[seq - 1] == -1 and seq - start < MAX_PULL_SPAN:
                seq += 1
            out.append(PullRequest(origin, start, seq - 1))

    def locators_in(self, origin: str, first: int, last: int) -> list[int]:
        """Locators of the records held in ``origin``'s range ``first..last``."""
        slots = self._origins.get(origin)
        if slots is None:
            return []
        stop = min(last, slots.top)
        return [loc for loc in slots.locators[first - 1:stop] if loc != -1]

    def catchup_slice(
        self, request: CatchupRequest
    ) -> tuple[list[tuple[str, int, int]], int, bool]:
        """The records a catch-up chunk should carry.

        Args:
            request: the peer's request.

        Returns:
            ``(items, remaining, exhausted)``: up to ``request.limit`` ``(origin, seq,
            locator)`` in (origin, seq) order, the number of records left to send from the
            request's position (including these), and whether the items reach the end.
        """
        items: list[tuple[str, int, int]] = []
        remaining = 0
        start_origin, start_seq = request.cursor if request.cursor else ("", 0)
        for origin in sorted(self._origins):
            if origin < start_origin:
                continue
            slots = self._origins[origin]
            after = request.vv.get(origin, 0)
            if origin == start_origin:
                after = max(after, start_seq - 1)
            remaining += slots.held_after(after)
            seq = after + 1
            while seq <= slots.top and len(items) < request.limit:
                loc = slots.locators[seq - 1]
                if loc != -1:
                    items.append((origin, seq, loc))
                seq += 1
        return items, remaining, len(items) >= remaining

    def digest(self) -> Digest:
        """This replica's anti-entropy digest."""
        fps = tuple(
            hashlib.blake2b(
                count.to_bytes(8, "big") + total.to_bytes(_KEY_BYTES, "big"),
                digest_size=_FP_BYTES,
            ).digest()
            for count, total in zip(self._counts, self._sums, strict=True)
        )
        return Digest(self.record_count, fps)

    def differing_buckets(self, remote: Digest) -> tuple[int, ...]:
        """Bucket numbers whose fingerprints differ from ``remote``'s."""
        mine = self.digest().fingerprints
        return tuple(i for i, (a, b) in enumerate(zip(mine, remote.fingerprints, strict=True))
                     if a != b)

    def bucket_entries(self, buckets: Iterable[int]) -> BucketEntries:
        """List the records held in ``buckets`` (cut at :data:`MAX_ENTRIES`)."""
        wanted = sorted(set(buckets))
        if any(not 0 <= b < DIGEST_BUCKETS for b in wanted):
            raise SyncError(f"bucket numbers must be 0..{DIGEST_BUCKETS - 1}")
        accept = bytearray(DIGEST_BUCKETS)
        for b in wanted:
            accept[b] = 1
        entries: list[tuple[str, int, bytes]] = []
        more = False
        for origin, slots in sorted(self._origins.items()):
            keys = slots.keys
            for index, loc in enumerate(slots.locators):
                if loc == -1 or not accept[keys[index * _KEY_BYTES] % DIGEST_BUCKETS]:
                    continue
                if len(entries) == MAX_ENTRIES:
                    more = True
                    break
                entries.append((origin, index + 1,
                                bytes(keys[index * _KEY_BYTES:(index + 1) * _KEY_BYTES])))
            if more:
                break
        return BucketEntries(tuple(wanted), tuple(entries), more)

    def lacking(self, listing: BucketEntries) -> list[PullRequest]:
        """Pull requests for the entries of a peer's listing that this replica lacks.

        Raises:
            SyncError: an entry names a slot held here with a different record (a
                conflict: one of the two replicas was fed a forged record).
        """
        wanted: dict[str, list[int]] = {}
        for origin, seq, key in listing.entries:
            slots = self._origins.get(origin)
            if slots is not None and slots.locator(seq) != -1:
                if slots.key(seq) != key:
                    raise SyncError(
                        f"peer holds a different record at ({origin}, {seq}) than this "
                        "replica: conflicting histories, one side was fed a forged record"
                    )
                continue
            wanted.setdefault(origin, []).append(seq)
        return pull_requests_for(wanted)

    # -- changing --

    def plan(
        self,
        records: Sequence[Record],
        *,
        after: Mapping[str, int] | None = None,
    ) -> MergePlan:
        """Validate a batch and work out what merging it changes; nothing is modified.

        Args:
            records: the batch (already decoded, so each content hash was checked).
            after: for a catch-up chunk, the version vector the request sent: every record
                must lie beyond it, since that is all that was asked for.

        Returns:
            The plan to make durable and then :meth:`apply`.

        Raises:
            SyncError: a record claims a sequence number implausibly far ahead, lies
                outside what was asked for, or conflicts with a record already held or
                with another record in the batch. The batch is refused as a whole.
        """
        accepted: list[Record] = []
        seen: dict[tuple[str, int], bytes] = {}
        duplicates = 0
        tops: dict[str, int] = {}
        batch = len(records)
        for record in records:
            origin, seq = record.origin, record.seq
            if after is not None and seq <= after.get(origin, 0):
                raise SyncError(
                    f"record ({origin}, {seq}) is at or below the requested starting point "
                    f"{after.get(origin, 0)}: not what the catch-up asked for"
                )
            top = tops.get(origin)
            if top is None:
                top = tops[origin] = self.top_seq(origin)
            if seq > top + self._max_ahead + batch:
                raise SyncError(
                    f"record ({origin}, {seq}) claims a sequence number more than "
                    f"{self._max_ahead} past the highest held ({top}); refused as forged "
                    "(a replica that far behind must catch up first)"
                )
            slots = self._origins.get(origin)
            if slots is not None and slots.locator(seq) != -1:
                if slots.key(seq) != record.key:
                    raise SyncError(
                        f"record ({origin}, {seq}) conflicts with the record already held "
                        "there: forged, or the origin reused a sequence number"
                    )
                duplicates += 1
                continue
            earlier = seen.get((origin, seq))
            if earlier is not None:
                if earlier != record.key:
                    raise SyncError(f"two different records claim ({origin}, {seq}) in one batch")
                duplicates += 1
                continue
            seen[(origin, seq)] = record.key
            accepted.append(record)
        newly_retracted: dict[bytes, None] = {}
        for record in accepted:
            body = record.body
            if isinstance(body, Retraction) and body.target not in self._retracted:
                newly_retracted[body.target] = None
        add: dict[bytes, Observation] = {}
        for record in accepted:
            body = record.body
            if (
                isinstance(body, Observation)
                and body.id not in self._retracted
                and body.id not in newly_retracted
            ):
                add[body.id] = body
        return MergePlan(tuple(accepted), duplicates, tuple(add.values()),
                         tuple(newly_retracted))

    def apply(self, plan: MergePlan, locators: Sequence[int]) -> None:
        """Commit a plan whose records the adapter has stored at ``locators``.

        Args:
            plan: from :meth:`plan`, with no other change to this state in between.
            locators: one non-negative locator per ``plan.accepted`` record.

        Raises:
            KnowledgeError: the locators do not match the plan.
        """
        if len(locators) != len(plan.accepted):
            raise KnowledgeError("apply() needs exactly one locator per accepted record")
        for record, loc in zip(plan.accepted, locators, strict=True):
            kind = RecordKind.OBSERVATION if isinstance(record.body, Observation) else (
                RecordKind.RETRACTION)
            target = record.body.target if isinstance(record.body, Retraction) else None
            self.load(record.origin, record.seq, record.key, kind, target, loc)

    # -- saving --

    def snapshot(self) -> bytes:
        """The whole state as bytes, for :meth:`restore` (a shard saves it at close, so
        that its next start reads only the journal written after it)."""
        origins = [[origin, s.contiguous, s.count, _locators_bytes(s.locators), bytes(s.keys)]
                   for origin, s in self._origins.items()]
        sums = b"".join(total.to_bytes(_KEY_BYTES, "big") for total in self._sums)
        return msgpack.packb([_SNAPSHOT_VERSION, self._observations, self._retractions,
                              sums, self._counts, sorted(self._retracted), origins],
                             use_bin_type=True)

    @classmethod
    def restore(cls, data: bytes, *, max_seq_ahead: int = MAX_SEQ_AHEAD) -> ReplicaState:
        """The state :meth:`snapshot` saved.

        Raises:
            KnowledgeError: ``data`` is not a snapshot of this version, or its parts do
                not agree with each other.
        """
        try:
            (version, observations, retractions, sums, counts, retracted,
             origins) = msgpack.unpackb(data, raw=False, use_list=True)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise KnowledgeError(f"not a replica state snapshot ({exc})") from None
        if version != _SNAPSHOT_VERSION:
            raise KnowledgeError(f"replica state snapshot version {version!r}, "
                                 f"not {_SNAPSHOT_VERSION}")
        state = cls(max_seq_ahead=max_seq_ahead)
        try:
            if (len(sums) != DIGEST_BUCKETS * _KEY_BYTES or len(counts) != DIGEST_BUCKETS
                    or not all(isinstance(c, int) and c >= 0 for c in counts)
                    or not all(isinstance(t, bytes) for t in retracted)):
                raise ValueError("digest buckets or tombstones malformed")
            state._sums = [int.from_bytes(sums[i:i + _KEY_BYTES], "big")
                           for i in range(0, len(sums), _KEY_BYTES)]
            state._counts = list(counts)
            state._retracted = set(retracted)
            state._observations, state._retractions = int(observations), int(retractions)
            for origin, contiguous, count, locators, keys in origins:
                slots = _Slots()
                slots.locators = _locators_from(locators)
                slots.keys = bytearray(keys)
                top = len(slots.locators)
                if (not isinstance(origin, str) or len(keys) != top * _KEY_BYTES
                        or not 0 <= contiguous <= top or not contiguous <= count <= top):
                    raise ValueError(f"the log of {origin!r} is malformed")
                slots.contiguous, slots.count = contiguous, count
                state._origins[origin] = slots
        except (ValueError, TypeError) as exc:
            raise KnowledgeError(f"replica state snapshot malformed: {exc}") from None
        if sum(state._counts) != state.record_count:
            raise KnowledgeError("replica state snapshot malformed: its digest counts "
                                 f"{sum(state._counts)} records, its logs "
                                 f"{state.record_count}")
        return state

    def load(
        self,
        origin: str,
        seq: int,
        key: bytes,
        kind: RecordKind,
        target: bytes | None,
        locator: int,
    ) -> bool:
        """Add one record known to be valid (from the node's own journal at start-up).

        Returns:
            ``False`` if the slot was already filled (the record is ignored).
        """
        if locator < 0:
            raise KnowledgeError("locators must be non-negative")
        slots = self._origins.get(origin)
        if slots is None:
            slots = self._origins[origin] = _Slots()
        if slots.locator(seq) != -1:
            return False
        slots.put(seq, key, locator)
        bucket = key[0] % DIGEST_BUCKETS
        self._sums[bucket] = (self._sums[bucket] + int.from_bytes(key, "big")) % _KEY_MOD
        self._counts[bucket] += 1
        if kind == RecordKind.RETRACTION:
            self._retractions += 1
            if target is not None:
                self._retracted.add(target)
        else:
            self._observations += 1
        return True


_SNAPSHOT_VERSION: Final = 1


def _locators_bytes(locators: array[int]) -> bytes:
    """Locators as little-endian int64s (the snapshot's byte order on any machine)."""
    if sys.byteorder == "little":
        return locators.tobytes()
    swapped = array("q", locators)
    swapped.byteswap()
    return swapped.tobytes()


def _locators_from(data: bytes) -> array[int]:
    if not isinstance(data, bytes) or len(data) % 8:
        raise ValueError("locators are not whole int64s")
    locators = array("q")
    locators.frombytes(data)
    if sys.byteorder != "little":
        locators.byteswap()
    return locators


def _spans(origin: str, first: int, last: int) -> list[PullRequest]:
    return [PullRequest(origin, lo, min(lo + MAX_PULL_SPAN - 1, last))
            for lo in range(first, last + 1, MAX_PULL_SPAN)]


def pull_requests_for(wanted: Mapping[str, Iterable[int]]) -> list[PullRequest]:
    """Group wanted sequence numbers into as few pull requests as allowed.

    Args:
        wanted: per origin, the sequence numbers to fetch.

    Returns:
        Pull requests over contiguous runs, each at most :data:`MAX_PULL_SPAN` long.
    """
    out: list[PullRequest] = []
    for origin in sorted(wanted):
        seqs = sorted(set(wanted[origin]))
        i = 0
        while i < len(seqs):
            j = i
            while j + 1 < len(seqs) and seqs[j + 1] == seqs[j] + 1:
                j += 1
            out.extend(_spans(origin, seqs[i], seqs[j]))
            i = j + 1
    return out
