"""``make demo`` from a fresh clone: a new virtual environment with the runtime
dependencies only, then the demo, which ends by itself; then the rest of the README's
sequence in that clone (``up`` of the demo team and the Python example).

Needs PyPI (pip installs into the new environment; its cache makes a second run quick):
skipped, with the reason printed, when pip cannot reach it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
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


class Clone:
    """A fresh clone after ``make demo``: its directory and what ``make demo`` printed."""

    def __init__(self, path: Path, made: subprocess.CompletedProcess[str]) -> None:
        self.path = path
        self.made = made
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("VIRTUAL_ENV") and k != "PYTHONPATH"}

    def bin(self, name: str) -> str:
        return str(self.path / ".venv" / "bin" / name)


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Clone:
    """``git clone`` of this checkout, then ``make demo`` in it, as a new user does."""
    if shutil.which("make") is None or shutil.which("git") is None:
        pytest.skip("make and git are needed")
    tmp_path = tmp_path_factory.mktemp("fresh")
    problem = pypi_problem(tmp_path / "probe")
    if problem is not None:
        print(f"skipped: {problem}")
        pytest.skip(problem)
    path = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(path)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("VIRTUAL_ENV") and k != "PYTHONPATH"}
    env["PYTHON"] = sys.executable  # the interpreter running the tests makes the venv
    try:
        made = subprocess.run(["make", "demo"], cwd=path, capture_output=True, text=True,
                              timeout=MAKE_DEMO_TIMEOUT, env=env)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"make demo did not end within {MAKE_DEMO_TIMEOUT}s: the demo "
                             f"must end by itself; output: {str(exc.stdout)[-3000:]}") from None
    return Clone(path, made)


def test_make_demo_from_a_fresh_clone(clone: Clone) -> None:
    made = clone.made
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    assert "demo complete" in made.stdout, made.stdout[-3000:]
    assert (clone.path / "demo-out" / "messages.jsonl").exists()

    listed = subprocess.run([clone.bin("python"), "-m", "pip", "list",
                             "--format=json", "--disable-pip-version-check"],
                            capture_output=True, text=True, timeout=120, check=True)
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert {"porter-mesh", *RUNTIME} <= installed, sorted(set(RUNTIME) - installed)
    assert not installed & set(NOT_FOR_THE_DEMO), sorted(installed & set(NOT_FOR_THE_DEMO))
    if shutil.which("gcc") is not None:  # the compiled hot path is built by the install
        built = subprocess.run(
            [clone.bin("python"), "-c",
             "from porter_mesh.core import speedups; print(speedups.available())"],
            capture_output=True, text=True, timeout=60, env=clone.env, check=True)
        assert built.stdout.strip() == "True", made.stdout[-3000:]


def readme_example(readme: str) -> tuple[str, str]:
    """The README's Python example and the line it says the example prints."""
    example = next(block for block in re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
                   if "SyncNode(" in block)
    after = readme.split(example, 1)[1]
    printed = re.search(r"It prints.*?```\n(.*?)\n```", after, re.DOTALL)
    assert printed is not None, "the README does not say what its example prints"
    return example, printed.group(1)


def test_the_readmes_sequence_from_a_fresh_clone(clone: Clone, tmp_path: Path) -> None:
    """``make demo``, then ``up`` of the demo team, then the Python example, each as the
    README gives it. The team runs on a mesh of this test's own (``--mesh``, which the
    example's ``mesh="demo"`` is changed to), so that other runs on this host are not met."""
    assert clone.made.returncode == 0, clone.made.stdout[-3000:]
    readme = (clone.path / "README.md").read_text()
    assert ".venv/bin/porter-mesh up examples/demo-team.toml\n" in readme
    example, printed = readme_example(readme)
    assert 'mesh="demo"' in example
    mesh = f"readme{os.getpid()}"
    script = tmp_path / "example.py"
    script.write_text(example.replace('mesh="demo"', f"mesh={mesh!r}"))
    env = dict(clone.env, PYTHONUNBUFFERED="1")
    up = subprocess.Popen([clone.bin("porter-mesh"), "up", "examples/demo-team.toml",
                           "--mesh", mesh], cwd=clone.path, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[str] = []
    try:
        assert up.stdout is not None
        for line in up.stdout:  # until the team is on the mesh (up's own deadline below)
            lines.append(line)
            if "worker-1         alive on the mesh" in line:
                break
        else:
            raise AssertionError(f"up ended before worker-1 was alive: {lines}")
        ran = subprocess.run([clone.bin("python"), str(script)], cwd=clone.path,
                             capture_output=True, text=True, timeout=60, env=env)
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert ran.stdout.strip() == printed, (ran.stdout, printed)
        up.send_signal(signal.SIGINT)
        rest, _ = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.communicate()
    assert up.returncode == 130, [*lines, rest]
    assert "stopped every agent" in rest, rest
