"""The event loop porter-mesh's own processes run on.

Every ``porter-mesh`` command, the agent programs and the threads that carry a node for
blocking code (:class:`~porter_mesh.node.sync.SyncNode`, external MCP servers) make
their loops here: uvloop's when it is installed (it is a dependency on Linux and macOS),
asyncio's own otherwise. uvloop runs the same asyncio programs on libuv, with the loop's
own bookkeeping (its turns, handles, timers and futures' callbacks) in compiled code
rather than Python: the node's direct round trip is measured with each in
``docs/performance.md``, "The event loop".

``PORTER_MESH_LOOP`` chooses: ``uvloop``, ``asyncio``, or unset for uvloop when it can
be imported. A node in an application runs on whatever loop that application runs:
nothing in the node depends on which one it is, and the tests run on both.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from porter_mesh.errors import ConfigError

__all__ = ["LOOP_ENV", "loop_name", "new_event_loop", "run"]

T = TypeVar("T")

#: The environment variable that chooses the loop.
LOOP_ENV = "PORTER_MESH_LOOP"
_CHOICES = ("uvloop", "asyncio")


def _uvloop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _choice() -> tuple[str, Callable[[], asyncio.AbstractEventLoop]]:
    wanted = os.environ.get(LOOP_ENV, "").strip().lower()
    if wanted and wanted not in _CHOICES:
        raise ConfigError(f"{LOOP_ENV}={os.environ[LOOP_ENV]!r} is not a loop porter-mesh "
                          f"knows: set it to uvloop or asyncio (or unset it for uvloop "
                          f"where it is installed)")
    if wanted == "asyncio":
        return "asyncio", asyncio.new_event_loop
    factory = _uvloop_factory()
    if factory is not None:
        return "uvloop", factory
    if wanted == "uvloop":
        raise ConfigError(f"{LOOP_ENV}=uvloop but uvloop is not installed: install it "
                          f"(pip install uvloop) or set {LOOP_ENV}=asyncio")
    return "asyncio", asyncio.new_event_loop


def loop_name() -> str:
    """``"uvloop"`` or ``"asyncio"``: the loop :func:`run` and :func:`new_event_loop`
    make in this process."""
    return _choice()[0]


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop of the chosen kind, for a thread to run."""
    return _choice()[1]()


def run(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to its end on a new loop of the chosen kind, as :func:`asyncio.run`
    does (the loop is closed afterwards, async generators and the default executor shut
    down)."""
    try:
        factory = _choice()[1]
    except ConfigError:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
