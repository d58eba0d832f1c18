"""The command line against a secured node, as processes: without keys a command is told,
in one line and within its wait, which keys to make, and the node audits the refusal;
with the human's key (``porter-ui``) a command's seat is let in under its own name."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from porter_mesh.adapters.security import AUDIT_FILE, create_key_pair, provision_mesh
from porter_mesh.node.config import ENV_KEY, ENV_TRUSTED
from tests.integration.test_cli_knowledge import Daemon

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]
_ids = itertools.count()
CLI = (sys.executable, "-m", "porter_mesh.cli.main")
WAIT = 20.0


def cli(*args: str, keys: dict[str, str] | None = None) -> tuple[int, str, float]:
    """Run a command without keys (or with ``keys``): exit status, stderr, seconds."""
    env = {k: v for k, v in os.environ.items() if k not in (ENV_KEY, ENV_TRUSTED)}
    env.update(keys or {})
    started = time.monotonic()
    out = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=90, env=env)
    return out.returncode, out.stderr, time.monotonic() - started


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    trusted, secrets = provision_mesh(tmp_path / "keys", ["alice", "porter-ui"])
    # A key named porter-ui that the mesh does not trust.
    _, secrets["stranger"] = create_key_pair(tmp_path / "stranger", "porter-ui")
    return {"trusted": trusted, **secrets}


def env_for(keys: dict[str, Path], who: str) -> dict[str, str]:
    return {ENV_KEY: str(keys[who]), ENV_TRUSTED: str(keys["trusted"])}


@pytest.fixture
def alice(keys: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
          ) -> Iterator[Daemon]:
    mesh = f"keys{os.getpid()}-{next(_ids)}"
    with monkeypatch.context() as patch:
        for name, value in env_for(keys, "alice").items():
            patch.setenv(name, value)
        node = Daemon("node", "--name", "alice", "--mesh", mesh, "--data-dir",
                      str(tmp_path / "alice"), ready="node alice up")
    node.mesh = mesh  # type: ignore[attr-defined]
    try:
        yield node
    finally:
        node.stop()


def audit(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def assert_needs_keys(rc: int, err: str, took: float, command: str) -> None:
    lines = err.splitlines()
    assert rc == 2, (command, rc, err)
    assert len(lines) == 1, (command, lines)
    line = lines[0]
    assert line.startswith(f"porter-mesh {command}: alice is secured"), line
    for words in ("porter-mesh keygen porter-ui", "porter-mesh trust porter-ui.key",
                  "PORTER_MESH_KEY", "docs/security.md"):
        assert words in line, (words, line)
    assert "attempt" not in line and "Traceback" not in err
    assert took < WAIT, f"{command} took {took:.1f}s: it waited for its whole --wait"


def test_without_keys_every_command_is_told_to_make_them(alice: Daemon, tmp_path: Path
                                                         ) -> None:
    mesh: str = alice.mesh  # type: ignore[attr-defined]
    net = ("--mesh", mesh, "--wait", str(WAIT))
    rc, err, took = cli("send", "task:alice", "hello", "--type", "Note", *net)
    assert_needs_keys(rc, err, took, "send")
    rc, err, took = cli("send", "log", "hello", *net)
    assert_needs_keys(rc, err, took, "send")
    rc, err, took = cli("request", "task:alice", "do it", "--context", "k1", *net)
    assert_needs_keys(rc, err, took, "request")
    rc, err, took = cli("recall", "SELECT ?s WHERE { ?s ?p ?o }", *net)
    assert_needs_keys(rc, err, took, "recall")
    # Without mDNS, through a seed: the handshake says so all the same.
    seed = ("--no-discovery", "--peer", f"alice@127.0.0.1:{alice.router_port}")
    rc, err, took = cli("send", "task:alice", "hello", "--type", "Note", "--mesh", mesh,
                        "--wait", str(WAIT), *seed)
    assert_needs_keys(rc, err, took, "send")

    # The node wrote the refusals down, and warned once.
    records = audit(tmp_path / "alice" / AUDIT_FILE)
    refused = [r for r in records if r["event"] == "no-key"]
    assert refused, records
    assert all(r["node"] == "alice" and "without keys" in r["detail"] for r in refused)
    assert len(refused) <= 10  # the client stopped knocking once told (5 commands, 2 sockets)
    alice.wait_line(lambda line: "WARNING" in line and "(no-key)" in line, 10,
                    "the node's warning")


def test_the_humans_key_lets_a_seat_in_and_an_untrusted_key_is_told(
        alice: Daemon, keys: dict[str, Path], tmp_path: Path) -> None:
    mesh: str = alice.mesh  # type: ignore[attr-defined]
    net = ("--mesh", mesh, "--wait", str(WAIT))
    rc, err, _ = cli("send", "task:alice", "hello", "--type", "Note", *net,
                     keys=env_for(keys, "porter-ui"))
    assert rc == 0, err
    assert "delivered to alice" in err
    rc, err, _ = cli("remember", "urn:porter:file:a", "a fact", *net,
                     keys=env_for(keys, "porter-ui"))
    assert rc == 0 and "alice holds it" in err, err
    # A key that alice does not trust: refused by alice's ZAP, which the seat learns.
    rc, err, took = cli("send", "task:alice", "hello", "--type", "Note", *net,
                        keys=env_for(keys, "stranger"))
    last = err.splitlines()[-1]
    assert rc == 2, err
    assert last.startswith("porter-mesh send: alice refused the key of porter-ui-"), last
    assert "porter-mesh trust porter-ui.key" in last and took < WAIT
    events = {r["event"] for r in audit(tmp_path / "alice" / AUDIT_FILE)}
    # The seats with the human's key were not taken for spoofers; the stranger was audited.
    assert events == {"untrusted-key"}, events
