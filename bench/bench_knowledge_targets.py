"""The knowledge shard's three ratio targets alone, quick enough to alternate two checkouts.

``bench.bench_knowledge`` measures everything once; on a shared machine one run of a
wall-clock ratio scatters widely, so comparing two versions of the code needs several
short runs of each, taken alternately. This measures, with the same functions:

* ``merge``: 100k observations merged (16,384 per message, journal fsync'd) against a
  raw on-disk ``bulk_load`` of the same N-Triples in the same process, twice; the ratio
  and the process CPU per observation.
* ``memory``: the marginal memory per observation between 10k and 100k (fresh child
  processes, as ``bench.bench_knowledge`` does).
* ``restart``: reopening a 100k shard with the in-memory index and with the on-disk
  index, twice each: until it serves the mesh, and until its queries answer (with the
  in-memory index, from the copy of it on disk while it loads); then once more until
  the in-memory index has loaded. Also the first close (which writes that copy) and
  the disk each index kind takes per observation.

Run from the checkout to measure, e.g. alternating with a ``git archive`` of another
commit: ``PYTHONPATH=. .venv/bin/python -m bench.bench_knowledge_targets merge`` (no
argument: all three).
Nothing is written besides temporary directories.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import tempfile
import time
from collections.abc import Sequence

import pyoxigraph as ox

from bench import bench_knowledge as bk
from porter_mesh.adapters.shard import Index, Shard, _ntriples
from porter_mesh.core.knowledge import MAX_RECORDS_PER_MESSAGE

N = 100_000


def merge(root: pathlib.Path) -> None:
    records = bk.make_records(N)
    msgs = bk.messages(records, MAX_RECORDS_PER_MESSAGE)
    text = _ntriples([r.body for r in records])  # type: ignore[misc]
    for i in range(2):
        raw = ox.Store(str(root / f"raw{i}"))
        started = time.perf_counter()
        raw.bulk_load(text, format=ox.RdfFormat.N_TRIPLES)
        raw.flush()
        raw_seconds = time.perf_counter() - started
        del raw
        with Shard(root / f"shard{i}", agent="bench") as shard:
            seconds, cpu = bk.merge_timed(shard, msgs)
        print(f"merge: raw bulk {N / raw_seconds:.0f} obs/s, shard {N / seconds:.0f} obs/s, "
              f"CPU {cpu / N * 1e6:.1f} us/obs, ratio {raw_seconds / seconds:.2f}", flush=True)


def memory(root: pathlib.Path) -> None:
    small = bk.memory_per_observation(root, N // 10, "shard")
    big = bk.memory_per_observation(root, N, "shard")
    marginal = (big["growth_mb"] - small["growth_mb"]) * 2**20 / (N - N // 10)
    print(f"memory: {small['bytes_per_obs']:.0f} B/obs at {N // 10}, "
          f"{big['bytes_per_obs']:.0f} at {N}, marginal {marginal:.0f} B/obs", flush=True)


def restart(root: pathlib.Path) -> None:
    msgs = bk.messages(bk.make_records(N), MAX_RECORDS_PER_MESSAGE)
    for index in (Index.MEMORY, Index.DISK):
        shard = Shard(root / index.name, agent="bench", index=index)
        bk.merge_into(shard, msgs)
        started = time.perf_counter()
        shard.close()
        closed = time.perf_counter() - started
        sizes = {p.name: bk.dir_bytes(p) if p.is_dir() else p.stat().st_size
                 for p in (root / index.name).iterdir()}
        print(f"close, {index.name.lower()} index: {closed:.2f} s; disk per observation: "
              + ", ".join(f"{name} {size / N:.0f} B" for name, size in sorted(sizes.items())
                          if size > 4096), flush=True)
        for _ in range(2):
            opened, ready = bk.reopen(root / index.name, "bench", index)
            print(f"restart, {index.name.lower()} index: serves after {opened:.2f} s, "
                  f"queries answer after {ready:.2f} s", flush=True)
        if index is Index.MEMORY:
            started = time.perf_counter()
            with Shard(root / index.name, agent="bench", index=index) as shard:
                shard.wait_index()
                print(f"restart, memory index: loaded into memory after "
                      f"{time.perf_counter() - started:.2f} s", flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", nargs="*", help="merge, memory or restart (default: all three)")
    args = parser.parse_args(argv)
    measures = {"merge": merge, "memory": memory, "restart": restart}
    unknown = set(args.what) - set(measures)
    if unknown:
        parser.error(f"unknown measure {', '.join(sorted(unknown))}; choose from "
                     "merge, memory, restart")
    for what in args.what or list(measures):
        root = pathlib.Path(tempfile.mkdtemp(prefix="porter-kg-targets-"))
        try:
            measures[what](root)
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
