"""Subscriptions both ways: the channels this node receives, and who receives its own.

This node's SUB sockets (the shared one, or one per link on a secured node) subscribe to
each channel's topic and, after it, to a second topic that names this node and the
channel, ``\\xff<name>\\x00<channel>``, on which nothing is ever published. A peer's XPUB
reads those: :meth:`Subscriptions.subscribers` is then the set of nodes a broadcast on a
channel reaches, which a command that broadcasts once waits for. 0xff never occurs in
UTF-8, so no published topic starts with it; and it sorts after every real topic, so a
SUB that connects sends it after the subscription it stands for (libzmq replays
subscriptions in byte order).

An observer (``porter-mesh tail``) subscribes to ``task:`` too: each node republishes a
copy of the direct messages it accepts, only while a subscription to them reached its
XPUB (:attr:`Subscriptions.direct_watched`).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

import zmq

from porter_mesh.core import constants as C
from porter_mesh.core.envelope import encode_topic

__all__ = ["OBSERVE_PREFIX", "Subscriptions"]

#: The topic prefix of the observer copies of direct messages (``task:<agent>``).
OBSERVE_PREFIX = C.DIRECT_PREFIX.encode()
#: First byte of a subscription that names its subscriber (see the module docstring).
_MARK = b"\xff"


def _marker(name: str, channel: str) -> bytes:
    return _MARK + name.encode() + b"\x00" + channel.encode()


def _watches_direct(subs: collections.Counter[bytes]) -> bool:
    """Whether any subscription matches the observer copies of direct messages
    (topics ``task:<agent>``): a prefix of ``task:`` or a topic under it."""
    return any(n > 0 and (OBSERVE_PREFIX.startswith(t) or t.startswith(OBSERVE_PREFIX))
               for t, n in subs.items())


class Subscriptions:
    """The channels a node receives and the subscriptions that reached its PUB.

    Args:
        name: this node's agent name.
        sub_sockets: the node's SUB sockets now (the shared one and the links').
    """

    def __init__(self, name: str,
                 sub_sockets: Callable[[], list[zmq.Socket[bytes]]]) -> None:
        self._name = name
        self._sub_sockets = sub_sockets
        self._channels: set[str] = set()
        self._observing = False
        # Subscriptions that reached this node's XPUB: per topic, and per (channel,
        # subscriber name) from the markers.
        self._topics: collections.Counter[bytes] = collections.Counter()
        self._named: collections.Counter[tuple[str, str]] = collections.Counter()
        #: Whether an observer subscribes to the copies of direct messages.
        self.direct_watched = False

    # -------------------------------------------------------------- what we receive

    @property
    def channels(self) -> frozenset[str]:
        """Channels this node receives."""
        return frozenset(self._channels)

    def receives(self, channel: str) -> bool:
        """Whether this node receives ``channel``."""
        return channel in self._channels

    def topics(self) -> list[bytes]:
        """The topics a new SUB socket subscribes to."""
        topics = [encode_topic(channel) for channel in self._channels]
        topics += [_marker(self._name, channel) for channel in self._channels]
        return [*topics, OBSERVE_PREFIX] if self._observing else topics

    def subscribe(self, channel: str) -> None:
        """Receive broadcasts on ``channel`` from now on (idempotent)."""
        if channel not in self._channels:
            self._channels.add(channel)
            for sub in self._sub_sockets():
                sub.setsockopt(zmq.SUBSCRIBE, encode_topic(channel))
                sub.setsockopt(zmq.SUBSCRIBE, _marker(self._name, channel))

    def unsubscribe(self, channel: str) -> None:
        """Stop receiving ``channel`` (``control`` cannot be dropped)."""
        if channel == C.CHANNEL_CONTROL or channel not in self._channels:
            return
        self._channels.discard(channel)
        for sub in self._sub_sockets():
            sub.setsockopt(zmq.UNSUBSCRIBE, _marker(self._name, channel))
            sub.setsockopt(zmq.UNSUBSCRIBE, encode_topic(channel))

    def observe_direct(self) -> None:
        """Also receive the copies of direct messages (see the module docstring)."""
        self._observing = True
        for sub in self._sub_sockets():
            sub.setsockopt(zmq.SUBSCRIBE, OBSERVE_PREFIX)

    # -------------------------------------------------------------- who receives ours

    def on_subscription(self, frame: bytes) -> None:
        """One (un)subscription read from this node's XPUB."""
        if frame[1:2] == _MARK:
            self._on_marker(frame)
            return
        topics = self._topics
        if frame[:1] == b"\x01":
            topics[frame[1:]] += 1
        elif frame[:1] == b"\x00" and topics[frame[1:]] > 0:
            topics[frame[1:]] -= 1

    def read_done(self) -> None:
        """A read of the XPUB ended: see whether observers still watch direct messages."""
        self.direct_watched = _watches_direct(self._topics)

    def _on_marker(self, frame: bytes) -> None:
        name, _, channel = frame[2:].partition(b"\x00")
        key = (channel.decode("utf-8", "replace"), name.decode("utf-8", "replace"))
        if frame[:1] == b"\x01":
            self._named[key] += 1
        elif self._named[key] > 1:
            self._named[key] -= 1
        else:
            self._named.pop(key, None)

    def reset(self) -> None:
        """The PUB socket was replaced: no subscription reached the new one yet."""
        self._topics.clear()
        self._named.clear()
        self.direct_watched = False

    def subscribers(self, channel: str) -> frozenset[str]:
        """The names of the nodes whose subscription to ``channel`` reached this node's
        PUB (see :meth:`Node.subscribers`)."""
        return frozenset(name for (ch, name), n in self._named.items()
                         if ch == channel and n > 0)

    def count(self, channel: str) -> int:
        """How many subscriber sockets currently receive ``channel`` from this node."""
        return self._topics[encode_topic(channel)]

    async def wait_for(self, channel: str, count: int, timeout: float) -> None:
        """Wait until ``count`` subscribers receive ``channel`` from this node.

        Raises:
            TimeoutError: fewer subscribed within ``timeout`` seconds.
        """
        deadline = time.monotonic() + timeout
        while self.count(channel) < count:
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"only {self.count(channel)} of {count} subscribers on "
                    f"{channel!r} within {timeout}s")
            await asyncio.sleep(0.01)
