"""The demo mesh as real processes: the profile's story end to end, and a worker's death."""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agents.demo import run_demo, summary_of

pytestmark = [pytest.mark.network, pytest.mark.timeout(150)]


def story(log: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(sender, type) of every task activity, in arrival order."""
    return [(m["sender"], m["activity"]["type"]) for m in log
            if m["activity"].get("context", "").startswith("urn:porter:task:")]


def is_subsequence(needle: list[tuple[str, str]], hay: list[tuple[str, str]]) -> bool:
    it = iter(hay)
    return all(any(x == y for y in it) for x in needle)


def test_demo_command_plays_the_story(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    mesh = f"mine{os.getpid()}"
    proc = subprocess.run(
        [sys.executable, "-m", "porter_mesh.cli.main", "demo", "--out", str(out),
         "--timeout", "60", "--mesh", mesh],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"porter-mesh demo: mesh {mesh!r} on 127.0.0.1" in proc.stdout
    assert "demo complete" in proc.stdout
    assert "api-design" in proc.stdout  # what the architect recalled
    learned = proc.stdout.split("\nThe team learned:\n", 1)[-1].split("\ndemo complete")[0]
    assert proc.stdout.lower().count("team learned:") == 1, learned  # one heading
    assert re.match(r"\d+ row\(s\) \(about, finding\):\n1\. about=api-design", learned), learned
    log = summary_of(out / "messages.jsonl")
    expected = [
        ("architect", "Offer"), ("worker-1", "Accept"), ("worker-1", "Invoke"),
        ("worker-1", "Create"), ("worker-1", "Remember"), ("worker-1", "Offer"),
        ("reviewer", "Reject"), ("worker-1", "Update"), ("worker-1", "Create"),
        ("worker-1", "Invoke"), ("worker-1", "Offer"), ("reviewer", "Accept"),
        ("worker-1", "Announce"), ("architect", "Announce"),
    ]
    assert is_subsequence(expected, story(log)), story(log)
    assert any(m["activity"]["type"] == "Recall" and m["sender"] == "architect" for m in log)
    offer = next(m for m in log if m["activity"]["type"] == "Offer")
    assert offer["direct"] and offer["channel"] == "task:worker-1"
    assert offer["activity"]["summary"] == "Add GET /users endpoint"
    route = (out / "workspace/src/routes/users.py").read_text()
    assert "def validate" in route
    test = subprocess.run([sys.executable, "tests/test_users.py"], cwd=out / "workspace",
                          capture_output=True, text=True, timeout=30)
    assert test.returncode == 0, test.stderr


def test_killed_worker_task_is_reoffered_and_done_once(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    console = io.StringIO()
    status = asyncio.run(run_demo(out, timeout=90, stream=console,
                                  extra={"worker-1": ["--fail-after", "accept"]}))
    assert status == 0, console.getvalue()[-4000:]
    log = summary_of(out / "messages.jsonl")
    offers = [m for m in log if m["activity"]["type"] == "Offer" and m["sender"] == "architect"]
    assert [(o["channel"], o["activity"].get("attempt")) for o in offers[:2]] == [
        ("task:worker-1", 1), ("task:worker-2", 2)]
    after_accept = False
    for m in log:
        if m["sender"] == "worker-1" and m["activity"]["type"] == "Accept":
            after_accept = True
        elif after_accept:
            assert m["sender"] != "worker-1", f"worker-1 acted after its death: {m}"
    task_acts = story(log)
    # The task's effects happened once, by the second holder.
    assert task_acts.count(("worker-2", "Remember")) == 1
    assert task_acts.count(("worker-2", "Announce")) == 1
    assert task_acts.count(("reviewer", "Accept")) == 1
    assert ("worker-1", "Create") not in task_acts


def test_the_demo_plays_the_team_its_file_names(tmp_path: Path) -> None:
    team = tmp_path / "renamed.toml"
    team.write_text("""
[mesh]
name = "renamed"

[[agents]]
name = "lead"
role = "architect"

[[agents]]
name = "builder"
role = "worker"

[[agents]]
name = "checker"
role = "reviewer"
""")
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "porter_mesh.cli.main", "demo", "--out", str(out),
         "--timeout", "60", "--team", str(team)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "mesh 'renamed-" in proc.stdout
    assert "team connected: lead, builder, checker" in proc.stdout
    expected = [("lead", "Offer"), ("builder", "Accept"), ("builder", "Offer"),
                ("checker", "Reject"), ("builder", "Offer"), ("checker", "Accept"),
                ("lead", "Announce")]
    log = summary_of(out / "messages.jsonl")
    assert is_subsequence(expected, story(log)), story(log)
    assert (out / "workspace/src/routes/users.py").exists()


def test_a_wrong_team_file_is_one_line_and_status_2(tmp_path: Path) -> None:
    team = tmp_path / "bad.toml"
    team.write_text('[mesh]\nname = "x"\n[[agents]]\nname = "w"\nrole = "worker"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "porter_mesh.cli.main", "demo", "--out", str(tmp_path / "o"),
         "--team", str(team)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f'porter-mesh demo: {team}: the demo needs an agent with '
                                   'role "architect"')
    assert not (tmp_path / "o").exists()


def test_a_bad_loop_setting_is_one_line_and_status_2(tmp_path: Path) -> None:
    env = {**os.environ, "PORTER_MESH_LOOP": "trio"}
    proc = subprocess.run(
        [sys.executable, "-m", "porter_mesh.cli.main", "demo", "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "porter-mesh demo: PORTER_MESH_LOOP='trio' is not a loop porter-mesh knows: set it "
        "to uvloop or asyncio (or unset it for uvloop where it is installed)")
    assert not (tmp_path / "o").exists()
