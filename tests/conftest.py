"""Shared fixtures. Every test is checked for leaked threads and child processes."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psutil
import pytest


def _live_children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if p.is_running()}


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
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
    for pid in _live_children() - children_before:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                leaked_children.append(pid)
        except psutil.NoSuchProcess:
            pass
    assert not leaked_threads, f"test leaked threads: {leaked_threads}"
    assert not leaked_children, f"test leaked child processes: {leaked_children}"
