"""Delivery journal soak: sustained direct traffic to a journaled node, its disk use
over time.

Run from the repository root::

    .venv/bin/python -m bench.bench_journal            # 20 s
    .venv/bin/python -m bench.bench_journal --quick    # 5 s

A receiver node runs in its own process (this module with ``--receiver``) with a data
directory, no inbox and one handler, so every direct message is journaled before its
acknowledgement and taken as soon as the handler returns. This process sends it
batches of the AS2 profile's status ``Announce`` example, a few batches in flight, for
``--seconds`` or ``--count`` messages, whichever comes first, and samples the size of
the receiver's ``inbox.journal`` as it goes. Without compaction while running, the file
would grow by the size of every message; with it, it stays within about twice
``--compact-bytes`` (the journal is rewritten when it passes the threshold and taken
records make up over half of it).

Output: a table on stdout (size over time), ``bench/results/journal.json`` and
``bench/results/journal.png``. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from bench.common import RESULTS_DIR, environment, print_table, progress

NAME = "journal"
RECEIVER = "journal-rx"
SENDER = "journal-tx"
BATCH = 256
IN_FLIGHT = 4
#: Seconds between two samples of the journal's size.
SAMPLE_EVERY = 0.25


def _announce(actor: str) -> Any:
    from bench.node_peer import ANNOUNCE
    from porter_mesh.core.as2 import Activity

    return Activity.from_dict({**ANNOUNCE, "actor": actor})


async def receiver(data_dir: pathlib.Path, compact_bytes: int) -> None:
    """The receiving node: prints its ROUTER port, runs until stdin closes."""
    from porter_mesh.node.node import Message, Node

    taken = 0

    def handle(_msg: Message) -> None:
        nonlocal taken
        taken += 1

    async with Node(name=RECEIVER, mesh=f"bench-{os.getpid()}", discovery=False,
                    data_dir=data_dir, inbox_size=0, handlers=[handle],
                    journal_compact_bytes=compact_bytes) as node:
        print(json.dumps({"router": node.router_port}), flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes it
    print(json.dumps({"taken": taken}), flush=True)


async def soak(port: int, mesh: str, journal: pathlib.Path, seconds: float,
               count: int) -> list[dict[str, float]]:
    """Send until ``seconds`` pass or ``count`` messages are acknowledged; returns the
    samples ``{"t", "bytes", "sent"}``."""
    from porter_mesh.node.node import Node

    samples: list[dict[str, float]] = []
    async with Node(name=SENDER, mesh=mesh, discovery=False, seeds=(f"127.0.0.1:{port}",),
                    send_timeout=30.0) as node:
        await node.wait_for_peers([RECEIVER], 20)
        batch = [_announce(SENDER)] * BATCH
        start = time.monotonic()
        next_sample = start
        sent = 0
        flying: list[asyncio.Future[None]] = []
        while True:
            now = time.monotonic()
            if now >= next_sample:
                samples.append({"t": round(now - start, 3), "bytes": journal.stat().st_size,
                                "sent": sent})
                next_sample = now + SAMPLE_EVERY
            if now - start >= seconds or sent >= count:
                break
            flying.append(node.async_send_many(RECEIVER, batch))
            if len(flying) >= IN_FLIGHT:
                await flying.pop(0)
                sent += BATCH
        for fut in flying:
            await fut
            sent += BATCH
        samples.append({"t": round(time.monotonic() - start, 3),
                        "bytes": journal.stat().st_size, "sent": sent})
    return samples


def plot(results: dict[str, Any], out: pathlib.Path) -> pathlib.Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = results["samples"]
    fig, size_ax = plt.subplots(figsize=(9, 4))
    size_ax.plot([s["t"] for s in samples], [s["bytes"] / 1e6 for s in samples],
                 color="#2e86c1", label="inbox.journal (MB)")
    size_ax.axhline(results["compact_bytes"] / 1e6, color="#c0392b", linestyle="dashed",
                    label="compaction threshold")
    size_ax.set_ylim(0, max(results["max_bytes"], results["compact_bytes"]) * 1.2 / 1e6)
    size_ax.set_xlabel("seconds")
    size_ax.set_ylabel("journal size (MB)")
    sent_ax = size_ax.twinx()
    sent_ax.plot([s["t"] for s in samples], [s["sent"] / 1e6 for s in samples],
                 color="#aab7b8", label="messages acknowledged (millions)")
    sent_ax.set_ylabel("messages acknowledged (millions)")
    lines = size_ax.get_legend_handles_labels()
    more = sent_ax.get_legend_handles_labels()
    size_ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    size_ax.set_title(f"Delivery journal under sustained direct traffic: {results['sent']:,} "
                      f"messages, {results['received_mb']:.0f} MB received", fontsize=10)
    fig.tight_layout()
    path = out / f"{NAME}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """Run the soak; print the table; write the JSON and the chart."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 s instead of 20 s")
    parser.add_argument("--seconds", type=float, help="how long to send (default 20)")
    parser.add_argument("--count", type=int, default=5_000_000,
                        help="most messages to send (default %(default)s)")
    parser.add_argument("--compact-bytes", type=int, default=1024 * 1024,
                        help="the receiver's journal_compact_bytes (default 1 MiB)")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS_DIR)
    parser.add_argument("--receiver", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.receiver is not None:
        asyncio.run(receiver(args.receiver, args.compact_bytes))
        return 0
    seconds = args.seconds or (5.0 if args.quick else 20.0)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = pathlib.Path(tmp) / "rx"
        progress(f"journal soak: {seconds:g} s, threshold {args.compact_bytes} bytes")
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.bench_journal", "--receiver", str(data_dir),
             "--compact-bytes", str(args.compact_bytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdin is not None
            port = json.loads(proc.stdout.readline())["router"]
            mesh = f"bench-{proc.pid}"
            samples = asyncio.run(soak(port, mesh, data_dir / "inbox.journal", seconds,
                                       args.count))
            proc.stdin.close()
            taken = json.loads(proc.stdout.readline())["taken"]
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
    sent = int(samples[-1]["sent"])
    payload = len(_announce(SENDER).to_json())
    results = {
        "environment": environment(), "seconds": seconds, "compact_bytes": args.compact_bytes,
        "sent": sent, "taken": taken, "received_mb": sent * payload / 1e6,
        "max_bytes": max(s["bytes"] for s in samples), "final_bytes": samples[-1]["bytes"],
        "samples": samples,
    }
    shown = samples[::max(1, len(samples) // 12)]
    if shown[-1] is not samples[-1]:
        shown.append(samples[-1])
    print_table(["t (s)", "journal bytes", "messages acknowledged"],
                [[s["t"], f"{int(s['bytes']):,}", f"{int(s['sent']):,}"] for s in shown])
    print(f"\n{sent:,} messages ({results['received_mb']:.0f} MB of payload) journaled and "
          f"taken; the journal peaked at {results['max_bytes']:,} bytes "
          f"(threshold {args.compact_bytes:,})")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{NAME}.json").write_text(json.dumps(results, indent=1))
    chart = plot(results, args.out)
    print(f"wrote {args.out / (NAME + '.json')} and {chart}")
    return 0 if taken == sent else 1


if __name__ == "__main__":
    sys.exit(main())
