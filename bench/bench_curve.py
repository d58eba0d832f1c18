"""The cost of CurveZMQ: the node benchmark's mesh measurements with security on and off.

Run from the repository root::

    .venv/bin/python -m bench.bench_curve            # full counts, 5 interleaved rounds
    .venv/bin/python -m bench.bench_curve --quick    # small counts, 1 round

Each measurement is the node benchmark's own (:mod:`bench.bench_node`: separate
``bench.node_peer`` processes on 127.0.0.1, the AS2 profile's status ``Announce`` as
payload, no sleeps, hard time limits): broadcast 1->1 (messages per second at the
subscriber), acknowledged direct sends per second (a window of futures in flight) and
direct round-trip latency. With security on, every peer process gets its own key pair
(``PORTER_MESH_KEY``), all keys are trusted (``PORTER_MESH_TRUSTED``), and the seeds name
the agent expected there (``NAME@HOST:PORT``); with it off, the same processes run
without keys. Off and on alternate within each round; the best round of each is kept.

The figures are ratios on/off: below 1.0 a rate is slower with CURVE, above 1.0 a
latency is longer.

Output: a table on stdout, ``bench/results/curve.json`` and ``bench/results/curve.png``.
To show these rows in the node benchmark's table, call :func:`table` on the JSON's
``summary`` (see the end of this module's :func:`main`).

``python -m bench.bench_curve peer ROLE [node_peer options]`` is the peer process: the
node benchmark's role, with the seed named after the agent it expects.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import bench_node
from bench.common import environment, plot_ratios, print_table, progress
from bench.node_peer import ASK_PORT, PUB_NAME, RECV_NAME

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
#: The agent name each node_peer role runs as, and the one its seed points at.
ROLE_NAMES = {"mesh-pub": PUB_NAME, "mesh-recv": RECV_NAME, "mesh-send": "send",
              "mesh-ping": "ping", "zmq-pub": PUB_NAME, "zmq-echo": RECV_NAME,
              "zmq-ping": "ping"}
SEED_TARGETS = {"mesh-sub": PUB_NAME, "mesh-send": RECV_NAME, "mesh-ping": RECV_NAME}
AGENTS = (PUB_NAME, RECV_NAME, "send", "ping", "sub-0")
#: (section, label, figure in bench_node's result, unit, higher is better)
MEASURES = (
    ("broadcast", "broadcast 1->1", "mean", "msg/s", True),
    ("direct", "direct, acknowledged", "rate", "msg/s", True),
    ("rtt", "round trip p50", "p50_us", "us", False),
    ("rtt", "round trip p99", "p99_us", "us", False),
    ("broadcast-raw", "raw pyzmq broadcast 1->1", "mean", "msg/s", True),
    ("rtt-raw", "raw pyzmq round trip p50", "p50_us", "us", False),
)

_keys: dict[str, str] | None = None  # the trusted directory and secret keys, while "on"


class CurvePeer(bench_node.Peer):
    """A node benchmark peer started through this module, secured when keys are set."""

    def __init__(self, role: str, options: dict[str, Any]) -> None:
        cmd = [sys.executable, "-m", "bench.bench_curve", "peer", role,
               *bench_node.peer_flags(options)]
        env = {k: v for k, v in os.environ.items()
               if k not in ("PORTER_MESH_KEY", "PORTER_MESH_TRUSTED")}
        if _keys is not None:
            name = ROLE_NAMES.get(role) or str(options.get("name", ""))
            env.update(PORTER_MESH_KEY=_keys[name], PORTER_MESH_TRUSTED=_keys["trusted"],
                       PORTER_MESH_SECURE_SEEDS="1")
        self.role = role
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env)
        self._buffer = b""
        self._events: list[dict[str, Any]] = []


@contextlib.contextmanager
def peers(keys: dict[str, str] | None) -> Iterator[None]:
    """Run the node benchmark's measurements with :class:`CurvePeer` processes."""
    global _keys
    saved = bench_node.Peer
    bench_node.Peer = CurvePeer  # type: ignore[misc]
    _keys = keys
    try:
        yield
    finally:
        bench_node.Peer = saved  # type: ignore[misc]
        _keys = None


def provision(directory: Path) -> dict[str, str]:
    """A key pair per benchmark agent, all trusted."""
    from porter_mesh.adapters.security import provision_mesh

    trusted, secrets = provision_mesh(directory, list(AGENTS))
    return {"trusted": str(trusted), **{name: str(path) for name, path in secrets.items()}}


