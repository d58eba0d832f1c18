"""What an idle node costs while nothing happens: wake-ups of its event-loop thread.

Usage (from the repository root): ``python -m bench.bench_idle [--seconds 10]
[--no-discovery] [--repeat 1]``.

One ``porter-mesh node`` process runs alone (its own mesh name, loopback only, no
knowledge shard unless ``--knowledge``, a fresh data directory). Once it says it is up
and a short settle window has passed, the context switches of its main thread (the asyncio loop:
``voluntary_ctxt_switches`` plus ``nonvoluntary_ctxt_switches`` in
``/proc/PID/task/PID/status``) are read at the start and the end of the window; their
difference per second is the number of times the loop woke up. The whole process (every
thread: zeroconf's, libzmq's I/O thread) and its CPU time are shown beside it.

As root the node runs in a network namespace of its own (``unshare --net``, loopback
only), so that the mDNS traffic of other processes on this machine's loopback does not
wake it; ``--shared-loopback`` (or not being root) runs it beside them.

A node with nothing to do should wake for its heartbeat and little else: the target is
at most 3 wake-ups per second of the main thread with the default 1 s heartbeat.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time

TARGET_PER_S = 3.0


def _switches(path: pathlib.Path) -> int:
    total = 0
    for line in path.read_text().splitlines():
        if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
            total += int(line.split()[1])
    return total


def _process_switches(pid: int) -> int:
    return sum(_switches(task / "status") for task in pathlib.Path(f"/proc/{pid}/task").iterdir())


def _cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def isolation_available() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None


def measure(seconds: float, discovery: bool, isolated: bool,
            settle: float = 2.0, knowledge: bool = False) -> dict[str, float]:
    """Start one idle node, measure it over ``seconds`` and stop it.

    Returns:
        ``main_per_s`` (wake-ups of the loop thread per second), ``all_per_s`` (every
        thread's), ``cpu_pct`` (percent of one core).

    Raises:
        RuntimeError: the node did not come up within 60 s.
    """
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        cmd = [sys.executable, "-m", "porter_mesh.cli.main", "node", "--name", "idle",
               "--mesh", "bench-idle-" + secrets.token_hex(4),
               "--data-dir", tmp, "--interface", "127.0.0.1"]
        if not knowledge:
            cmd.append("--no-knowledge")
        if not discovery:
            cmd.append("--no-discovery")
        if isolated:
            # exec keeps the pid: the one measured is the node's.
            cmd = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
                   *cmd]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        try:
            up = threading.Event()

            def read_stderr() -> None:
                assert proc.stderr is not None
                for line in proc.stderr:
                    if " up: " in line:
                        up.set()

            threading.Thread(target=read_stderr, daemon=True).start()
            if not up.wait(60):
                raise RuntimeError("the node did not say it was up within 60 s")
            # The window itself is the measurement: start-up work (imports, the first
            # mDNS announcements) is over by the end of the settle time.
            time.sleep(settle)
            main = pathlib.Path(f"/proc/{proc.pid}/task/{proc.pid}/status")
            m0, a0, c0, t0 = (_switches(main), _process_switches(proc.pid),
                              _cpu_seconds(proc.pid), time.monotonic())
            time.sleep(seconds)
            m1, a1, c1, t1 = (_switches(main), _process_switches(proc.pid),
                              _cpu_seconds(proc.pid), time.monotonic())
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    span = t1 - t0
    return {"main_per_s": (m1 - m0) / span, "all_per_s": (a1 - a0) / span,
            "cpu_pct": 100 * (c1 - c0) / span}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0, help="measurement window")
    p.add_argument("--no-discovery", action="store_true", help="run without zeroconf")
    p.add_argument("--repeat", type=int, default=1, help="runs, one after the other")
    p.add_argument("--knowledge", action="store_true",
                   help="keep a knowledge shard (its replica must add no wake-ups alone)")
    p.add_argument("--shared-loopback", action="store_true",
                   help="run the node on this machine's loopback, beside other processes")
    a = p.parse_args()
    isolated = not a.shared_loopback and isolation_available()
    if not a.shared_loopback and not isolated:
        print("not root (or no unshare): the node shares this machine's loopback, and "
              "other processes' mDNS may wake it", flush=True)
    worst = 0.0
    for _ in range(a.repeat):
        r = measure(a.seconds, discovery=not a.no_discovery, isolated=isolated,
                    knowledge=a.knowledge)
        worst = max(worst, r["main_per_s"])
        where = "own netns" if isolated else "shared loopback"
        print(f"idle node ({'no ' if a.no_discovery else ''}discovery, "
              f"{'a' if a.knowledge else 'no'} knowledge shard, {where}), "
              f"{a.seconds:g} s: "
              f"main thread {r['main_per_s']:.1f} wake-ups/s, all threads "
              f"{r['all_per_s']:.1f}/s, CPU {r['cpu_pct']:.2f}% of a core", flush=True)
    verdict = "PASS" if worst <= TARGET_PER_S else "FAIL"
    print(f"main-thread wake-ups/s (worst of {a.repeat}): {worst:.1f} "
          f"(target <= {TARGET_PER_S:g}) {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
