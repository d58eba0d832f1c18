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

:func:`run` also fixes how glibc's allocator gives memory back (:func:`steady_heap`),
once per process, as a server sets its allocator up before it serves.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from porter_mesh.errors import ConfigError

__all__ = ["LOOP_ENV", "loop_name", "new_event_loop", "run", "steady_heap"]

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


# glibc's mallopt() parameters, and the values set by steady_heap().
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Free memory at the top of the heap that is kept rather than handed back to the system.
TRIM_THRESHOLD = 1 << 20
#: Blocks from this size up get a mapping of their own; smaller ones come from the heap.
MMAP_THRESHOLD = 512 << 10
# Settings of the user's own for glibc's allocator, which steady_heap() leaves alone.
_ALLOCATOR_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")
_heap_set: bool | None = None


def steady_heap() -> bool:
    """Fix glibc's thresholds for handing free heap memory back to the system: keep up to
    :data:`TRIM_THRESHOLD` free at the heap's top, and serve blocks below
    :data:`MMAP_THRESHOLD` from the heap. Returns whether they are set (not where the C
    library is not glibc, nor when the environment sets the allocator up itself).

    By default glibc starts from 128 KiB for both and raises them only after a large
    mapped block is freed, so a process's allocator behaves according to what happened
    to be freed early in its life. A publisher packs up to 256 activities into each
    ZeroMQ message, up to 64 KiB, freed once sent: under the start-up thresholds every
    such message can shrink the heap and the next one grow it again, a system call and
    fresh zero-filled pages each time. Measured on a publisher with four subscribers
    (``docs/performance.md``, "The event loop"), that was 15,000 ``brk`` calls per
    million broadcasts and half as much CPU again per message; with these values, under
    50. They are the values glibc itself reaches after freeing one 512 KiB block, and
    they keep at most 1 MiB of free memory per process.
    """
    global _heap_set
    if _heap_set is not None:
        return _heap_set
    _heap_set = False
    if not sys.platform.startswith("linux") or any(k in os.environ for k in _ALLOCATOR_ENV):
        return False
    try:
        mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    except OSError:
        return False
    if mallopt is None:  # a C library without it
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    _heap_set = bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                     and mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    return _heap_set


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
    down), after :func:`steady_heap`."""
    steady_heap()
    try:
        factory = _choice()[1]
    except ConfigError:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)
