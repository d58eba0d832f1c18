"""Where the mesh's round trip spends its time, stage by stage, beside raw pyzmq's round
trip measured in the same run.

The round trip is ``bench.bench_node``'s: ``mesh-ping`` sends a direct message to
``mesh-recv --echo``, whose handler sends it back, one trip at a time, acknowledgements
carried by the next message. With ``--stages`` both processes stamp
``time.perf_counter_ns()`` (the machine's monotonic clock, one for both processes) at
fixed points of the node's direct path, by wrapping the node's own methods:

* ``call``: the application calls ``async_send_nowait``;
* ``flush``: the node's flush starts (encoding and the carried acknowledgements);
* ``presend`` / ``sent``: around the ZeroMQ send of the message's frames. The send's
  last frame wakes ZeroMQ's I/O thread, which may take the sending thread's core at
  once and do the TCP write then; the share of sends during which the sender was
  switched out involuntarily (``getrusage``) is reported;
* ``read``: the loop calls the ROUTER's reader (the socket's descriptor woke it);
* ``direct``: a message's frames have been read off the socket;
* ``accept``: the read's new messages have been decoded and passed the session's
  checks (sequence, duplicates, carried acknowledgements), and go to the inbox;
* ``returned``: the application's ``receive()`` returns the reply.

A trip is then cut into stages, each the time between two stamps, the two wire stages
across the processes (from one side's send call returning to the other side's reader
being called: ZeroMQ's I/O threads, TCP on loopback, the loop's wake-up). Each stage's
figure is its median over the timed trips, and each figure in the table the median over
the rounds; rounds alternate with raw pyzmq's round trip (``zmq-ping``/``zmq-echo``),
so the ratio is to a baseline of the same moment. The stages' medians need not add up
to the trip's median. The probes add calls of their own (about fourteen per trip, and
two ``getrusage`` calls per send), so the trip here is slower than
``bench.bench_node``'s: this benchmark says where the time goes, that one what it is.

Results: a table on stdout, ``rtt_stages.json`` and ``rtt_stages.png`` in
``bench/results`` (or ``--out DIR``).
"""

from __future__ import annotations

import argparse
import bisect
import functools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.common import RESULTS_DIR, environment, print_table, progress

#: Stamps of the pinging side, in the order of a trip, and of the echoing side.
PING_MARKS = ("call", "flush", "presend", "sent", "read", "direct", "accept", "returned")
ECHO_MARKS = ("read", "direct", "accept", "flush", "presend", "sent")

#: (side, from, to, what, kind): the trip's stages in order. Side "wire" goes from the
#: first side's stamp to the second's.
STAGES: tuple[tuple[str, str, str, str, str], ...] = (
    ("ping", "call", "flush", "ping: the request queued, the flush scheduled", "python"),
    ("ping", "flush", "presend", "ping: envelope, encoding, carried acks", "python"),
    ("ping", "presend", "sent", "ping: ZeroMQ send call", "zmq"),
    ("wire", "sent", "read", "wire to echo: I/O threads, TCP, wake-up", "wire"),
    ("echo", "read", "direct", "echo: frames read off the socket", "zmq"),
    ("echo", "direct", "accept", "echo: decode, session checks, acks", "python"),
    ("echo", "accept", "flush", "echo: inbox, handler, reply queued", "python"),
    ("echo", "flush", "presend", "echo: envelope, encoding, carried acks", "python"),
    ("echo", "presend", "sent", "echo: ZeroMQ send call", "zmq"),
    ("back", "sent", "read", "wire back: I/O threads, TCP, wake-up", "wire"),
    ("ping", "read", "direct", "ping: frames read off the socket", "zmq"),
    ("ping", "direct", "accept", "ping: decode, session checks, acks", "python"),
    ("ping", "accept", "returned", "ping: inbox, the receiver woken", "python"),
)

#: The marks of reading a message off the socket, which may repeat before the trip's own.
_REREAD = frozenset({"read", "direct"})

KIND_COLOURS = {"python": "#2e86c1", "zmq": "#f39c12", "wire": "#95a5a6"}


# -- in the peer processes ------------------------------------------------------------


class Stamps:
    """The probes of one process: every stamp, by mark, in order."""

    def __init__(self) -> None:
        self.times: dict[str, list[int]] = {}
        #: [sends, sends with an involuntary switch of this thread]
        self.preempted = [0, 0]

    def wrap(self, owner: Any, attr: str, mark: str) -> None:
        """Stamp ``mark`` whenever ``owner.attr`` is called."""
        stamps = self.times.setdefault(mark, [])
        now = time.perf_counter_ns
        inner = getattr(owner, attr)

        @functools.wraps(inner)
        def stamped(*args: Any, **kwargs: Any) -> Any:
            stamps.append(now())
            return inner(*args, **kwargs)

        setattr(owner, attr, stamped)

    def trips(self, marks: Sequence[str]) -> list[list[int]]:
        """Each trip's stamps, one per mark in ``marks`` order: the first stamp of each
        mark after the previous mark's, except while the trip's message is being read:
        a later ``read`` or ``direct`` then starts the reading over (a wake-up that found
        nothing, or a control message such as a hello read before the trip's own)."""
        events = sorted((t, mark) for mark, ts in self.times.items() if mark in marks
                        for t in ts)
        out: list[list[int]] = []
        current: list[int] = []
        for t, mark in events:
            n = len(current)
            if n < len(marks) and mark == marks[n]:
                current.append(t)
            elif mark in _REREAD and mark in marks[:n]:
                j = marks.index(mark)
                if all(m in _REREAD for m in marks[j:n]):
                    del current[j:]
                    current.append(t)
            if len(current) == len(marks):
                out.append(current)
                current = []
        return out


