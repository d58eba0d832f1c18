"""``porter-mesh a2a --join URL --name N``: an outside A2A agent works on the mesh.

The outside agent (``a2a_outside_agent.py``, on the A2A SDK's server side) runs as its
own process; the join command puts it on the mesh as worker ``ext1``. A requester on
the mesh offers it tasks as it would any worker: it sees the Accept, the agent's
artifact as a Create, the review request a mesh worker sends when its work is done, and,
once the reviewer approves, the closing Announce; the agent's ``input-required`` reaches
it as a Question that it answers; its withdrawal of a task becomes ``CancelTask``. The
demo's scripted architect and reviewer finish their story with an outside agent as their
only worker.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import orjson
import pytest

pytest.importorskip("a2a.client", reason="the A2A SDK is not installed: pip install "
                    "'porter-mesh[a2a]'")

from porter_mesh.core import as2
from porter_mesh.core import constants as C
from porter_mesh.core.tasks import cancel_activity
from porter_mesh.node.node import Message
from porter_mesh.node.sync import SyncNode
from tests.integration.cli_proc import Running, cli

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]

DEADLINE = 30.0
AGENT = pathlib.Path(__file__).with_name("a2a_outside_agent.py")


class Outside:
    """The outside A2A agent's process."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(AGENT), *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._seen = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        self.url = self.wait_line("serving").split()[1]

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._seen:
                self.lines.append(line.strip())
                self._seen.notify_all()

    def wait_line(self, start: str, containing: str = "") -> str:
        deadline = time.monotonic() + DEADLINE
        with self._seen:
            while True:
                for line in self.lines:
                    if line.startswith(start) and containing in line:
                        return line
                left = deadline - time.monotonic()
                assert left > 0, f"no line {start!r}: {self.lines}"
                self._seen.wait(left)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def join(outside: Outside, name: str, mesh: str, tmp_path: pathlib.Path,
         *extra: str) -> Running:
    """``porter-mesh a2a --join`` of ``outside`` as worker ``name``, once it is up."""
    proc = Running("a2a", "--join", outside.url, "--name", name, "--mesh", mesh,
                   "--data-dir", str(tmp_path / name), *extra)
    try:
        proc.wait_until(lambda: any(" up on mesh " in line for line in proc.out), 30,
                        "the worker is up")
    except AssertionError:
        proc.stop()
        raise
    return proc


@pytest.fixture
def joined(mesh: str, tmp_path: pathlib.Path) -> Iterator[Outside]:
    outside = Outside()
    try:
        worker = join(outside, "ext1", mesh, tmp_path, "--reviewer", "arch1")
    except AssertionError:
        outside.stop()
        raise
    try:
        yield outside
    finally:
        worker.stop()
        outside.stop()


def _until(node: SyncNode, context: str, kind: str) -> list[Message]:
    seen: list[Message] = []
    deadline = time.monotonic() + DEADLINE
    while True:
        msg = node.receive(timeout=max(0.0, deadline - time.monotonic()))
        if msg.activity.context != context:
            continue
        seen.append(msg)
        if msg.activity.type == kind:
            return seen


def _state(mesh: str, context: str) -> dict[str, object]:
    listed = cli("tasks", "--mesh", mesh, "--json", "--all", "--wait", "3")
    assert listed.returncode == 0, listed.stderr
    mine = [t for t in map(orjson.loads, listed.stdout.splitlines()) if t["context"] == context]
    assert mine, listed.stdout
    return mine[0]  # type: ignore[no-any-return]


def test_request_gets_accept_artifact_review_and_announce(joined: Outside, mesh: str) -> None:
    out = cli("request", "task:ext1", "shout this", "--type", "Offer", "--mesh", mesh,
              "--timeout", "30", "--wait", "20")
    # The human offered it, so the human reviews it: the request stops there.
    assert "waiting for your review" in out.stderr, out.stderr
    lines = out.stdout.splitlines()
    assert "Accept" in lines[0], lines
    assert any("Create" in line for line in lines), lines
    assert "Offer" in lines[-1] and "Ready for review: shout this" in lines[-1], lines
    context = out.stderr.split()[1]
    approved = cli("send", "review", "approve", "--type", "Accept", "--context", context,
                   "--mesh", mesh, "--wait", "5")
    assert approved.returncode == 0, approved.stderr
    deadline = time.monotonic() + DEADLINE
    while (task := _state(mesh, context))["state"] != "completed":
        assert time.monotonic() < deadline, task
    assert task["holder"] == "ext1", task
    peers = cli("peers", "--mesh", mesh, "--json", "--wait", "3")
    assert '"ext1"' in peers.stdout and '"worker"' in peers.stdout, peers.stdout


