"""An observer for the scale benchmark: asks nodes for their own view, over the mesh.

Run as ``python -m bench.scale_observer --mesh M --interface IP --peer HOST:PORT ...``
(inside a lab host's namespace for the multi-host case). It joins as an observer (on
nobody's roster, no heartbeats, no mDNS record), reaches the nodes through their seeds,
and answers commands on stdin, one JSON object per line:

* ``{"op": "views", "names": [...], "timeout": 5}``: asks each named node for its view
  (the ``stats`` request that ``porter-mesh stats`` sends, see
  :class:`~porter_mesh.cli.cmd_stats.ViewClient`) and prints ``{"ev": "views", "t",
  "views": {name: summary}, "errors": {name: why}}``; a summary is ``peers`` (name ->
  state), ``digest`` (knowledge digest, or None), ``records``, ``lost``, ``dropped``.
* ``{"op": "quit"}`` (or end of input): leaves.

It prints ``{"ev": "up"}`` once started. ``t`` is ``time.monotonic()``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from typing import Any

import orjson

from porter_mesh.cli.cmd_stats import ViewClient
from porter_mesh.node.config import NodeConfig
from porter_mesh.node.node import Node


def emit(**fields: Any) -> None:
    sys.stdout.write(orjson.dumps(fields).decode() + "\n")
    sys.stdout.flush()


def summary(view: dict[str, Any]) -> dict[str, Any]:
    """The parts of a node's view the benchmark compares."""
    kg = view.get("knowledge")
    has_kg = isinstance(kg, dict) and "digest" in kg
    return {
        "peers": {p["name"]: p["state"] for p in view.get("peers", [])},
        "digest": kg["digest"] if has_kg else None,
        "records": (kg.get("observations", 0) + kg.get("retractions", 0)) if has_kg else 0,
        "lost": view.get("lost", 0),
        "dropped": view.get("dropped", 0),
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mesh", required=True)
    parser.add_argument("--name", default="scale-observer")
    parser.add_argument("--interface", default="127.0.0.1")
    parser.add_argument("--peer", action="append", default=[])
    args = parser.parse_args()
    config = NodeConfig(name=args.name, mesh=args.mesh, role="observer", observer=True,
                        channels=(), inbox_size=0, interfaces=(args.interface,),
                        seeds=tuple(args.peer), discovery=False, insecure=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    async with Node(config) as node:
        client = ViewClient(node)
        emit(ev="up", t=time.monotonic())
        while True:
            line = await reader.readline()
            if not line:
                break
            cmd = orjson.loads(line)
            if cmd.get("op") == "quit":
                break
            if cmd.get("op") != "views":
                emit(ev="error", error=f"unknown op {cmd.get('op')!r}")
                continue
            names = list(cmd["names"])
            timeout = float(cmd.get("timeout", 5.0))
            known = {p.name for p in node.peers()}
            # Asked anyway after that: the answers say who could not be reached.
            with contextlib.suppress(TimeoutError):
                await node.wait_for_peers([n for n in names if n not in known],
                                          min(timeout, 2.0))
            answers = await client.ask_all(names, timeout)
            emit(ev="views", t=time.monotonic(), tag=cmd.get("tag"),
                 views={n: summary(v) for n, v in answers.items() if isinstance(v, dict)},
                 errors={n: f"{type(v).__name__}: {v}" for n, v in answers.items()
                         if isinstance(v, BaseException)})


if __name__ == "__main__":
    asyncio.run(main())