def _stamp_sends(stamps: Stamps, outgoing: Any) -> None:
    """Stamp ``presend`` and ``sent`` around the node's ZeroMQ sends, and count the sends
    during which this thread was switched out involuntarily (``getrusage``): the
    I/O thread that a send wakes taking this thread's core."""
    import resource

    send = outgoing.send_frames
    before, after = stamps.times.setdefault("presend", []), stamps.times.setdefault("sent", [])
    counts = stamps.preempted
    now, usage, thread = time.perf_counter_ns, resource.getrusage, resource.RUSAGE_THREAD

    @functools.wraps(send)
    def stamped(sock: Any, frames: Any) -> Any:
        switches = usage(thread).ru_nivcsw
        before.append(now())
        result = send(sock, frames)
        after.append(now())
        counts[0] += 1
        counts[1] += usage(thread).ru_nivcsw > switches
        return result

    outgoing.send_frames = stamped


def install_probes() -> Stamps:
    """Wrap the node's direct path with stamps (see the module docstring)."""
    from porter_mesh.node import api, arrivals, outgoing
    from porter_mesh.node import node as node_module

    stamps = Stamps()
    stamps.wrap(api.NodeAPI, "async_send_nowait", "call")
    stamps.wrap(node_module.Node, "_flush", "flush")
    _stamp_sends(stamps, outgoing)
    stamps.wrap(arrivals.Arrivals, "read_router", "read")
    stamps.wrap(arrivals.Arrivals, "_on_direct", "direct")
    stamps.wrap(arrivals.Arrivals, "_accept", "accept")
    receive = api.NodeAPI.receive

    @functools.wraps(receive)
    async def received(*args: Any, **kwargs: Any) -> Any:
        message = await receive(*args, **kwargs)
        stamps.times.setdefault("returned", []).append(time.perf_counter_ns())
        return message

    api.NodeAPI.receive = received  # type: ignore[method-assign]
    return stamps


def report(stamps: Stamps, role: str) -> dict[str, Any]:
    """The ``stages`` event of a peer: its marks and each trip's stamps."""
    marks = PING_MARKS if role == "mesh-ping" else ECHO_MARKS
    sends, preempted = stamps.preempted
    return {"marks": list(marks), "trips": stamps.trips(marks), "sends": sends,
            "sends_preempted": preempted}


# -- in the driver --------------------------------------------------------------------


def cut(ping: list[list[int]], echo: list[list[int]], warmup: int) -> dict[str, list[float]]:
    """Each stage's durations in microseconds over the timed trips: a ping trip is
    matched with the echo trip whose read falls between the start of its send and its
    reply's read. (Not the send's end: the I/O thread that took the sender's core may
    have written the message, and the echo begun reading it, before the send call
    returned. That trip's wire stage is then negative, and its send stage holds the
    wire's time.)"""
    p_at = {m: i for i, m in enumerate(PING_MARKS)}
    e_at = {m: i for i, m in enumerate(ECHO_MARKS)}
    echo_reads = [trip[e_at["read"]] for trip in echo]
    durations: dict[str, list[float]] = {stage[3]: [] for stage in STAGES}
    durations["trip"] = []
    for trip in ping[warmup:]:
        sending, back = trip[p_at["presend"]], trip[p_at["read"]]
        j = bisect.bisect_left(echo_reads, sending)
        if j == len(echo) or echo_reads[j] > back:
            continue  # no echo trip inside this one (cannot happen unless stamps were lost)
        other = echo[j]
        for side, start, end, what, _ in STAGES:
            if side == "ping":
                value = trip[p_at[end]] - trip[p_at[start]]
            elif side == "echo":
                value = other[e_at[end]] - other[e_at[start]]
            elif side == "wire":
                value = other[e_at[end]] - trip[p_at[start]]
            else:  # back
                value = trip[p_at[end]] - other[e_at[start]]
            durations[what].append(value / 1000)
        durations["trip"].append((trip[p_at["returned"]] - trip[p_at["call"]]) / 1000)
    return durations


