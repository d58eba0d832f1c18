"""The replica state a shard saves at close: the next start reads it back and scans only
the journal written after it, and a saved state that does not match its journal (damaged,
from another journal, ahead of a cut journal) is not used. Real shards on a real disk;
the crash is a real process that ends without closing its shard."""

from __future__ import annotations

import logging
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest

from porter_mesh.adapters.shard import Durability, Index, Shard
from porter_mesh.core.knowledge import Observation, Record, format_timestamp

STATE = "replica-state"
LOGGER = "porter_mesh.shard"


def build(path: pathlib.Path, n: int, *, agent: str = "worker-1",
          index: Index = Index.AUTO) -> None:
    """A closed shard: ``n`` Remembers of ``agent``, a peer's records with a hole in
    their sequence, and a retraction."""
    with Shard(path, agent=agent, durability=Durability.OS, index=index) as s:
        own = [s.remember(f"urn:porter:file:f{i}.ts", f"finding {agent} {i}")
               for i in range(n)]
        peer = [Record("peer-1", seq, Observation(f"urn:porter:file:p{seq}.ts",
                                                  f"peer finding {seq}", "peer-1",
                                                  format_timestamp(1_700_000_000 + seq)))
                for seq in (1, 2, 3, 5, 6)]
        assert s.merge(peer).accepted == 5
        s.retract(own[1].body.iri)  # type: ignore[union-attr]


def state_of(s: Shard) -> tuple[object, ...]:
    st = s.state
    return (st.version_vector(), st.digest(), st.record_count, st.observation_records,
            st.retraction_records, st.retracted, st.missing_ranges(),
            st.locators_in("worker-1", 1, 1000), st.locators_in("peer-1", 1, 1000),
            s.stats().observations)


def scanned_whole(path: pathlib.Path, tmp_path: pathlib.Path) -> tuple[object, ...]:
    """The state of a copy of the shard at ``path`` read from its whole journal."""
    copy = tmp_path / "scanned"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(path, copy)
    (copy / STATE).unlink(missing_ok=True)
    with Shard(copy) as s:
        return state_of(s)


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


@pytest.mark.parametrize("index", [Index.MEMORY, Index.DISK])
def test_a_clean_restart_reads_only_the_journal_past_the_saved_state(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture, index: Index) -> None:
    path = tmp_path / "s"
    build(path, 40, index=index)
    assert (path / STATE).is_file(), "closing saved no replica state"
    expected = scanned_whole(path, tmp_path)
    caplog.set_level(logging.INFO, logger=LOGGER)
    caplog.clear()  # only what the start below logs
    with Shard(path, index=index) as s:
        assert state_of(s) == expected
        assert any("read back; the 0 bytes of journal past it are read" in m
                   for m in messages(caplog)), messages(caplog)
        assert s.remember("urn:porter:file:next.ts", "next").seq == 42  # 40, a retraction


def test_after_a_crash_the_journal_past_the_saved_state_is_read(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "s"
    build(path, 20)
    # Another process opens it, writes, retracts and ends without closing (no new state
    # is saved: the one from the clean close stays, behind the journal).
    crash = textwrap.dedent(f"""
        import os
        from porter_mesh.adapters.shard import Shard
        s = Shard({str(path)!r})
        late = [s.remember(f"urn:porter:file:late{{i}}.ts", f"late {{i}}") for i in range(7)]
        s.retract(late[2].body.iri)
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", crash], check=True, timeout=60)
    expected = scanned_whole(path, tmp_path)
    caplog.set_level(logging.INFO, logger=LOGGER)
    caplog.clear()  # only what the start below logs
    with Shard(path) as s:
        assert state_of(s) == expected
        assert s.state.version_vector()["worker-1"] == 29  # 21, then 7 and a retraction
        read = [m for m in messages(caplog) if "saved at the last close is read back" in m]
        assert read and "the 0 bytes" not in read[0], messages(caplog)
        assert s.remember("urn:porter:file:next.ts", "next").seq == 30


def _damaged(path: pathlib.Path, tmp_path: pathlib.Path) -> str:
    data = bytearray((path / STATE).read_bytes())
    data[-5] ^= 0xFF
    (path / STATE).write_bytes(bytes(data))
    return "it is damaged"


def _from_another_journal(path: pathlib.Path, tmp_path: pathlib.Path) -> str:
    other = tmp_path / "other"
    build(other, 3, agent="worker-2")  # a shorter journal: its state's offset lies within
    shutil.copy(other / STATE, path / STATE)
    return "it was saved from another journal"


def _ahead_of_a_cut_journal(path: pathlib.Path, tmp_path: pathlib.Path) -> str:
    later = tmp_path / "later"
    shutil.copytree(path, later)
    with Shard(later) as s:
        s.remember("urn:porter:file:more.ts", "more")
    shutil.copy(later / STATE, path / STATE)  # the journal lost what this state holds
    return "bytes of journal, and the journal holds"


@pytest.mark.parametrize("spoil", [_damaged, _from_another_journal, _ahead_of_a_cut_journal])
def test_a_saved_state_that_does_not_match_its_journal_is_not_used(
        tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture, spoil: object) -> None:
    path = tmp_path / "s"
    build(path, 12)
    expected = scanned_whole(path, tmp_path)
    assert callable(spoil)
    why = spoil(path, tmp_path)
    caplog.set_level(logging.INFO, logger=LOGGER)
    caplog.clear()  # only what the start below logs
    with Shard(path) as s:
        assert state_of(s) == expected
        warned = [m for m in messages(caplog) if "is not used" in m]
        assert warned and why in warned[0] and "the whole journal is read" in warned[0], \
            messages(caplog)
        assert not any("read back" in m for m in messages(caplog))
        assert s.remember("urn:porter:file:next.ts", "next").seq == 14
