"""Lab scale: real ``porter-mesh node`` processes, on one host and on five, measured.

What runs (every node is ``python -m porter_mesh.cli.main node`` with its default
timings: heartbeat 1 s, evasive after 3 s, expired after 10 s, knowledge shard on):

* **one host**: N = 10, 20, 50 nodes on the loopback of one network namespace, found by
  mDNS on 127.0.0.1 (the namespace keeps its traffic counters apart from the rest of the
  machine, and its mDNS away from everyone else's); plus N = 50 without knowledge
  (``--no-knowledge``), to show what the shard costs;
* **five hosts**: 5 x 10 nodes in five namespaces on one bridge
  (:mod:`tests.integration.netns`), mDNS on each host's lab address (the bridge floods
  multicast, so it crosses hosts) and, for every other host, its first node as a static
  seed.

Measured, per run:

* **discovery**: from the last node's start (its ``up`` line) until every node's own
  roster holds all N-1 others. Each node prints its roster changes; one reader thread
  stamps every line as it arrives (:mod:`bench.fleet`);
* **idle cost** over a window after the mesh settled: CPU per node (``/proc/PID/stat``,
  all threads), memory per node (RSS, PSS, USS from ``smaps_rollup``; PSS splits shared
  library pages among the processes that map them, so N x PSS is what the N nodes take
  from the machine), and traffic per node per second from the namespaces' own counters:
  mesh TCP (heartbeats, anti-entropy digests, TCP acks) is IP octets sent minus
  multicast octets; discovery is the multicast (mDNS) octets. No observer runs during
  the window;
* **flapping**: evasive or expired events between healthy nodes over the idle window
  (the five-host window is 5 min); those of the settle period before it (15 s from the
  moment the mesh was complete, while N processes that started at once on one machine
  finish their catch-ups) are counted apart, with their times;
* **views**: afterwards an observer per host (:mod:`bench.scale_observer`) asks every
  node for its own view (the ``stats`` request of ``porter-mesh stats``) and checks that
  it holds all N-1 others, alive, and the knowledge digests;
* **cut and heal** (five hosts): the last host's bridge port goes down for 60 s (beyond
  expiry); on its side ``porter-mesh remember`` writes one observation; the port comes
  back up. Measured: time until every roster is whole again, and until every node's
  knowledge digest is equal (the new observation everywhere), polled through the views.

Then a simulation (:mod:`bench.sim_membership`) drives the pure peer-state core for
500-5,000 members with a virtual clock and compares full-mesh heartbeats with a
SWIM-style protocol (see docs/scale.md).

``--quick`` is a smoke test: 4 nodes on one host (with and without knowledge), 2 x 2 on
two hosts with shorter timings (heartbeat 0.5 s, expiry 4 s) and a 7 s cut, a small
simulation: about a minute. Results: table on stdout, ``bench/results/scale.json`` and
``scale.png`` (or ``--out DIR``). Needs root for the namespaces; without it only the
one-host runs happen, on the real loopback, without traffic figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bench import sim_membership
from bench.common import RESULTS_DIR, environment, print_table, progress
from bench.fleet import (
    Fleet,
    NodeProc,
    PeerChange,
    counters_delta,
    cpu_seconds,
    memory,
    net_counters,
    python_command,
)
from tests.integration.netns import IP, Host, Lab, network_lab, unavailable_reason

#: The issue's targets.
TARGET_DISCOVERY_S = 5.0
TARGET_FLAPS = 0
TARGET_HEAL_S = 10.0
TARGET_CPU_PCT = 1.0
TARGET_MEMORY_MB = 35.0
ROUTER_BASE = 20000
PUB_BASE = 21000


@dataclass(frozen=True)
class Plan:
    """What one benchmark run does."""

    sizes: tuple[int, ...] = (10, 20, 50)
    bare: int = 50
    hosts: int = 5
    per_host: int = 10
    settle: float = 5.0
    idle_one_host: float = 30.0
    idle_lab: float = 300.0
    cut: float = 60.0
    #: Node timings (heartbeat, evasive after, expire after, re-contact cap); None: defaults.
    timings: tuple[float, float, float, float] | None = None
    sim_sizes: tuple[int, ...] = (500, 1000, 2000, 5000)
    sim_seconds: float = 120.0
    deadline: float = 180.0


FULL = Plan(settle=15.0)
QUICK = Plan(sizes=(4,), bare=4, hosts=2, per_host=2, settle=1.0, idle_one_host=3.0,
             idle_lab=4.0, cut=7.0, timings=(0.5, 1.5, 4.0, 2.0), sim_sizes=(200, 500),
             sim_seconds=30.0, deadline=60.0)


@dataclass
class RunResult:
    """One measured mesh."""

    label: str
    nodes: int
    hosts: int
    knowledge: bool
    #: The prefix of the namespaces of its lab (None on the real loopback).
    lab_tag: str | None = None
    discovery_s: float | None = None
    discovery_incl_startup_s: float | None = None
    start_spread_s: float | None = None
    idle_s: float = 0.0
    cpu_pct: list[float] = field(default_factory=list)
    memory: list[dict[str, float]] = field(default_factory=list)
    traffic: dict[str, float] = field(default_factory=dict)
    #: Evasive/left events over the idle window (the flapping the target counts).
    flaps: list[str] = field(default_factory=list)
    #: The same from the moment the mesh was complete until the idle window began (the
    #: settle period right after N processes started at once), with times from then.
    startup_flaps: list[str] = field(default_factory=list)
    views_ok: int = 0
    view_errors: list[str] = field(default_factory=list)
    heal: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["summary"] = self.summary()
        return out

    def summary(self) -> dict[str, Any]:
        def mean(key: str) -> float | None:
            return statistics.fmean(m[key] for m in self.memory) if self.memory else None

        return {
            "cpu_pct_mean": statistics.fmean(self.cpu_pct) if self.cpu_pct else None,
            "cpu_pct_max": max(self.cpu_pct) if self.cpu_pct else None,
            "rss_mb": mean("rss"), "pss_mb": mean("pss"), "uss_mb": mean("uss"),
            "flaps": len(self.flaps),
            "startup_flaps": len(self.startup_flaps),
        }


# -- processes and hosts ----------------------------------------------------------------


def node_env(data_root: Path) -> dict[str, str]:
    """The environment of a node process: no keys from the caller, data under the run's
    temporary directory."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PORTER_MESH")}
    env["PORTER_MESH_DATA"] = str(data_root)
    return env


