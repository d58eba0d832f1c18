"""Keys, the trusted directory, the audit log and the security settings, on real files
(no sockets): what a lab operator and a node rely on before any connection is made."""

from __future__ import annotations

import collections
import os
import pathlib
import stat

import orjson
import pytest
import zmq

from porter_mesh.adapters.security import (
    RESCAN_EVERY,
    AuditLog,
    MeshSecurity,
    RecordSigner,
    RecordVerifier,
    TrustStore,
    add_signing_key,
    check_libzmq,
    create_key_pair,
    load_identity,
    provision_mesh,
    trust_key,
)
from porter_mesh.cli.main import main as cli
from porter_mesh.core import constants as C
from porter_mesh.core.advert import PeerAdvert
from porter_mesh.errors import ConfigError, SecurityError
from porter_mesh.node.config import (
    ENV_INSECURE,
    ENV_KEY,
    ENV_TRUSTED,
    NodeConfig,
    default_trusted_dir,
    split_seed,
)


def mode(path: pathlib.Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def public_of(path: pathlib.Path) -> str:
    return zmq.auth.load_certificate(path)[0].decode()


def advert(name: str, key: str | None, signing: str | None = None) -> PeerAdvert:
    return PeerAdvert(name=name, role="agent", mesh="m", pub_port=1, router_port=2,
                      version=C.PROTOCOL_VERSION, incarnation=1, public_key=key,
                      signing_key=signing)


# -- libzmq ------------------------------------------------------------------------------------


def test_old_libzmq_is_refused_with_the_reason() -> None:
    with pytest.raises(SecurityError, match=r"4\.3\.1 is too old.*4\.3\.2"):
        check_libzmq((4, 3, 1))
    check_libzmq((4, 3, 2))
    check_libzmq()  # the one this environment runs


# -- keygen ------------------------------------------------------------------------------------


def test_keygen_writes_standard_certificates_with_a_private_secret(tmp_path: pathlib.Path
                                                                  ) -> None:
    public, secret = create_key_pair(tmp_path / "keys", "worker-1")
    assert (public.name, secret.name) == ("worker-1.key", "worker-1.key_secret")
    assert mode(secret) == 0o600 and mode(public) == 0o644
    pub_key, secret_key = zmq.auth.load_certificate(secret)
    assert zmq.auth.load_certificate(public) == (pub_key, None)
    assert secret_key is not None and len(secret_key) == 40
    identity = load_identity(secret)
    assert identity.name == "worker-1" and identity.public_key == pub_key.decode()
    assert secret_key.decode() not in repr(identity)  # never shown
    assert not [p for p in (tmp_path / "keys").iterdir() if p.name.startswith(".")]


def test_keygen_refuses_to_overwrite_unless_forced(tmp_path: pathlib.Path) -> None:
    public, _ = create_key_pair(tmp_path, "w")
    before = public_of(public)
    with pytest.raises(SecurityError, match=r"already exists.*--force"):
        create_key_pair(tmp_path, "w")
    create_key_pair(tmp_path, "w", force=True)
    assert public_of(public) != before
    with pytest.raises(ConfigError, match="agent name"):
        create_key_pair(tmp_path, "Not Valid")


def test_a_secret_key_others_can_read_is_refused(tmp_path: pathlib.Path) -> None:
    _, secret = create_key_pair(tmp_path, "w")
    os.chmod(secret, 0o640)
    with pytest.raises(SecurityError, match="chmod 600"):
        load_identity(secret)
    with pytest.raises(SecurityError, match="keygen"):
        load_identity(tmp_path / "missing.key_secret")
    public = tmp_path / "w.key"
    os.chmod(public, 0o600)
    with pytest.raises(SecurityError, match="only a public key"):
        load_identity(public)


# -- trust -------------------------------------------------------------------------------------


def test_trust_binds_a_key_to_the_file_name(tmp_path: pathlib.Path) -> None:
    trusted = tmp_path / "trusted"
    public, secret = create_key_pair(tmp_path / "k", "alice")
    target = trust_key(public, trusted)
    assert target == trusted / "alice.key"
    store = TrustStore(trusted)
    store.refresh()
    assert store.name_for(public_of(public)) == "alice"
    assert store.key_for("alice") == public_of(public) and store.names == {"alice"}
    with pytest.raises(SecurityError, match="contains a secret key"):
        trust_key(secret, trusted)
    with pytest.raises(SecurityError, match="already trusted as 'alice'"):
        trust_key(public, trusted, name="mallory")  # one key, one agent
    other, _ = create_key_pair(tmp_path / "k2", "alice")
    with pytest.raises(SecurityError, match="--force"):
        trust_key(other, trusted)
    trust_key(other, trusted, force=True)
    store.refresh()
    assert store.key_for("alice") == public_of(other)


def test_the_store_follows_the_directory_without_a_restart(tmp_path: pathlib.Path) -> None:
    trusted, secrets = provision_mesh(tmp_path / "keys", ["a", "b"])
    store = TrustStore(trusted)
    assert store.refresh() and store.names == {"a", "b"}
    generation = store.generation
    assert not store.refresh() and store.generation == generation  # nothing changed
    (trusted / "b.key").unlink()
    assert store.refresh() and store.names == {"a"} and store.generation == generation + 1
    public, _ = create_key_pair(tmp_path / "more", "c")
    trust_key(public, trusted)
    store.refresh()
    assert store.names == {"a", "c"}
    # Same name, new key, same size and possibly the same mtime: still noticed.
    newer, _ = create_key_pair(tmp_path / "newer", "c")
    trust_key(newer, trusted, force=True)
    store.refresh()
    assert store.key_for("c") == public_of(newer)
    assert secrets  # the secrets stay where they were made
    assert not (trusted / "a.key_secret").exists()


def test_the_cheap_look_reads_the_directory_only_when_it_changed(tmp_path: pathlib.Path
                                                                 ) -> None:
    """A node looks once a heartbeat: one stat of the directory, unless a key came or
    went (the directory changed) or the rescan interval passed (an in-place rewrite,
    which leaves the directory's own status alone)."""
    trusted, _ = provision_mesh(tmp_path / "keys", ["a", "b"])
    store = TrustStore(trusted)
    now = 100.0
    assert store.refresh_if_changed(now) and store.names == {"a", "b"}
    assert not store.refresh_if_changed(now + 0.1)
    (trusted / "b.key").unlink()
    assert store.refresh_if_changed(now + 0.2) and store.names == {"a"}
    public, _ = create_key_pair(tmp_path / "more", "c")
    trust_key(public, trusted)
    assert store.refresh_if_changed(now + 0.3) and store.names == {"a", "c"}
    # c's certificate rewritten in place with another key: the directory looks the same.
    newer, _ = create_key_pair(tmp_path / "newer", "c")
    with open(trusted / "c.key", "r+b") as f:
        data = newer.read_bytes()
        f.write(data)
        f.truncate(len(data))
    assert not store.refresh_if_changed(now + 0.4)
    assert store.key_for("c") == public_of(public)
    assert store.refresh_if_changed(now + 0.3 + RESCAN_EVERY)
    assert store.key_for("c") == public_of(newer)


def test_the_store_counts_keys_that_leave_it(tmp_path: pathlib.Path) -> None:
    """Removals (which must cut open connections) are told apart from additions."""
    trusted, _ = provision_mesh(tmp_path / "keys", ["a", "b"])
    store = TrustStore(trusted)
    store.refresh()
    before = store.removals
    public, _ = create_key_pair(tmp_path / "more", "c")
    trust_key(public, trusted)
    assert store.refresh() and store.removals == before  # an addition cuts nobody
    (trusted / "b.key").unlink()
    assert store.refresh() and store.removals == before + 1
    newer, _ = create_key_pair(tmp_path / "newer", "c")
    trust_key(newer, trusted, force=True)  # c's old key is no longer trusted
    assert store.refresh() and store.removals == before + 2


def test_a_stray_file_or_an_ambiguous_key_does_not_hide_the_others(tmp_path: pathlib.Path
                                                                   ) -> None:
    trusted, _ = provision_mesh(tmp_path / "keys", ["a", "b"])
    (trusted / "junk.key").write_text("not a certificate\n")
    (trusted / "Bad Name.key").write_bytes((trusted / "a.key").read_bytes())
    (trusted / "huge.key").write_bytes(b"#" * (1 << 20))
    (trusted / "twin.key").write_bytes((trusted / "b.key").read_bytes())  # b's key again
    store = TrustStore(trusted)
    store.refresh()
    assert store.names == {"a"}  # b is ambiguous (also "twin"), the rest are not keys
    assert TrustStore(tmp_path / "missing").refresh() is False


def test_adverts_are_checked_against_the_binding(tmp_path: pathlib.Path) -> None:
    trusted, secrets = provision_mesh(tmp_path / "keys", ["alice", "bob"])
    store = TrustStore(trusted)
    store.refresh()
    alice, bob = public_of(secrets["alice"]), public_of(secrets["bob"])
    stranger = zmq.curve_keypair()[0].decode()
    assert store.advert_problem(advert("alice", alice)) is None
    assert store.advert_problem(advert("alice", None))[0] == "insecure-advert"  # type: ignore[index]
    assert store.advert_problem(advert("alice", bob))[0] == "advert-key-mismatch"  # type: ignore[index]
    assert store.advert_problem(advert("alice", stranger))[0] == "advert-key-mismatch"  # type: ignore[index]
    assert store.advert_problem(advert("carol", stranger))[0] == "untrusted-advert"  # type: ignore[index]
    assert store.advert_problem(advert("carol", bob))[0] == "advert-key-mismatch"  # type: ignore[index]
    # The signing key, when an advert carries one, must be the one trusted for the name.
    alice_signs = load_identity(secrets["alice"]).signing_key_z85
    bob_signs = load_identity(secrets["bob"]).signing_key_z85
    assert store.advert_problem(advert("alice", alice, alice_signs)) is None
    assert store.advert_problem(advert("alice", alice, bob_signs))[0] == (  # type: ignore[index]
        "advert-key-mismatch")


# -- the audit log -----------------------------------------------------------------------------


def test_audit_lines_are_counted_and_repeats_are_bounded(tmp_path: pathlib.Path) -> None:
    counters: collections.Counter[str] = collections.Counter()
    path = tmp_path / "node" / "audit.jsonl"
    audit = AuditLog(path, "alice", counters)
    for _ in range(50):
        audit.record("spoofed-actor", "bob said he was carol", peer="bob")
    audit.record("untrusted-key", "refused", key="K" * 40, address="10.0.0.9")
    audit.close()
    audit.close()
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert counters["audit.spoofed-actor"] == 50 and counters["audit.untrusted-key"] == 1
    assert len(lines) == 11  # ten of the repeated event, then only counted
    assert lines[0]["node"] == "alice" and lines[0]["peer"] == "bob" and lines[9]["repeat"] == 10
    assert lines[-1] | {"time": None} == {
        "time": None, "node": "alice", "event": "untrusted-key", "peer": None,
        "key": "K" * 40, "address": "10.0.0.9", "detail": "refused", "repeat": 1}
    assert mode(path) == 0o600
    AuditLog(None, "x", counters).record("e", "only counted")
    assert counters["audit.e"] == 1


# -- settings ------------------------------------------------------------------------------------


def test_seeds_may_name_the_agent_expected_there() -> None:
    assert split_seed("127.0.0.1:5555") == (None, "127.0.0.1", 5555)
    assert split_seed("worker-1@10.0.0.5:7") == ("worker-1", "10.0.0.5", 7)
    assert split_seed("w@[::1]:7") == ("w", "[::1]", 7)
    for bad in ("nohost", "Bad Name@1.2.3.4:5", "w@1.2.3.4:0", "@1.2.3.4:5"):
        with pytest.raises(ConfigError):
            split_seed(bad)
    assert NodeConfig(name="w", seeds=("a@127.0.0.1:9",)).seeds == ("a@127.0.0.1:9",)


def test_protected_mode_needs_keys_or_an_explicit_opt_out(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: pathlib.Path) -> None:
    for variable in (ENV_KEY, ENV_TRUSTED, ENV_INSECURE):
        monkeypatch.delenv(variable, raising=False)
    exposed = NodeConfig(name="w", interfaces=("10.0.0.5",))
    with pytest.raises(SecurityError, match=r"10\.0\.0\.5.*insecure=True.*--insecure"):
        exposed.check_protected()
    NodeConfig(name="w").check_protected()  # loopback needs nothing
    NodeConfig(name="w", interfaces=("10.0.0.5",), insecure=True).check_protected()
    key = tmp_path / "w.key_secret"
    NodeConfig(name="w", interfaces=("0.0.0.0",), secret_key_file=key).check_protected()
    monkeypatch.setenv(ENV_INSECURE, "1")
    NodeConfig(name="w", interfaces=("10.0.0.5",)).check_protected()


def test_security_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: pathlib.Path) -> None:
    monkeypatch.setenv("PORTER_MESH_DATA", str(tmp_path))
    monkeypatch.delenv(ENV_TRUSTED, raising=False)
    monkeypatch.setenv(ENV_KEY, str(tmp_path / "w.key_secret"))
    cfg = NodeConfig(name="w", mesh="lab")
    assert cfg.secured and cfg.secret_key_file == tmp_path / "w.key_secret"
    assert cfg.trusted_path == tmp_path / "lab" / "trusted" == default_trusted_dir("lab")
    monkeypatch.setenv(ENV_TRUSTED, str(tmp_path / "elsewhere"))
    assert NodeConfig(name="w").trusted_path == tmp_path / "elsewhere"
    monkeypatch.delenv(ENV_KEY)
    assert not NodeConfig(name="w").secured and not NodeConfig(name="w").insecure


