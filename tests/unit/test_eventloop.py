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
