"""The node's own work per message, counted in Python calls: a figure the machine's load
does not move.

Timings on a shared machine scatter with whatever else runs; the number of Python
function calls (C functions included) the node makes per message does not. Two nodes
run in one process and one event loop on 127.0.0.1 (no discovery), sending one activity
built beforehand (the node encodes it each time; building it is the application's
cost, measured by ``bench.bench_codec``), and cProfile counts
every call twice, over a short and a long run, so that the difference is the steady
cost of the extra messages, start-up and close left out:

* **round trip**: ``ping`` sends a direct message and waits for ``echo``'s reply, which
  its handler sends with ``async_send_nowait`` (both nodes' work: the request, its
  acknowledgement, the reply and its acknowledgement);
* **broadcast**: ``pub`` publishes on a channel that ``sub`` counts with a batch handler
  (both nodes' work per message, batching included).

CPU time per trip and per message is printed beside (process time, so both nodes, and
as noisy as any timing). Use it to compare two checkouts: run it in each (``cd
CHECKOUT && PYTHONPATH=. python -m bench.bench_calls``). Results: a table on stdout and
``bench/results/calls.json`` (or ``--out DIR``).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, environment, print_table, progress
from bench.node_peer import ANNOUNCE
from porter_mesh.core.as2 import Activity
from porter_mesh.node.node import Message, Node


def _activity(actor: str) -> Activity:
    return Activity.from_dict({**ANNOUNCE, "actor": actor})


async def _round_trips(n: int) -> float:
    """``n`` round trips after 50 to warm up; returns process CPU seconds for ``n``."""
    echo = Node(name="echo", discovery=False, channels=())
    await echo.astart()
    ping = Node(name="ping", discovery=False, channels=(),
                seeds=(f"127.0.0.1:{echo.router_port}",))
    try:
        await ping.astart()
        await ping.wait_for_peers(["echo"], 20)
        await echo.wait_for_peers(["ping"], 20)
        request, reply = _activity("ping"), _activity("echo")
        # The echo's last reply future, awaited before closing: its acknowledgement may
        # still be on its way, and closing fails what is unsettled. (Each earlier reply
        # is settled by the acknowledgement the next request carries.)
        last: list[asyncio.Future[None]] = []

        def answer(msg: Message) -> None:
            last[:] = [echo.async_send_nowait("ping", reply)]

        echo.add_handler(answer)
        started = 0.0
        for i in range(n + 50):
            if i == 50:
                started = time.process_time()
            ack = ping.async_send_nowait("echo", request)
            await ping.receive(timeout=10)
            await ack
        cpu = time.process_time() - started
        await asyncio.wait_for(last[0], 10)
        return cpu
    finally:
        await ping.aclose()
        await echo.aclose()


async def _broadcasts(n: int) -> float:
    """``n`` broadcasts from ``pub`` counted by ``sub``; returns process CPU seconds."""
    pub = Node(name="pub", discovery=False, channels=())
    await pub.astart()
    sub = Node(name="sub", discovery=False, channels=("status",), inbox_size=0,
               seeds=(f"127.0.0.1:{pub.router_port}",))
    got = 0
    done = asyncio.Event()

    def count(msgs: list[Message]) -> None:
        nonlocal got
        got += len(msgs)
        if got >= n:
            done.set()

    sub.add_batch_handler(count)
    try:
        await sub.astart()
        await pub.wait_for_peers(["sub"], 20)
        await pub.wait_for_subscribers("status", 1, 20)
        status = _activity("pub")
        started = time.process_time()
        for i in range(n):
            pub.async_publish("status", status)
            if i % 500 == 499:
                await asyncio.sleep(0)  # let the flush and the reads run
        await asyncio.wait_for(done.wait(), 60)
        return time.process_time() - started
    finally:
        await sub.aclose()
        await pub.aclose()


def _counted(run: Callable[[int], Coroutine[Any, Any, float]], n: int) -> tuple[int, float]:
    """Python calls made by ``run(n)`` (everything in the process), and its CPU seconds."""
    profile = cProfile.Profile()
    profile.enable()
    cpu = asyncio.run(run(n))
    profile.disable()
    calls: int = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    return calls, cpu


def measure(name: str, run: Callable[[int], Coroutine[Any, Any, float]], short: int,
            long: int) -> dict[str, Any]:
    """Calls per message of ``run``: the difference between a long and a short run."""
    progress(f"{name}: {short} and {long} messages, profiled")
    calls_short, _ = _counted(run, short)
    calls_long, _ = _counted(run, long)
    progress(f"{name}: {long} messages, timed")
    cpu = asyncio.run(run(long))
    extra = long - short
    return {"calls_per_message": (calls_long - calls_short) / extra,
            "cpu_us_per_message": cpu / long * 1e6, "short": short, "long": long}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer messages (a smoke test)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="directory for calls.json")
    a = p.parse_args()
    trips = (100, 300) if a.quick else (300, 1300)
    casts = (1000, 3000) if a.quick else (2000, 12000)
    res: dict[str, Any] = {
        "round trip": measure("round trip", _round_trips, *trips),
        "broadcast": measure("broadcast", _broadcasts, *casts),
    }
    print()
    print_table(["per message", "Python calls", "CPU us (both nodes)"],
                [[k, round(v["calls_per_message"], 1), round(v["cpu_us_per_message"], 1)]
                 for k, v in res.items()])
    res["meta"] = {"quick": a.quick, "environment": environment()}
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "calls.json"
    path.write_text(json.dumps(res, indent=2))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