def node_argv(plan: Plan, *, name: str, mesh: str, address: str, data_dir: Path,
              index: int | None, seeds: Sequence[str], knowledge: bool) -> list[str]:
    """The command line of one bare node."""
    argv = python_command("porter_mesh.cli.main", "node", "--name", name, "--mesh", mesh,
                          "--interface", address, "--insecure", "--data-dir", str(data_dir))
    if index is not None:  # inside a namespace the ports are ours to choose
        argv += ["--router-port", str(ROUTER_BASE + index), "--pub-port",
                 str(PUB_BASE + index)]
    if plan.timings is not None:
        beat, evasive, expire, _ = plan.timings
        argv += ["--heartbeat", str(beat), "--evasive-after", str(evasive),
                 "--expire-after", str(expire)]
    if not knowledge:
        argv.append("--no-knowledge")
    for seed in seeds:
        argv += ["--peer", seed]
    return argv


def in_host(host: Host | None, argv: list[str]) -> list[str]:
    return host.command(argv) if host is not None else argv


@contextlib.contextmanager
def maybe_lab(count: int, use_netns: bool) -> Iterator[Lab | None]:
    """A lab of ``count`` hosts (always removed afterwards), or None without namespaces."""
    if not use_netns:
        yield None
        return
    with network_lab(count, tag=f"pm-{os.getpid()}-{secrets.token_hex(2)}") as lab:
        yield lab


