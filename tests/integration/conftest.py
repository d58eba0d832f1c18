"""Fixtures shared by the integration tests."""

from __future__ import annotations

import itertools
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.harness import NodeProcess

_mesh_ids = itertools.count()


@pytest.fixture
def mesh() -> str:
    """A mesh name of this test only, so concurrent runs never see each other."""
    return f"t{os.getpid()}-{next(_mesh_ids)}"


@pytest.fixture
def procs() -> Iterator[list[NodeProcess]]:
    """Node processes a test started; each is stopped (by its pid) afterwards."""
    started: list[NodeProcess] = []
    yield started
    for p in started:
        p.stop()


@pytest.fixture
def nodes(procs: list[NodeProcess]) -> list[NodeProcess]:
    """The same list as ``procs``, by another name."""
    return procs


@pytest.fixture
def ui(mesh: str, tmp_path: pathlib.Path) -> Iterator[Any]:
    """``porter-mesh ui --port 0`` on the test's mesh, stopped (and checked) afterwards."""
    from tests.integration.test_ui_api import UI

    proc = UI(mesh, tmp_path / "ui-data")
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.stderr
