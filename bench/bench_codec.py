"""Codec micro-benchmark: what the wire format costs per activity, next to bare orjson.

Cases, timed round-robin in one run (see :func:`bench.common.measure_interleaved`):

(a) ``baseline``  -- ``orjson.loads(orjson.dumps(d))`` of the profile's Announce example:
    the least any JSON-on-the-wire design can cost.
(b) ``single``    -- one message carrying one activity: ``encode_envelope`` +
    ``encode_payload`` then ``decode_envelope`` + ``decode_payload`` (full parse and
    validation into an :class:`~porter_mesh.core.as2.Activity`). Each call re-encodes the
    activity the previous call decoded, so the JSON is really serialised every time (an
    activity built in Python carries cached JSON, which would flatter the figure).
(c) ``batched``   -- the same with 64 activities per message, per activity.

Targets: (b) <= 4.0x and (c) <= 1.5x the baseline. The remaining rows are not targets: the
same round trips when the activities' JSON is already cached (as it is for activities
built in Python), and (b) and (c) broken down by stage, so that a miss can be traced to
the envelope or to the AS2 layer.

Run: ``.venv/bin/python -m bench.bench_codec`` (``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import msgpack
import orjson

from bench.common import (
    measure_interleaved,
    plot_ratios,
    print_table,
    progress,
    ratio,
    write_results,
)
from porter_mesh.core import as2
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
TARGETS = {"single": 4.0, "batched": 1.5}

#: The profile's status announcement (its "Announce" example), the payload measured.
ANNOUNCE: dict[str, Any] = profile_examples()["Status announcement"]
INCARNATION = 0x5EED_1234_ABCD_0042
HLC = 1_778_000_000_000 << 16 | 3
SEQ = 12_345


def _envelope(count: int = 1) -> Envelope:
    return Envelope(
        version=PROTOCOL_VERSION,
        msg_id=make_msg_id(INCARNATION, "log", SEQ),
        sender="worker-backend",
        channel="log",
        seq=SEQ,
        incarnation=INCARNATION,
        hlc=HLC,
        count=count,
    )


def _round_trip(activities: list[Activity], *, relay: bool = True) -> Callable[[], object]:
    """A full encode + decode of one message.

    With ``relay`` each call encodes what the previous call decoded, so the JSON is
    serialised every time; without it the same activities (whose JSON is cached since
    they were built) are sent again and again.
    """
    env = _envelope(len(activities))
    state = activities

    def run() -> object:
        nonlocal state
        header = encode_envelope(env)
        payload = encode_payload(state)
        got = decode_envelope(header)
        decoded = decode_payload(payload, got.count)
        if relay:
            state = decoded
        return decoded

    return run


def build_cases() -> dict[str, tuple[Callable[[], object], int]]:
    """The timed cases: name -> (function, operations per call)."""
    dumps, loads = orjson.dumps, orjson.loads
    single = [Activity.from_dict(ANNOUNCE)]
    batch = [Activity.from_dict({**ANNOUNCE, "summary": f"step {i}"}) for i in range(BATCH)]
    env = _envelope()
    header = encode_envelope(env)
    payload = encode_payload(single)
    batch_payload = encode_payload(batch)
    decoded = loads(payload)
    # The floor for a msgpack-map envelope: pack and unpack the same map, no checks.
    wire_map = msgpack.unpackb(header)
    packer, unpackb = msgpack.Packer().pack, msgpack.unpackb

    cases: dict[str, tuple[Callable[[], object], int]] = {
        "baseline": (lambda: loads(dumps(ANNOUNCE)), 1),
        "single": (_round_trip(single), 1),
        "batched": (_round_trip(batch), BATCH),
        # Breakdown (not targets).
        "single, cached JSON": (_round_trip(single, relay=False), 1),
        "batched, cached JSON": (_round_trip(batch, relay=False), BATCH),
        "envelope encode": (lambda: encode_envelope(env), 1),
        "envelope decode": (lambda: decode_envelope(header), 1),
        "payload decode (1)": (lambda: decode_payload(payload, 1), 1),
        "payload decode (64)": (lambda: decode_payload(batch_payload, BATCH), BATCH),
        "payload encode (64, cached)": (lambda: encode_payload(batch), BATCH),
        "msgpack only (envelope map)": (lambda: unpackb(packer(wire_map)), 1),
        "orjson.loads payload": (lambda: loads(payload), 1),
        "orjson.dumps activity": (lambda: dumps(decoded), 1),
    }
    check = getattr(as2, "_check_activity", None)
    if check is not None:  # the AS2 validator alone, to attribute decode cost
        cases["as2 validate (dict)"] = (lambda: check(decoded), 1)
    return cases


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark, print the table, write JSON and PNG.

    Returns 0 once the measurements are done; a missed target is reported (MISS in the
    table, ``verdict`` in the JSON), not turned into a failure status, as in the other
    benchmarks.
    """
    parser = argparse.ArgumentParser(prog="python -m bench.bench_codec", description=__doc__)
    parser.add_argument("--rounds", type=int, default=21, help="rounds (median reported)")
    parser.add_argument("--round-ms", type=float, default=60.0, help="ms per case per round")
    parser.add_argument("--quick", action="store_true", help="5 short rounds")
    args = parser.parse_args(argv if argv is not None else [])
    rounds, round_s = (5, 0.02) if args.quick else (args.rounds, args.round_ms / 1000)

    cases = build_cases()
    progress(f"codec: {len(cases)} cases x {rounds} rounds of ~{round_s * 1000:.0f} ms")
    timings = measure_interleaved(cases, rounds=rounds, round_s=round_s)
    base = timings["baseline"]

    rows: list[list[object]] = []
    results: dict[str, Any] = {}
    met = True
    for name, timing in timings.items():
        r = ratio(timing, base)
        target = TARGETS.get(name)
        verdict = "" if target is None else ("PASS" if r <= target else "MISS")
        met = met and verdict != "MISS"
        per = "activity" if timing.ops_per_call > 1 else "op"
        rows.append(
            [name, per, timing.median_us, timing.best_us, f"{r:.2f}x", target or "", verdict]
        )
        results[name] = {
            **timing.to_json(),
            "ratio": r,
            "target": target,
            "verdict": verdict or None,
        }
    print_table(["case", "per", "median us", "best us", "ratio", "target", ""], rows)

    json_path = write_results(NAME, {"batch": BATCH, "rounds": rounds, "cases": results})
    shown = {
        "single": "(b) single",
        "batched": f"(c) batched x{BATCH}",
        "single, cached JSON": "(b) cached JSON",
        "batched, cached JSON": "(c) cached JSON",
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
