"""Shared fixtures. Every test is checked for leaked threads and child processes, and
runs with ``PORTER_MESH_DATA`` in a directory of its own, so that no node or command a
test starts writes into the real home directory."""

from __future__ import annotations

import pathlib
import threading
from collections.abc import Callable, Iterator

import psutil
import pytest
from hypothesis import settings

from tests.fuzzing import examples

# Properties that name no count of their own: Hypothesis' default, scaled like the rest.
settings.register_profile("porter-mesh", max_examples=examples(100))
settings.load_profile("porter-mesh")


def _is_property(item: pytest.Item) -> bool:
    """A Hypothesis test: a ``@given`` function, or a state machine's test case."""
    if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
        return True
    cls = getattr(item, "cls", None)
    return cls is not None and any(
        base.__module__ == "hypothesis.stateful" for base in cls.__mro__)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every property test ``property`` (``make test-properties`` runs them alone,
    at the full count of examples)."""
    for item in items:
        if _is_property(item):
            item.add_marker(pytest.mark.property)


def _live_children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()}


@pytest.fixture
def leak_exempt() -> Callable[[], set[int]]:
    """The pids a test may leave running: helpers that a longer-lived fixture's processes
    start when they need them. A conftest overrides this (the browser tests do)."""
    return set


@pytest.fixture(autouse=True)
def no_leaks(leak_exempt: Callable[[], set[int]]) -> Iterator[None]:
    """Fail a test that leaves threads or child processes behind."""
    threads_before = set(threading.enumerate())
    children_before = _live_children()
    yield
    deadline_threads = [
        t for t in threading.enumerate() if t not in threads_before and t.is_alive()
    ]
    for t in deadline_threads:
        t.join(timeout=5.0)
    leaked_threads = [t.name for t in deadline_threads if t.is_alive()]
    leaked_children = []
    for pid in _live_children() - children_before - leak_exempt():
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                leaked_children.append(pid)
        except psutil.NoSuchProcess:
            pass
    assert not leaked_threads, f"test leaked threads: {leaked_threads}"
    assert not leaked_children, f"test leaked child processes: {leaked_children}"


@pytest.fixture(autouse=True)
def data_root(tmp_path_factory: pytest.TempPathFactory,
              monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """Every test's default data root (``$PORTER_MESH_DATA``), inherited by its processes."""
    root = tmp_path_factory.mktemp("porter-mesh-data")
    monkeypatch.setenv("PORTER_MESH_DATA", str(root))
    return root