def _jobs(counts: bench_node.Counts) -> list[tuple[str, str, bool, Callable[[], dict[str, Any]]]]:
    # The raw pyzmq rows (the same bytes, no node) show libzmq's own CURVE cost.
    return [
        ("broadcast", "mean", True, lambda: bench_node.measure_broadcast("mesh", 1, counts)),
        ("direct", "rate", True, lambda: bench_node.measure_direct(counts)),
        ("rtt", "p50_us", False, lambda: bench_node.measure_rtt("mesh", counts)),
        ("broadcast-raw", "mean", True,
         lambda: bench_node.measure_broadcast("zmq-raw", 1, counts)),
        ("rtt-raw", "p50_us", False, lambda: bench_node.measure_rtt("zmq", counts)),
    ]


def run(counts: bench_node.Counts, repeat: int, keys: dict[str, str]) -> dict[str, Any]:
    """Every measurement off and on, ``repeat`` interleaved rounds: the best round of each
    is kept, and every round's pair of figures is listed under ``rounds``."""
    errors: dict[str, str] = {}
    res: dict[str, Any] = {"off": {}, "on": {}, "errors": errors, "rounds": []}
    for round_no in range(repeat):
        figures: dict[str, dict[str, float]] = {"off": {}, "on": {}}
        for section, figure, higher, job in _jobs(counts):
            for mode in ("off", "on"):
                progress(f"{section}, CURVE {mode} (round {round_no + 1}/{repeat})")
                got: dict[str, Any] = {}
                with peers(keys if mode == "on" else None):
                    bench_node._attempt(got, section, job, errors)
                if section in got:
                    kind = section.removesuffix("-raw")
                    progress(f"  {bench_node._describe(kind, got[section])}")
                    bench_node._keep_best(res[mode], section, got[section], figure, higher,
                                         round_no + 1)
                    for part, label, name, _, _ in MEASURES:
                        if part == section and name in got[section]:
                            figures[mode][label] = got[section][name]
        res["rounds"].append(figures)
    for name in list(errors):
        if all(name in res[m] for m in ("off", "on")):
            res.setdefault("round_failures", {})[name] = errors.pop(name)
    return res


