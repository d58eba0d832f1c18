"""Data directories: where they default to, one process each, and the byte-bounded
broadcast batches that keep a subscriber's queue within its budget."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from porter_mesh.adapters.dirlock import DirLock
from porter_mesh.core.as2 import Activity
from porter_mesh.core.envelope import decode_payload
from porter_mesh.core.session.sending import runs
from porter_mesh.errors import ConfigError, KnowledgeError
from porter_mesh.node.config import (
    BROADCAST_MESSAGE_BYTES,
    SUBSCRIBER_QUEUE_BYTES,
    NodeConfig,
    data_root,
    default_data_dir,
)


def test_the_data_root_is_porter_mesh_data_else_the_user_data_directory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("PORTER_MESH_DATA", str(tmp_path / "root"))
    assert default_data_dir("lab", "worker-1") == tmp_path / "root" / "lab" / "worker-1"
    monkeypatch.delenv("PORTER_MESH_DATA")
    if sys.platform.startswith("linux"):
        monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
        assert data_root() == tmp_path / "xdg" / "porter-mesh"
        monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
        assert data_root() == pathlib.Path.home() / ".local" / "share" / "porter-mesh"


def test_a_locked_directory_is_refused_naming_the_holder(tmp_path: pathlib.Path) -> None:
    with DirLock(tmp_path / "d") as lock:
        assert lock.held
        with pytest.raises(ConfigError, match=f"pid {os.getpid()}"):
            DirLock(tmp_path / "d")
        # Another process is refused too (flock belongs to the open file).
        code = subprocess.run([sys.executable, "-c", (
            "import sys; from porter_mesh.adapters.dirlock import DirLock\n"
            "try:\n DirLock(sys.argv[1])\nexcept Exception as e:\n print(e); sys.exit(3)"),
            str(tmp_path / "d")], capture_output=True, text=True, timeout=60)
        assert code.returncode == 3 and f"pid {os.getpid()}" in code.stdout
        with pytest.raises(KnowledgeError, match="the shard"):
            DirLock(tmp_path / "d", what="the shard", error=KnowledgeError)
    assert not lock.held
    DirLock(tmp_path / "d").release()  # free again once released


def test_the_pub_mark_is_the_byte_budget_in_messages() -> None:
    cfg = NodeConfig(name="w")
    assert cfg.pub_hwm * cfg.broadcast_message_bytes == SUBSCRIBER_QUEUE_BYTES
    assert cfg.broadcast_message_bytes == BROADCAST_MESSAGE_BYTES
    with pytest.raises(ConfigError, match="at least one broadcast"):
        NodeConfig(name="w", subscriber_queue_bytes=1000, broadcast_message_bytes=4096)


def _note(i: int, size: int) -> Activity:
    return Activity.from_dict({"type": "Announce", "actor": "w", "summary": f"{i}:" + "x" * size})


@pytest.mark.parametrize("size", [10, 300, 3000, 9000])
def test_broadcast_batches_are_split_by_bytes_in_order(size: int) -> None:
    activities = [_note(i, size) for i in range(500)]
    cap = 8192
    got = []
    for chunk, payload in runs(activities, None, batch_max=64, max_bytes=cap):
        assert len(payload) <= cap or len(chunk) == 1
        assert len(chunk) <= 64
        assert [a.summary for a in decode_payload(payload, len(chunk))] == [
            a.summary for a in chunk]
        got.extend(chunk)
    assert got == activities
