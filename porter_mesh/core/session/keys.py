"""Idempotency keys on the receiving side: which keyed direct messages were seen lately.

Theory of operation
-------------------
A sender that cannot tell whether its message arrived (its deadline passed, or it
restarted) may send it again with the same *idempotency key*. The key travels as the
message id (``k:`` and the key, see :data:`KEY_PREFIX`). The receiver remembers each
(sender, key) for ``window`` seconds of **wall-clock** time, because the window must
hold across the receiver's restarts (the delivery journal keeps each key with the wall
time it arrived), and the monotonic clock starts again at every boot. A keyed message
whose key is remembered is a duplicate: acknowledged, never delivered again.

Keys are kept oldest first. Expired keys are dropped from the front as new ones come;
past ``limit`` keys the oldest is dropped even before it expires (a bound on memory,
about 100 bytes a key). A retry that arrives after its key was dropped is delivered
again: the window is a promise for ``window`` seconds and ``limit`` keys, whichever
ends first.

Pure: the caller passes the wall time (seconds since the epoch).
"""

from __future__ import annotations

from typing import Final

__all__ = ["KEY_PREFIX", "MAX_KEYS", "MAX_KEY_CHARS", "IdempotencyKeys", "key_of"]

#: The message id of a direct message sent with an idempotency key is this plus the key.
KEY_PREFIX: Final = "k:"
#: Longest idempotency key.
MAX_KEY_CHARS: Final = 256
#: Most keys a receiver remembers.
MAX_KEYS: Final = 100_000


def key_of(msg_id: str) -> str | None:
    """The idempotency key a message id carries, or None for an ordinary id."""
    return msg_id[len(KEY_PREFIX):] if msg_id.startswith(KEY_PREFIX) else None


class IdempotencyKeys:
    """The (sender, key) pairs seen within the window, oldest first.

    Args:
        window: seconds (wall clock) a key is remembered.
        limit: most keys remembered; past it the oldest goes.
    """

    def __init__(self, *, window: float, limit: int = MAX_KEYS) -> None:
        self.window = window
        self.limit = limit
        # (sender, key) -> wall-clock expiry; insertion order is arrival order.
        self._expiry: dict[tuple[str, str], float] = {}

    def __len__(self) -> int:
        return len(self._expiry)

    def seen(self, sender: str, key: str, wall: float) -> bool:
        """Whether ``key`` from ``sender`` repeats one seen within the window; if not,
        it is remembered from now on.

        Args:
            sender: the sending agent.
            key: the idempotency key.
            wall: the wall time now (seconds since the epoch).

        Returns:
            True for a duplicate (acknowledge it, do not deliver it).
        """
        keys = self._expiry
        entry = (sender, key)
        expiry = keys.get(entry)
        if expiry is not None and expiry > wall:
            return True
        keys.pop(entry, None)  # expired: it goes to the back again
        keys[entry] = wall + self.window
        while keys:
            oldest = next(iter(keys))
            if keys[oldest] > wall and len(keys) <= self.limit:
                break
            del keys[oldest]
        return False

    def restore(self, sender: str, key: str, arrived: float) -> None:
        """Remember a key that arrived at wall time ``arrived`` (from the journal of an
        earlier run of this node; oldest first, as it was written)."""
        self._expiry[(sender, key)] = arrived + self.window

    def forget(self, sender: str, key: str) -> None:
        """Forget a key whose message was not kept after all (the journal could not
        write it): its retry must be delivered."""
        self._expiry.pop((sender, key), None)
