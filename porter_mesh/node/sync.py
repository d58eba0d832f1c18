"""A synchronous facade over :class:`~porter_mesh.node.node.Node`.

The node runs on an event loop in a daemon thread owned by the facade. Every call is
handed to that loop and waited for with a timeout: a call that cannot complete raises
:class:`~porter_mesh.errors.OperationTimeout` instead of hanging the caller.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

from porter_mesh import eventloop
from porter_mesh.core.as2 import Activity
from porter_mesh.core.peers import PeerEvent, PeerInfo
from porter_mesh.core.tracecontext import TraceContext
from porter_mesh.errors import NodeClosedError, OperationTimeout
from porter_mesh.node.config import NodeConfig
from porter_mesh.node.node import Message, Node

__all__ = ["SyncNode"]

T = TypeVar("T")

#: Seconds a facade call may take unless the caller says otherwise.
DEFAULT_CALL_TIMEOUT = 30.0


class SyncNode:
    """A node for scripts and simple agents: blocking calls, each with a timeout.

    Args:
        config: a :class:`NodeConfig`, or its fields as keyword arguments.
        start_timeout: seconds to wait for the node to start.
        handlers: message handlers installed before the node starts (see
            :class:`~porter_mesh.node.node.Node`): they run on the node's thread and see
            every message, those a restart delivers again included. A handler added
            later with :meth:`add_handler` misses those on a node with an inbox.
        batch_handlers: batch handlers installed the same way.
        prepare: called with the :class:`Node` on its loop thread before it starts:
            register extension kinds (:meth:`Node.register_kind`) and view sections
            there, so that a peer that asks at once (a command's seat handing its spans,
            a dashboard asking a newcomer for its view) finds them.

    Raises:
        OperationTimeout: the node did not start in time.
    """

    def __init__(self, config: NodeConfig | None = None, *, start_timeout: float = 30.0,
                 handlers: Iterable[Callable[[Message], None]] = (),
                 batch_handlers: Iterable[Callable[[list[Message]], None]] = (),
                 prepare: Callable[[Node], None] | None = None,
                 **settings: Any) -> None:
        self._loop = eventloop.new_event_loop()
        self._thread = threading.Thread(
            target=self._run, name=f"porter-mesh-node-{settings.get('name', '')}", daemon=True
        )
        self._thread.start()
        self._closed = False
        try:
            self.node = self._call(
                self._make(config, list(handlers), list(batch_handlers), prepare, settings),
                start_timeout)
        except BaseException:
            self._stop_loop()
            raise

    async def _make(self, config: NodeConfig | None,
                    handlers: list[Callable[[Message], None]],
                    batch_handlers: list[Callable[[list[Message]], None]],
                    prepare: Callable[[Node], None] | None,
                    settings: dict[str, Any]) -> Node:
        node = Node(config, handlers=handlers, batch_handlers=batch_handlers, **settings)
        if prepare is not None:
            prepare(node)
        await node.astart()
        return node

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()
        self._loop.close()

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        if self._loop.is_closed() or not self._thread.is_alive():
            coro.close()
            raise NodeClosedError("the node's loop has stopped; create a new SyncNode")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(DEFAULT_CALL_TIMEOUT if timeout is None else timeout)
        except concurrent.futures.TimeoutError:
            # Since Python 3.11 this is the built-in TimeoutError, which the node's own
            # errors (DeliveryTimeout...) subclass: those come from a finished call and
            # are raised as they are.
            if future.done() and not future.cancelled():
                raise
            future.cancel()
            raise OperationTimeout(
                f"call did not complete within {timeout}s; the node may be overloaded or "
                "stuck (see its log), pass a larger timeout"
            ) from None

    def _in_loop(self, func: Callable[[], T], timeout: float | None = None) -> T:
        async def run() -> T:
            return func()

        return self._call(run(), timeout)

    def call_in_loop(self, func: Callable[[], T], timeout: float | None = None) -> T:
        """Run ``func()`` on the node's loop thread and return its result.

        Raises:
            OperationTimeout: it did not complete within ``timeout`` seconds.
        """
        return self._in_loop(func, timeout)

    def run_coroutine(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run a coroutine on the node's loop and wait for its result.

        Raises:
            OperationTimeout: it did not complete within ``timeout`` seconds.
        """
        return self._call(coro, timeout)

    @property
    def name(self) -> str:
        """The agent name."""
        return self.node.name

    def publish(self, channel: str, activity: Activity, *,
                trace: TraceContext | None = None) -> None:
        """Broadcast ``activity`` on ``channel`` (``trace``: W3C trace context)."""
        self._in_loop(lambda: self.node.async_publish(channel, activity, trace=trace))

    def send(self, recipient: str, activity: Activity, *, timeout: float | None = None,
             key: str | None = None, trace: TraceContext | None = None) -> None:
        """Deliver to one agent and wait for the acknowledgement (``key``: an idempotency
        key, see :meth:`Node.send`; ``trace``: W3C trace context).

        Raises:
            UnknownPeerError, DeliveryTimeout, DeliveryError: as :meth:`Node.send`.
        """
        wait = (timeout if timeout is not None else self.node.config.send_timeout) + 5.0
        self._call(self.node.send(recipient, activity, timeout=timeout, key=key, trace=trace),
                   wait)

    def send_nowait(self, recipient: str, activity: Activity, *,
                    timeout: float | None = None,
                    on_done: Callable[[BaseException | None], None] | None = None) -> None:
        """Queue a direct message and return at once.

        The node keeps it in flight (and resends it when the recipient reconnects) until
        it is acknowledged or ``timeout`` passes; then ``on_done`` is called, on the
        node's thread, with ``None`` or the error. For messages that must not hold the
        caller up while their recipient is paused.

        Raises:
            UnknownPeerError: the recipient is not on the mesh now.
        """
        def settled(fut: asyncio.Future[None]) -> None:
            error = asyncio.CancelledError() if fut.cancelled() else fut.exception()
            if on_done is not None:
                on_done(error)

        def queue() -> None:
            self.node.async_send_nowait(recipient, activity, timeout=timeout
                                        ).add_done_callback(settled)

        self._in_loop(queue)

    def send_to_channel(self, channel: str, activity: Activity, *,
                        timeout: float | None = None,
                        trace: TraceContext | None = None) -> None:
        """``task:<agent>`` goes direct (acknowledged); other channels are broadcast."""
        wait = (timeout if timeout is not None else self.node.config.send_timeout) + 5.0
        self._call(self.node.send_to_channel(channel, activity, timeout=timeout, trace=trace),
                   wait)

    def receive(self, timeout: float, *, ack: bool = True) -> Message:
        """The next message, waiting up to ``timeout`` seconds (see :meth:`Node.receive`
        for ``ack``).

        Raises:
            OperationTimeout: nothing arrived in time.
        """
        try:
            return self._call(self.node.receive(timeout, ack=ack), timeout + 5.0)
        except TimeoutError as exc:
            if isinstance(exc, OperationTimeout):
                raise
            raise OperationTimeout(f"no message within {timeout}s") from None

    def add_handler(self, handler: Callable[[Message], None]) -> Callable[[], None]:
        """Call ``handler`` (on the node's thread) for every delivered message, as
        :meth:`Node.add_handler`. Returns a function that removes it."""
        remove = self._in_loop(lambda: self.node.add_handler(handler))
        return lambda: self._in_loop(remove)

    def add_batch_handler(self, handler: Callable[[list[Message]], None]
                          ) -> Callable[[], None]:
        """Call ``handler`` (on the node's thread) with each ZeroMQ message's messages,
        as :meth:`Node.add_batch_handler`. Returns a function that removes it."""
        remove = self._in_loop(lambda: self.node.add_batch_handler(handler))
        return lambda: self._in_loop(remove)

    def redeliver(self) -> None:
        """Offer the messages handlers declined to them again now
        (:meth:`Node.redeliver`)."""
        self._in_loop(self.node.redeliver)

    def ack(self, message: Message | None = None) -> None:
        """Say the application has taken messages from the inbox (:meth:`Node.ack`)."""
        self._in_loop(lambda: self.node.ack(message))

    def wait_readable(self, timeout: float) -> bool:
        """Block until the inbox holds a message (True) or ``timeout`` passes (False)."""
        async def wait() -> bool:
            try:
                await asyncio.wait_for(self.node.wait_readable(), timeout)
            except TimeoutError:
                return False
            return True

        return self._call(wait(), timeout + 5.0)

    def drain(self, *, ack: bool = True) -> list[Message]:
        """Every message waiting in the inbox, without blocking (see :meth:`Node.drain`
        for ``ack``)."""
        return self._in_loop(lambda: self.node.drain(ack=ack))

    def peers(self) -> list[PeerInfo]:
        """The roster."""
        return self._in_loop(self.node.peers)

    def wait_for_peers(self, names: Iterable[str] | int, timeout: float) -> list[PeerInfo]:
        """Block until the named agents (or that many) are on the roster.

        Raises:
            OperationTimeout: they did not all appear in time.
        """
        wanted = names if isinstance(names, int) else list(names)
        try:
            return self._call(self.node.wait_for_peers(wanted, timeout), timeout + 5.0)
        except TimeoutError as exc:
            raise OperationTimeout(str(exc)) from None

    def subscribe(self, channel: str) -> None:
        """Receive ``channel`` from now on."""
        self._in_loop(lambda: self.node.subscribe(channel))

    def add_peer_listener(self, listener: Callable[[PeerEvent], None]) -> Callable[[], None]:
        """Call ``listener`` (on the node's thread) on every roster change."""
        return self._in_loop(lambda: self.node.add_peer_listener(listener))

    def add_control_listener(
        self, listener: Callable[[str, str, dict[str, Any]], None]
    ) -> Callable[[], None]:
        """Call ``listener(kind, sender, body)`` (on the node's thread) for control
        messages addressed to this node (``drain``, ``halt``)."""
        return self._in_loop(lambda: self.node.add_control_listener(listener))

    def control(self, kind: str, *, target: str | None = None) -> None:
        """Broadcast a control message (``drain``, ``halt``)."""
        self._in_loop(lambda: self.node.async_control(kind, target=target))

    def wait_for_stats(self, predicate: Callable[[dict[str, int]], bool],
                       timeout: float) -> dict[str, int]:
        """Block until ``predicate(stats())`` holds.

        Raises:
            OperationTimeout: it did not hold in time.
        """
        try:
            return self._call(self.node.wait_for_stats(predicate, timeout), timeout + 5.0)
        except TimeoutError as exc:
            if isinstance(exc, OperationTimeout):
                raise
            raise OperationTimeout(str(exc)) from None

    def stats(self) -> dict[str, int]:
        """The node's counters."""
        return self._in_loop(self.node.stats)

    def close(self, timeout: float = 10.0) -> None:
        """Leave the mesh gracefully and stop the loop thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self._call(self.node.aclose(), timeout)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10.0)

    def __enter__(self) -> SyncNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
