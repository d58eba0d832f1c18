"""The replicated knowledge graph across real node processes, on real disk.

Every node here is a ``kg_proc.py`` process (a node plus its shard); discovery runs on
127.0.0.1 with a mesh name of the test's own. Waits are on reported events or on polls
with deadlines, never on sleeps.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import msgpack
import orjson
import pytest
import zmq
import zmq.utils.garbage as zmq_garbage

from porter_mesh.core import constants as C
from porter_mesh.core.envelope import KIND_SYNC, Envelope, encode_direct
from porter_mesh.core.knowledge import (
    MAX_RECORDS_PER_MESSAGE,
    BucketEntries,
    CatchupChunk,
    CatchupRequest,
    Observation,
    PullReply,
    PullRequest,
    Record,
    Records,
    decode_sync,
    encode_record,
    encode_sync,
)
from porter_mesh.node.node import Reply
from porter_mesh.node.sync import SyncNode
from tests.integration.harness import peers_seen
from tests.integration.kg_proc import TIMINGS, KgProcess, poll, power_cut, see_each_other

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]

_mesh_ids = itertools.count()


@pytest.fixture
def mesh() -> str:
    """A mesh name of this test only, so concurrent runs never see each other."""
    return f"kg{os.getpid()}-{next(_mesh_ids)}"


@pytest.fixture
def procs() -> Iterator[list[KgProcess]]:
    started: list[KgProcess] = []
    yield started
    for p in started:
        p.stop()


def start(procs: list[KgProcess], name: str, data: Path, *extra: str, mesh: str,
          unique: bool = True) -> KgProcess:
    """Start a node; its name carries the test's mesh name (``unique``), so that runs in
    parallel on one host never announce the same name."""
    if unique:
        name = f"{name}-{mesh}"
    p = KgProcess(name, data / name, *TIMINGS, *extra, mesh=mesh)
    procs.append(p)
    return p


def converged(nodes: list[KgProcess], must_hold: dict[str, int]) -> Callable[[], Any]:
    """A poll condition: equal digests everywhere and every reported record held."""

    def check() -> Any:
        stats = [n.stats()["kg"] for n in nodes]
        digests = {s["digest"] for s in stats}
        covered = all(s["version_vector"].get(o, 0) >= top
                      for s in stats for o, top in must_hold.items())
        if len(digests) == 1 and covered:
            return stats
        return False

    return check


def read_to_end(node: KgProcess) -> None:
    """Collect every event a dead process printed before it died."""
    with contextlib.suppress(AssertionError):  # "exited before": the end was reached
        node.wait_until(lambda ev: False, 10, "the end of its output")


def ids_reported(node: KgProcess) -> dict[int, str]:
    """seq -> observation id hex of every Remember the process reported as stored."""
    return {e["seq"]: e["id"] for e in node.stored()}


@pytest.mark.slow
def test_five_nodes_converge_through_kill_late_join_and_loss(
        procs: list[KgProcess], mesh: str, tmp_path: Path) -> None:
    started = time.monotonic()
    # n1 and n3 lose every 7th broadcast on purpose; n2 is killed and restarted; n4 is late.
    n0 = start(procs, "n0", tmp_path, mesh=mesh)
    n1 = start(procs, "n1", tmp_path, "--drop-every", "7", mesh=mesh)
    n2 = start(procs, "n2", tmp_path, mesh=mesh)
    n3 = start(procs, "n3", tmp_path, "--drop-every", "7", mesh=mesh)
    see_each_other([n0, n1, n2, n3])
    bursts, per_burst = 4, 50
    for node in (n0, n1, n2, n3):
        for b in range(bursts):
            node.command(op="remember", n=per_burst, prefix=f"{node.name}-b{b}-")

    # Kill n2 in the middle of its bursts; what it reported stored must survive.
    n2.wait_until(lambda ev: sum(e["ev"] == "stored" for e in ev) >= 70, 30, "n2 stores 70")
    n2.kill()
    read_to_end(n2)
    before_kill = ids_reported(n2)
    assert before_kill, "n2 reported nothing before it was killed"

    # The late joiner arrives while the others are still writing.
    n0.wait_until(lambda ev: sum(e["ev"] == "stored" for e in ev) >= 120, 30, "n0 stores 120")
    n4 = start(procs, "n4", tmp_path, "--drop-every", "5", mesh=mesh)

    # n2 comes back on the same data directory and ports, with a new incarnation.
    n2b = start(procs, "n2", tmp_path, "--pub-port", str(n2.up["pub"]),
                "--router-port", str(n2.up["router"]), mesh=mesh)
    assert n2b.up["vv"].get(n2.name, 0) >= max(before_kill), "n2 lost records it stored"
    for b in range(2):
        n2b.command(op="remember", n=per_burst, prefix=f"n2-again-b{b}-")
    n4.command(op="remember", n=per_burst * 2, prefix="n4-")

    # A few retractions: n0 withdraws two of its own, n3 one of n1's once it holds it.
    n0.wait_until(lambda ev: sum(e["ev"] == "stored" for e in ev) >= 200, 30, "n0 stores 200")
    n0_ids = ids_reported(n0)
    retracted = {n0_ids[3], n0_ids[150]}
    for target in sorted(retracted):
        n0.ask("retract", "retracted", id=target)
    n1.wait_until(lambda ev: sum(e["ev"] == "stored" for e in ev) >= 10, 30, "n1 stores 10")
    n1_target = ids_reported(n1)[10]
    poll(lambda: n3.stats()["kg"]["version_vector"].get(n1.name, 0) >= 10, 20,
         "n3 holds n1's 10th record")
    n3.ask("retract", "retracted", id=n1_target)
    retracted.add(n1_target)

    everyone = [n0, n1, n2b, n3, n4]
    for node, batches in zip(everyone, (bursts, bursts, 2, bursts, 1), strict=True):
        node.wait_until(lambda ev, b=batches: sum(e["ev"] == "stored-batch" for e in ev) >= b,
                        40, f"{node.name} finishes its bursts")
    reported = {n.name: ids_reported(n) for n in (n0, n1, n3, n4)}
    reported[n2.name] = {**before_kill, **ids_reported(n2b)}
    assert min(ids_reported(n2b)) > max(before_kill), "a restarted node reused a sequence number"
    must_hold = {origin: max(seqs) for origin, seqs in reported.items()}
    stats = poll(converged(everyone, must_hold), 40, "convergence")

    dumps = [n.ask("dump", "dump") for n in everyone]
    first = dumps[0]
    assert not first["more"] and not first["truncated"]
    records = sorted(map(tuple, first["records"]))
    for node, dump in zip(everyone, dumps, strict=True):
        assert sorted(map(tuple, dump["records"])) == records, f"{node.name} differs"
        assert sorted(map(tuple, dump["live"])) == sorted(map(tuple, first["live"]))
        assert set(dump["retracted"]) == retracted, f"{node.name} misses a retraction"
    # None duplicated: every (origin, seq) once, every record key once, no holes.
    assert len({(o, s) for o, s, _ in records}) == len(records)
    assert len({k for _, _, k in records}) == len(records)
    vv = stats[0]["version_vector"]
    for origin in vv:
        seqs = sorted(s for o, s, _ in records if o == origin)
        assert seqs == list(range(1, vv[origin] + 1)), f"holes in {origin}'s log"
    # None lost: every reported observation is live everywhere, unless retracted.
    live = {iri.rsplit(":", 1)[1] for iri, _ in first["live"]}
    for origin, seqs in reported.items():
        for seq, obs in seqs.items():
            assert obs in live or obs in retracted, f"({origin}, {seq}) lost"
            key = obs[:32]
            assert (origin, seq, key) in set(records), f"({origin}, {seq}) has other content"
    assert not live & retracted
    assert len(live) == stats[0]["observations"]
    assert all(s["retractions"] == len(retracted) for s in stats)
    # The late joiner and the restarted node caught up by chunked catch-up.
    assert any(e["ev"] == "caught-up" for e in n4.events)
    assert any(e["ev"] == "caught-up" for e in n2b.events)
    assert time.monotonic() - started < 60


def test_reported_remember_survives_kill_and_restart_resumes_then_catches_up(
        procs: list[KgProcess], mesh: str, tmp_path: Path) -> None:
    a = start(procs, "a", tmp_path, mesh=mesh)
    b = start(procs, "b", tmp_path, mesh=mesh)
    see_each_other([a, b])
    a.command(op="remember", n=400, prefix="a-")
    a.wait_until(lambda ev: sum(e["ev"] == "stored" for e in ev) >= 100, 30, "a stores 100")
    a.kill()
    read_to_end(a)
    reported = ids_reported(a)
    top = max(reported)
    b.ask("remember", "stored-batch", n=30, prefix="b-while-a-is-down-")

    # Alone (no discovery, no seed): whatever it has now came from its own disk.
    ports = ("--pub-port", str(a.up["pub"]), "--router-port", str(a.up["router"]))
    alone = start(procs, "a", tmp_path, "--no-discovery", *ports, mesh=mesh)
    assert alone.up["vv"].get(a.name, 0) >= top
    dump = alone.ask("dump", "dump")
    held = {(o, s): k for o, s, k in dump["records"]}
    live = {iri.rsplit(":", 1)[1] for iri, _ in dump["live"]}
    for seq, obs in reported.items():
        assert held.get((a.name, seq)) == obs[:32] and obs in live, f"stored record {seq} lost"
    alone.stop()

    # Back on the mesh: it catches up with what b wrote meanwhile and never reuses a seq.
    again = start(procs, "a", tmp_path, *ports, mesh=mesh)
    again.wait_for(lambda e: e["ev"] == "caught-up" and e["peer"] == b.name, 20, "catch-up")
    poll(converged([again, b], {a.name: top, b.name: 30}), 20, "convergence after restart")
    fresh = again.ask("remember", "stored-batch", n=1, prefix="after-restart-")
    assert fresh["top"] == alone.up["vv"][a.name] + 1
    poll(converged([again, b], {a.name: fresh["top"], b.name: 30}), 20,
         "the new record replicates")


def test_clock_skew_neither_reorders_nor_loses(
        procs: list[KgProcess], mesh: str, tmp_path: Path) -> None:
    skewed = start(procs, "skewed", tmp_path, "--drop-every", "3", mesh=mesh)
    honest = start(procs, "honest", tmp_path, mesh=mesh)
    see_each_other([skewed, honest])
    # A wall clock a century ahead, then one stuck in 1970, then the right time.
    stamps = ("2126-01-01T00:00:00.000000Z", "1970-01-01T00:00:01.000000Z", None)
    for i, stamp in enumerate(stamps):
        skewed.ask("remember", "stored-batch", n=20, prefix=f"skew{i}-", generated_at=stamp)
        honest.ask("remember", "stored-batch", n=5, prefix=f"honest{i}-")
    written = ids_reported(skewed)
    poll(converged([skewed, honest], {skewed.name: 60, honest.name: 15}), 20, "convergence")
    dump = honest.ask("dump", "dump")
    # Order is the origin's sequence, whatever the stamps say: seq i is the i-th written.
    held = {s: k for o, s, k in dump["records"] if o == skewed.name}
    assert held == {seq: obs[:32] for seq, obs in written.items()}
    rows = honest.ask("query", "rows", limit=1000, sparql=(
        f"SELECT ?f ?t WHERE {{ ?o porter:discoveredBy '{skewed.name}' ; porter:finding ?f ; "
        "prov:generatedAtTime ?t }"))["items"]
    # The stamps are data, kept as written (Oxigraph prints a dateTime canonically).
    stamped = {r["f"]: datetime.fromisoformat(r["t"]) for r in rows}
    assert len(stamped) == 60
    for batch in (0, 1):
        stamp = datetime.fromisoformat(str(stamps[batch]))
        assert all(stamped[f"skew{batch}-{i}"] == stamp for i in range(20))


# --- hostile input -----------------------------------------------------------------------


def obs_record(origin: str, seq: int, finding: str) -> Record:
    return Record(origin, seq, Observation("urn:porter:file:h", finding, origin,
                                           "2026-01-01T00:00:00.000000Z"))


def packed(head: dict[str, Any], records: list[bytes] | None = None) -> bytes:
    """A sync message built by hand, past the rules the codec would enforce."""
    data = msgpack.packb(head, use_bin_type=True)
    if records is None:
        return data
    # Add "r" to the map: bump the map header and append the key and the array.
    body = msgpack.packb({**head, "r": []}, use_bin_type=True)[:-1]
    return body + msgpack.Packer(use_bin_type=True).pack_array_header(len(records)) + b"".join(
        records)


def forged_hash(origin: str, seq: int) -> bytes:
    """A record whose content does not hash to the id it carries."""
    item = msgpack.unpackb(encode_record(obs_record(origin, seq, "honest text")))
    item[5] = "tampered text"
    return msgpack.packb(item, use_bin_type=True)


class Hostile:
    """A real node in this process that speaks the mesh protocol but sends garbage on the
    sync path, and answers the victim's requests with poison."""

    def __init__(self, mesh: str, victim_router: int) -> None:
        self.node = SyncNode(name="hostile", mesh=mesh, discovery=False,
                             seeds=(f"127.0.0.1:{victim_router}",), heartbeat_interval=0.2,
                             evasive_after=1.5, expire_after=5.0)
        self.answers: collections.Counter[tuple[str, str]] = collections.Counter()
        self.node.call_in_loop(lambda: self.node.node.register_kind(KIND_SYNC, self._on_sync))

    def _on_sync(self, env: Envelope, payload: bytes, reply: Reply) -> None:
        message = decode_sync(payload)  # the victim speaks properly
        if isinstance(message, CatchupRequest):
            n = self.answers["catchup", env.sender]
            self.answers["catchup", env.sender] += 1
            good = encode_record(obs_record("hostile", 1, "poison"))
            too_many = MAX_RECORDS_PER_MESSAGE + 1
            chunk = [
                # Counts that do not add up to what was asked.
                packed({"t": "cc", "d": 999, "tot": 999, "c": None}, [good]),
                # A record whose hash does not match.
                packed({"t": "cc", "d": 1, "tot": 1, "c": None}, [forged_hash("hostile", 1)]),
                # Oversize: more records than a chunk may carry.
                packed({"t": "cc", "d": too_many, "tot": too_many, "c": None},
                       [good] * too_many),
            ][n % 3]
            reply(KIND_SYNC, chunk)
        elif isinstance(message, PullRequest):
            n = self.answers["pull", env.sender]
            self.answers["pull", env.sender] += 1
            outside = encode_record(obs_record("hostile", message.last + 1, "outside"))
            reply(KIND_SYNC, [
                # Another range than the one asked.
                encode_sync(PullReply(message.origin, message.first, message.last + 1, ())),
                # The asked range, with a record outside it.
                packed({"t": "pulled", "o": message.origin, "f": message.first,
                        "l": message.last}, [outside]),
            ][n % 2])

    def send(self, payload: bytes) -> None:
        self.node.call_in_loop(lambda: self.node.node.async_send_kind("victim", KIND_SYNC,
                                                                      payload))

    def broadcast(self, payload: bytes) -> None:
        self.node.call_in_loop(lambda: self.node.node.async_publish_kind(KIND_SYNC, payload))