class Observers:
    """One :mod:`bench.scale_observer` per host, asking its own host's nodes."""

    def __init__(self, mesh: str, groups: list[tuple[Host | None, list[NodeProc]]]) -> None:
        self.groups = []
        for index, (host, nodes) in enumerate(groups):
            address = nodes[0].address
            argv = python_command("bench.scale_observer", "--mesh", mesh, "--name",
                                  f"scale-observer-{index}", "--interface", address,
                                  *[x for n in nodes for x in ("--peer", n.seed)])
            proc = subprocess.Popen(in_host(host, argv), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    cwd=Path(__file__).resolve().parents[1])
            self.groups.append((proc, nodes))
        for proc, _ in self.groups:
            self._line(proc, "up", 60.0)

    def _line(self, proc: subprocess.Popen[bytes], ev: str, timeout: float) -> dict[str, Any]:
        assert proc.stdout is not None
        import selectors

        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not sel.select(deadline - time.monotonic()):
                    break
                line = proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"observer ended (status {proc.poll()})")
                event: dict[str, Any] = json.loads(line)
                if event.get("ev") == ev:
                    return event
        raise TimeoutError(f"observer: no {ev!r} within {timeout}s")

    def views(self, timeout: float = 5.0) -> tuple[dict[str, Any], dict[str, str]]:
        """Every node's view summary, asked through the observer of its host."""
        for proc, nodes in self.groups:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({"op": "views", "names": [n.name for n in nodes],
                                         "timeout": timeout}).encode() + b"\n")
            proc.stdin.flush()
        views: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for proc, _ in self.groups:
            answer = self._line(proc, "views", timeout + 30.0)
            views.update(answer["views"])
            errors.update(answer["errors"])
        return views, errors

    def close(self) -> None:
        for proc, _ in self.groups:
            if proc.poll() is None and proc.stdin is not None:
                with contextlib.suppress(BrokenPipeError):
                    proc.stdin.close()
        for proc, _ in self.groups:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()


def check_views(views: dict[str, Any], errors: dict[str, str], names: set[str]
                ) -> tuple[int, list[str]]:
    """How many views hold every other node alive; what is wrong with the others."""
    ok, wrong = 0, [f"{n}: {why}" for n, why in sorted(errors.items())]
    for name, view in sorted(views.items()):
        peers = {p for p, state in view["peers"].items() if p in names}
        alive = {p for p in peers if view["peers"][p] == "alive"}
        if alive == names - {name}:
            ok += 1
        else:
            wrong.append(f"{name}: {len(alive)} alive of {len(names) - 1}")
    return ok, wrong


# -- one mesh ---------------------------------------------------------------------------


def measure_idle(fleet: Fleet, res: RunResult, hosts: list[tuple[Host | None, list[NodeProc]]],
                 seconds: float, counted: bool) -> None:
    """CPU, memory and traffic per node over ``seconds`` of an idle mesh."""
    cpu0 = {n.name: cpu_seconds(n.pid) for n in fleet.nodes}
    net0 = [net_counters(nodes[0].pid) for _, nodes in hosts] if counted else []
    t0 = time.monotonic()
    time.sleep(seconds)  # the idle window is the measurement
    elapsed = time.monotonic() - t0
    res.idle_s = round(elapsed, 2)
    res.cpu_pct = [round(100 * (cpu_seconds(n.pid) - cpu0[n.name]) / elapsed, 3)
                   for n in fleet.nodes]
    res.memory = [memory(n.pid) for n in fleet.nodes]
    if counted:
        deltas = [counters_delta(net_counters(nodes[0].pid), before)
                  for (_, nodes), before in zip(hosts, net0, strict=True)]
        n = len(fleet.nodes)
        octets = sum(d["OutOctets"] for d in deltas)
        mcast = sum(d["OutMcastOctets"] for d in deltas)
        res.traffic = {
            "mesh_tcp_bytes_per_node_s": round((octets - mcast) / n / elapsed, 1),
            "mdns_bytes_per_node_s": round(mcast / n / elapsed, 1),
            "tcp_segments_per_node_s": round(sum(d["OutSegs"] for d in deltas) / n / elapsed, 1),
            "udp_datagrams_per_node_s": round(
                sum(d["OutDatagrams"] for d in deltas) / n / elapsed, 2),
            "total_bytes_s": round(octets / elapsed, 1),
        }


