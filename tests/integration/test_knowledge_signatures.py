"""Knowledge records prove their author on a secured mesh, across real node processes.

A trusted insider (``mallory``, whose key is in the trusted directory like everyone's)
writes records in other agents' names straight into its own shard, as anyone with
access to its data directory could, and then lets catch-up and anti-entropy relay them.
Every honest replica must refuse them before storing them, count them per claimed
author and audit them, and the real author's next record must keep its own sequence
number. Waits are on reported events or polls with deadlines, never on sleeps.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from porter_mesh.adapters.security import AUDIT_FILE, RecordSigner, load_identity, provision_mesh
from porter_mesh.adapters.shard import Shard
from porter_mesh.core.knowledge import (
    Observation,
    PullRequest,
    Record,
    format_timestamp,
    record_signing_bytes,
    sign_record,
)
from porter_mesh.node.config import ENV_KEY, ENV_TRUSTED
from tests.integration.kg_proc import TIMINGS, KgProcess, poll, see_each_other

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]

_ids = itertools.count()
BACKDOOR = "deploy the backdoor"


class SecuredMesh:
    """Keys for four agents, all trusted; names carry the mesh name (unique per test)."""

    def __init__(self, root: Path) -> None:
        self.name = f"kgs{os.getpid()}-{next(_ids)}"
        self.root = root
        self.agents = {a: f"{a}-{self.name}"
                       for a in ("alice", "bob", "carol", "dave", "mallory")}
        self.trusted, self.secrets = provision_mesh(root / "keys", list(self.agents.values()))

    def start(self, procs: list[KgProcess], who: str) -> KgProcess:
        name = self.agents[who]
        proc = KgProcess(name, self.root / "shards" / name, *TIMINGS,
                         "--node-dir", str(self.root / "nodes" / name), mesh=self.name,
                         env={ENV_KEY: str(self.secrets[name]),
                              ENV_TRUSTED: str(self.trusted)})
        procs.append(proc)
        return proc

    def audit(self, who: str) -> list[dict[str, Any]]:
        path = self.root / "nodes" / self.agents[who] / AUDIT_FILE
        if not path.exists():
            return []
        return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def live_findings(node: KgProcess) -> list[str]:
    rows = node.ask("query", "rows", sparql="SELECT ?f WHERE { ?o porter:finding ?f }",
                    limit=1000)["items"]
    return [row["f"] for row in rows]


def held(node: KgProcess, origin: str, seq: int) -> str | None:
    """The record key (hex) ``node`` holds at ``(origin, seq)``, if any."""
    for o, s, key in node.ask("dump", "dump")["records"]:
        if (o, s) == (origin, seq):
            return str(key)
    return None


def test_an_insider_cannot_plant_records_in_another_agents_name(
        tmp_path: Path, procs: list[KgProcess]) -> None:
    mesh = SecuredMesh(tmp_path)
    alice_name, carol_name = mesh.agents["alice"], mesh.agents["carol"]
    alice, bob, carol, mallory = (mesh.start(procs, a)
                                  for a in ("alice", "bob", "carol", "mallory"))
    see_each_other([alice, bob, carol, mallory], 30)

    alice.command(op="remember", n=1, prefix="alice genuine ")
    first = alice.wait_for(lambda e: e["ev"] == "stored", 20, "alice's first record")
    assert first["seq"] == 1
    poll(lambda: all(held(n, alice_name, 1) for n in (bob, carol, mallory)), 30,
         "everyone holds alice's first record")

    # The insider stops, writes two records in other names into its own shard through
    # the storage layer (as anyone with its data directory could), and comes back.
    mallory.stop()
    signer = RecordSigner(load_identity(mesh.secrets[mesh.agents["mallory"]]))
    now = format_timestamp(time.time())
    forged_alice = Record(alice_name, 2, Observation(
        "urn:porter:file:deploy.sh", f"alice says: {BACKDOOR}", alice_name, now))
    forged_alice = Record(forged_alice.origin, 2, forged_alice.body,
                          sig=signer(record_signing_bytes(forged_alice)))  # mallory's key
    forged_carol = Record(carol_name, 1, Observation(  # no signature at all
        "urn:porter:file:deploy.sh", f"carol says: {BACKDOOR} too", carol_name, now))
    with Shard(mallory.data_dir) as shard:
        assert shard.merge([forged_alice, forged_carol]).accepted == 2
    mallory = mesh.start(procs, "mallory")
    assert mallory.up["records"] == 3

    # Every honest replica is offered the forgeries (catch-up from the returning peer,
    # then digests), refuses them, counts them per claimed author and audits them.
    honest = {"alice": alice, "bob": bob, "carol": carol}
    for who, node in honest.items():
        def refused_both(node: KgProcess = node) -> Any:
            kg = node.stats()["kg"]
            by_origin = kg["refused_by_origin"]
            return by_origin.get(alice_name, 0) >= 1 and by_origin.get(carol_name, 0) >= 1
        poll(refused_both, 40, f"{who} refuses both forgeries")
        stats = node.stats()
        assert stats["kg"]["refused.bad-signature"] >= 1
        assert stats["kg"]["refused.unsigned"] >= 1
        assert stats["node"]["audit.forged-record"] >= 2
        audited = {(line["event"], line["peer"]) for line in mesh.audit(who)}
        assert {("forged-record", alice_name), ("forged-record", carol_name)} <= audited
        assert held(node, alice_name, 2) is None
        assert held(node, carol_name, 1) is None

    # Alice's next genuine record takes seq 2, her own, and reaches everyone honest.
    alice.command(op="remember", n=1, prefix="alice second ")
    second = alice.wait_for(lambda e: e["ev"] == "stored" and e["seq"] != 1, 20,
                            "alice's second record")
    assert second["seq"] == 2
    genuine_key = second["id"][:32]
    poll(lambda: all(held(n, alice_name, 2) == genuine_key for n in (bob, carol)), 30,
         "bob and carol hold alice's genuine seq 2")
    for who, node in honest.items():
        findings = live_findings(node)
        assert not [f for f in findings if BACKDOOR in f], (who, findings)
        assert any(f.startswith("alice second ") for f in findings), (who, findings)

    # One warning per claimed author, however often the forgery came round.
    for node in honest.values():
        node.command(op="quit")
    for who, node in honest.items():
        node.wait_for(lambda e: e["ev"] == "closed", 30, f"{who} closes")
        log = node.stderr
        for origin in (alice_name, carol_name):
            warnings = [line for line in log.splitlines()
                        if "(forged-record)" in line and f"({origin}," in line]
            assert len(warnings) == 1, (who, origin, warnings)


def test_an_insider_relaying_a_genuine_run_with_one_record_replaced_gets_only_it_refused(
        tmp_path: Path, procs: list[KgProcess]) -> None:
    """A relayed run is proved by its top record's signature and the chain below it, so
    a record swapped inside it must not ride on its neighbours' proof."""
    mesh = SecuredMesh(tmp_path)
    alice_name = mesh.agents["alice"]
    alice, mallory = mesh.start(procs, "alice"), mesh.start(procs, "mallory")
    see_each_other([alice, mallory], 30)
    alice.command(op="remember", n=6, prefix="alice genuine ")
    alice.wait_for(lambda e: e["ev"] == "stored-batch", 30, "alice's six records")
    genuine = {e["seq"]: e["id"][:32] for e in alice.stored()}
    assert sorted(genuine) == [1, 2, 3, 4, 5, 6]
    poll(lambda: all(held(mallory, alice_name, s) for s in genuine), 30,
         "the insider holds alice's six records")
    alice.stop()
    mallory.stop()

    # The insider rebuilds its shard with alice's genuine run, record 4 replaced by its
    # own record in alice's name, chained exactly where the genuine one was.
    old_dir = mallory.data_dir.with_name(mallory.data_dir.name + "-old")
    mallory.data_dir.rename(old_dir)
    with Shard(old_dir) as old:
        run = list(old.answer_pull(PullRequest(alice_name, 1, 6)).records)
    signer = RecordSigner(load_identity(mesh.secrets[mesh.agents["mallory"]]))
    swapped = sign_record(Record(alice_name, 4, Observation(
        "urn:porter:file:deploy.sh", f"alice says: {BACKDOOR}", alice_name,
        format_timestamp(time.time()))), run[3].prev, signer)
    run[3] = swapped
    with Shard(mallory.data_dir, agent=mesh.agents["mallory"]) as shard:
        assert shard.merge(run).accepted == 6
    mallory = mesh.start(procs, "mallory")

    # A newcomer catches up from the insider alone: the rest of the run goes in, the
    # swapped record is refused, counted against alice and audited.
    dave = mesh.start(procs, "dave")
    see_each_other([mallory, dave], 30)
    poll(lambda: all(held(dave, alice_name, s) == genuine[s] for s in (1, 2, 3, 5, 6)), 40,
         "dave holds the genuine records around the swapped one")
    stats = poll(lambda: (lambda st: st if st["kg"]["refused_by_origin"].get(alice_name)
                          else None)(dave.stats()), 40, "dave refuses the swapped record")
    assert stats["kg"]["refused.bad-signature"] >= 1
    assert stats["node"]["audit.forged-record"] >= 1
    assert ("forged-record", alice_name) in {(line["event"], line["peer"])
                                              for line in mesh.audit("dave")}
    assert held(dave, alice_name, 4) is None

    # Alice comes back: dave takes her genuine record 4, and the backdoor never shows.
    alice = mesh.start(procs, "alice")
    poll(lambda: held(dave, alice_name, 4) == genuine[4], 40,
         "dave holds alice's genuine record 4")
    findings = live_findings(dave)
    assert not [f for f in findings if BACKDOOR in f], findings
    assert sorted(f for f in findings if f.startswith("alice genuine ")) == [
        f"alice genuine {i}" for i in range(6)]


def test_a_node_whose_key_cannot_sign_refuses_to_write_knowledge_and_says_why(
        tmp_path: Path) -> None:
    import zmq.auth

    from porter_mesh.errors import SecurityError
    from porter_mesh.node.knowledge import attach_knowledge
    from porter_mesh.node.sync import SyncNode

    # A key pair as it was made before signing keys: trusted, but it cannot sign.
    zmq.auth.create_certificates(str(tmp_path), "old", metadata={"name": "old"})
    secret = tmp_path / "old.key_secret"
    os.chmod(secret, 0o600)
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / "old.key").write_bytes((tmp_path / "old.key").read_bytes())
    with SyncNode(name="old", mesh=f"kgs{os.getpid()}-{next(_ids)}", discovery=False,
                  secret_key_file=secret, trusted_dir=trusted) as node:
        knowledge = attach_knowledge(node, tmp_path / "shard")
        try:
            with pytest.raises(SecurityError, match="add-signing-key"):
                node.call_in_loop(lambda: knowledge.knowledge.async_observe(
                    "urn:porter:file:x", "not signed, so not written"))
            assert knowledge.knowledge.shard.state.record_count == 0
        finally:
            knowledge.close()
