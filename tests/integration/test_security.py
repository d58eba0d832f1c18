"""A secured mesh against strangers and dishonest members, with real processes and sockets.

The secured node under attack runs in its own process (``node_proc.py``, secured through
``PORTER_MESH_KEY`` / ``PORTER_MESH_TRUSTED``); attackers are raw pyzmq sockets, raw TCP
sockets, mDNS adverts from another process, or nodes in this process. Every test also
shows the honest path working, so that a refusal cannot pass by accident.

Run as a module, this file is also the advert spoofer: ``python -m
tests.integration.test_security advert --mesh M --name N [--key K]`` registers an mDNS
advert for ``N`` (with key ``K``, or none) until its stdin closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import itertools
import os
import selectors
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest
import zmq
from zmq.auth import load_certificate
from zmq.utils.monitor import recv_monitor_message

from porter_mesh.adapters.security import AUDIT_FILE, create_key_pair, provision_mesh
from porter_mesh.core import constants as C
from porter_mesh.core.advert import PeerAdvert, encode_txt
from porter_mesh.core.as2 import Activity
from porter_mesh.core.envelope import Envelope, encode_control, encode_direct, encode_payload
from porter_mesh.errors import ConfigError, SecurityError
from porter_mesh.node.config import ENV_INSECURE, ENV_KEY, ENV_TRUSTED
from porter_mesh.node.node import Node
from porter_mesh.node.sync import SyncNode
from tests.integration.harness import Event, NodeProcess, peers_seen

pytestmark = [pytest.mark.network, pytest.mark.timeout(120)]
REPO = Path(__file__).resolve().parents[2]
_ids = itertools.count()
_EVENT_NAMES = {getattr(zmq, n): n for n in dir(zmq) if n.startswith("EVENT_")}


# -- a secured mesh on disk ---------------------------------------------------------------


@dataclass
class Mesh:
    """Keys for alice, bob and carol (trusted) and mallory (a stranger's key)."""

    name: str
    root: Path
    trusted: Path
    secrets: dict[str, Path]

    def public(self, agent: str) -> bytes:
        return load_certificate(self.secrets[agent])[0]

    def env(self, agent: str) -> dict[str, str]:
        return {ENV_KEY: str(self.secrets[agent]), ENV_TRUSTED: str(self.trusted)}

    def audit(self, agent: str) -> list[dict[str, Any]]:
        path = self.root / "data" / agent / AUDIT_FILE
        return [orjson.loads(line) for line in path.read_bytes().splitlines()]

    def node(self, agent: str, **settings: Any) -> SyncNode:
        """A secured node in this process."""
        chosen: dict[str, Any] = {
            "discovery": False, "trusted_dir": self.trusted, "heartbeat_interval": 0.2,
            "evasive_after": 0.8, "expire_after": 2.0, "retry_initial": 0.1, "retry_max": 0.5}
        chosen.update(settings)
        return SyncNode(name=agent, mesh=self.name, secret_key_file=self.secrets[agent],
                        **chosen)


@pytest.fixture
def mesh(tmp_path: Path) -> Mesh:
    trusted, secrets = provision_mesh(tmp_path / "keys", ["alice", "bob", "carol"])
    _, secrets["mallory"] = create_key_pair(tmp_path / "stranger", "mallory")
    return Mesh(f"sec-{os.getpid()}-{next(_ids)}", tmp_path, trusted, secrets)


@pytest.fixture
def processes() -> Iterator[list[NodeProcess]]:
    started: list[NodeProcess] = []
    yield started
    for proc in started:
        proc.stop()


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)


def spawn(processes: list[NodeProcess], mesh: Mesh, agent: str, *extra: str,
          secured: bool = True) -> NodeProcess:
    """A node process; secured through the environment, with a data dir for its audit."""
    env = mesh.env(agent) if secured else {}
    saved = {k: os.environ.get(k) for k in (ENV_KEY, ENV_TRUSTED)}
    try:
        os.environ.update(env)
        proc = NodeProcess(agent, "--data-dir", str(mesh.root / "data" / agent), *extra,
                           mesh=mesh.name)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    processes.append(proc)
    return proc


