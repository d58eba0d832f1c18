"""Membership at 500-5,000 nodes, simulated on a virtual clock: what full-mesh heartbeats
cost per node, and what a SWIM-style protocol (Serf/memberlist) would cost instead.

Two models, both driven by virtual time (no sockets, no sleeping):

* **full mesh** (what porter-mesh does): every node hears every other node's heartbeat
  once per interval. Each node's view is independent of the others', so one node's
  :class:`~porter_mesh.core.peers.PeerTable` (the real pure core) is driven with N-1
  peers, their heartbeats spread over the interval, ``tick`` on every beat, for the
  simulated seconds; the CPU that core takes (``thread_time``) per simulated second is
  the core's share of one node's idle cost. Messages per node per second are N-1 in and
  N-1 out, so the mesh carries N(N-1).
* **SWIM** (Das, Gupta, Motivala 2002; memberlist's variant): every protocol period each
  member pings one random member; without an ack it asks ``k`` others to ping it (the
  indirect probe); without any ack the target is *suspect*, and *dead* after a suspicion
  timeout of ``4 * log10(N)`` periods unless it refutes with a higher incarnation. State
  changes ride piggybacked on pings and acks, each sent ``3 * log2(N)`` times. Members
  keep only the updates they have heard (everyone else is alive), so 5,000 members fit.
  A member crashes at period 5; every message is lost with probability ``loss``.
  Measured: messages per member per period, periods until the first member suspects the
  crashed one and until every member holds it dead, and false suspicions / deaths of
  live members.

``python -m bench.sim_membership`` runs it alone and prints the tables.
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.common import print_table, progress
from porter_mesh.core import constants as C
from porter_mesh.core.advert import PeerAdvert
from porter_mesh.core.envelope import (
    KIND_HEARTBEAT,
    Envelope,
    decode_broadcast,
    decode_control,
    encode_broadcast,
    encode_control,
    make_msg_id,
)
from porter_mesh.core.hlc import HybridClock
from porter_mesh.core.knowledge import ReplicaState, encode_sync
from porter_mesh.core.peers import PeerEventKind, PeerTable

#: Granularity of the node's timer (``porter_mesh.node.node._TICK``).
TICK = 0.05


def full_mesh(n: int, seconds: float, *, interval: float = 1.0, evasive: float = 3.0,
              expire: float = 10.0, crash_at: float = 5.0, seed: int = 1) -> dict[str, Any]:
    """One node's peer table hearing N-1 peers for ``seconds`` of virtual time; one peer
    falls silent (crashes) at ``crash_at``. Events about the others are false."""
    rng = random.Random(seed)
    table = PeerTable(evasive_after=evasive, expire_after=expire)
    peers = [PeerAdvert(name=f"m{i}", role="agent", mesh="sim", pub_port=1, router_port=2,
                        version=1, incarnation=i + 1) for i in range(n - 1)]
    for advert in peers:
        table.found(advert, 0.0)
    per_interval = max(1, round(interval / TICK))
    buckets: list[list[PeerAdvert]] = [[] for _ in range(per_interval)]
    for advert in peers:
        buckets[rng.randrange(per_interval)].append(advert)
    crashed = peers[0].name
    events = {kind: 0 for kind in PeerEventKind}
    found_crash: dict[PeerEventKind, float] = {}
    heard = 0
    steps = round(seconds / TICK)
    start = time.thread_time()
    for step in range(1, steps + 1):
        now = step * TICK
        for advert in buckets[step % per_interval]:
            if advert.name == crashed and now >= crash_at:
                continue
            table.heard(advert.name, advert.incarnation, now)
            heard += 1
        if step % per_interval == 0:
            for event in table.tick(now):
                if event.peer.name == crashed:
                    found_crash.setdefault(event.kind, now - crash_at)
                else:
                    events[event.kind] += 1
    cpu = time.thread_time() - start
    return {
        "nodes": n, "seconds": seconds, "heard": heard,
        "messages_per_node_s": round(2 * (n - 1) / interval, 1),  # in and out
        "mesh_messages_s": n * (n - 1) / interval,
        "core_us_per_heartbeat": round(1e6 * cpu / heard, 3),
        "core_cpu_pct": round(100 * cpu / seconds, 4),
        "false_evasive": events[PeerEventKind.EVASIVE],
        "false_expired": events[PeerEventKind.LEFT],
        "evasive_crash_s": found_crash.get(PeerEventKind.EVASIVE),
        "detect_crash_s": found_crash.get(PeerEventKind.LEFT),
    }


# -- SWIM -------------------------------------------------------------------------------

ALIVE, SUSPECT, DEAD = 0, 1, 2


@dataclass
class _Member:
    incarnation: int = 0
    #: What this member believes about others that are not simply alive:
    #: target -> (state, incarnation, since period).
    view: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    #: Updates to piggyback: (target, state, incarnation) -> sends left.
    gossip: dict[tuple[int, int, int], int] = field(default_factory=dict)


class Swim:
    """A SWIM-style membership of ``n`` members (see the module docstring).

    Per protocol period: every live member probes one random member (ping, ack; on
    failure ``k`` indirect probes); then, as memberlist does, ``gossip_rounds`` times
    a member that has updates to spread sends them to ``fanout`` random members (idle
    members send nothing). Every message carries at most ``piggyback`` updates.
    """

    def __init__(self, n: int, *, loss: float, k: int = 3, piggyback: int = 6,
                 fanout: int = 3, gossip_rounds: int = 5, seed: int = 1) -> None:
        self.n = n
        self.loss = loss
        self.k = k
        self.piggyback = piggyback
        self.fanout = fanout
        self.gossip_rounds = gossip_rounds
        self.rng = random.Random(seed)
        self.members = [_Member() for _ in range(n)]
        self.crashed: set[int] = set()
        self.retransmit = max(1, math.ceil(3 * math.log2(n)))
        self.suspicion = max(1, math.ceil(4 * math.log10(n)))
        self.period = 0
        self.messages = 0
        self.false_suspicions = 0
        #: Live members that some member declared dead.
        self.falsely_dead: set[int] = set()

    def _send(self, src: int, dst: int) -> bool:
        """One message from ``src`` to ``dst`` carrying ``src``'s gossip; True if it
        arrived (``dst`` merged the gossip)."""
        self.messages += 1
        if self.rng.random() < self.loss or dst in self.crashed:
            return False
        sender = self.members[src]
        if sender.gossip:
            chosen = sorted(sender.gossip.items(), key=lambda kv: -kv[1])[:self.piggyback]
            for update, left in chosen:
                if left <= 1:
                    del sender.gossip[update]
                else:
                    sender.gossip[update] = left - 1
                self._merge(dst, *update)
        return True

    def _merge(self, at: int, target: int, state: int, incarnation: int) -> None:
        """``at`` hears ``state`` about ``target`` (SWIM's precedence rules)."""
        member = self.members[at]
        if target == at:
            if state != ALIVE and incarnation >= member.incarnation:
                member.incarnation = incarnation + 1  # refute
                self._spread(at, at, ALIVE, member.incarnation)
            return
        held_state, held_inc, _ = member.view.get(target, (ALIVE, 0, 0))
        if state == ALIVE:
            newer = incarnation > held_inc
        elif state == SUSPECT:
            newer = held_state != DEAD and (incarnation > held_inc or (
                incarnation == held_inc and held_state == ALIVE))
        else:
            newer = held_state != DEAD and incarnation >= held_inc
        if newer:
            self._conclude(at, target, state, incarnation)

    def _conclude(self, at: int, target: int, state: int, incarnation: int) -> None:
        """``at`` now holds ``state`` about ``target`` and spreads it."""
        member = self.members[at]
        if state == ALIVE:
            member.view.pop(target, None)
        else:
            member.view[target] = (state, incarnation, self.period)
            if state == DEAD and target not in self.crashed:
                self.falsely_dead.add(target)
        self._spread(at, target, state, incarnation)

    def _spread(self, at: int, target: int, state: int, incarnation: int) -> None:
        gossip = self.members[at].gossip
        for key in [key for key in gossip if key[0] == target]:
            del gossip[key]
        gossip[(target, state, incarnation)] = self.retransmit

    def _probe(self, src: int, dst: int) -> bool:
        if self._send(src, dst) and self._send(dst, src):
            return True
        helpers = self.rng.sample(range(self.n), min(self.k + 2, self.n))
        for helper in [h for h in helpers if h not in (src, dst)][:self.k]:
            if (self._send(src, helper) and self._send(helper, dst)
                    and self._send(dst, helper) and self._send(helper, src)):
                return True
        return False

    def _other(self, src: int) -> int:
        dst = self.rng.randrange(self.n - 1)
        return dst + (dst >= src)

    def _knows(self, victim: int, states: tuple[int, ...]) -> bool:
        return all(m.view.get(victim, (ALIVE,))[0] in states
                   for i, m in enumerate(self.members) if i not in self.crashed)

    def run(self, periods: int, crash_at: int = 5) -> dict[str, Any]:
        """Run ``periods`` protocol periods; member 0 crashes at ``crash_at``."""
        victim = 0
        first_suspect = all_suspect = all_dead = None
        for self.period in range(periods):
            if self.period == crash_at:
                self.crashed.add(victim)
            for src in range(self.n):
                if src in self.crashed:
                    continue
                member = self.members[src]
                for target, (state, inc, since) in list(member.view.items()):
                    if state == SUSPECT and self.period - since >= self.suspicion:
                        self._conclude(src, target, DEAD, inc)
                dst = self._other(src)
                held_state, held_inc, _ = member.view.get(dst, (ALIVE, 0, 0))
                if held_state == DEAD or self._probe(src, dst):
                    continue
                if held_state == ALIVE:
                    if dst not in self.crashed:
                        self.false_suspicions += 1
                    elif first_suspect is None:
                        first_suspect = self.period - crash_at + 1
                    self._conclude(src, dst, SUSPECT, held_inc)
            for _ in range(self.gossip_rounds):
                for src in [i for i, m in enumerate(self.members)
                            if m.gossip and i not in self.crashed]:
                    for _ in range(self.fanout):
                        self._send(src, self._other(src))
            if self.period >= crash_at:
                done = self.period - crash_at + 1
                if all_suspect is None and self._knows(victim, (SUSPECT, DEAD)):
                    all_suspect = done
                if all_dead is None and self._knows(victim, (DEAD,)):
                    all_dead = done
        live = self.n - len(self.crashed)
        return {
            "nodes": self.n, "periods": periods, "loss": self.loss,
            "messages_per_node_s": round(self.messages / live / periods, 2),
            "detect_first_periods": first_suspect,
            "suspect_all_periods": all_suspect,
            "dead_all_periods": all_dead,
            "suspicion_periods": self.suspicion,
            "false_suspicions": self.false_suspicions,
            "false_deaths": len(self.falsely_dead),
        }


def heartbeat_path(rounds: int = 20000) -> dict[str, Any]:
    """The pure part of hearing one heartbeat, as a node does it: split and check the
    frames, merge the clock, mark the peer heard, decode the body. The rest of a real
    node's cost per heartbeat is outside the core (ZeroMQ, the kernel, the event loop).
    """
    clock = HybridClock()
    wall = int(time.time() * 1000)
    incarnation = 0x1234_5678_9ABC_DEF0
    env = Envelope(version=C.PROTOCOL_VERSION, msg_id=make_msg_id(incarnation, "control", 7),
                   sender="n1-07", channel=C.CHANNEL_CONTROL, seq=7, incarnation=incarnation,
                   hlc=clock.now(wall), kind=KIND_HEARTBEAT)
    frames = encode_broadcast(env, encode_control(
        {"s": {C.CHANNEL_LOG: 0, C.CHANNEL_TASK: 0, C.CHANNEL_REVIEW: 0}, "d": False}))
    table = PeerTable(evasive_after=3.0, expire_after=10.0)
    table.found(PeerAdvert(name="n1-07", role="agent", mesh="sim", pub_port=1,
                           router_port=2, version=1, incarnation=incarnation), 0.0)
    start = time.thread_time()
    for i in range(rounds):
        got, payload = decode_broadcast(frames)
        clock.receive(got.hlc, wall)
        table.heard(got.sender, got.incarnation, float(i))
        decode_control(payload)
    cpu = time.thread_time() - start
    return {"frame_bytes": sum(len(f) for f in frames),
            "core_us": round(1e6 * cpu / rounds, 2)}


def anti_entropy(interval: float = 2.0) -> dict[str, Any]:
    """What the knowledge digest exchange costs per node, whatever N is."""
    size = len(encode_sync(ReplicaState().digest()))
    return {"digest_bytes": size, "interval_s": interval,
            # One digest sent per interval; equal digests get no answer.
            "per_node_bytes_s": round(size / interval, 1)}


def run(sizes: Sequence[int], seconds: float) -> dict[str, Any]:
    """Both models at every size; SWIM with no loss and with 1% loss."""
    out: dict[str, Any] = {"full_mesh": [], "swim": [], "swim_lossy": []}
    for n in sizes:
        progress(f"  full mesh, {n} members")
        out["full_mesh"].append(full_mesh(n, seconds))
        periods = max(30, round(seconds / 2))
        progress(f"  SWIM, {n} members, {periods} periods")
        out["swim"].append(Swim(n, loss=0.0).run(periods))
        out["swim_lossy"].append(Swim(n, loss=0.01, seed=2).run(periods))
    out["anti_entropy"] = anti_entropy()
    out["heartbeat_path"] = heartbeat_path()
    return out


def print_tables(sim: dict[str, Any]) -> None:
    print_table(
        ["full mesh N", "msgs/node/s", "mesh msgs/s", "core us/beat", "core cpu %/node",
         "false evasive", "detect s"],
        [[r["nodes"], r["messages_per_node_s"], f"{r['mesh_messages_s']:.0f}",
          r["core_us_per_heartbeat"], r["core_cpu_pct"], r["false_evasive"],
          r["detect_crash_s"]] for r in sim["full_mesh"]])
    print()
    print_table(
        ["SWIM N", "loss", "msgs/node/s", "first suspects", "all suspect", "all dead",
         "suspicion", "false suspect", "false dead"],
        [[r["nodes"], r["loss"], r["messages_per_node_s"], r["detect_first_periods"],
          r["suspect_all_periods"], r["dead_all_periods"], r["suspicion_periods"],
          r["false_suspicions"], r["false_deaths"]] for r in sim["swim"] + sim["swim_lossy"]])
    print("(SWIM figures in protocol periods of 1 s)")
    hb = sim["heartbeat_path"]
    print(f"\na heartbeat is {hb['frame_bytes']} bytes of frames; the pure core hears one in "
          f"{hb['core_us']} us (frames, clock, roster, body)")
    ae = sim["anti_entropy"]
    print(f"\nanti-entropy: a digest is {ae['digest_bytes']} bytes, one sent per node every "
          f"{ae['interval_s']} s (answered only when they differ): {ae['per_node_bytes_s']} "
          "B/s per node at any N")


if __name__ == "__main__":
    sizes = tuple(int(s) for s in sys.argv[1].split(",")) if len(sys.argv) > 1 else (500, 5000)
    print_tables(run(sizes, 60.0))
