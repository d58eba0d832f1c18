"""A watcher (``tail``) running when ``send`` runs sees the broadcast, every time; a
known node that cannot be reached makes ``send`` exit 1 naming it."""

from __future__ import annotations

import itertools
import json
import os
import signal
from collections.abc import Iterator

import pytest

from porter_mesh.core.advert import is_human
from tests.integration.cli_proc import Running, cli

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]
_ids = itertools.count()


@pytest.fixture
def mesh(tmp_path: object) -> str:
    return f"w{os.getpid()}-{next(_ids)}"


@pytest.fixture
def nodes(mesh: str) -> Iterator[list[Running]]:
    procs = [Running("node", "--name", name, "--mesh", mesh) for name in ("alpha", "beta")]
    try:
        for proc in procs:
            proc.wait_until(lambda p=proc: any("up:" in line for line in p.err), 30, "node up")
        yield procs
    finally:
        for proc in procs:
            proc.stop()


def start_tail(mesh: str, *args: str) -> Running:
    tail = Running("tail", "--mesh", mesh, "--json", *args)
    tail.wait_until(lambda: {"watching alpha", "watching beta"} <= set(tail.err), 30,
                    "tail connected")
    return tail


def test_every_tail_sees_every_send(nodes: list[Running], mesh: str) -> None:
    tails = [start_tail(mesh), start_tail(mesh)]
    try:
        for i in range(6):
            out = cli("send", "log", f"note {i}", "--mesh", mesh, "--wait", "15")
            assert out.returncode == 0, out.stderr
            assert "published on log to 4 of 4 subscriber(s)" in out.stderr, out.stderr
        for tail in tails:
            tail.wait_until(lambda t=tail: len(t.out) >= 6, 30, "six broadcasts")
            got = [json.loads(line)["activity"]["summary"] for line in tail.out]
            assert got == [f"note {i}" for i in range(6)]
    finally:
        for tail in tails:
            tail.stop()


def test_send_names_the_watcher_it_could_not_reach(nodes: list[Running], mesh: str) -> None:
    tail = start_tail(mesh)
    os.kill(tail.proc.pid, signal.SIGSTOP)  # known on the mesh, but cannot subscribe
    try:
        out = cli("send", "log", "are you there", "--mesh", mesh, "--wait", "3",
                  "--output", "json")
        assert out.returncode == 1, out.stderr
        report = json.loads(out.stdout)
        assert report["missed"] == [f"porter-tail-{tail.proc.pid}"]
        assert set(report["reached"]) == {"alpha", "beta"}
        assert report["ok"] is False
    finally:
        os.kill(tail.proc.pid, signal.SIGCONT)
        tail.stop()


def test_send_repeats_and_reads_an_activity(nodes: list[Running], mesh: str,
                                            tmp_path: object) -> None:
    tail = start_tail(mesh, "log")
    try:
        activity = json.dumps({"type": "Announce", "summary": "from a file"})
        out = cli("send", "log", "--json", "-", "--count", "3", "--mesh", mesh,
                  "--output", "json", stdin=activity)
        assert out.returncode == 0, out.stderr
        reports = [json.loads(line) for line in out.stdout.splitlines()]
        assert len(reports) == 3 and all(r["ok"] for r in reports)
        tail.wait_until(lambda: len(tail.out) >= 3, 30, "three copies")
        acts = [json.loads(line)["activity"] for line in tail.out]
        assert [a["summary"] for a in acts] == ["from a file"] * 3
        # One command, one seat: a name of the human's that is not the dashboard's.
        assert len({a["actor"] for a in acts}) == 1 and is_human(acts[0]["actor"])
        assert acts[0]["actor"] != "porter-ui"
        # A tail line goes back in through validate and send as it is.
        again = cli("send", "log", "--json", "-", "--mesh", mesh, stdin=tail.out[0])
        assert again.returncode == 0, again.stderr
        valid = cli("validate", "-", stdin="\n".join(tail.out))
        assert valid.returncode == 0, valid.stderr
    finally:
        tail.stop()


def test_an_offer_without_context_gets_one(nodes: list[Running], mesh: str) -> None:
    out = cli("send", "task:alpha", "do it", "--mesh", mesh)
    assert out.returncode == 0, out.stderr
    first = out.stderr.splitlines()[0]
    assert first.startswith("context urn:porter:task:"), out.stderr