def stats(proc: NodeProcess, pred: Callable[[dict[str, int]], bool], timeout: float = 10.0,
          what: str = "stats") -> dict[str, int]:
    """Ask the process for its counters until ``pred`` holds (each answer paces the next
    question; nothing sleeps)."""
    deadline = time.monotonic() + timeout
    while True:
        count = sum(1 for e in proc.events if e["ev"] == "stats")
        proc.command(op="stats")
        proc.wait_until(lambda ev, n=count: sum(1 for e in ev if e["ev"] == "stats") > n,
                        timeout, "a stats answer")
        current: dict[str, int] = [e for e in proc.events if e["ev"] == "stats"][-1]["stats"]
        if pred(current):
            return current
        if time.monotonic() > deadline:
            raise AssertionError(f"{proc.name}: {what} not reached within {timeout}s: {current}")


def curve_socket(ctx: zmq.Context[zmq.Socket[bytes]], kind: int, mesh: Mesh, client: str,
                 server: str) -> zmq.Socket[bytes]:
    sock = ctx.socket(kind)
    public, secret = load_certificate(mesh.secrets[client])
    assert secret is not None
    sock.curve_serverkey = mesh.public(server)
    sock.curve_publickey = public
    sock.curve_secretkey = secret
    return sock


def monitored(sock: zmq.Socket[bytes]) -> zmq.Socket[bytes]:
    return sock.get_monitor_socket()


HANDSHAKE_OUTCOMES = {zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                      zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_AUTH}


def handshake(sock: zmq.Socket[bytes], endpoint: str, *frames: bytes) -> int:
    """Connect ``sock`` (sending ``frames`` if any) and return how its first handshake
    ended; the socket stays open for the caller."""
    mon = monitored(sock)
    sock.connect(endpoint)
    if frames:
        sock.send_multipart(list(frames))
    try:
        return wait_event(mon, HANDSHAKE_OUTCOMES)
    finally:
        sock.disable_monitor()
        mon.close(0)


def wait_event(mon: zmq.Socket[bytes], wanted: set[int], timeout: float = 10.0) -> int:
    """The first monitor event in ``wanted``; fails listing what was seen instead."""
    deadline = time.monotonic() + timeout
    seen = []
    while (left := deadline - time.monotonic()) > 0:
        if mon.poll(int(left * 1000)):
            event = recv_monitor_message(mon)["event"]
            if event in wanted:
                return int(event)
            seen.append(_EVENT_NAMES.get(event, event))
    raise AssertionError(f"none of {[_EVENT_NAMES[w] for w in wanted]} within {timeout}s; "
                         f"saw {seen}")


def close_monitored(sock: zmq.Socket[bytes], mon: zmq.Socket[bytes]) -> None:
    sock.disable_monitor()
    mon.close(0)
    sock.close(0)


def announce(actor: str, text: str) -> Activity:
    return Activity.from_dict({"type": "Announce", "actor": actor, "summary": text})


def envelope(sender: str, recipient: str | None = "alice", *, kind: str | None = None,
             seq: int = 1, incarnation: int = 7) -> Envelope:
    channel = C.CHANNEL_CONTROL if kind else f"task:{recipient}"
    return Envelope(C.PROTOCOL_VERSION, f"{incarnation:x}.{seq}", sender, channel,
                    0 if kind else seq, incarnation, time.time_ns() // 1_000_000 << 16,
                    recipient, None, 1, kind)


def delivered(proc: NodeProcess, text: str) -> Callable[[list[Event]], bool]:
    return lambda ev: any(e["ev"] == "msg" and e["text"] == text for e in ev)


# -- tests ----------------------------------------------------------------------------------