def summarize(res: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per figure: the best off and on, their ratio, and the median of the
    per-round ratios (a round measures off and on back to back, so that background load
    tends to hit both alike)."""
    rows = []
    for section, label, figure, unit, higher in MEASURES:
        off = res["off"].get(section, {}).get(figure)
        on = res["on"].get(section, {}).get(figure)
        paired = [r["on"][label] / r["off"][label] for r in res["rounds"]
                  if r["on"].get(label) and r["off"].get(label)]
        rows.append({"measure": label, "unit": unit, "off": off, "on": on,
                     "ratio": on / off if off and on else None,
                     "paired_median": statistics.median(paired) if paired else None,
                     "paired": paired, "higher_is_better": higher})
    return rows


def table(summary: list[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The summary as table headers and rows (for this module or the node benchmark)."""
    def fmt(value: float | None, unit: str) -> str:
        if value is None:
            return "-"
        return f"{value:,.0f} {unit}" if unit == "msg/s" else f"{value:,.1f} {unit}"

    def times(value: float | None) -> str:
        return f"{value:.2f}x" if value is not None else "-"

    headers = ["CURVE cost (best of rounds)", "off", "on", "on/off", "per-round median"]
    rows = [[r["measure"], fmt(r["off"], r["unit"]), fmt(r["on"], r["unit"]),
             times(r["ratio"]), times(r.get("paired_median"))] for r in summary]
    return headers, rows


async def echo(a: argparse.Namespace) -> None:
    """``mesh-recv --echo`` with a reply authored by this node: a secured mesh drops an
    activity whose actor is not its sender, so the request cannot simply go back."""
    from bench import node_peer
    from porter_mesh.core.as2 import Activity
    from porter_mesh.node.node import Node

    reply = Activity.from_dict({**node_peer.ANNOUNCE, "actor": RECV_NAME})
    async with Node(name=RECV_NAME, discovery=False, channels=()) as node:

        def answer(msg: Any) -> None:
            if msg.direct:
                fut = node.async_send_nowait(msg.sender, reply)
                fut.add_done_callback(lambda f: f.cancelled() or f.exception())

        node.add_handler(answer)
        node_peer.emit("ready", port=node.router_port)
        drainer = asyncio.ensure_future(node_peer.empty_inbox(
            node, node_peer.count_deliveries(node, lambda m: m.direct), 1 << 62, a.limit,
            a.limit))
        await node_peer.async_stdin_closed(a.limit)
        drainer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await drainer
        node_peer.emit("result", stats=node.stats())


def _curve_raw_sockets(node_peer: Any, trusted: Path, key_file: Path) -> None:
    """Make node_peer's raw pyzmq sockets CURVE servers (ROUTER, XPUB) or clients of the
    echo or publisher; no ZAP, so this is libzmq's cost alone."""
    import zmq
    from zmq.auth import load_certificate

    plain = node_peer.zmq_socket
    public, secret = load_certificate(key_file)

    @contextlib.contextmanager
    def secured(kind: int) -> Iterator[Any]:
        with plain(kind) as sock:
            sock.curve_secretkey = secret
            if kind in (zmq.ROUTER, zmq.XPUB):
                sock.curve_server = True
            else:
                server = RECV_NAME if kind == zmq.DEALER else PUB_NAME
                sock.curve_serverkey = load_certificate(trusted / f"{server}.key")[0]
                sock.curve_publickey = public
            yield sock

    node_peer.zmq_socket = secured


def peer_main(argv: list[str]) -> int:
    """The peer process: bench.node_peer's role, with a named seed when secured, and
    activities authored by the node that sends them."""
    from bench import node_peer

    a = node_peer.parse_args(argv)
    if a.port == ASK_PORT:
        a.port = node_peer._read_port()
    target = SEED_TARGETS.get(a.role)
    secured = bool(os.environ.get("PORTER_MESH_SECURE_SEEDS"))
    a.seed = f"{target}@127.0.0.1:{a.port}" if secured and target else f"127.0.0.1:{a.port}"
    node_peer.ANNOUNCE["actor"] = ROLE_NAMES.get(a.role) or a.name
    if secured and a.role.startswith("zmq-"):
        _curve_raw_sockets(node_peer, Path(os.environ["PORTER_MESH_TRUSTED"]),
                           Path(os.environ["PORTER_MESH_KEY"]))
    role = echo if a.role == "mesh-recv" and a.echo else node_peer.ROLES[a.role]
    try:
        node_peer.run_role(role, a)
    except Exception as exc:
        sys.stderr.write(f"{a.role}: {type(exc).__name__}: {exc}\n")
        return 2
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(prog="python -m bench.bench_curve", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="much smaller counts")
    p.add_argument("--repeat", type=int, default=None,
                   help="interleaved rounds, best kept (default 5, --quick 1)")
    p.add_argument("--out", type=Path, default=RESULTS, help="directory for curve.json/png")
    for name in ("broadcast", "direct", "window", "rtt"):
        p.add_argument(f"--{name}", type=int, default=None, help=f"override the {name} count")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; exit status 1 when a measurement failed."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["peer"]:
        return peer_main(args[1:])
    a = parse_args(args)
    counts = bench_node.QUICK if a.quick else bench_node.FULL
    counts = replace(counts, **{k: getattr(a, k) for k in ("broadcast", "direct", "window", "rtt")
                                if getattr(a, k) is not None})
    repeat = max(1, a.repeat if a.repeat is not None else 1 if a.quick else 5)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="porter-bench-curve-") as tmp:
        res = run(counts, repeat, provision(Path(tmp)))
    import zmq

    res["summary"] = summarize(res)
    res["meta"] = {"quick": a.quick, "repeat": repeat, "seconds": time.monotonic() - started,
                   "counts": counts.__dict__, "environment": environment(),
                   "libzmq": zmq.zmq_version(), "pyzmq": zmq.__version__}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "curve.json").write_text(json.dumps(res, indent=2) + "\n")
    shown = [r for r in res["summary"] if r["paired_median"] is not None]
    if shown:
        # Two-line labels keep six bars readable; the per-round medians are plotted.
        labels = [r["measure"].replace("raw pyzmq ", "raw pyzmq\n").replace(", ", "\n")
                  .replace("round trip ", "round trip\n") for r in shown]
        png = plot_ratios("curve", labels, [r["paired_median"] for r in shown],
                          title="CurveZMQ on / off, median of per-round ratios\n(rates: below "
                          "1 is slower; latencies: above 1 is slower)", ylabel="on / off")
        if a.out != RESULTS:
            png.replace(a.out / "curve.png")
    print_table(*table(res["summary"]))
    print(f"\nwrote {a.out / 'curve.json'} and {a.out / 'curve.png'}")
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
