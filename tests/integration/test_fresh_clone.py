"""``make demo`` from a fresh clone: a new virtual environment with the runtime
dependencies only, then the demo, which ends by itself.

Needs PyPI (pip installs into the new environment; its cache makes a second run quick):
skipped, with the reason printed, when pip cannot reach it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
REPO = Path(__file__).resolve().parents[2]
#: The demo's own deadline is 30 s; installing takes most of this when pip's cache is cold.
MAKE_DEMO_TIMEOUT = 1200
RUNTIME = ("pyzmq", "msgpack", "orjson", "msgspec", "rdflib", "zeroconf", "pyoxigraph",
           "oxrdflib", "aiohttp", "argcomplete")
NOT_FOR_THE_DEMO = ("mypy", "ruff", "matplotlib", "eclipse-zenoh", "pytest", "playwright")


def pypi_problem(tmp: Path) -> str | None:
    """Why pip cannot fetch from PyPI here, or None when it can (asked quickly)."""
    try:
        probe = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
             "--timeout", "5", "--retries", "0", "--dest", str(tmp), "six"],
            capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "pip download six did not finish within 60s"
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return f"pip cannot reach PyPI ({last})"
    return None


def test_make_demo_from_a_fresh_clone(tmp_path: Path) -> None:
    if shutil.which("make") is None or shutil.which("git") is None:
        pytest.skip("make and git are needed")
    problem = pypi_problem(tmp_path / "probe")
    if problem is not None:
        print(f"skipped: {problem}")
        pytest.skip(problem)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    env["PYTHON"] = sys.executable  # the interpreter running the tests makes the venv
    try:
        made = subprocess.run(["make", "demo"], cwd=clone, capture_output=True, text=True,
                              timeout=MAKE_DEMO_TIMEOUT, env=env)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"make demo did not end within {MAKE_DEMO_TIMEOUT}s: the demo "
                             f"must end by itself; output: {str(exc.stdout)[-3000:]}") from None
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    assert "demo complete" in made.stdout, made.stdout[-3000:]
    assert (clone / "demo-out" / "messages.jsonl").exists()

    listed = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-m", "pip", "list",
                             "--format=json", "--disable-pip-version-check"],
                            capture_output=True, text=True, timeout=120, check=True)
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert {"porter-mesh", *RUNTIME} <= installed, sorted(set(RUNTIME) - installed)
    assert not installed & set(NOT_FOR_THE_DEMO), sorted(installed & set(NOT_FOR_THE_DEMO))