def test_untrusted_key_is_refused_and_audited(mesh: Mesh, processes: list[NodeProcess],
                                              ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    alice = spawn(processes, mesh, "alice", "--no-discovery")
    stranger = curve_socket(ctx, zmq.DEALER, mesh, "mallory", "alice")
    frames = encode_direct(envelope("mallory"), encode_payload([announce("mallory", "in?")]))
    assert handshake(stranger, f"tcp://127.0.0.1:{alice.up['router']}", *frames
                     ) == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    stats(alice, lambda st: st.get("audit.untrusted-key", 0) >= 1)
    entry = next(e for e in mesh.audit("alice") if e["event"] == "untrusted-key")
    assert entry["key"] == mesh.public("mallory").decode()
    assert entry["address"] == "127.0.0.1"
    stranger.close(0)
    # A trusted node still gets through, and the stranger's message never reached a handler.
    with mesh.node("bob", seeds=(f"alice@127.0.0.1:{alice.up['router']}",)) as bob:
        bob.wait_for_peers(["alice"], 10)
        bob.send("alice", announce("bob", "hello"), timeout=10)
        alice.wait_until(delivered(alice, "hello"), 10, "bob's message")
    assert not any(e["ev"] == "msg" and e["sender"] == "mallory" for e in alice.events)


def test_spoofed_actor_and_sender_from_a_trusted_key_are_dropped_and_audited(
        mesh: Mesh, processes: list[NodeProcess], ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    alice = spawn(processes, mesh, "alice", "--no-discovery")
    with mesh.node("bob", seeds=(f"alice@127.0.0.1:{alice.up['router']}",)) as bob:
        bob.wait_for_peers(["alice"], 10)
        bob.send("alice", announce("carol", "direct spoof"), timeout=10)  # acked, dropped
        bob.run_coroutine(bob.node.wait_for_subscribers("log", 1, 10))
        bob.publish("log", announce("carol", "broadcast spoof"))
        bob.send("alice", announce("bob", "genuine"), timeout=10)
        alice.wait_until(delivered(alice, "genuine"), 10, "bob's genuine message")
        # The envelope itself lies: bob's key, carol's name.
        liar = curve_socket(ctx, zmq.DEALER, mesh, "bob", "alice")
        liar.connect(f"tcp://127.0.0.1:{alice.up['router']}")
        liar.send_multipart(encode_direct(envelope("carol"),
                                          encode_payload([announce("carol", "sender spoof")])))
        counters = stats(alice, lambda st: st.get("dropped.spoofed-actor", 0) >= 2
                         and st.get("dropped.spoofed-sender", 0) >= 1)
        liar.close(0)
    assert counters["audit.spoofed-actor"] >= 2 and counters["audit.spoofed-sender"] >= 1
    texts = {e["text"] for e in alice.messages()}
    assert "genuine" in texts
    assert not texts & {"direct spoof", "broadcast spoof", "sender spoof"}
    events = {(e["event"], e["peer"]) for e in mesh.audit("alice")}
    assert ("spoofed-actor", "bob") in events and ("spoofed-sender", "bob") in events


def test_second_hand_advert_cannot_move_a_live_peer(
        mesh: Mesh, processes: list[NodeProcess], ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    alice = spawn(processes, mesh, "alice", "--no-discovery")
    seed = f"alice@127.0.0.1:{alice.up['router']}"
    with mesh.node("carol", seeds=(seed,)) as carol:
        alice.wait_until(lambda ev: "carol" in peers_seen(ev), 10, "carol joins")
        real = carol.node.advert()
        # bob (a trusted member) claims carol moved to ports where nobody holds her key.
        fake = PeerAdvert(name="carol", role="agent", mesh=mesh.name, pub_port=9,
                          router_port=9, version=C.PROTOCOL_VERSION,
                          incarnation=real.incarnation + 1, public_key=real.public_key)
        me = PeerAdvert(name="bob", role="agent", mesh=mesh.name, pub_port=9, router_port=9,
                        version=C.PROTOCOL_VERSION, incarnation=7,
                        public_key=mesh.public("bob").decode())
        body = {"a": encode_txt(me), "x": ["127.0.0.1"],
                "p": [[encode_txt(fake), ["127.0.0.1"]]]}
        insider = curve_socket(ctx, zmq.DEALER, mesh, "bob", "alice")
        insider.connect(f"tcp://127.0.0.1:{alice.up['router']}")
        insider.send_multipart(encode_direct(envelope("bob", None, kind="hello"),
                                             encode_control(body)))
        stats(alice, lambda st: st.get("dropped.unverified-advert", 0) >= 1)
        insider.close(0)
        carol.send("alice", announce("carol", "still here"), timeout=10)
        alice.wait_until(delivered(alice, "still here"), 10, "carol still reaches alice")
    restarts = [e for e in alice.events if e["ev"] == "peer" and e["peer"] == "carol"
                and e["reason"] == "restarted"]
    assert not restarts


def test_spoofed_discovery_advert_is_ignored(mesh: Mesh, processes: list[NodeProcess]) -> None:
    alice = spawn(processes, mesh, "alice")
    spoofers = [
        # A known name with another key, and a name announced without any key.
        spoof_advert(mesh.name, "bob", mesh.public("mallory").decode()),
        spoof_advert(mesh.name, "dave", None),
    ]
    try:
        for proc in spoofers:
            expect_line(proc, "ready")
        carol = spawn(processes, mesh, "carol")
        alice.wait_until(lambda ev: "carol" in peers_seen(ev), 20, "alice discovers carol")
        carol.wait_until(lambda ev: "alice" in peers_seen(ev), 20, "carol discovers alice")
        counters = stats(alice, lambda st: st.get("audit.advert-key-mismatch", 0) >= 1
                         and st.get("audit.insecure-advert", 0) >= 1, 20,
                         "both spoofed adverts refused")
    finally:
        for proc in spoofers:
            stop_spoofer(proc)
    assert counters["dropped.advert-key-mismatch"] >= 1
    assert not peers_seen(alice.events) & {"bob", "dave"}
    entry = next(e for e in mesh.audit("alice") if e["event"] == "advert-key-mismatch")
    assert entry["peer"] == "bob" and entry["key"] == mesh.public("mallory").decode()


def test_client_without_curve_cannot_connect(mesh: Mesh, processes: list[NodeProcess],
                                             ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    alice = spawn(processes, mesh, "alice", "--no-discovery")
    router, pub = (f"tcp://127.0.0.1:{alice.up[k]}" for k in ("router", "pub"))
    listener = ctx.socket(zmq.SUB)
    listener.setsockopt(zmq.SUBSCRIBE, b"")
    failed = HANDSHAKE_OUTCOMES - {zmq.EVENT_HANDSHAKE_SUCCEEDED}
    attempts = [
        # Plain (NULL) clients, on the ROUTER and on the PUB.
        (ctx.socket(zmq.DEALER), router, failed),
        (listener, pub, failed),
        # A trusted key that expects the wrong server key.
        (curve_socket(ctx, zmq.DEALER, mesh, "bob", "carol"), router, failed),
        # The same key with the right server key passes: the refusals above were real.
        (curve_socket(ctx, zmq.DEALER, mesh, "bob", "alice"), router,
         {zmq.EVENT_HANDSHAKE_SUCCEEDED}),
    ]
    frames = encode_direct(envelope("bob"), encode_payload([announce("bob", "x")]))
    for sock, endpoint, expected in attempts:
        sent = frames if sock.type == zmq.DEALER else []
        outcome = handshake(sock, endpoint, *sent)
        assert outcome in expected, _EVENT_NAMES[outcome]
        sock.close(0)
    counters = stats(alice, lambda st: True)
    assert not any(k.startswith("received.") for k in counters), counters


def test_removed_key_cannot_open_new_connections(
        mesh: Mesh, processes: list[NodeProcess], ctx: zmq.Context[zmq.Socket[bytes]]) -> None:
    alice = spawn(processes, mesh, "alice", "--no-discovery")
    router = f"tcp://127.0.0.1:{alice.up['router']}"
    with mesh.node("bob", seeds=(f"alice@{router[6:]}",)) as bob:
        bob.wait_for_peers(["alice"], 10)
        alice.wait_until(lambda ev: "bob" in peers_seen(ev), 10, "bob joins")
        early = curve_socket(ctx, zmq.DEALER, mesh, "bob", "alice")
        assert handshake(early, router) == zmq.EVENT_HANDSHAKE_SUCCEEDED
        (mesh.trusted / "bob.key").unlink()
        late = curve_socket(ctx, zmq.DEALER, mesh, "bob", "alice")
        assert handshake(late, router) == zmq.EVENT_HANDSHAKE_FAILED_AUTH
        # The running node noticed without a restart: bob's live link is cut as well, and
        # what still comes over the connection opened before the removal is refused.
        alice.wait_until(lambda ev: any(e["ev"] == "peer" and e["peer"] == "bob"
                                        and e["reason"] == "untrusted" for e in ev),
                         10, "bob disconnected once untrusted")
        early.send_multipart(encode_direct(envelope("bob"),
                                           encode_payload([announce("bob", "too late")])))
        stats(alice, lambda st: st.get("dropped.revoked-key", 0) >= 2
              and st.get("audit.untrusted-key", 0) >= 1)
        early.close(0)
        late.close(0)
    assert not any(e["ev"] == "msg" and e["text"] == "too late" for e in alice.events)


def test_revoked_key_stops_receiving_broadcasts_within_a_heartbeat(mesh: Mesh) -> None:
    """bob subscribes to alice's broadcasts while alice keeps publishing; bob's key leaves
    the trusted directory. Within one heartbeat (plus a margin for a loaded machine) bob
    receives nothing more, while carol, still trusted, reconnects and keeps receiving."""
    heartbeat, margin = 0.2, 0.4  # the heartbeat of Mesh.node
    # bob keeps its own copy of the trusted directory: a revoked node does not cooperate.
    bob_trusted = mesh.root / "bob-trusted"
    shutil.copytree(mesh.trusted, bob_trusted)
    published: dict[int, float] = {}
    got: dict[str, dict[int, float]] = {"bob": {}, "carol": {}}

    arrived = threading.Condition()

    def collector(name: str) -> Callable[[Any], None]:
        def on_msg(msg: Any) -> None:
            if msg.sender == "alice" and msg.activity.summary.startswith("tick-"):
                with arrived:
                    got[name][int(msg.activity.summary[5:])] = time.monotonic()
                    arrived.notify_all()
        return on_msg

    with mesh.node("alice") as alice:
        seed = (f"alice@127.0.0.1:{alice.node.router_port}",)
        with mesh.node("bob", seeds=seed, trusted_dir=bob_trusted, inbox_size=0) as bob, \
                mesh.node("carol", seeds=seed, inbox_size=0) as carol:
            for node in (bob, carol):
                node.call_in_loop(lambda n=node: n.node.add_handler(collector(n.name)))
            alice.run_coroutine(alice.node.wait_for_subscribers(C.CHANNEL_LOG, 2, 10), 15)
            deadline = time.monotonic() + 30
            cut: float | None = None
            for i in range(6000):  # bounded: at most 6000 broadcasts and 30 s
                published[i] = time.monotonic()
                alice.publish(C.CHANNEL_LOG, announce("alice", f"tick-{i}"))
                now = time.monotonic()
                if cut is None and len(got["bob"]) >= 5 and len(got["carol"]) >= 5:
                    (mesh.trusted / "bob.key").unlink()
                    cut = now
                with arrived:
                    late = [t for t in got["carol"].values()
                            if cut is not None and t > cut + heartbeat + margin + 1.0]
                    if len(late) >= 20 or now > deadline:
                        break
                    # Paced by carol: the next broadcast goes once this one reached her
                    # (or after 10 ms while she reconnects), so the loop never floods.
                    arrived.wait_for(lambda n=i: n in got["carol"], 0.01)
            assert cut is not None, "bob and carol never received alice's broadcasts"
            counters = alice.stats()
            healed = carol.stats()
    after = cut + heartbeat + margin
    too_late = sorted(i for i in got["bob"] if published[i] > after)
    last_bob = max(got["bob"].values()) - cut
    honest = sorted(i for i in got["carol"] if published[i] > after)
    sent_after = [i for i, t in published.items() if t > after]
    lost = len(set(range(min(got["carol"]), max(got["carol"]) + 1)) - set(got["carol"]))
    print(f"bob's last broadcast arrived {last_bob:+.3f}s after the key was removed; carol "
          f"missed {lost} of {len(published)} broadcasts")
    assert not too_late, (f"bob still received {len(too_late)} broadcast(s) published more "
                          f"than {heartbeat + margin}s after its key was removed")
    assert len(honest) >= 20 and len(honest) >= len(sent_after) - 5, (len(honest),
                                                                       len(sent_after))
    assert counters.get("security.pub-reopened", 0) >= 1, counters
    # What carol missed while she reconnected is a counted gap, never a silent one.
    assert healed.get("lost.broadcast", 0) >= lost, healed


def zmtp_greeting(mechanism: bytes) -> bytes:
    """A ZMTP 3.0 greeting offering ``mechanism``, as a client."""
    return (b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + mechanism.ljust(20, b"\x00")
            + b"\x00" + b"\x00" * 31)


def huge_header_attack(port: int, mechanism: bytes) -> bool:
    """Greet, then announce a command frame of 2**63-1 bytes. True when the node hung up."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.settimeout(10)
        conn.sendall(zmtp_greeting(mechanism))
        header = bytes([0x06]) + (2**63 - 1).to_bytes(8, "big")  # LONG | COMMAND
        with contextlib.suppress(OSError):
            conn.sendall(header + b"\x05HELLO" + b"A" * 4096)
        try:
            while conn.recv(65536):
                pass
        except ConnectionResetError:
            pass
        except TimeoutError:
            return False
    return True


@pytest.mark.parametrize("secured", [True, False], ids=["secured", "unsecured"])
def test_oversized_frames_and_huge_length_headers_disconnect_only_that_peer(
        mesh: Mesh, processes: list[NodeProcess], ctx: zmq.Context[zmq.Socket[bytes]],
        secured: bool) -> None:
    alice = spawn(processes, mesh, "alice", "--no-discovery", secured=secured)
    rss = psutil.Process(alice.proc.pid)
    router = f"127.0.0.1:{alice.up['router']}"
    seed = f"alice@{router}" if secured else router
    good = (mesh.node("bob", seeds=(seed,)) if secured
            else SyncNode(name="bob", mesh=mesh.name, discovery=False, seeds=(seed,)))
    with good:
        good.wait_for_peers(["alice"], 10)
        good.send("alice", announce("bob", "before"), timeout=10)
        alice.wait_until(delivered(alice, "before"), 10, "bob before the attack")
        before = rss.memory_info().rss
        mechanism = b"CURVE" if secured else b"NULL"
        for _ in range(100):
            assert huge_header_attack(alice.up["router"], mechanism)
            assert huge_header_attack(alice.up["pub"], mechanism)
        for _ in range(10):  # a member sends more than max_message_bytes
            big = (curve_socket(ctx, zmq.DEALER, mesh, "carol", "alice") if secured
                   else ctx.socket(zmq.DEALER))
            mon = monitored(big)
            big.connect(f"tcp://{router}")
            big.send_multipart([b"x" * 100, b"y" * (C.MAX_MESSAGE_BYTES + 1024)])
            wait_event(mon, {zmq.EVENT_DISCONNECTED})
            close_monitored(big, mon)
        after = rss.memory_info().rss
        good.send("alice", announce("bob", "after"), timeout=10)
        alice.wait_until(delivered(alice, "after"), 10, "bob after the attack")
    assert alice.proc.poll() is None
    assert after - before < 32 * 1024 * 1024, f"RSS grew {(after - before) >> 20} MiB"


def _unassigned_address() -> str:
    local = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs}
    for candidate in ("192.0.2.77", "198.51.100.77", "203.0.113.77"):
        if candidate not in local:
            return candidate
    pytest.skip("every documentation address is assigned here")


async def _start(node: Node) -> None:
    try:
        await node.astart()
    finally:
        await node.aclose()


def test_protected_mode_refuses_a_non_loopback_bind_without_keys(tmp_path: Path) -> None:
    address = _unassigned_address()
    ipaddress.ip_address(address)
    with pytest.raises(SecurityError, match="insecure=True") as refused:
        asyncio.run(_start(Node(name="w", interfaces=(address,), discovery=False,
                                secret_key_file=None, insecure=False)))
    assert address in str(refused.value) and "--insecure" in str(refused.value)
    # The refusal comes before binding: with the flag, binding itself is what fails.
    with pytest.raises(ConfigError, match="cannot bind"):
        asyncio.run(_start(Node(name="w", interfaces=(address,), discovery=False,
                                secret_key_file=None, insecure=True)))
    env = {k: v for k, v in os.environ.items() if k not in (ENV_KEY, ENV_INSECURE)}
    cli = [sys.executable, "-m", "porter_mesh.cli.main", "node", "--name", "w",
           "--interface", address, "--no-discovery"]
    proc = subprocess.run(cli, capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
    assert proc.returncode == 2 and "protected mode" in proc.stderr, proc.stderr
    proc = subprocess.run(cli, capture_output=True, text=True, timeout=60, cwd=REPO,
                          env={**env, ENV_INSECURE: "1"})
    assert proc.returncode == 2 and "cannot bind" in proc.stderr, proc.stderr


def test_secured_demo_plays_the_story(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "porter_mesh.cli.main", "demo", "--secure", "--out", str(out),
         "--timeout", "60"], capture_output=True, text=True, timeout=110, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "secured with CurveZMQ" in proc.stdout and "demo complete" in proc.stdout
    assert "api-design" in proc.stdout
    audits = list((out / "data").glob(f"*/{AUDIT_FILE}"))
    assert len(audits) == 4 and all(a.read_bytes() == b"" for a in audits)


# -- the advert spoofer (a separate process) ------------------------------------------------


def spoof_advert(mesh: str, name: str, key: str | None) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tests.integration.test_security", "advert", "--mesh", mesh,
           "--name", name]
    if key is not None:
        cmd.append(f"--key={key}")  # a Z85 key may start with '-'
    return subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def expect_line(proc: subprocess.Popen[bytes], word: str, timeout: float = 20.0) -> None:
    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"spoofer said nothing within {timeout}s")
    line = proc.stdout.readline().decode().strip()
    assert line == word, f"spoofer said {line!r} (exit status {proc.poll()})"


def stop_spoofer(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


async def _spoof(args: argparse.Namespace) -> None:
    from porter_mesh.adapters.discovery import Discovery

    discovery = Discovery(mesh=args.mesh, interfaces=["127.0.0.1"], on_found=lambda _: None,
                          on_lost=lambda _: None)
    await discovery.astart(PeerAdvert(
        name=args.name, role="agent", mesh=args.mesh, pub_port=9, router_port=9,
        version=C.PROTOCOL_VERSION, incarnation=1234, public_key=args.key))
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.buffer.read)
    await discovery.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["advert"])
    parser.add_argument("--mesh", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--key")
    asyncio.run(_spoof(parser.parse_args()))