def run_mesh(plan: Plan, *, label: str, hosts: int, per_host: int, knowledge: bool,
             idle: float, use_netns: bool, cut: bool) -> RunResult:
    """Start a mesh, measure it, end it. Every process and namespace is gone afterwards."""
    mesh = f"scale-{os.getpid()}-{secrets.token_hex(2)}"
    res = RunResult(label=label, nodes=hosts * per_host, hosts=hosts, knowledge=knowledge)
    data_root = Path(tempfile.mkdtemp(prefix="porter-scale-"))
    fleet = Fleet()
    observers: Observers | None = None
    try:
        with maybe_lab(hosts, use_netns) as lab:
            res.lab_tag = lab.tag if lab is not None else None
            placed: list[tuple[Host | None, list[NodeProc]]] = []
            host_list: list[Host | None] = list(lab.hosts) if lab is not None else [None]
            one_host = hosts == 1
            for h_index, host in enumerate(host_list):
                address = "127.0.0.1" if one_host or host is None else host.address
                seeds = ([] if one_host else
                         [f"{other.address}:{ROUTER_BASE}" for other in host_list
                          if other is not None and other is not host])
                group = []
                for i in range(per_host):
                    name = f"n{h_index}-{i:02d}"
                    argv = node_argv(plan, name=name, mesh=mesh, address=address,
                                     data_dir=data_root / name,
                                     index=i if host is not None else None,
                                     seeds=seeds, knowledge=knowledge)
                    group.append(fleet.spawn(
                        name, in_host(host, argv), host=host.netns if host else "root",
                        address=address, router_port=ROUTER_BASE + i,
                        env=node_env(data_root)))
                placed.append((host, group))
            progress(f"{label}: {res.nodes} node processes started")
            complete = fleet.wait(fleet.full, plan.deadline, f"{label}: full discovery")
            last_up = max(n.up_at or 0.0 for n in fleet.nodes)
            first_spawn = min(n.spawned_at for n in fleet.nodes)
            res.discovery_s = round(max(0.0, complete - last_up), 3)
            res.discovery_incl_startup_s = round(complete - first_spawn, 3)
            res.start_spread_s = round(last_up - min(n.up_at or 0.0 for n in fleet.nodes), 3)
            progress(f"{label}: every roster whole {res.discovery_s} s after the last start "
                     f"({res.discovery_incl_startup_s} s after the first spawn)")
            time.sleep(plan.settle)  # let start-up catch-ups and mDNS announcements finish
            idle_from = time.monotonic()
            res.startup_flaps = [flap_line(who, c, complete)
                                 for who, c in fleet.flaps(complete, idle_from)]
            progress(f"{label}: idle for {idle:.0f} s")
            measure_idle(fleet, res, placed, idle, counted=lab is not None)
            res.flaps = [flap_line(who, c, complete)
                         for who, c in fleet.flaps(idle_from, time.monotonic())]
            observers = Observers(mesh, placed)
            views, errors = observers.views()
            names = {n.name for n in fleet.nodes}
            res.views_ok, res.view_errors = check_views(views, errors, names)
            progress(f"{label}: {res.views_ok}/{res.nodes} views hold every other node; "
                     f"{len(res.flaps)} flap(s); cpu {res.summary()['cpu_pct_mean']:.2f}%, "
                     f"pss {res.summary()['pss_mb']:.1f} MB per node")
            if cut and lab is not None:
                res.heal = cut_and_heal(plan, lab, fleet, observers, placed, mesh, data_root)
    finally:
        if observers is not None:
            observers.close()
        res.problems += fleet.stop()
        fleet.close()
        subprocess.run(["rm", "-rf", str(data_root)], check=False)
    return res


def flap_line(who: str, change: PeerChange, since: float) -> str:
    return (f"{who}: {change.peer} {change.kind} {change.reason} "
            f"at +{change.t - since:.1f}s").replace("  ", " ")


def set_port(lab: Lab, host: Host, state: str) -> None:
    """Bring ``host``'s port on the lab bridge ``up`` or ``down`` (inside the lab only)."""
    port = f"v-{host.netns.rsplit('-', 1)[1]}"
    subprocess.run([IP, "-n", lab.bridge_netns, "link", "set", port, state], check=True,
                   capture_output=True, timeout=30)


