"""Browser tests: skipped, with the reason printed, when Chromium or Playwright is missing."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from tests.browser.dashboard import chromium, helpers, missing_browser, settle_children

MISSING = missing_browser()


def pytest_report_header(config: pytest.Config) -> str:
    return f"browser tests: {'skipped: ' + MISSING if MISSING else 'headless /usr/bin/chromium'}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/browser/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.browser)
            if MISSING:
                item.add_marker(pytest.mark.skip(reason=f"browser tests skipped: {MISSING}"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for a module's tests."""
    with chromium() as b:
        yield b


@pytest.fixture
def leak_exempt() -> Callable[[], set[int]]:
    """Chromium starts helper processes when it needs them (one per page, a utility
    process on first use of a feature), and so does ``porter-mesh ui`` (its SPARQL worker
    on the first query); they belong to the module's browser and mesh, which end them.
    A process the test itself started is still a leak."""
    return helpers


@pytest.fixture(autouse=True)
def browser_helpers_end() -> Iterator[None]:
    """Give the helpers of this test's pages time to end before the leak check looks."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    settle_children(before | helpers(), timeout=5.0)
