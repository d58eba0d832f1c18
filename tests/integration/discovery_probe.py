"""A one-node discovery process for tests, and the client tests use to drive it.

Run as ``python -m tests.integration.discovery_probe --mesh M --name N [...]`` from the
repository root. It starts a :class:`~porter_mesh.adapters.discovery.Discovery`, prints
one JSON object per line on stdout and obeys commands on stdin:

stdout events: ``{"event": "starting", "t"}`` (imports done),
``{"event": "ready", "name", "incarnation", "t"}`` (registered),
``{"event": "found", "peer", "incarnation", "addresses", "t"}``,
``{"event": "lost", "peer", "t"}``, ``{"event": "stats", "stats", "t"}``,
``{"event": "log", "level", "message"}`` (the package's log records),
``{"event": "error", "type", "message"}`` (start failed, exit status 2) and
``{"event": "closed", "stats", "t"}``. ``t`` is ``time.monotonic()``, which is one clock
for every process on a Linux host, so latencies can be computed across processes.

stdin commands: ``update <incarnation>``, ``stats``, ``close`` (end of input also closes).

``python -m tests.integration.discovery_probe measure --nodes 10 --rounds 5`` starts that
many probes at once and prints how long full discovery took (see :func:`measure`).

:class:`ProbeProcess` starts the script (optionally behind a command prefix such as
``ip netns exec NAME``) and reads its events with deadlines, never sleeping.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import pathlib
import secrets
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
Event = dict[str, Any]


# -- the probe process ------------------------------------------------------------------


def _emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields, "t": time.monotonic()}) + "\n")
    sys.stdout.flush()


async def _run(args: argparse.Namespace) -> int:
    from porter_mesh.adapters.discovery import Discovery
    from porter_mesh.core.advert import PeerAdvert
    from porter_mesh.core.constants import PROTOCOL_VERSION
    from porter_mesh.errors import PorterError

    def found(advert: PeerAdvert) -> None:
        _emit(
            "found",
            peer=advert.name,
            incarnation=advert.incarnation,
            role=advert.role,
            addresses=list(advert.addresses),
            pub=advert.endpoint_pub(),
        )

    def lost(name: str) -> None:
        _emit("lost", peer=name)

    def advert(incarnation: int) -> PeerAdvert:
        return PeerAdvert(
            name=args.name,
            role=args.role,
            mesh=args.mesh,
            pub_port=args.pub_port,
            router_port=args.router_port,
            version=PROTOCOL_VERSION,
            incarnation=incarnation,
        )

    class _Forward(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            _emit("log", level=record.levelname, message=record.getMessage())

    package_log = logging.getLogger("porter_mesh")
    package_log.addHandler(_Forward())
    package_log.setLevel(logging.DEBUG)
    discovery = Discovery(
        mesh=args.mesh,
        interfaces=args.interface,
        on_found=found,
        on_lost=lost,
        conflict_grace=args.conflict_grace,
    )
    _emit("starting")
    try:
        await discovery.astart(advert(args.incarnation))
    except PorterError as exc:
        _emit("error", type=type(exc).__name__, message=str(exc))
        return 2
    _emit("ready", name=args.name, incarnation=args.incarnation)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        while line := (await reader.readline()).decode().split():
            if line[0] == "update":
                await discovery.aupdate(advert(int(line[1])))
                _emit("updated", incarnation=int(line[1]))
            elif line[0] == "stats":
                _emit("stats", stats=discovery.stats)
            elif line[0] == "close":
                break
    finally:
        await discovery.aclose()
    _emit("closed", stats=discovery.stats)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--role", default="worker")
    parser.add_argument("--interface", action="append", default=None)
    parser.add_argument("--incarnation", type=int, default=None)
    parser.add_argument("--pub-port", type=int, default=40001)
    parser.add_argument("--router-port", type=int, default=40002)
    parser.add_argument("--conflict-grace", type=float, default=3.0)
    args = parser.parse_args(argv)
    args.interface = args.interface or ["127.0.0.1"]
    if args.incarnation is None:
        args.incarnation = secrets.randbits(63)
    return asyncio.run(_run(args))


# -- the client used by tests ----------------------------------------------------------


class ProbeProcess:
    """A running probe; read its events with deadlines.

    Args:
        mesh: mesh name.
        name: agent name.
        interface: address to bind zeroconf to.
        incarnation: the incarnation to announce (random when None).
        prefix: command prefix, e.g. ``["ip", "netns", "exec", "pm-x-a"]``.
        extra: more command-line options for the probe.
    """

    def __init__(
        self,
        *,
        mesh: str,
        name: str,
        interface: str = "127.0.0.1",
        incarnation: int | None = None,
        prefix: Sequence[str] = (),
        extra: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.incarnation = incarnation if incarnation is not None else secrets.randbits(63)
        self.started_at = time.monotonic()
        self.events: list[Event] = []
        self._buffer = b""
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in cleanup)
        command = [
            *prefix, sys.executable, "-m", "tests.integration.discovery_probe",
            "--mesh", mesh, "--name", name, "--interface", interface,
            "--incarnation", str(self.incarnation), *extra,
        ]
        self.proc = subprocess.Popen(
            command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)
        self._eof = False

    def _read_available(self, deadline: float) -> list[Event]:
        """Wait until ``deadline`` for output; return the complete lines that arrived."""
        assert self.proc.stdout is not None
        if self._eof:
            return []
        if not self._selector.select(max(0.0, deadline - time.monotonic())):
            return []
        chunk = self.proc.stdout.read()
        if not chunk:
            if chunk == b"":
                self._eof = True
            return []
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        events = [json.loads(line) for line in lines if line.strip()]
        self.events.extend(events)
        return events

    def wait_for(
        self, predicate: Callable[[Event], bool], timeout: float, what: str, *, since: int = 0
    ) -> Event:
        """Return the first event from index ``since`` on that satisfies ``predicate``.

        Raises:
            AssertionError: the deadline passed or the process ended first.
        """
        for event in self.events[since:]:
            if predicate(event):
                return event
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._eof:
            for event in self._read_available(deadline):
                if predicate(event):
                    return event
        raise AssertionError(
            f"{self.name}: no {what} within {timeout}s; events {self.events}; "
            f"stderr {self.stderr()[-2000:]!r}"
        )

    def wait_found(self, peers: Iterable[str], timeout: float) -> dict[str, Event]:
        """Wait until every peer in ``peers`` has been reported found; return the events."""
        wanted = set(peers)
        deadline = time.monotonic() + timeout
        seen: dict[str, Event] = {}
        for peer in sorted(wanted):
            seen[peer] = self.wait_for(
                lambda e, p=peer: e["event"] == "found" and e["peer"] == p,  # type: ignore[misc]
                max(0.0, deadline - time.monotonic()),
                f"found {peer}",
            )
        return seen

    def drain(self, timeout: float = 0.0) -> None:
        """Collect whatever output arrives within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            got = self._read_available(deadline)
            if not got and (time.monotonic() >= deadline or self._eof):
                return

    def found_peers(self) -> set[str]:
        return {e["peer"] for e in self.events if e["event"] == "found"}

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()

    def stats(self, timeout: float = 10.0) -> dict[str, int]:
        marker = len(self.events)
        self.send("stats")
        event = self.wait_for(lambda e: e["event"] == "stats", timeout, "stats", since=marker)
        return dict(event["stats"])

    def close(self, timeout: float = 10.0) -> Event:
        """Ask for a graceful close; return the ``closed`` event."""
        self.send("close")
        event = self.wait_for(lambda e: e["event"] == "closed", timeout, "closed")
        self.proc.wait(timeout)
        return event

    def kill(self) -> None:
        """End the probe at once, without goodbyes, and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def cleanup(self) -> None:
        """Reap the process and release its pipes (for fixtures; safe to call twice)."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()
        if self.proc.stdout is not None:
            self._selector.close()
            self.proc.stdout.close()
        self._stderr.close()


