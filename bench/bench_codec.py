"""Codec micro-benchmark: what the wire format costs per activity, next to bare orjson.

Cases, each timed against the baseline in the same run (see "Timing" below):

(a) ``baseline``  -- ``orjson.loads(orjson.dumps(d))`` of the profile's Announce example:
    the least any JSON-on-the-wire design can cost.
(b) ``single``    -- one message carrying one activity: ``encode_envelope`` +
    ``encode_payload`` then ``decode_envelope`` + ``decode_payload`` (full parse and
    validation into an :class:`~porter_mesh.core.as2.Activity`).
(c) ``batched``   -- the same with 64 activities per message, per activity.

What is honest about (b) and (c):

* *Fresh activity each time.* Each call re-encodes the activities the previous call
  decoded, so their JSON is really serialised every time (an activity built in Python
  carries cached JSON, which would flatter the figure; the ``same activity object`` rows
  show that case separately).
* *A new envelope each time.* Each call encodes the next of 4096 envelopes of one
  stream, with increasing ``seq`` and ``hlc`` (and the conventional ``msg_id``), as a
  sender produces them; the envelopes are built before timing, like the baseline's dict,
  so (b) and (c) time encoding and decoding only. The ``envelope built per message``
  row adds what building one costs the node (``make_msg_id`` and the constructor).
* The envelope codec caches per-stream templates (see
  :mod:`porter_mesh.core.envelope`): the encoded prefix per (sender, channel,
  incarnation, recipient), and the decoded fields per received prefix. Every message of
  a stream after its first one uses them, so (b) and (c) include them; the
  ``envelope decode, first of a stream`` row shows the uncached (full msgpack) path.

Timing: CPU time of this thread, GC off during timing, as in the other benchmarks. On a
shared machine the speed changes from second to second, so each case is timed in
*pairs* with the baseline: in every round, a case and the baseline take turns in short
slices (about 3 ms each), and that round's ratio is the case's time over the baseline's
time in those same slices. The figures reported are medians over rounds: per-operation
microseconds, and the ratio.

Targets: (b) <= 4.0x and (c) <= 1.5x the baseline, judged for both variants (fresh
activities, and the same activity objects); the table says which passes. The remaining
rows are not targets: (b) and (c) broken down by stage, so that a miss can be traced to
the envelope or to the AS2 layer.

Run: ``.venv/bin/python -m bench.bench_codec`` (``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import orjson

from bench.common import (
    Timing,
    _calibrate,
    plot_ratios,
    print_table,
    progress,
    write_results,
)
from porter_mesh.core import as2, envelope
from porter_mesh.core.as2 import Activity
from porter_mesh.core.constants import PROTOCOL_VERSION
from porter_mesh.core.envelope import (
    Envelope,
    decode_envelope,
    decode_payload,
    encode_envelope,
    encode_payload,
    make_msg_id,
)
from porter_mesh.core.profile_examples import profile_examples

NAME = "codec"
BATCH = 64
TARGETS = {
    "single": 4.0,
    "batched": 1.5,
    "single, same activity object": 4.0,
    "batched, same activity objects": 1.5,
}

#: The profile's status announcement (its "Announce" example), the payload measured.
ANNOUNCE: dict[str, Any] = profile_examples()["Status announcement"]
SENDER = "worker-backend"
CHANNEL = "log"
INCARNATION = 0x5EED_1234_ABCD_0042
HLC = 1_778_000_000_000 << 16 | 3
FIRST_SEQ = 12_345
POOL = 4096


def _stream(count: int) -> Iterator[Envelope]:
    """Endless envelopes of one stream: ``POOL`` consecutive messages, built up front."""
    envelopes = [
        Envelope(
            PROTOCOL_VERSION,
            make_msg_id(INCARNATION, CHANNEL, seq),
            SENDER,
            CHANNEL,
            seq,
            INCARNATION,
            HLC + k,
            count=count,
        )
        for k, seq in enumerate(range(FIRST_SEQ, FIRST_SEQ + POOL * count, count))
    ]
    for env in envelopes:  # every one round-trips (and the stream prefix gets cached)
        assert decode_envelope(encode_envelope(env)) == env
    return itertools.cycle(envelopes)


def _round_trip(
    activities: list[Activity], *, relay: bool = True, build: bool = False
) -> Callable[[], object]:
    """A full encode + decode of one message, with the next envelope of the stream.

    With ``relay`` each call encodes what the previous call decoded (fresh activities,
    serialised every time); without it the same activity objects, whose JSON is cached
    since they were built, are sent again and again. With ``build`` the envelope is
    constructed in the call, as the node does, instead of taken from the prepared ones.
    """
    count = len(activities)
    envelopes = _stream(count)
    seqs = itertools.count(FIRST_SEQ, count)
    state = activities
    expected = [a.to_dict() for a in activities]
    assert [a.to_dict() for a in decode_payload(encode_payload(activities), count)] == expected

    def run() -> object:
        nonlocal state
        if build:
            seq = next(seqs)
            env = Envelope(
                PROTOCOL_VERSION, make_msg_id(INCARNATION, CHANNEL, seq), SENDER, CHANNEL,
                seq, INCARNATION, HLC + seq, None, None, count, None,
            )  # fmt: skip
        else:
            env = next(envelopes)
        header = encode_envelope(env)
        payload = encode_payload(state)
        got = decode_envelope(header)
        decoded = decode_payload(payload, got.count)
        if relay:
            state = decoded
        return decoded

    return run


def _cold_decode(header: bytes) -> Callable[[], object]:
    """Decode the first envelope of a stream: the prefix cache is emptied each time."""
    prefixes = envelope._prefixes

    def run() -> object:
        prefixes.clear()
        return decode_envelope(header)

    return run


def build_cases() -> dict[str, tuple[Callable[[], object], int]]:
    """The timed cases: name -> (function, operations per call)."""
    dumps, loads = orjson.dumps, orjson.loads
    single = [Activity.from_dict(ANNOUNCE)]
    batch = [Activity.from_dict({**ANNOUNCE, "summary": f"step {i}"}) for i in range(BATCH)]
    fresh_batch = decode_payload(encode_payload(batch), BATCH)  # no cached JSON
    envelopes = _stream(1)
    env = next(envelopes)
    header = encode_envelope(env)
    payload = encode_payload(single)
    batch_payload = encode_payload(batch)
    decoded = loads(payload)
    # The floor for a msgpack-map envelope: pack and unpack the same map, no checks.
    wire_map = msgpack.unpackb(header)
    packer, unpackb = msgpack.Packer().pack, msgpack.unpackb
    activity = as2.activity_from_decoded
    # Envelopes for the encode-only row, consecutive like the round trips'.
    next_envelope = envelopes.__next__

    cases: dict[str, tuple[Callable[[], object], int]] = {
        "baseline": (lambda: loads(dumps(ANNOUNCE)), 1),
        "single": (_round_trip(single), 1),
        "batched": (_round_trip(batch), BATCH),
        # Variants (not targets).
        "single, same activity object": (_round_trip(single, relay=False), 1),
        "batched, same activity objects": (_round_trip(batch, relay=False), BATCH),
        "single, envelope built per message": (_round_trip(single, build=True), 1),
        # Breakdown.
        "envelope encode": (lambda: encode_envelope(next_envelope()), 1),
        "envelope decode": (lambda: decode_envelope(header), 1),
        "envelope decode, first of a stream": (_cold_decode(header), 1),
        # An activity caches its JSON once serialised, so a fresh one is made each time:
        # this row includes "as2 validate+wrap" below.
        "payload encode (1, fresh, with validate+wrap)": (
            lambda: encode_payload([activity(loads(payload))]), 1),
        "payload decode (1)": (lambda: decode_payload(payload, 1), 1),
        "payload encode (64, fresh)": (lambda: encode_payload(fresh_batch), BATCH),
        "payload encode (64, cached)": (lambda: encode_payload(batch), BATCH),
        "payload decode (64)": (lambda: decode_payload(batch_payload, BATCH), BATCH),
        "msgpack only (envelope map)": (lambda: unpackb(packer(wire_map)), 1),
        "orjson.loads payload": (lambda: loads(payload), 1),
        "orjson.dumps activity": (lambda: dumps(decoded), 1),
        "as2 validate+wrap (one dict)": (lambda: activity(decoded), 1),
    }
    return cases


def _run(fn: Callable[[], object], number: int) -> int:
    clock = time.thread_time_ns
    start = clock()
    for _ in range(number):
        fn()
    return clock() - start


def measure_paired(
    cases: dict[str, tuple[Callable[[], object], int]],
    *,
    rounds: int,
    round_s: float,
    slice_s: float = 0.003,
) -> tuple[dict[str, Timing], dict[str, list[float]]]:
    """Time every case against ``cases["baseline"]`` in alternating short slices.

    Args:
        cases: name -> (function, operations per call); one of them is ``"baseline"``.
        rounds: rounds; each times every case once, paired with the baseline.
        round_s: CPU time per case per round (the baseline gets as much again).
        slice_s: length of one turn.

    Returns:
        Per-operation timings per case (the baseline's from all its turns), and per
        case the per-round ratios to the baseline.
    """
    base_fn, _ = cases["baseline"]
    base_n = _calibrate(base_fn, slice_s)
    numbers = {name: _calibrate(fn, slice_s) for name, (fn, _) in cases.items()}
    turns = max(1, round(round_s / slice_s))
    samples: dict[str, list[float]] = {name: [] for name in cases}
    ratios: dict[str, list[float]] = {name: [] for name in cases}
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection in the middle of one slice would bias it
    try:
        for index in range(rounds):
            for name, (fn, ops) in cases.items():
                if name == "baseline":
                    continue
                number, base_ns, case_ns = numbers[name], 0, 0
                for _ in range(turns):
                    base_ns += _run(base_fn, base_n)
                    case_ns += _run(fn, number)
                base_us = base_ns / 1000 / (base_n * turns)
                case_us = case_ns / 1000 / (number * turns) / ops
                samples["baseline"].append(base_us)
                samples[name].append(case_us)
                ratios[name].append(case_us / base_us)
            gc.collect()
            progress(f"round {index + 1}/{rounds}")
    finally:
        if gc_was_enabled:
            gc.enable()
    ratios["baseline"] = [1.0]
    timings = {
        name: Timing(name=name, ops_per_call=cases[name][1], samples_us=tuple(samples[name]))
        for name in cases
    }
    return timings, ratios


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table, write JSON and PNG.

    Returns 0 once the measurements are done; a missed target is reported (MISS in the
    table, ``verdict`` in the JSON), not turned into a failure status, as in the other
    benchmarks.
    """
    parser = argparse.ArgumentParser(prog="python -m bench.bench_codec", description=__doc__)
    parser.add_argument("--rounds", type=int, default=21, help="rounds (median reported)")
    parser.add_argument("--round-ms", type=float, default=30.0, help="ms per case per round")
    parser.add_argument("--quick", action="store_true", help="5 short rounds")
    args = parser.parse_args(argv if argv is not None else [])
    rounds, round_s = (5, 0.012) if args.quick else (args.rounds, args.round_ms / 1000)

    cases = build_cases()
    progress(f"codec: {len(cases)} cases x {rounds} rounds of ~{round_s * 2000:.0f} ms")
    timings, ratios = measure_paired(cases, rounds=rounds, round_s=round_s)

    rows: list[list[object]] = []
    results: dict[str, Any] = {}
    met = True
    for name, timing in timings.items():
        r = statistics.median(ratios[name])
        target = TARGETS.get(name)
        verdict = "" if target is None else ("PASS" if r <= target else "MISS")
        met = met and verdict != "MISS"
        per = "activity" if timing.ops_per_call > 1 else "op"
        rows.append(
            [name, per, timing.median_us, timing.best_us, f"{r:.2f}x", target or "", verdict]
        )
        results[name] = {
            **timing.to_json(),
            "ratios": ratios[name],
            "ratio": r,
            "target": target,
            "verdict": verdict or None,
        }
    print_table(["case", "per", "median us", "best us", "ratio", "target", ""], rows)

    json_path = write_results(NAME, {"batch": BATCH, "rounds": rounds, "cases": results})
    shown = {
        "single": "(b) single",
        "batched": f"(c) batched x{BATCH}",
        "single, same activity object": "(b) same\nactivity",
        "batched, same activity objects": "(c) same\nactivities",
        "envelope encode": "envelope\nencode",
        "envelope decode": "envelope\ndecode",
        "payload decode (1)": "payload\ndecode (1)",
        "payload decode (64)": "payload\ndecode (64)",
    }
    png_path = plot_ratios(
        NAME,
        list(shown.values()),
        [results[n]["ratio"] for n in shown],
        targets=[TARGETS.get(n) for n in shown],
        title="Codec cost per activity vs bare orjson dumps+loads (dashed: target)",
    )
    progress(f"wrote {json_path} and {png_path}")
    progress("all targets met" if met else "a target was missed (see MISS above)")
    return 0


def _cli() -> int:
    return main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(_cli())
