"""Fixtures of the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.harness import NodeProcess


@pytest.fixture
def nodes() -> Iterator[list[NodeProcess]]:
    """A list to put started node processes in; each is stopped after the test."""
    started: list[NodeProcess] = []
    yield started
    for node in started:
        node.stop()