@pytest.fixture(scope="module")
def zmq_gc_thread() -> None:
    """pyzmq starts one garbage-collector thread per process on the first zero-copy send
    (the hostile node's megabyte replies) and keeps it for the life of the process; start
    it before the leak check looks, since it is not this test's to stop."""
    if zmq_garbage.gc.thread is None or not zmq_garbage.gc.thread.is_alive():
        zmq_garbage.gc.start()


@pytest.mark.usefixtures("zmq_gc_thread")
def test_garbage_on_the_sync_path_is_refused_and_the_node_keeps_serving(
        procs: list[KgProcess], mesh: str, tmp_path: Path) -> None:
    victim = start(procs, "victim", tmp_path, "--no-discovery", "--catchup-timeout", "1",
                   mesh=mesh, unique=False)
    seed = ("--seed", f"127.0.0.1:{victim.up['router']}")
    good = start(procs, "good", tmp_path, "--no-discovery", *seed, mesh=mesh, unique=False)
    see_each_other([victim, good])
    good.ask("remember", "stored-batch", n=20, prefix="before-")
    poll(converged([victim, good], {"good": 20}), 20, "first convergence")

    hostile = Hostile(mesh, victim.up["router"])
    raw: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        victim.wait_until(lambda ev: "hostile" in peers_seen(ev), 20, "victim meets hostile")
        hostile.node.wait_for_peers(["victim"], 20)
        hostile.node.run_coroutine(
            hostile.node.node.wait_for_subscribers("control", 1, 20), 25)
        # Direct garbage from a peer on the roster.
        hostile.send(b"\xc1 not msgpack")
        hostile.send(packed({"t": "pull", "o": "good", "f": 10, "l": 5}))      # inverted
        hostile.send(packed({"t": "pull", "o": "good", "f": 1, "l": 100_000}))  # too long
        hostile.send(packed({"t": "pull", "o": "good", "f": 0, "l": 3}))        # seq 0
        hostile.send(encode_sync(Records((obs_record("hostile", 1, "x"),))))  # not broadcast
        # Broadcast: one honest record of its own, then forgeries.
        hostile.broadcast(encode_sync(Records((obs_record("hostile", 1, "mine"),))))
        hostile.broadcast(encode_sync(Records((obs_record("hostile", 1, "other"),))))  # clash
        hostile.broadcast(encode_sync(Records((obs_record("hostile", 10**9, "far"),))))
        hostile.broadcast(encode_sync(Records((obs_record("good", 21, "not mine"),))))
        hostile.broadcast(packed({"t": "rec"}, [forged_hash("hostile", 2)]))
        hostile.broadcast(encode_sync(Records((obs_record("hostile", 3, "gap"),))))
        # A raw socket that never said hello, and was never asked anything.
        dealer = raw.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{victim.up['router']}")
        env = Envelope(C.PROTOCOL_VERSION, "raw.1", "stranger", C.CHANNEL_CONTROL, 0, 7,
                       time.time_ns() // 1_000_000 << 16, "victim", kind=KIND_SYNC)
        for payload in (b"\x93garbage", packed({"t": "cc", "d": 0, "tot": 0}),
                        encode_sync(PullReply("good", 1, 1, ())),
                        encode_sync(CatchupChunk((), 0, 0, None)),
                        encode_sync(BucketEntries((), ()))):
            dealer.send_multipart(encode_direct(env, payload))

        expected = {"malformed": 7, "unasked": 3, "not-broadcast": 1, "wrong-origin": 1,
                    "refused": 2, "stale": 1}

        seen: list[Any] = []

        def all_refused() -> bool:
            st = victim.stats()
            drops = {k.removeprefix("dropped.sync."): v for k, v in st["node"].items()
                     if k.startswith("dropped.sync.")}
            seen[:] = [drops, st["kg"]]
            return (all(drops.get(k, 0) >= v for k, v in expected.items())
                    and st["kg"].get("catchup.abandoned", 0) >= 1)

        try:
            poll(lambda: all_refused() and hostile.answers["pull", "victim"] >= 2, 30,
                 f"victim refuses everything ({expected})")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; refused {seen}; {hostile.answers}; " + str(
                [e for e in victim.events if e["ev"] in ("caught-up", "progress", "peer")])
            ) from None
        assert hostile.answers["catchup", "victim"] >= 1

        # The victim keeps serving, in both directions, and holds nothing forged.
        good.ask("remember", "stored-batch", n=20, prefix="after-")
        victim.ask("remember", "stored-batch", n=5, prefix="victim-")
        poll(lambda: (victim.stats()["kg"]["version_vector"].get("good") == 40
                      and good.stats()["kg"]["version_vector"].get("victim") == 5), 20,
             "replication after the garbage")
        mine = {(o, s, k) for o, s, k in victim.ask("dump", "dump")["records"]}
        theirs = {(o, s, k) for o, s, k in good.ask("dump", "dump")["records"]}
        honest = {(o, s, k) for o, s, k in mine if o != "hostile"}
        assert honest == {(o, s, k) for o, s, k in theirs if o != "hostile"}
        assert {(o, s, k) for o, s, k in mine if o == "hostile"} <= {
            ("hostile", 1, obs_record("hostile", 1, "mine").key.hex()),
            ("hostile", 3, obs_record("hostile", 3, "gap").key.hex())}
        dealer.close(0)
    finally:
        hostile.node.close()
        raw.destroy(linger=0)


