"""A real, tiny filesystem for tests of what happens when the disk is full.

``tiny_filesystem(dir)`` mounts a tmpfs of a few MiB on ``dir`` (root only: the test is
skipped with the reason printed otherwise) and unmounts it afterwards; ``fill(dir)``
writes a file until the filesystem has no space left, and returns it so the test can
free the space again by removing it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import subprocess
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def tiny_filesystem(path: pathlib.Path, size: str = "2m") -> Iterator[pathlib.Path]:
    """Mount a tmpfs of ``size`` on ``path`` (created) for the duration."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs (a real full disk); run as root")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs on {path}: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


def fill(path: pathlib.Path, leave: int = 0) -> pathlib.Path:
    """Write ``path/filler`` until the filesystem is full (then shrink it so ``leave``
    bytes stay free). Returns the filler file."""
    filler = path / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    chunk = b"\0" * 65536
    try:
        while True:
            try:
                if os.write(fd, chunk) < len(chunk):
                    chunk = chunk[:len(chunk) // 2 or 1]
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    break
                chunk = chunk[:len(chunk) // 2]
        if leave:
            os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
    finally:
        os.close(fd)
    return filler