def test_question_answered_and_cancel(joined: Outside, mesh: str) -> None:
    with SyncNode(name="arch1", role="architect", mesh=mesh,
                  channels=(C.CHANNEL_LOG, C.CHANNEL_TASK, C.CHANNEL_REVIEW)) as node:
        node.wait_for_peers(["ext1"], timeout=DEADLINE)
        ctx = "urn:porter:task:join-ask-1"
        node.send("ext1", as2.offer("arch1", "ask me", "please ask me", context=ctx,
                                    target="ext1"), timeout=DEADLINE)
        seen = _until(node, ctx, "Question")
        created = [m.activity for m in seen if m.activity.type == "Create"]
        assert created and created[0].object.content == "PLEASE ASK ME"  # type: ignore[union-attr]
        assert "Which language?" in (seen[-1].activity.summary or "")
        node.send("ext1", as2.Activity("Note", "arch1", "Python", context=ctx,
                                       object=as2.note_object("Python")), timeout=DEADLINE)
        asked = _until(node, ctx, "Offer")
        assert any(m.activity.type == "Create" and m.activity.object.url == "language.txt"  # type: ignore[union-attr]
                   for m in asked)
        request = asked[-1]
        assert request.channel == C.CHANNEL_REVIEW and request.activity.target == "arch1"
        assert "language.txt" in [doc.url for doc in request.activity.object.items]  # type: ignore[union-attr]
        node.publish(C.CHANNEL_REVIEW, as2.accept("arch1", "LGTM", context=ctx))
        done = _until(node, ctx, "Announce")[-1].activity
        assert "done" in (done.tag or ()) and "All done" in done.summary, done.to_dict()
        task = _state(mesh, ctx)
        assert task["holder"] == "ext1" and task["state"] == "completed", task
        # A task the agent keeps working on is cancelled through the mesh.
        slow = "urn:porter:task:join-slow-1"
        node.send("ext1", as2.offer("arch1", "slow", "slow work", context=slow, target="ext1"),
                  timeout=DEADLINE)
        _until(node, slow, "Create")
        node.send("ext1", cancel_activity("arch1", slow, "no longer needed", cancel=True),
                  timeout=DEADLINE)
        joined.wait_line("cancelled")  # the outside agent's executor was told
        confirmed = _until(node, slow, "Announce")[-1].activity
        assert "cancelled" in (confirmed.tag or ()), confirmed.to_dict()


def test_a_team_entry_puts_the_outside_agent_on_the_mesh(mesh: str,
                                                         tmp_path: pathlib.Path) -> None:
    outside = Outside()
    team = tmp_path / "team.toml"
    team.write_text(f'[mesh]\nname = "{mesh}"\n\n[[agents]]\nname = "ext2"\nrole = "worker"\n'
                    f'a2a = "{outside.url}"\nslots = 2\n')
    up = Running("up", str(team))
    try:
        out = cli("request", "task:ext2", "from the team", "--type", "Offer", "--mesh", mesh,
                  "--timeout", "30", "--wait", "20")
        assert "waiting for your review" in out.stderr, (out.stderr, up.err[-10:])
        assert "Ready for review" in out.stdout.splitlines()[-1], out.stdout
    finally:
        up.stop()
        outside.stop()
    bad = tmp_path / "bad.toml"
    bad.write_text(f'[mesh]\nname = "{mesh}"\n\n[[agents]]\nname = "ext3"\nrole = "worker"\n'
                   'a2a = "localhost:9"\n')
    refused = cli("up", str(bad))
    assert refused.returncode == 2
    assert "agents[0].a2a: expected the A2A agent's base URL" in refused.stderr


