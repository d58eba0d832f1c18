"""The frames the mesh's sessions speak, as typed values, and the actions they share.

A session never sees bytes: the driver decodes what arrives into one of the frames
below and encodes the frames a :class:`SendFrame` names into envelopes and control
bodies (:mod:`porter_mesh.core.envelope`, :mod:`porter_mesh.core.control`). A completion
token is opaque to a session (the node keeps futures in it); a direct message that
carries several activities settles or fails all their tokens at once.

Pure: data only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Literal, NamedTuple, TypeVar

from porter_mesh.core.advert import PeerAdvert
from porter_mesh.core.tracecontext import TraceContext

__all__ = [
    "AckFrame", "BroadcastFrame", "ByeFrame", "Count", "DirectFrame", "Fail", "FailReason",
    "Frame", "HeartbeatFrame", "HelloFrame", "SendFrame", "Settle", "WelcomeFrame",
]

T = TypeVar("T")


# -- frames ---------------------------------------------------------------------------


class DirectFrame(NamedTuple):
    """A direct message (``task:<recipient>``) of ``count`` activities from ``seq``;
    ``trace``: the W3C trace context it carries, if it belongs to a traced task.

    A ``NamedTuple`` rather than a frozen dataclass, as the envelope is, because one is
    built per message: it is as immutable and builds in about a third of the time.
    """

    sender: str
    incarnation: int
    recipient: str
    seq: int
    # Shadows tuple.count, as Envelope.count does: the wire's name reads better.
    count: int  # type: ignore[assignment]
    msg_id: str
    payload: bytes
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True)
class AckFrame:
    """``ack``: the direct messages of ``recipient`` received by ``sender``, each named
    by its first sequence number."""

    sender: str
    incarnation: int
    recipient: str
    firsts: tuple[int, ...]


class BroadcastFrame(NamedTuple):
    """A broadcast of ``count`` activities on ``channel``, numbered per (sender,
    channel) from ``seq``; ``kind`` names a control message (its body is the payload).
    A ``NamedTuple`` for the reason :class:`DirectFrame` is one."""

    sender: str
    incarnation: int
    channel: str
    seq: int
    payload: bytes
    count: int = 1  # type: ignore[assignment]
    kind: str | None = None
    trace: TraceContext | None = None


@dataclass(frozen=True, slots=True)
class HelloFrame:
    """``hello``: the sender introduces itself to ``recipient``."""

    advert: PeerAdvert
    recipient: str


@dataclass(frozen=True, slots=True)
class WelcomeFrame:
    """``welcome``: the answer to a hello, the answerer's introduction."""

    advert: PeerAdvert
    recipient: str


@dataclass(frozen=True, slots=True)
class HeartbeatFrame:
    """``hb`` on the control channel: the sender is alive."""

    sender: str
    incarnation: int


@dataclass(frozen=True, slots=True)
class ByeFrame:
    """``bye`` on the control channel: the sender leaves the mesh."""

    sender: str
    incarnation: int


Frame = (DirectFrame | AckFrame | BroadcastFrame | HelloFrame | WelcomeFrame | HeartbeatFrame
         | ByeFrame)


# -- actions shared by the sessions -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendFrame:
    """Put ``frame`` on the wire (a broadcast goes to every subscriber).

    A driver whose socket refuses a direct frame (its queue is full) sends none of the
    later direct frames to that recipient from the same list of actions: they wait in
    the outbox for their resend, so that the stream stays in order.
    """

    frame: Frame


@dataclass(frozen=True, slots=True)
class Settle(Generic[T]):
    """The direct message behind ``tokens`` was acknowledged."""

    tokens: tuple[T, ...]


#: Why a send failed: ``deadline`` (not acknowledged in time), ``overflow`` (too much in
#: flight to the recipient), ``left`` (the recipient, a command line's seat, said
#: goodbye), ``refused`` (the recipient refused this node's connection) or ``closed``
#: (this node closed first).
FailReason = Literal["deadline", "overflow", "left", "refused", "closed"]


@dataclass(frozen=True, slots=True)
class Fail(Generic[T]):
    """The direct message behind ``tokens`` (``count`` activities to ``recipient``)
    failed for ``reason`` (see :data:`FailReason`) after ``attempts`` sends."""

    tokens: tuple[T, ...]
    recipient: str
    reason: FailReason
    attempts: int = 0
    count: int = 1


@dataclass(frozen=True, slots=True)
class Count:
    """Add ``n`` to the counter ``name`` (what ``porter-mesh stats`` shows)."""

    name: str
    n: int = 1
