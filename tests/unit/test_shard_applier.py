"""The shard's store applier: a read waits for the batches committed before it, and
for nothing after."""

from __future__ import annotations

import threading

import pytest

from porter_mesh.adapters.shard import _Applier, _StoreTask

pytestmark = pytest.mark.timeout(60)


def test_a_read_does_not_wait_for_a_stream_of_writes_that_began_after_it() -> None:
    stop = threading.Event()
    written: list[int] = []
    applier: _Applier

    def write(task: _StoreTask) -> None:
        # Each batch written has the next one submitted already: the queue is never
        # empty while the stream goes on (a writer merging faster than the store).
        written.append(task.new_mark)
        if not stop.is_set():
            applier.submit(_StoreTask((), (), task.new_mark + 1, ()))

    applier = _Applier(write)
    drained = threading.Event()
    seen: list[int] = []

    def read() -> None:
        applier.drain()
        seen.append(len(written))
        drained.set()

    try:
        applier.submit(_StoreTask((), (), 1, ()))
        reader = threading.Thread(target=read)
        reader.start()
        try:
            assert drained.wait(10), "the read waited for the stream of writes to stop"
        finally:
            stop.set()
            reader.join(30)
        assert seen[0] >= 1  # the batch submitted before the read is in
    finally:
        applier.close()


def test_a_read_sees_every_batch_submitted_before_it() -> None:
    gate = threading.Semaphore(0)
    written: list[int] = []

    def write(task: _StoreTask) -> None:
        assert gate.acquire(timeout=30)
        written.append(task.new_mark)

    applier = _Applier(write)
    try:
        for mark in (1, 2, 3):
            applier.submit(_StoreTask((), (), mark, ()))
        for _ in range(3):
            gate.release()
        applier.drain()
        # Joined or not (the applier writes batches that wait together as one), the
        # last of the three was written before the read returned.
        assert written and written[-1] == 3, written
    finally:
        applier.close()