def cut_and_heal(plan: Plan, lab: Lab, fleet: Fleet, observers: Observers,
                 placed: list[tuple[Host | None, list[NodeProc]]], mesh: str,
                 data_root: Path) -> dict[str, Any]:
    """Cut the last host off for ``plan.cut`` seconds, write on its side, heal, time it."""
    cut_host, cut_nodes = placed[-1]
    assert cut_host is not None
    inside = {n.name for n in cut_nodes}
    outside = [n for n in fleet.nodes if n.name not in inside]
    progress(f"cut: {cut_host.netns} ({len(cut_nodes)} nodes) off for {plan.cut:.0f} s")
    t_cut = time.monotonic()
    set_port(lab, cut_host, "down")
    out: dict[str, Any] = {"cut_s": plan.cut, "cut_nodes": len(cut_nodes)}

    def split() -> bool:
        return (all(not (n.roster & inside) for n in outside)
                and all(not (n.roster - inside) for n in cut_nodes))

    out["split_after_s"] = round(fleet.wait(split, plan.cut + 30, "the cut splits the rosters")
                                 - t_cut, 2)
    writer = subprocess.run(
        cut_host.command(python_command(
            "porter_mesh.cli.main", "remember", "urn:porter:bench:scale",
            f"written on {cut_host.netns} while it was cut off", "--mesh", mesh,
            "--interface", cut_nodes[0].address, "--insecure", "--no-discovery",
            "--peer", cut_nodes[0].seed, "--timeout", "20")),
        capture_output=True, text=True, timeout=60, env=node_env(data_root),
        cwd=Path(__file__).resolve().parents[1])
    out["remember_status"] = writer.returncode
    if writer.returncode != 0:
        out["remember_error"] = writer.stderr.strip()[-500:]
    left = plan.cut - (time.monotonic() - t_cut)
    if left > 0:
        time.sleep(left)  # the partition lasts as long as the plan says
    t_heal = time.monotonic()
    out["cut_lasted_s"] = round(t_heal - t_cut, 2)
    # Between healthy nodes on the same side nothing may have flapped during the cut.
    same_side = [f"{who}: {c.peer} {c.kind}" for who, c in fleet.flaps(t_cut, t_heal)
                 if (who in inside) == (c.peer in inside)]
    out["same_side_flaps"] = same_side
    set_port(lab, cut_host, "up")
    progress("healed: waiting for rosters and digests")
    rosters = fleet.wait(fleet.full, plan.deadline, "rosters whole after the heal")
    out["rosters_s"] = round(rosters - t_heal, 2)
    deadline = time.monotonic() + plan.deadline
    digests: set[str | None] = set()
    while time.monotonic() < deadline:
        views, errors = observers.views(timeout=3.0)
        digests = {v["digest"] for v in views.values()}
        records = {v["records"] for v in views.values()}
        if not errors and len(views) == len(fleet.nodes) and len(digests) == 1 \
                and records == {1}:
            out["digests_s"] = round(time.monotonic() - t_heal, 2)
            break
        time.sleep(0.5)  # poll interval of the views
    else:
        out["digests_s"] = None
        out["digests_seen"] = len(digests)
    out["converged_s"] = (max(out["rosters_s"], out["digests_s"])
                          if out["digests_s"] is not None else None)
    progress(f"healed: rosters {out['rosters_s']} s, digests {out['digests_s']} s")
    return out


# -- dependencies -----------------------------------------------------------------------

#: What a bare node's process imports, in the order it does, then what it no longer does.
IMPORT_STEPS = (
    ("python", "pass"),
    ("asyncio (with ssl)", "import asyncio"),
    ("pyzmq", "import zmq"),
    ("msgpack, orjson, msgspec", "import msgpack, orjson, msgspec"),
    ("porter_mesh (node, core, tools)", "import porter_mesh"),
    ("cli: node command only", "from porter_mesh.cli.main import build_parser; "
     "build_parser('node')"),
    ("zeroconf + discovery", "import porter_mesh.adapters.discovery"),
    ("knowledge shard (pyoxigraph)", "import porter_mesh.node.knowledge, "
     "porter_mesh.adapters.shard"),
    ("not loaded: rdflib", "import rdflib"),
    ("not loaded: every cli command (aiohttp...)",
     "from porter_mesh.cli.main import build_parser; build_parser()"),
)