def test_a_node_only_speaks_under_the_name_its_key_is_bound_to(tmp_path: pathlib.Path) -> None:
    trusted, secrets = provision_mesh(tmp_path / "keys", ["alice", "bob"])
    counters: collections.Counter[str] = collections.Counter()

    def load(name: str, key: str, directory: pathlib.Path = trusted, **kw: bool) -> MeshSecurity:
        return MeshSecurity.load(name=name, mesh="m", key_file=secrets[key],
                                 trusted_dir=directory, audit_path=None, counters=counters,
                                 **kw)

    assert load("alice", "alice").identity.name == "alice"
    with pytest.raises(SecurityError, match="made for 'bob', not 'alice'"):
        load("alice", "bob")
    load("tail-1", "bob", observer=True)  # a watcher sends nothing under its own name
    with pytest.raises(SecurityError, match=r"does not exist.*porter-mesh trust"):
        load("alice", "alice", tmp_path / "nowhere")
    (trusted / "alice.key").rename(trusted / "carol.key")
    with pytest.raises(SecurityError, match="as 'carol', not 'alice'"):
        load("alice", "alice")


# -- the commands ------------------------------------------------------------------------------


def test_keygen_and_trust_commands(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORTER_MESH_DATA", str(tmp_path / "data"))
    monkeypatch.delenv(ENV_TRUSTED, raising=False)
    keys = tmp_path / "keys"
    assert cli(["keygen", "worker-1", "--dir", str(keys)]) == 0
    assert cli(["keygen", "worker-1", "--dir", str(keys)]) == 1
    assert cli(["trust", str(keys / "worker-1.key"), "--mesh", "lab"]) == 0
    assert (tmp_path / "data" / "lab" / "trusted" / "worker-1.key").is_file()
    assert cli(["trust", str(keys / "worker-1.key_secret"), "--mesh", "lab"]) == 1
    assert "secret key" in capsys.readouterr().err
    assert cli(["trust", "--list", "--mesh", "lab"]) == 0
    assert capsys.readouterr().out.startswith("worker-1 ")
    assert cli(["trust", "--remove", "worker-1", "--mesh", "lab"]) == 0
    assert cli(["trust", "--remove", "worker-1", "--mesh", "lab"]) == 1
    assert cli(["trust", "--mesh", "lab"]) == 2
    err = capsys.readouterr().err
    assert "is not trusted" in err and "give a public" in err


# -- signing keys ----------------------------------------------------------------------------


def test_keygen_adds_a_signing_key_that_trusting_the_certificate_trusts(
        tmp_path: pathlib.Path) -> None:
    trusted, secrets = provision_mesh(tmp_path, ["alice", "bob"])
    alice = load_identity(secrets["alice"])
    assert alice.signing_public is not None and len(alice.signing_public) == 32
    assert alice.signing_secret is not None
    assert zmq.utils.z85.encode(alice.signing_secret).decode() not in repr(alice)
    assert b"signing-secret-key" not in (tmp_path / "alice.key").read_bytes()
    store = TrustStore(trusted)
    store.refresh()
    assert store.signing_key_for("alice") == alice.signing_public
    assert store.signing_key_for("bob") != alice.signing_public

    sign, verify = RecordSigner(alice), RecordVerifier(store)
    signature = sign(b"record bytes")
    assert verify("alice", b"record bytes", signature) is None
    assert verify("alice", b"other bytes", signature) == RecordVerifier.BAD_SIGNATURE
    assert verify("bob", b"record bytes", signature) == RecordVerifier.BAD_SIGNATURE
    assert verify("alice", b"record bytes", None) == RecordVerifier.UNSIGNED
    assert verify("carol", b"record bytes", signature) == RecordVerifier.UNKNOWN_SIGNER

    # A replaced key pair is followed at the next refresh (no restart).
    public, _ = create_key_pair(tmp_path / "new", "alice")
    trust_key(public, trusted, force=True)
    store.refresh()
    assert verify("alice", b"record bytes", signature) == RecordVerifier.BAD_SIGNATURE


def test_a_key_pair_without_a_signing_key_can_be_given_one(tmp_path: pathlib.Path) -> None:
    # A pair as pyzmq writes it (and as keygen did before signing keys existed).
    zmq.auth.create_certificates(str(tmp_path), "old", metadata={"name": "old"})
    secret = tmp_path / "old.key_secret"
    os.chmod(secret, 0o600)
    before = load_identity(secret)
    assert before.signing_secret is None
    with pytest.raises(SecurityError, match="--add-signing-key"):
        RecordSigner(before)
    trusted = tmp_path / "trusted"
    trust_key(tmp_path / "old.key", trusted)
    store = TrustStore(trusted)
    store.refresh()
    assert store.trusts("old") and store.signing_key_for("old") is None

    public, _ = add_signing_key(tmp_path, "old")
    after = load_identity(secret)
    assert after.public_key == before.public_key  # the CURVE key is kept
    assert after.signing_secret is not None and mode(secret) == 0o600
    with pytest.raises(SecurityError, match="already has a signing key"):
        add_signing_key(tmp_path, "old")
    trust_key(public, trusted)  # same CURVE key: no --force needed
    store.refresh()
    assert store.signing_key_for("old") == after.signing_public
    assert RecordVerifier(store)("old", b"x", RecordSigner(after)(b"x")) is None


def test_a_signing_key_that_does_not_match_its_secret_is_refused(tmp_path: pathlib.Path
                                                                 ) -> None:
    _, secret = create_key_pair(tmp_path, "w")
    _, other = create_key_pair(tmp_path / "o", "w")
    text = secret.read_text().splitlines(keepends=True)
    foreign = next(line for line in other.read_text().splitlines(keepends=True)
                   if "signing-key =" in line)
    secret.write_text("".join(foreign if "signing-key =" in line else line for line in text))
    with pytest.raises(SecurityError, match="does not belong"):
        load_identity(secret)
    secret.write_text(secret.read_text().replace("signing-key = \"", "signing-key = \"!"))
    with pytest.raises(SecurityError, match="not a 40-character"):
        load_identity(secret)


def test_keygen_command_adds_a_signing_key_and_trust_lists_who_signs(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    zmq.auth.create_certificates(str(tmp_path), "old")
    os.chmod(tmp_path / "old.key_secret", 0o600)
    create_key_pair(tmp_path, "new")
    trusted = tmp_path / "trusted"
    for name in ("old", "new"):
        assert cli(["trust", str(tmp_path / f"{name}.key"), "--dir", str(trusted)]) == 0
    capsys.readouterr()
    assert cli(["trust", "--list", "--dir", str(trusted)]) == 0
    listing = dict(line.split(" ", 1) for line in capsys.readouterr().out.splitlines())
    assert listing["new"].endswith("signs records")
    assert "--add-signing-key" in listing["old"]
    assert cli(["keygen", "old", "--dir", str(tmp_path), "--add-signing-key"]) == 0
    assert cli(["keygen", "old", "--dir", str(tmp_path), "--add-signing-key"]) == 1
    assert "already has a signing key" in capsys.readouterr().err
    assert cli(["trust", str(tmp_path / "old.key"), "--dir", str(trusted)]) == 0
    capsys.readouterr()
    assert cli(["trust", "--list", "--dir", str(trusted)]) == 0
    assert capsys.readouterr().out.count("signs records") == 2