def measure_stages(counts: Any) -> dict[str, Any]:
    """One mesh round-trip run with the probes on: each stage's median (us)."""
    from bench.bench_node import measure_rtt

    result = measure_rtt("mesh", counts, stages=True)
    ping_stages, echo_stages = result["stages"], result["echo"]["stages"]
    durations = cut(ping_stages["trips"], echo_stages["trips"], counts.warmup)
    trips = len(durations["trip"])
    if trips < counts.rtt * 0.9:
        raise RuntimeError(f"only {trips} of {counts.rtt} timed trips could be cut into "
                           "stages; the probes missed stamps")
    sends = ping_stages["sends"] + echo_stages["sends"]
    preempted = ping_stages["sends_preempted"] + echo_stages["sends_preempted"]
    return {"p50_us": result["p50_us"], "trips_cut": trips,
            "sends_preempted": preempted / sends if sends else 0.0,
            "stages_us": {k: statistics.median(v) for k, v in durations.items()}}


def plot(path: Path, stages: dict[str, float], mesh_p50: float, zmq_p50: float) -> None:
    """One bar of the mesh's trip cut into its stages, one of raw pyzmq's trip."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.0, 3.4))
    left = 0.0
    for _, _, _, what, kind in STAGES:
        width = stages[what]
        ax.barh(1, width, left=left, color=KIND_COLOURS[kind], edgecolor="white")
        if width > 0.06 * mesh_p50:
            ax.text(left + width / 2, 1, f"{width:.0f}", ha="center", va="center", fontsize=7)
        left += width
    ax.barh(0, zmq_p50, color="#7f8c8d")
    ax.text(zmq_p50, 0, f"  {zmq_p50:.0f} us", va="center", fontsize=8)
    ax.text(left, 1, f"  sum {left:.0f} us (trip p50 {mesh_p50:.0f})", va="center",
            fontsize=8)
    ax.set_yticks([0, 1], ["raw pyzmq", "mesh"])
    ax.set_xlabel("microseconds (medians); blue: the node's Python, orange: ZeroMQ calls, "
                  "grey: the wire")
    ax.set_xlim(0, max(left, zmq_p50) * 1.35)
    ax.set_title("Where a direct round trip's time goes", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(rounds: int, counts: Any, measure_zmq: Callable[[], float]) -> dict[str, Any]:
    """``rounds`` alternating runs of the probed mesh trip and raw pyzmq's trip."""
    per_round: list[dict[str, Any]] = []
    for r in range(1, rounds + 1):
        progress(f"round {r}/{rounds}: the mesh's round trip, stamped")
        mesh = measure_stages(counts)
        progress(f"round {r}/{rounds}: raw pyzmq's round trip")
        zmq_p50 = measure_zmq()
        per_round.append({**mesh, "zmq_p50_us": zmq_p50})
        progress(f"  mesh p50 {mesh['p50_us']:.1f} us, raw pyzmq {zmq_p50:.1f} us")
    names = [stage[3] for stage in STAGES] + ["trip"]
    stages = {n: statistics.median(r["stages_us"][n] for r in per_round) for n in names}
    python = sum(stages[s[3]] for s in STAGES if s[4] == "python")
    return {
        "rounds": per_round,
        "stages_us": stages,
        "mesh_p50_us": statistics.median(r["p50_us"] for r in per_round),
        "zmq_p50_us": statistics.median(r["zmq_p50_us"] for r in per_round),
        "python_us": python,
        "ratio_rounds": [r["p50_us"] / r["zmq_p50_us"] for r in per_round],
        "sends_preempted": statistics.median(r["sends_preempted"] for r in per_round),
    }


def main(argv: list[str] | None = None) -> int:
    from bench.bench_node import FULL, QUICK, measure_rtt

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="few trips (a smoke test)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR,
                   help="directory for rtt_stages.json and .png")
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error(f"--rounds must be 1 or more, got {a.rounds}")
    counts = replace(QUICK, limit=30.0) if a.quick else FULL
    res = run(a.rounds, counts, lambda: float(measure_rtt("zmq", counts)["p50_us"]))
    stages, zmq_p50 = res["stages_us"], res["zmq_p50_us"]
    print()
    rows: list[list[object]] = [
        [what, kind, round(stages[what], 1), f"{stages[what] / zmq_p50:.2f}x"]
        for _, _, _, what, kind in STAGES]
    rows.append(["the node's Python, both sides", "python", round(res["python_us"], 1),
                 f"{res['python_us'] / zmq_p50:.2f}x"])
    rows.append(["trip (stamped, median of the cut trips)", "-", round(stages["trip"], 1),
                 f"{stages['trip'] / zmq_p50:.2f}x"])
    rows.append(["raw pyzmq round trip p50", "baseline", round(zmq_p50, 1), "1.00x"])
    print_table(["stage", "kind", "median us", "of raw pyzmq's trip"], rows)
    print("\nmesh p50 / raw pyzmq p50 per round: "
          + ", ".join(f"{r:.2f}x" for r in res["ratio_rounds"]))
    print(f"ZeroMQ sends during which the sending thread lost its core: "
          f"{res['sends_preempted']:.0%}")
    res["meta"] = {"quick": a.quick, "trips": counts.rtt, "warmup": counts.warmup,
                   "environment": environment()}
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / "rtt_stages.json"
    path.write_text(json.dumps(res, indent=2) + "\n")
    png = a.out / "rtt_stages.png"
    plot(png, stages, res["mesh_p50_us"], zmq_p50)
    print(f"\nwrote {path} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