def import_costs() -> list[dict[str, Any]]:
    """Resident memory after each step of :data:`IMPORT_STEPS`, each step adding to the
    ones before it, every figure from a fresh interpreter."""
    rows = []
    code = []
    previous = None
    for label, statement in IMPORT_STEPS:
        code.append(statement)
        script = "; ".join(code) + "; import sys; print(open('/proc/self/status').read())"
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              timeout=60, cwd=Path(__file__).resolve().parents[1])
        status = dict(line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
        rss = int(status.get("VmRSS", "0 kB").split()[0]) / 1024
        anon = int(status.get("RssAnon", "0 kB").split()[0]) / 1024
        rows.append({"step": label, "rss_mb": round(rss, 1), "anon_mb": round(anon, 1),
                     "added_mb": round(rss - previous, 1) if previous is not None else None})
        previous = rss
    return rows


# -- report -----------------------------------------------------------------------------


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else "PASS" if ok else "MISS"


def table(runs: list[RunResult]) -> tuple[list[str], list[list[Any]]]:
    headers = ["mesh", "N", "kg", "disc s", "cpu %/node", "rss MB", "pss MB", "uss MB",
               "tcp B/s/node", "mdns B/s/node", "flaps", "start flaps", "views ok",
               "heal s"]
    rows = []
    for r in runs:
        s = r.summary()
        rows.append([
            r.label, r.nodes, "yes" if r.knowledge else "no",
            r.discovery_s if r.discovery_s is not None else "-",
            round(s["cpu_pct_mean"], 2) if s["cpu_pct_mean"] is not None else "-",
            round(s["rss_mb"], 1) if s["rss_mb"] else "-",
            round(s["pss_mb"], 1) if s["pss_mb"] else "-",
            round(s["uss_mb"], 1) if s["uss_mb"] else "-",
            r.traffic.get("mesh_tcp_bytes_per_node_s", "-"),
            r.traffic.get("mdns_bytes_per_node_s", "-"),
            s["flaps"], s["startup_flaps"], f"{r.views_ok}/{r.nodes}",
            r.heal.get("converged_s", "-") if r.heal else "",
        ])
    return headers, rows


def targets(runs: list[RunResult]) -> list[list[Any]]:
    lab = next((r for r in runs if r.hosts > 1), None)
    if lab is None:
        return []
    s = lab.summary()
    heal = lab.heal.get("converged_s") if lab.heal else None
    return [
        ["every node sees all others after the last start", f"<= {TARGET_DISCOVERY_S} s",
         f"{lab.discovery_s} s",
         verdict(lab.discovery_s is not None and lab.discovery_s <= TARGET_DISCOVERY_S)],
        [f"flapping over {lab.idle_s:.0f} s idle", "0", str(s["flaps"]),
         verdict(s["flaps"] == TARGET_FLAPS)],
        ["converged after the heal (rosters and digests)", f"<= {TARGET_HEAL_S} s",
         f"{heal} s", verdict(heal is not None and heal <= TARGET_HEAL_S)],
        ["idle CPU per node", f"<= {TARGET_CPU_PCT}% of a core",
         f"{s['cpu_pct_mean']:.2f}% (max {s['cpu_pct_max']:.2f}%)",
         verdict(s["cpu_pct_mean"] <= TARGET_CPU_PCT)],
        ["memory per node (PSS)", f"<= {TARGET_MEMORY_MB} MB", f"{s['pss_mb']:.1f} MB "
         f"(RSS {s['rss_mb']:.1f}, USS {s['uss_mb']:.1f})",
         verdict(s["pss_mb"] <= TARGET_MEMORY_MB)],
    ]


def plot(res: dict[str, Any], path: Path) -> None:
    """Cost per node against N (measured), and the simulated membership beyond."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in res["runs"] if r["hosts"] == 1 and r["knowledge"]]
    lab = [r for r in res["runs"] if r["hosts"] > 1]
    bare = [r for r in res["runs"] if r["hosts"] == 1 and not r["knowledge"]]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))

    def series(ax: Any, key: str, label: str, runs_: list[dict[str, Any]], style: str,
               source: str = "summary") -> None:
        xs = [r["nodes"] for r in runs_ if r[source].get(key) is not None]
        ys = [r[source][key] for r in runs_ if r[source].get(key) is not None]
        if xs:
            ax.plot(xs, ys, style, label=label)

    ax = axes[0][0]
    series(ax, "cpu_pct_mean", "one host, knowledge", runs, "o-")
    series(ax, "cpu_pct_mean", "one host, no knowledge", bare, "s")
    series(ax, "cpu_pct_mean", "5 hosts, knowledge", lab, "^")
    ax.axhline(TARGET_CPU_PCT, color="#c0392b", linestyle="--", linewidth=0.8,
               label="target")
    ax.set_title("idle CPU per node (% of a core)", fontsize=10)
    ax.set_xlabel("nodes N")
    ax.legend(fontsize=8)

    ax = axes[0][1]
    for key, style in (("rss_mb", "o-"), ("pss_mb", "s-"), ("uss_mb", "^-")):
        series(ax, key, f"{key[:3].upper()}, one host", runs, style)
    series(ax, "pss_mb", "PSS, no knowledge", bare, "x")
    series(ax, "pss_mb", "PSS, 5 hosts", lab, "D")
    ax.axhline(TARGET_MEMORY_MB, color="#c0392b", linestyle="--", linewidth=0.8,
               label="target")
    ax.set_title("memory per idle node (MB)", fontsize=10)
    ax.set_xlabel("nodes N")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)

    ax = axes[1][0]
    series(ax, "mesh_tcp_bytes_per_node_s", "mesh TCP, one host", runs, "o-", "traffic")
    series(ax, "mdns_bytes_per_node_s", "mDNS, one host", runs, "s-", "traffic")
    series(ax, "mesh_tcp_bytes_per_node_s", "mesh TCP, no knowledge", bare, "x", "traffic")
    series(ax, "mesh_tcp_bytes_per_node_s", "mesh TCP, 5 hosts", lab, "^", "traffic")
    fit = res.get("heartbeat_fit")
    if fit:
        xs = [10, 50]
        ax.plot(xs, [fit["fixed"] + fit["per_peer"] * (x - 1) for x in xs], ":",
                color="#555555", label=f"fit {fit['per_peer']:.0f} B/s per peer")
    ax.set_title("traffic sent per node (bytes/s, IP)", fontsize=10)
    ax.set_xlabel("nodes N")
    ax.legend(fontsize=8)

    ax = axes[1][1]
    sim = res.get("simulation", {})
    for key, label, style in (("full_mesh", "full-mesh heartbeats", "o-"),
                              ("swim", "SWIM-style probes", "s-")):
        rows = sim.get(key, [])
        if rows:
            ax.plot([r["nodes"] for r in rows], [r["messages_per_node_s"] for r in rows],
                    style, label=f"{label}: messages/node/s")
    rows = sim.get("full_mesh", [])
    if rows:
        ax.plot([r["nodes"] for r in rows], [r["core_cpu_pct"] for r in rows], "^--",
                label="full mesh: peer core CPU % per node")
    cfit = res.get("cpu_fit")
    if rows and cfit and cfit["per_peer"] > 0:
        xs = [r["nodes"] for r in rows]
        ax.plot(xs, [cfit["fixed"] + cfit["per_peer"] * (x - 1) for x in xs], "v:",
                label="real node CPU % per node (lab fit, extrapolated)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title("simulated membership (virtual clock)", fontsize=10)
    ax.set_xlabel("members N")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.suptitle("porter-mesh at lab scale: cost per node against N", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fit_per_peer(runs: list[RunResult], value: Any) -> dict[str, float] | None:
    """Least squares of ``value(run)`` against N-1 over the one-host runs with knowledge:
    the part that grows with every peer (``per_peer``) and the ``fixed`` part."""
    points = [(r.nodes - 1, value(r)) for r in runs if r.hosts == 1 and r.knowledge]
    points = [(x, y) for x, y in points if y is not None]
    if len({x for x, _ in points}) < 2:
        return None
    slope, intercept = statistics.linear_regression(*zip(*points, strict=True))
    return {"per_peer": round(slope, 4), "fixed": round(intercept, 4)}


def heartbeat_fit(runs: list[RunResult]) -> dict[str, float] | None:
    """Mesh TCP bytes sent per node per second against N-1."""
    return fit_per_peer(runs, lambda r: r.traffic.get("mesh_tcp_bytes_per_node_s"))


def cpu_fit(runs: list[RunResult]) -> dict[str, float] | None:
    """Idle CPU per node (% of a core) against N-1."""
    return fit_per_peer(runs, lambda r: r.summary()["cpu_pct_mean"])


# -- entry point ------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.bench_scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a smoke test of about a minute")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="where scale.json/png go")
    p.add_argument("--sizes", help="one-host sizes, comma-separated (default 10,20,50)")
    p.add_argument("--idle", type=float, help="seconds of the five-host idle window")
    p.add_argument("--cut", type=float, help="seconds the host is cut off")
    p.add_argument("--skip", default="", help="comma-separated: one-host,bare,lab,sim,imports")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    plan = QUICK if a.quick else FULL
    if a.sizes:
        plan = replace(plan, sizes=tuple(int(s) for s in a.sizes.split(",")))
    if a.idle is not None:
        plan = replace(plan, idle_lab=a.idle)
    if a.cut is not None:
        plan = replace(plan, cut=a.cut)
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    # A SIGTERM must still run the teardown (processes by pid, namespaces).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    reason = unavailable_reason()
    use_netns = reason is None
    if not use_netns:
        progress(f"no network namespaces ({reason}): one host on the real loopback, "
                 "no traffic figures, no five-host run")
    started = time.monotonic()
    runs: list[RunResult] = []
    errors: dict[str, str] = {}

    def attempt(label: str, **kw: Any) -> None:
        try:
            runs.append(run_mesh(plan, label=label, use_netns=use_netns, **kw))
        except Exception as exc:  # one failed mesh must not hide the others' figures
            errors[label] = f"{type(exc).__name__}: {exc}"
            progress(f"{label} failed: {errors[label]}")

    if "one-host" not in skip:
        for n in plan.sizes:
            attempt(f"1 host x {n}", hosts=1, per_host=n, knowledge=True,
                    idle=plan.idle_one_host, cut=False)
    if "bare" not in skip:
        attempt(f"1 host x {plan.bare}, bare", hosts=1, per_host=plan.bare, knowledge=False,
                idle=plan.idle_one_host, cut=False)
    if use_netns and "lab" not in skip:
        attempt(f"{plan.hosts} hosts x {plan.per_host}", hosts=plan.hosts,
                per_host=plan.per_host, knowledge=True, idle=plan.idle_lab, cut=True)
    res: dict[str, Any] = {"plan": asdict(plan), "runs": [r.to_json() for r in runs],
                           "errors": errors}
    res["heartbeat_fit"] = heartbeat_fit(runs)
    res["cpu_fit"] = cpu_fit(runs)
    if "imports" not in skip:
        progress("import costs, one fresh interpreter per step")
        res["imports"] = import_costs()
    if "sim" not in skip:
        progress(f"simulation: {plan.sim_sizes} members, {plan.sim_seconds:.0f} s virtual")
        res["simulation"] = sim_membership.run(plan.sim_sizes, plan.sim_seconds)
    res["targets"] = [dict(zip(("measure", "target", "measured", "result"), row, strict=True))
                      for row in targets(runs)]
    res["meta"] = {"quick": a.quick, "seconds": round(time.monotonic() - started, 1),
                   "environment": environment(), "netns": use_netns}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "scale.json").write_text(json.dumps(res, indent=2) + "\n")
    plot(res, a.out / "scale.png")
    print_table(*table(runs))
    if res["targets"]:
        print()
        print_table(["target", "goal", "measured", "result"], targets(runs))
    if res.get("heartbeat_fit"):
        fit = res["heartbeat_fit"]
        print(f"\nmesh TCP sent per node ~ {fit['fixed']:.0f} + {fit['per_peer']:.1f} x (N-1) "
              "B/s; the whole mesh sends N times that (N^2 growth)")
    if res.get("cpu_fit"):
        fit = res["cpu_fit"]
        print(f"idle CPU per node ~ {fit['fixed']:.3f} + {fit['per_peer']:.4f} x (N-1) % of a "
              "core")
    if "imports" in res:
        print()
        print_table(["import step", "rss MB", "added MB"],
                    [[r["step"], r["rss_mb"], r["added_mb"] if r["added_mb"] is not None
                      else "-"] for r in res["imports"]])
    if "simulation" in res:
        print()
        sim_membership.print_tables(res["simulation"])
    print(f"\nwrote {a.out / 'scale.json'} and {a.out / 'scale.png'} "
          f"in {res['meta']['seconds']:.0f} s")
    for label, why in errors.items():
        print(f"error: {label}: {why}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
