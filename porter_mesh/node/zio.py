"""Non-blocking ZeroMQ reads and writes for the node's hot paths.

pyzmq's convenience layer costs more than the work on small messages: ``recv_multipart``
asks for ``RCVMORE`` with a system call per frame, every option and flag passes through
an ``enum``, ``send_multipart`` checks each part in Python, and an empty non-blocking
read raises ``zmq.Again``, whose construction alone takes several microseconds. These
helpers call the compiled backend directly with plain integer constants, poll with a
zero timeout instead of provoking ``Again`` on an empty socket (cheaper than asking
``EVENTS``, whose getter looks the option up in an ``enum`` each time; both make ZeroMQ
process pending commands and re-arm the descriptor), and read the "more" flag from the
frame itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, cast

import zmq
from zmq.backend import Socket as _BackendSocket
from zmq.backend import zmq_poll as _zmq_poll

__all__ = ["readable", "recv_frames", "recv_frames_from", "send_frames"]

# Unbound methods of the compiled class, typed for the integer options used here.
_send = cast(Callable[..., None], _BackendSocket.send)
_recv = cast(Callable[..., zmq.Frame], _BackendSocket.recv)

NOBLOCK: Final = int(zmq.NOBLOCK)
_MORE: Final = int(zmq.NOBLOCK | zmq.SNDMORE)
_POLLIN: Final = int(zmq.POLLIN)
_USER_ID: Final = "User-Id"


def readable(sock: zmq.Socket[Any]) -> bool:
    """Whether a message is waiting on ``sock`` (which also re-arms its descriptor)."""
    return bool(_zmq_poll([(sock, _POLLIN)], 0))


def _read(sock: zmq.Socket[Any]) -> tuple[list[bytes], zmq.Frame] | None:
    """The frames of the next message and its last frame object, or ``None``."""
    if not _zmq_poll([(sock, _POLLIN)], 0):
        return None
    frame = _recv(sock, NOBLOCK, copy=False)
    parts = [frame.bytes]
    while frame.more:
        frame = _recv(sock, NOBLOCK, copy=False)
        parts.append(frame.bytes)
    return parts, frame


def recv_frames(sock: zmq.Socket[Any]) -> list[bytes] | None:
    """The frames of the next message on ``sock``, or ``None`` if none is waiting."""
    got = _read(sock)
    return None if got is None else got[0]


def recv_frames_from(sock: zmq.Socket[Any]) -> tuple[list[bytes], str] | None:
    """Like :func:`recv_frames`, with the ZAP ``User-Id`` of the connection the message
    came on (``""`` when there is none)."""
    got = _read(sock)
    if got is None:
        return None
    parts, frame = got
    try:
        user = frame.get(_USER_ID)
    except zmq.ZMQError:
        user = ""
    return parts, str(user or "")


def send_frames(sock: zmq.Socket[Any], frames: Sequence[bytes]) -> None:
    """Send one message without blocking.

    Raises:
        zmq.Again: the socket is at its high-water mark; nothing was sent (ZeroMQ takes
            the remaining frames of a message once it has taken the first).
    """
    # Copying sends: ZeroMQ takes a copy of each frame at once. (A zero-copy send only
    # pays off for large frames, and it starts pyzmq's garbage-collector thread.)
    last = len(frames) - 1
    for i in range(last):
        _send(sock, frames[i], _MORE)
    _send(sock, frames[last], NOBLOCK)
