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



# glibc's own account of its heap (mallinfo2, glibc 2.33 and later): ``arena`` is the
# heap's size, ``hblks`` the blocks that have a mapping of their own. 200 KB blocks are
# made until the heap has grown by one (the first ones may fit in memory the interpreter
# freed at start), then all are freed: does the heap give the growth back?
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
start, mapped = libc.mallinfo2().arena, libc.mallinfo2().hblks
blocks = []
while libc.mallinfo2().arena < start + 200_000 and len(blocks) < 20:
    blocks.append(bytes([len(blocks)]) * 200_000)
peak = libc.mallinfo2().arena
print(len(blocks), libc.mallinfo2().hblks - mapped, peak - start)
del blocks
print(peak - libc.mallinfo2().arena)
"""


def heap_under_churn(**env: str) -> tuple[str, int, int, int, int]:
    """(what steady_heap() returned, blocks made, of them mapped on their own, bytes the
    heap grew by, bytes of that given back once they were freed)."""
    import os

    out = subprocess.run([sys.executable, "-c", HEAP], capture_output=True, text=True,
                         timeout=60, check=True, env={**os.environ, **env}).stdout.split()
    if out == ["no-mallinfo2"]:
        pytest.skip("this C library has no mallinfo2 (glibc 2.33 or later has)")
    steady, made, mapped, grew, gave_back = out
    return steady, int(made), int(mapped), int(grew), int(gave_back)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator only")
def test_steady_heap_keeps_large_blocks_on_the_heap_and_its_free_top() -> None:
    steady, made, mapped, grew, gave_back = heap_under_churn()
    assert steady == "True"
    assert mapped == 0 and grew >= 200_000  # below MMAP_THRESHOLD: from the heap
    assert gave_back == 0  # below TRIM_THRESHOLD: kept for the next ones
    # The environment's own settings win. glibc's start-up thresholds, fixed: the blocks
    # get mappings of their own (made and unmapped each time; a few may still fit in
    # free memory inside the heap, how many depends on what the interpreter freed at
    # start), the heap never grows.
    start_up = {"MALLOC_TRIM_THRESHOLD_": "131072", "MALLOC_MMAP_THRESHOLD_": "131072"}
    steady, made, mapped, grew, gave_back = heap_under_churn(**start_up)
    assert steady == "False" and made == 20 and mapped >= made // 2 and grew < 200_000
    # Blocks from the heap but the start-up trim threshold: the growth is handed back.
    trimmed = {"MALLOC_TRIM_THRESHOLD_": "131072", "MALLOC_MMAP_THRESHOLD_": "4194304"}
    steady, made, mapped, grew, gave_back = heap_under_churn(**trimmed)
    assert steady == "False" and mapped == 0 and grew >= 200_000
    assert gave_back >= 100_000