# -- latency measurement ---------------------------------------------------------------


def measure(nodes: int, rounds: int, timeout: float = 30.0) -> list[dict[str, float]]:
    """Start ``nodes`` probes on 127.0.0.1 at once, ``rounds`` times; time discovery.

    Returns one row per round: ``full`` (first spawn to the last peer found by the last
    node), ``imported`` (first spawn to the last process done importing and starting
    discovery), ``ready`` (first spawn to the last node registered: start-up plus the
    name probe) and ``after_ready`` (last registration to full discovery).
    """
    rows = []
    for _ in range(rounds):
        mesh = f"bench-{secrets.token_hex(3)}"
        probes = [
            ProbeProcess(mesh=mesh, name=f"n{i}-{secrets.token_hex(2)}") for i in range(nodes)
        ]
        try:
            names = {p.name for p in probes}
            start = probes[0].started_at
            found_at = [
                e["t"]
                for p in probes
                for e in p.wait_found(names - {p.name}, timeout).values()
            ]
            ready_at = [p.wait_for(lambda e: e["event"] == "ready", timeout, "ready")["t"]
                        for p in probes]
            starting_at = [
                p.wait_for(lambda e: e["event"] == "starting", timeout, "starting")["t"]
                for p in probes
            ]
            for probe in probes:
                probe.close()
        finally:
            for probe in probes:
                probe.kill()
                probe.cleanup()
        full, ready = max(found_at) - start, max(ready_at) - start
        rows.append({
            "full": full,
            "imported": max(starting_at) - start,
            "ready": ready,
            "after_ready": max(0.0, full - ready),
        })
    return rows


def _measure_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description="time discovery of N probes on loopback")
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    rows = measure(args.nodes, args.rounds)
    for key in ("full", "imported", "ready", "after_ready"):
        values = sorted(row[key] for row in rows)
        print(
            f"{args.nodes} nodes {key:>11}: min {values[0]:.2f}s  "
            f"median {values[len(values) // 2]:.2f}s  max {values[-1]:.2f}s"
        )
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["measure"]:
        sys.exit(_measure_main(sys.argv[2:]))
    sys.exit(main())
