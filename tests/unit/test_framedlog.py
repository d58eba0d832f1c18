"""The framed log under both journals, on a real disk: frames come back as written, a
torn tail is cut wherever the write stopped, a damaged frame stops the replay and is
reported, a batch on a full filesystem is all or nothing, and each fsync policy syncs
when it says."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from porter_mesh.adapters.framedlog import (
    FRAME,
    DamagedLogError,
    FramedLog,
    Frames,
    Fsync,
    encode_frame,
)
from porter_mesh.errors import StorageError

HEADER = b"test log 1\n"
PAYLOADS = [b"first", b"second record", b"x" * 300, b"fourth", b"last one"]


def open_log(path: Path, fsync: Fsync = Fsync.NONE, end: int | None = None) -> FramedLog:
    return FramedLog(path, header=HEADER, fsync=fsync, max_frame=1 << 16,
                     what="test log", advice="free some space", end=end)


def written(path: Path, payloads: list[bytes]) -> list[int]:
    """A log at ``path`` holding ``payloads`` (one append each); their offsets."""
    log = open_log(path)
    try:
        return [log.append([p])[0] for p in payloads]
    finally:
        log.close()


def replayed(path: Path) -> list[bytes]:
    log = open_log(path)
    try:
        return [payload for _, payload in log.replay()]
    finally:
        log.close()


def test_frames_come_back_at_their_offsets(tmp_path: Path) -> None:
    path = tmp_path / "log"
    log = open_log(path)
    assert path.read_bytes() == HEADER and log.end == len(HEADER)
    first = log.append(PAYLOADS[:2])
    rest = log.append(PAYLOADS[2:])
    offsets = first + rest
    assert offsets[0] == len(HEADER)
    assert log.end == path.stat().st_size
    assert [log.read(o) for o in offsets] == PAYLOADS
    log.close()
    again = open_log(path)
    assert list(again.replay()) == list(zip(offsets, PAYLOADS, strict=True))
    assert list(again.replay(offsets[3])) == list(zip(offsets[3:], PAYLOADS[3:], strict=True))
    assert again.end == path.stat().st_size  # nothing cut
    again.close()


def test_a_torn_tail_is_cut_at_every_byte_of_the_last_frame(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Whatever byte the last write stopped at (inside the frame's head, or inside its
    payload), the frames before it are read, the rest is cut off and the warning says
    how many bytes; the next append lands right after the last whole frame."""
    caplog.set_level(logging.WARNING, logger="porter_mesh.framedlog")
    whole = tmp_path / "whole"
    offsets = written(whole, PAYLOADS)
    data = whole.read_bytes()
    last = offsets[-1]
    assert len(data) - last == FRAME.size + len(PAYLOADS[-1])
    path = tmp_path / "log"
    for kept in range(1, len(data) - last):
        caplog.clear()
        path.write_bytes(data[:last + kept])
        log = open_log(path)
        try:
            assert [p for _, p in log.replay()] == PAYLOADS[:-1], kept
            assert path.stat().st_size == last and log.end == last, kept
            assert log.append([b"after"]) == [last]
        finally:
            log.close()
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 1 and f"cut {kept} bytes" in warnings[0], (kept, warnings)
        assert str(path) in warnings[0] and f"at byte {last}" in warnings[0]
        assert replayed(path) == [*PAYLOADS[:-1], b"after"]


def test_a_last_frame_that_fails_its_checksum_is_torn(tmp_path: Path) -> None:
    path = tmp_path / "log"
    offsets = written(path, PAYLOADS)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert replayed(path) == PAYLOADS[:-1]
    assert path.stat().st_size == offsets[-1]


def test_zeros_past_the_last_frame_are_a_torn_tail(tmp_path: Path) -> None:
    """What a machine that lost power can leave: the size grew, the data never came."""
    path = tmp_path / "log"
    written(path, PAYLOADS)
    size = path.stat().st_size
    with open(path, "ab") as fh:
        fh.write(b"\0" * 8192)
    assert replayed(path) == PAYLOADS
    assert path.stat().st_size == size


