"""The event loop porter-mesh's own processes run on: uvloop's by default where it is
installed, asyncio's when asked or when uvloop is absent, a clear error otherwise."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import warnings

import pytest

from porter_mesh import eventloop
from porter_mesh.errors import ConfigError

uvloop = pytest.importorskip("uvloop", reason="uvloop is not installed here")


def running_loop_module() -> str:
    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__.partition(".")[0]

    return eventloop.run(which())


def test_uvloop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.LOOP_ENV, raising=False)
    assert eventloop.loop_name() == "uvloop"
    assert running_loop_module() == "uvloop"
    loop = eventloop.new_event_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


@pytest.mark.parametrize("value", ["asyncio", " AsyncIO "])
def test_asyncio_when_asked(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(eventloop.LOOP_ENV, value)
    assert eventloop.loop_name() == "asyncio"
    assert running_loop_module() == "asyncio"
    loop = eventloop.new_event_loop()
    try:
        assert not isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_an_unknown_loop_is_a_settings_error_that_says_what_to_set(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.LOOP_ENV, "trio")

    async def never() -> None:
        raise AssertionError("ran on a loop nobody asked for")

    coro = never()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine was never awaited" would fail here
        with pytest.raises(ConfigError, match="set it to uvloop or asyncio"):
            eventloop.run(coro)
    assert coro.cr_frame is None  # closed, not left pending
    with pytest.raises(ConfigError, match="'trio'"):
        eventloop.new_event_loop()


def test_run_returns_the_result_and_closes_its_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.LOOP_ENV, raising=False)
    seen: list[asyncio.AbstractEventLoop] = []

    async def answer() -> int:
        seen.append(asyncio.get_running_loop())
        return 42

    assert eventloop.run(answer()) == 42
    assert seen[0].is_closed()


# Without uvloop (an import that fails, as on a machine where it is not installed), in a
# process of its own so that this one's imports stay as they are.
WITHOUT_UVLOOP = """
import sys
sys.modules["uvloop"] = None
from porter_mesh import eventloop
from porter_mesh.errors import ConfigError
print(eventloop.loop_name())
import os
os.environ[eventloop.LOOP_ENV] = "uvloop"
try:
    eventloop.new_event_loop()
except ConfigError as exc:
    print(exc)
"""


def test_without_uvloop_asyncio_serves_and_asking_for_uvloop_says_how_to_get_it() -> None:
    out = subprocess.run([sys.executable, "-c", WITHOUT_UVLOOP], capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()
    assert out[0] == "asyncio"
    assert "uvloop is not installed" in out[1]
    assert "pip install uvloop" in out[1] and "PORTER_MESH_LOOP=asyncio" in out[1]



# glibc's own account of its heap (mallinfo2, glibc 2.33 and later): ``hblks`` counts the
# blocks that have a mapping of their own, ``keepcost`` the free memory kept at the
# heap's top. Two 300 KB blocks are made, counted, freed, and the heap looked at again.
HEAP = """
import ctypes, sys
from porter_mesh import eventloop
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
if not hasattr(libc, "mallinfo2"):
    print("no-mallinfo2")
    sys.exit()
libc.mallinfo2.restype = Info
print(eventloop.steady_heap())
mapped = libc.mallinfo2().hblks
blocks = [b"x" * 300_000, b"y" * 300_000]
print(libc.mallinfo2().hblks - mapped)
del blocks
print(libc.mallinfo2().keepcost)
"""


def heap_after_two_blocks(**env: str) -> tuple[str, int, int]:
    """(what steady_heap() returned, blocks mapped on their own, bytes kept at the top)."""
    import os

    out = subprocess.run([sys.executable, "-c", HEAP], capture_output=True, text=True,
                         timeout=60, check=True, env={**os.environ, **env}).stdout.split()
    if out == ["no-mallinfo2"]:
        pytest.skip("this C library has no mallinfo2 (glibc 2.33 or later has)")
    return out[0], int(out[1]), int(out[2])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator only")
def test_steady_heap_keeps_large_blocks_on_the_heap_and_its_free_top() -> None:
    steady, mapped, kept = heap_after_two_blocks()
    assert steady == "True"
    assert mapped == 0  # below MMAP_THRESHOLD: from the heap
    assert kept >= 550_000  # below TRIM_THRESHOLD: kept for the next ones
    # The environment's own settings win. glibc's start-up thresholds, fixed: each block
    # gets a mapping of its own (made and unmapped each time).
    start_up = {"MALLOC_TRIM_THRESHOLD_": "131072", "MALLOC_MMAP_THRESHOLD_": "131072"}
    steady, mapped, kept = heap_after_two_blocks(**start_up)
    assert steady == "False" and mapped == 2
    # Blocks from the heap but the start-up trim threshold: the free top is handed back.
    trimmed = {"MALLOC_TRIM_THRESHOLD_": "131072", "MALLOC_MMAP_THRESHOLD_": "4194304"}
    steady, mapped, kept = heap_after_two_blocks(**trimmed)
    assert steady == "False" and mapped == 0 and kept < 300_000
