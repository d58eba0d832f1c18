"""What a sender's caller waits on: a future per send, or one for a burst, and the
exception a failed send raises in it, saying what to do."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from porter_mesh.core.session.frames import Fail
from porter_mesh.errors import DeliveryError, DeliveryTimeout, NodeClosedError, PeerRefusedError

__all__ = ["Completion", "Countdown", "fail_all", "send_error", "settle"]


class Countdown:
    """One future for a whole burst of direct messages: done when every one is
    acknowledged, failed as soon as one fails."""

    __slots__ = ("future", "left")

    def __init__(self, future: asyncio.Future[None], count: int) -> None:
        self.future = future
        self.left = count


#: The completion token the sending rules carry for each direct message.
Completion = asyncio.Future[None] | Countdown


def settle(done: Completion) -> None:
    """One message of ``done`` was acknowledged."""
    if type(done) is Countdown:
        done.left -= 1
        if done.left == 0 and not done.future.done():
            done.future.set_result(None)
    elif not done.done():  # type: ignore[union-attr]
        done.set_result(None)  # type: ignore[union-attr]


def fail_all(tokens: Iterable[Completion], exc: BaseException) -> None:
    """Fail every caller waiting on ``tokens`` with ``exc`` (once each)."""
    for done in tokens:
        future = done.future if type(done) is Countdown else done
        if not future.done():  # type: ignore[union-attr]
            future.set_exception(exc)  # type: ignore[union-attr]


def send_error(fail: Fail[Completion], *, me: str, max_pending: int,
               refusal: PeerRefusedError | None) -> Exception:
    """The exception a failed send raises in its caller.

    Args:
        fail: the sending rules' failure (recipient, reason, count, attempts).
        me: this node's name.
        max_pending: the node's limit of unacknowledged messages per recipient.
        refusal: the recipient's refusal of this node, if it refused it.
    """
    recipient = fail.recipient
    if fail.reason == "deadline":
        return DeliveryTimeout(
            f"{recipient} did not acknowledge {fail.count} message(s) after "
            f"{fail.attempts} attempt(s); it may be stopped, overloaded or gone",
            recipient=recipient)
    if fail.reason == "overflow":
        return DeliveryError(
            f"{max_pending} messages to {recipient} are already waiting "
            "for acknowledgement; the receiver is slow or stopped, retry later",
            recipient=recipient)
    if fail.reason == "left":
        return DeliveryError(
            f"{recipient} left the mesh before it received this (a command line's seat "
            "that has finished)", recipient=recipient)
    if fail.reason == "refused":
        if refusal is not None:
            return PeerRefusedError(str(refusal), recipient=recipient, reason=refusal.reason)
        return PeerRefusedError(f"{recipient} refused the connection of {me}; "
                                "see docs/security.md", recipient=recipient)
    return NodeClosedError(f"node {me} closed before {recipient} acknowledged")