@pytest.mark.parametrize(("at", "bit"), [
    (FRAME.size + 10, 0x01),  # one bit of the third payload: its checksum fails
    # The top bit of its length: past max_frame, a length no append writes, so not a
    # write cut short even though it points past the end (cutting there would drop the
    # frames after it, and the shard would reuse their sequence numbers).
    (0, 0x80),
], ids=["payload", "length"])
def test_a_corrupt_frame_in_the_middle_stops_the_replay_and_says_so(
        tmp_path: Path, at: int, bit: int) -> None:
    """A damaged frame with whole frames after it is damage, not a torn write: the
    replay yields what comes before it, then raises with the offset, and cuts nothing
    (what follows it may still matter)."""
    path = tmp_path / "log"
    offsets = written(path, PAYLOADS)
    data = bytearray(path.read_bytes())
    data[offsets[2] + at] ^= bit
    path.write_bytes(bytes(data))
    log = open_log(path)
    seen = []
    with pytest.raises(DamagedLogError) as caught:
        for _, payload in log.replay():
            seen.append(payload)
    log.close()
    assert seen == PAYLOADS[:2]
    damage = caught.value.damage
    assert damage.offset == offsets[2] and damage.corrupt
    assert damage.lost == len(data) - offsets[2]
    assert f"damaged at byte {offsets[2]}" in str(caught.value)
    assert path.read_bytes() == bytes(data)  # nothing cut
    # The pure reader says the same.
    frames = Frames(bytes(data), len(HEADER), max_frame=1 << 16)
    assert [p for _, p in frames] == PAYLOADS[:2]
    assert frames.damage == damage and frames.end == offsets[2]


def test_replay_until_reads_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "log"
    offsets = written(path, PAYLOADS)
    with open(path, "ab") as fh:
        fh.write(b"\x00\x00\x01")  # a torn head
    size = path.stat().st_size
    log = open_log(path)
    assert [p for _, p in log.replay(until=offsets[3])] == PAYLOADS[:3]
    assert [p for _, p in log.replay(until=size)] == PAYLOADS
    assert path.stat().st_size == size
    log.close()


def test_empty_and_oversized_payloads_are_refused_whole(tmp_path: Path) -> None:
    path = tmp_path / "log"
    log = open_log(path)
    for batch in ([b"ok", b""], [b"ok", b"x" * ((1 << 16) + 1)]):
        with pytest.raises(ValueError, match="a frame holds"):
            log.append(batch)
    assert path.read_bytes() == HEADER and log.end == len(HEADER)
    log.close()


@pytest.mark.parametrize("policy", list(Fsync))
def test_each_fsync_policy_syncs_when_it_says(tmp_path: Path, policy: Fsync) -> None:
    log = open_log(tmp_path / "log", policy)
    log.append([b"a", b"b"])
    log.append([b"c"], sync=False)
    if policy is Fsync.EVERY:
        assert log.syncs == 2 and log.synced == log.end
    elif policy is Fsync.NONE:
        assert log.syncs == 0 and log.synced == log.end
    else:
        # The first append asked for its sync, the second left it to the caller.
        assert log.syncs == 1 and log.synced < log.end
        log.sync_to(log.end)
        log.sync_to(log.end)  # covered already: no second fdatasync
        assert log.syncs == 2 and log.synced == log.end
    log.close()


def test_group_commit_shares_one_fdatasync_among_waiting_writers(tmp_path: Path) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    log = open_log(tmp_path / "log", Fsync.GROUP)
    lock = threading.Lock()  # one writer at a time, as the shard's lock does
    start = threading.Barrier(8)

    def writer(k: int) -> int:
        start.wait(10)
        for i in range(40):
            with lock:
                (offset,) = log.append([f"{k}-{i}".encode()], sync=False)
                end = log.end
            log.sync_to(end)  # outside the lock: other writers join this one
            assert log.synced > offset
        return k

    with ThreadPoolExecutor(8) as pool:
        assert sorted(pool.map(writer, range(8), timeout=60)) == list(range(8))
    assert len(list(log.replay())) == 320
    assert log.syncs < 320, f"{log.syncs} fdatasyncs for 320 appends"
    log.close()