# --- the command line ------------------------------------------------------------------------

PROFILE_QUERY = (
    "SELECT ?about ?finding WHERE { ?obs <https://porter.chapeaux.io/vocab#about> ?about ; "
    "<https://porter.chapeaux.io/vocab#finding> ?finding }"
)
PROFILE_BINDING = {"about": "urn:porter:file:server.ts",
                   "finding": "depends on express module for HTTP routing"}


def cli(*args: str, data: Path, mesh: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``porter-mesh ARGS`` as a real process, with porter-ui's replica under ``data``."""
    env = dict(os.environ, PORTER_MESH_DATA=str(data), PORTER_MESH=mesh)
    env.pop("PORTER_MESH_AGENT", None)
    return subprocess.run([sys.executable, "-m", "porter_mesh.cli.main", *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


def test_remember_and_recall_commands_against_running_nodes(
        procs: list[KgProcess], mesh: str, tmp_path: Path) -> None:
    a = start(procs, "a", tmp_path, mesh=mesh)
    b = start(procs, "b", tmp_path, "--drop-every", "2", mesh=mesh)
    see_each_other([a, b])
    a.ask("remember", "stored-batch", n=300, prefix="a-", quiet=True)
    ui = tmp_path / "ui"

    done = cli("remember", PROFILE_BINDING["about"], PROFILE_BINDING["finding"],
               "--severity", "high", "--context", "urn:porter:task:a3f9", data=ui, mesh=mesh)
    assert done.returncode == 0, done.stderr
    iri = done.stdout.strip()
    assert iri.startswith("urn:porter:obs:") and "holds it" in done.stderr
    poll(converged([a, b], {a.name: 300, "porter-ui": 1}), 20, "the Remember reaches all")
    rows = b.ask("query", "rows", sparql=(
        "SELECT ?o ?sev ?ctx WHERE { ?o porter:discoveredBy 'porter-ui' ; "
        "porter:severity ?sev ; porter:context ?ctx }"))["items"]
    assert rows == [{"o": iri, "sev": "high", "ctx": "urn:porter:task:a3f9"}]

    # Its replica is thrown away, yet porter-ui never reuses a sequence number: each
    # command catches up first.
    assert not (ui / mesh / "porter-ui" / "knowledge").exists()
    again = cli("remember", "urn:porter:file:db.ts", "uses pg", data=ui, mesh=mesh)
    assert again.returncode == 0, again.stderr
    poll(converged([a, b], {a.name: 300, "porter-ui": 2}), 20, "the 2nd Remember replicates")

    # Recall: online catch-up (progress on stderr), then the profile's query locally.
    recalled = cli("recall", PROFILE_QUERY, "--json", "--limit", "1000", data=ui, mesh=mesh)
    assert recalled.returncode == 0, recalled.stderr
    assert "caught up from" in recalled.stderr
    items = orjson.loads(recalled.stdout)["items"]
    assert PROFILE_BINDING in items and len(items) == 302
    table = cli("recall", "SELECT ?f WHERE { ?o porter:about 'urn:porter:file:db.ts' ; "
                "porter:finding ?f }", data=ui, mesh=mesh)
    assert table.returncode == 0 and "uses pg" in table.stdout and "1 row" in table.stdout
    as_csv = cli("recall", "ASK { ?o porter:severity 'high' }", "--csv", data=ui, mesh=mesh)
    assert as_csv.stdout.splitlines() == ["boolean", "true"]
    refused = cli("recall", "LOAD <http://example.com/x>", data=ui, mesh=mesh)
    assert refused.returncode == 2 and "LOAD" in refused.stderr


def test_commands_without_a_peer_fail_clearly(mesh: str, tmp_path: Path) -> None:
    for args in (("remember", "urn:porter:file:x", "a fact"), ("recall", PROFILE_QUERY)):
        done = cli(*args, "--wait", "1", "--no-discovery", data=tmp_path, mesh=mesh)
        assert done.returncode == 1
        assert "no peer found on mesh" in done.stderr and done.stdout == ""
    bad = cli("remember", "urn:porter:file:x", "a fact", "--severity", "not ok!", data=tmp_path,
              mesh=mesh)
    assert bad.returncode == 2 and "severity" in bad.stderr


@pytest.mark.slow
def test_benchmark_quick_run_writes_table_json_and_chart(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_knowledge_mesh", "--quick", "--remembers", "50",
         "--catchup", "3000", "--out", str(tmp_path)],
        cwd=repo, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "late joiner catch-up of 3000" in done.stdout
    result = orjson.loads((tmp_path / "knowledge_mesh.json").read_bytes())
    assert result["replicated"]["equal_digests"] and result["catchup"]["complete"]
    assert (tmp_path / "knowledge_mesh.png").stat().st_size > 0


def test_concurrent_remembers_share_fsyncs_and_every_acknowledged_one_survives_kill_9(
        procs: list[KgProcess], mesh: str, tmp_path: Path) -> None:
    a = start(procs, "a", tmp_path, mesh=mesh)
    # Group commit: 32 Remembers in flight share their fdatasyncs.
    batch = a.ask("remember", "stored-batch", n=400, prefix="warm-", quiet=True,
                  concurrency=32)
    assert batch["top"] == 400
    assert 1 <= batch["fsyncs"] < 400 / 2, f"{batch['fsyncs']} fdatasyncs for 400 Remembers"

    # Killed (SIGKILL) in the middle of a concurrent burst: every Remember it reported
    # as stored (acknowledged after the fdatasync covering it) is there after restart.
    reported = kill_in_a_burst(a, 300)
    assert max(reported) < 400 + 20_000, "the burst was not cut"
    _, lost = restarted_alone(procs, a, tmp_path, mesh, reported)
    assert not lost, f"{len(lost)} acknowledged Remembers lost, e.g. seq {lost[:5]}"


def kill_in_a_burst(a: KgProcess, acknowledged: int) -> dict[int, str]:
    """Start 20,000 Remembers, 32 in flight, on ``a``; kill it with SIGKILL once it has
    acknowledged ``acknowledged`` of them; what it reported as stored (seq -> id)."""
    a.command(op="remember", n=20_000, prefix="burst-", concurrency=32)
    a.wait_until(lambda ev: sum(e["ev"] == "stored" for e in ev) >= acknowledged, 60,
                 f"a acknowledges {acknowledged} of the burst")
    a.kill()
    read_to_end(a)
    reported = ids_reported(a)
    assert len(reported) >= acknowledged
    return reported


def restarted_alone(procs: list[KgProcess], a: KgProcess, tmp_path: Path, mesh: str,
                    reported: dict[int, str]) -> tuple[KgProcess, list[int]]:
    """Restart the dead ``a`` on its data, without discovery (nothing comes back from a
    peer); the node, and the reported Remembers it does not hold (seqs, sorted)."""
    ports = ("--pub-port", str(a.up["pub"]), "--router-port", str(a.up["router"]))
    alone = start(procs, "a", tmp_path, "--no-discovery", *ports, mesh=mesh)
    dump = alone.ask("dump", "dump")
    held = {(o, s): k for o, s, k in dump["records"]}
    live = {iri.rsplit(":", 1)[1] for iri, _ in dump["live"]}
    return alone, sorted(seq for seq, obs in reported.items()
                         if held.get((a.name, seq)) != obs[:32] or obs not in live)


def test_every_acknowledged_remember_of_a_group_survives_a_power_cut(
        procs: list[KgProcess], mesh: str, tmp_path: Path) -> None:
    # A process killed with SIGKILL leaves what it wrote in the page cache, so that test
    # cannot tell an acknowledgement given after the write from one given after the
    # fdatasync. A power cut can: here the node records the journal's length at the
    # start of each fdatasync that completes, and after SIGKILL the journal is cut back
    # to the last one, which is what a power cut would leave of it.
    a = start(procs, "a", tmp_path, "--record-syncs", mesh=mesh)
    b = start(procs, "b", tmp_path, mesh=mesh)
    see_each_other([a, b])
    a.ask("wait-subscribers", "subscribers", n=1, timeout=20)
    reported = kill_in_a_burst(a, 500)
    assert max(reported) < 20_000, "the burst was not cut"
    cut = power_cut(a.data_dir)
    print(f"power cut: {cut} bytes written but never synced are lost")
    alone, lost = restarted_alone(procs, a, tmp_path, mesh, reported)
    assert not lost, (f"{len(lost)} of {len(reported)} acknowledged Remembers lost to the "
                      f"power cut, e.g. seq {lost[:5]}")
    # Nothing the peer received by broadcast lies past what survived: records travel
    # only once durable.
    top = alone.ask("vv", "vv")["vv"].get(a.name, 0)
    assert b.ask("vv", "vv")["vv"].get(a.name, 0) <= top
