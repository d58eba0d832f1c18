"""Why a ZeroMQ handshake failed, read from libzmq's socket monitor.

Theory of operation
-------------------
A node that cannot talk to a peer because of keys would otherwise learn it only from
silence: its messages are never acknowledged. libzmq knows better and says so on a
socket's monitor, right after the TCP connection: ``HANDSHAKE_FAILED_PROTOCOL`` with
``ZMTP_MECHANISM_MISMATCH`` when one side speaks CURVE and the other ZeroMQ's NULL
mechanism (no keys), ``HANDSHAKE_FAILED_AUTH`` with the ZAP status code (400) when the
server's ZAP handler refused the client's key, ``HANDSHAKE_SUCCEEDED`` otherwise.
:func:`classify` turns those events into a :class:`Refusal` (or a success); a
:class:`HandshakeWatch` reads one socket's monitor without blocking.

What each side can see. The client learns the reason, as above. A CURVE server meets a
keyless client before any ZAP request is made (the mechanisms are compared in the
greeting), so no ZAP handler hears of it: the server's own monitor reports the mismatch
with the server's endpoint only, not the client's address (libzmq's version-1 monitor
events carry one address, the local one for a bound socket) and no key, since the
client has none. A client with a key that is not trusted does reach ZAP, which sees its
address and key (:class:`~porter_mesh.adapters.security.MeshAuthenticator`).
"""

from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass
from typing import Final

import zmq
from zmq.utils.monitor import parse_monitor_message

__all__ = ["HandshakeOutcome", "HandshakeWatch", "Refusal", "classify"]

#: The monitor events a watch asks for.
HANDSHAKE_EVENTS: Final = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                           | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                           | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_MECHANISM_MISMATCH: Final = zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH


class Refusal(enum.Enum):
    """Why a peer refused a connection."""

    #: This side has no key; the other runs CurveZMQ.
    NEEDS_KEYS = "needs-keys"
    #: This side runs CurveZMQ; the other has no key (a secured node never downgrades).
    NOT_SECURED = "not-secured"
    #: The server's ZAP handler refused this side's key: it is not trusted there.
    KEY_REFUSED = "key-refused"


@dataclass(frozen=True, slots=True)
class HandshakeOutcome:
    """How one handshake ended.

    Attributes:
        succeeded: the connection is up.
        refusal: why it was refused, when it was for a reason that keys explain.
        endpoint: the endpoint libzmq reported (the remote one for a connecting socket,
            the local one for a bound socket).
    """

    succeeded: bool
    refusal: Refusal | None
    endpoint: str


def classify(event: int, value: int, endpoint: str, *, secured: bool) -> HandshakeOutcome | None:
    """The outcome a monitor event reports, or None when it reports no handshake outcome.

    Args:
        event: the ``zmq.EVENT_*`` number.
        value: the event's value (a protocol error or a ZAP status code).
        endpoint: the event's endpoint.
        secured: this side runs CurveZMQ.
    """
    if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
        return HandshakeOutcome(True, None, endpoint)
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == _MECHANISM_MISMATCH:
        return HandshakeOutcome(False, Refusal.NOT_SECURED if secured else Refusal.NEEDS_KEYS,
                                endpoint)
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return HandshakeOutcome(False, Refusal.KEY_REFUSED, endpoint)
    if event & HANDSHAKE_EVENTS:
        return HandshakeOutcome(False, None, endpoint)
    return None


class HandshakeWatch:
    """The handshake events of one socket, read without blocking.

    Args:
        sock: the socket to watch (before it connects, so that no event is missed).
        secured: this side runs CurveZMQ (see :func:`classify`).
    """

    def __init__(self, sock: zmq.Socket[bytes], *, secured: bool) -> None:
        self.watched = sock
        self.secured = secured
        self.monitor: zmq.Socket[bytes] = sock.get_monitor_socket(HANDSHAKE_EVENTS)
        self.monitor.setsockopt(zmq.LINGER, 0)

    def read(self) -> list[HandshakeOutcome]:
        """The outcomes reported since the last call (all of them: the descriptor is
        edge-triggered; there is at most one event per connection attempt)."""
        out: list[HandshakeOutcome] = []
        while True:
            try:
                frames = self.monitor.recv_multipart(zmq.NOBLOCK)
            except (zmq.Again, zmq.ZMQError):
                break
            try:
                message = parse_monitor_message(frames)
            except (ValueError, IndexError, TypeError):
                continue
            endpoint = message["endpoint"]
            text = endpoint.decode("utf-8", "replace") if isinstance(endpoint, bytes) else ""
            outcome = classify(int(message["event"]), int(message["value"]), text,
                               secured=self.secured)
            if outcome is not None:
                out.append(outcome)
        return out

    def close(self) -> None:
        """Stop monitoring and close the monitor socket (idempotent)."""
        if not self.watched.closed:
            with contextlib.suppress(zmq.ZMQError):
                self.watched.disable_monitor()
        self.monitor.close(linger=0)
