"""A node that publishes a paced burst on ``log`` for the dashboard's load test.

Prints JSON lines: ``up``; ``ready`` once ``--wait-for`` is on its roster and subscribed
to ``log``; ``done`` with the count after the burst. Reads one line on stdin to start.
The burst is bounded: ``--rate`` activities a second for ``--seconds`` seconds, sent in
ten slices a second.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import orjson

from porter_mesh.core.as2 import Activity
from porter_mesh.node.node import Node


def emit(**fields: object) -> None:
    sys.stdout.write(orjson.dumps(fields).decode() + "\n")
    sys.stdout.flush()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", default="burst")
    parser.add_argument("--mesh", required=True)
    parser.add_argument("--wait-for", default="porter-ui")
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    async with Node(name=args.name, role="load", mesh=args.mesh, inbox_size=0,
                    heartbeat_interval=0.5, evasive_after=2.0, expire_after=5.0) as node:
        emit(ev="up")
        await node.wait_for_peers([args.wait_for], 30.0)
        await node.wait_for_subscribers("log", 1, 30.0)
        emit(ev="ready")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.readline)
        slices = round(args.seconds * 10)
        per_slice = args.rate // 10
        start = time.monotonic()
        sent = 0
        for i in range(slices):
            for _ in range(per_slice):
                node.async_publish("log", Activity.from_dict({
                    "type": "Announce", "actor": node.name, "summary": f"burst {sent}"}))
                sent += 1
            # Pacing of the load itself (not a wait for an event): slice i+1 starts at
            # (i+1)/10 s.
            await asyncio.sleep(max(0.0, start + (i + 1) / 10 - time.monotonic()))
        emit(ev="done", sent=sent, seconds=round(time.monotonic() - start, 3))
        await loop.run_in_executor(None, sys.stdin.readline)


if __name__ == "__main__":
    asyncio.run(main())