def test_a_rewrite_replaces_the_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "log"
    log = open_log(path)
    log.append(PAYLOADS)
    ends = log.rewrite(b"test log 2\n", [b"kept"])
    assert ends == [len(b"test log 2\n") + FRAME.size + 4]
    assert log.end == ends[-1]
    log.append([b"after"])
    log.close()
    assert path.read_bytes() == b"test log 2\n" + encode_frame(b"kept") + encode_frame(b"after")
    # A rewrite a crash interrupted leaves its temporary file: it is cleared on open.
    path.with_suffix(".tmp").write_bytes(b"half of a rewrite")
    open_log(path).close()
    assert not path.with_suffix(".tmp").exists()


def test_a_batch_on_a_full_disk_is_all_or_nothing(tmp_path: Path) -> None:
    """A real full filesystem: a batch that does not fit raises StorageError naming the
    free space, leaves the file byte for byte as it was (its first frames, which did fit,
    are cut back too), and goes through whole once there is space."""
    from tests.tinyfs import fill, tiny_filesystem

    with tiny_filesystem(tmp_path / "fs") as fs:
        path = fs / "log"
        log = open_log(path)
        log.append([b"before"])
        before = path.read_bytes()
        filler = fill(fs, leave=100)
        batch = [b"small", b"y" * 16384, b"z"]
        with pytest.raises(StorageError) as caught:
            log.append(batch)
        error = caught.value
        assert error.path == str(path) and error.errno is not None
        assert error.free_bytes is not None and error.free_bytes < 16384
        assert f"({error.free_bytes} bytes free)" in str(error)
        assert "nothing was kept; free some space" in str(error)
        assert path.read_bytes() == before and log.end == len(before)
        assert log.failures == 1
        filler.unlink()
        offsets = log.append(batch)
        assert offsets[0] == len(before)
        log.close()
        assert replayed(path) == [b"before", *batch]


def test_a_new_log_that_cannot_be_made_says_so(tmp_path: Path) -> None:
    from tests.tinyfs import fill, tiny_filesystem

    with tiny_filesystem(tmp_path / "fs") as fs:
        filler = fill(fs)
        with pytest.raises(StorageError, match="free some space") as caught:
            open_log(fs / "log")
        assert caught.value.path == str(fs / "log")
        assert not (fs / "log").exists() and not (fs / "log.tmp").exists()
        filler.unlink()
        open_log(fs / "log").close()
        assert (fs / "log").read_bytes() == HEADER


def test_opening_at_a_known_end_cuts_what_follows(tmp_path: Path) -> None:
    """A user that read the file itself (the delivery journal) names where its whole
    frames end; the log cuts the rest when it opens."""
    path = tmp_path / "log"
    offsets = written(path, PAYLOADS)
    log = open_log(path, end=offsets[-1])
    assert path.stat().st_size == offsets[-1] == log.end
    log.close()
    assert replayed(path) == PAYLOADS[:-1]
    assert os.path.getsize(path) == offsets[-1]


def test_a_failed_fdatasync_is_never_reported_durable_later(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After an fdatasync fails (EIO), the kernel may have dropped the pages it covered: a
    later good fdatasync must not make a caller waiting on those frames believe them
    durable, while frames written after the failure are made durable as usual."""
    import errno

    log = open_log(tmp_path / "log", Fsync.GROUP)
    log.append([b"before"])  # synced
    (lost,) = log.append([b"in the failed sync"], sync=False)
    lost_end = log.end
    real = os.fdatasync

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(StorageError, match="durable"):
        log.sync_to(lost_end)
    monkeypatch.setattr(os, "fdatasync", real)
    log.append([b"after"], sync=False)
    log.sync_to(log.end)  # a good sync for the later frame
    assert log.synced == log.end
    with pytest.raises(StorageError, match="earlier fdatasync"):
        log.sync_to(lost_end)  # still not durable as far as anyone can know
    assert lost < lost_end
    log.close()


def test_a_rewrite_whose_directory_sync_fails_still_appends_to_the_new_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rename happened, then syncing the directory failed: appends go to the file the
    path names, not to the old, unlinked one."""
    import errno

    from porter_mesh.adapters import framedlog

    path = tmp_path / "log"
    log = open_log(path)
    log.append(PAYLOADS)

    def failing(directory: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(framedlog, "fsync_directory", failing)
    with pytest.raises(OSError):
        log.rewrite(HEADER, [b"kept"])
    monkeypatch.undo()
    log.append([b"after"])
    log.close()
    assert replayed(path) == [b"kept", b"after"]