def test_the_demo_architect_hands_its_task_to_an_outside_agent(mesh: str,
                                                              tmp_path: pathlib.Path) -> None:
    """The demo's scripted architect and reviewer, and an outside A2A agent joined as
    ``worker-1``: the reviewer sends the first result back (no validation), the joined
    worker passes the reason to the agent as a revision of its task, the second result is
    approved, and the architect's story ends done."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    outside = Outside("--workspace", str(workspace))
    team = [
        Running("a2a", "--join", outside.url, "--name", "worker-1", "--mesh", mesh,
                "--data-dir", str(tmp_path / "worker-1")),
        Running("agent", "reviewer", "--name", "reviewer", "--mesh", mesh, "--workspace",
                str(workspace)),
    ]
    arch = Running("agent", "architect", "--name", "architect", "--mesh", mesh,
                   "--workers", "1", "--reviewer", "reviewer", "--workspace", str(workspace),
                   "--task-timeout", "60")
    try:
        arch.wait_until(lambda: arch.proc.poll() is not None, 90, "the architect's story")
        err = "\n".join(arch.err)
        assert arch.proc.returncode == 0, err[-3000:]
        # The board saw the agent's first result sent back, its revision approved, and
        # names what the agent did.
        story = [line.split(": ", 2)[-1] for line in arch.err if "(worker-1, attempt 1)" in line
                 or "-> done" in line]
        assert "in-review -> changes-requested (worker-1, attempt 1)" in err, err[-3000:]
        assert any("GET /users returns a page of users as JSON" in line for line in story), story
        assert any("Validated page and limit" in line for line in story), story
        assert "in-review -> done: approve: LGTM" in err, err[-3000:]
        assert "the team learned" in err, err[-3000:]
        # Every report carried the claim's attempt: the board refused none.
        assert not any(line.startswith("[architect] refused") for line in arch.err), err[-3000:]
        # The agent did the story twice: the second task revises the first, with the
        # reviewer's reason.
        first = outside.wait_line("task ").split()
        assert first[3] == "-", first
        revision = outside.wait_line("task ", f" refs {first[1]} ")
        assert "asked for changes" in revision, revision
        assert "def validate" in (workspace / "src/routes/users.py").read_text()
        listed = cli("tasks", "--mesh", mesh, "--json", "--all", "--wait", "3")
        held = [t for t in map(orjson.loads, listed.stdout.splitlines())
                if t.get("holder") == "worker-1"]
        assert held and held[0]["state"] == "completed", listed.stdout
    finally:
        arch.stop()
        for proc in team:
            proc.stop()
        outside.stop()


def test_without_its_reviewer_the_task_waits_in_review(mesh: str,
                                                       tmp_path: pathlib.Path) -> None:
    """No agent named as reviewer is on the mesh: the worker says so, the task stays
    in review (no closing Announce), and a later verdict from that name still closes it."""
    outside = Outside()
    try:
        worker = join(outside, "ext4", mesh, tmp_path, "--reviewer", "rev9")
    except AssertionError:
        outside.stop()
        raise
    try:
        with SyncNode(name="arch4", role="architect", mesh=mesh,
                      channels=(C.CHANNEL_LOG, C.CHANNEL_REVIEW)) as node:
            node.wait_for_peers(["ext4"], timeout=DEADLINE)
            ctx = "urn:porter:task:join-norev-1"
            node.send("ext4", as2.offer("arch4", "shout", "shout", context=ctx,
                                        target="ext4"), timeout=DEADLINE)
            request = _until(node, ctx, "Offer")[-1]
            assert request.channel == C.CHANNEL_REVIEW and request.activity.target == "rev9"
            worker.wait_until(lambda: any("rev9, who is not on the mesh" in line
                                          for line in worker.err), 10, "the warning")
            assert _state(mesh, ctx)["state"] == "in-review"
            with SyncNode(name="rev9", role="reviewer", mesh=mesh) as rev:
                rev.wait_for_peers(["ext4"], timeout=DEADLINE)
                # Straight to the worker: acknowledged, so not lost to a late subscriber.
                rev.send("ext4", as2.accept("rev9", "LGTM", context=ctx), timeout=DEADLINE)
                done = _until(node, ctx, "Announce")[-1].activity
            assert "done" in (done.tag or ()), done.to_dict()
    finally:
        worker.stop()
        outside.stop()
