"""A private test network: hosts in Linux network namespaces joined by one bridge.

::

     ns <tag>-a           ns <tag>-b           ns <tag>-c          (hosts)
     lo, eth0 .1          lo, eth0 .2          lo, eth0 .3         10.213.X.0/24
        |                    |                    |
     v-a ----------------- v-b ----------------- v-c                (veth peers)
     +------------------ br0, in ns <tag>-br ----------------+      (bridge host)

Every interface, address and route lives inside namespaces this module creates, with a
random ``pm-<hex>`` tag; the root namespace and the machine's real interfaces are never
touched, so multicast (mDNS) sent by a host reaches the other hosts and nothing else.
:func:`network_lab` is a context manager that builds the lab and always removes it,
ending the processes started in it first.

Needs root and the ``ip`` tool (iproute2). :func:`unavailable_reason` says why a lab
cannot be built here, for a test to skip with.

Running something in a host (the hook for multi-host tests)::

    with network_lab(3) as lab:
        procs = spawn_on_hosts(
            lab, lambda host: python_module("my.module", "--interface", host.address),
            stdout=subprocess.PIPE,
        )

``spawn_on_hosts`` and ``lab.spawn`` start commands inside the hosts' namespaces with
the repository as the working directory, and the lab reaps them at teardown.
:class:`Host` also has ``command()`` and ``run()`` for one-shot commands (``ip addr``).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[2]
#: Test addresses are 10.213.<random>.0/24: private, and only inside the lab.
SUBNET_PREFIX = "10.213"
IP = shutil.which("ip") or "/usr/sbin/ip"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [IP, *args], check=check, capture_output=True, text=True, timeout=30
    )


def unavailable_reason() -> str | None:
    """Return why a lab cannot be built on this machine, or None when it can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None and not os.path.exists(IP):
        return "the 'ip' tool (iproute2) is not installed"
    probe = f"pm-{secrets.token_hex(3)}-probe"
    created = _ip("netns", "add", probe, check=False)
    if created.returncode != 0:
        return f"cannot create a network namespace: {created.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Host:
    """One host of the lab: a namespace with loopback and ``eth0`` on the lab subnet.

    Attributes:
        netns: namespace name.
        address: the host's IPv4 address on the lab subnet.
        interface: the interface name inside the namespace (``eth0``).
    """

    netns: str
    address: str
    interface: str = "eth0"

    def command(self, argv: Sequence[str]) -> list[str]:
        """Return ``argv`` prefixed so that it runs inside this host's namespace."""
        return [IP, "netns", "exec", self.netns, *argv]

    def run(self, argv: Sequence[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a short command inside the namespace and return its result (not checked)."""
        return subprocess.run(
            self.command(argv), capture_output=True, text=True, timeout=timeout, cwd=REPO
        )


@dataclass
class Lab:
    """A built lab. Create it with :func:`network_lab`.

    Attributes:
        tag: the random ``pm-<hex>`` prefix of every namespace name.
        subnet: the lab's IPv4 subnet in CIDR form.
        bridge_netns: the namespace holding the bridge.
        hosts: the hosts, in order ``a``, ``b``, ``c``...
    """

    tag: str
    subnet: str
    bridge_netns: str
    hosts: tuple[Host, ...] = ()
    processes: list[subprocess.Popen[Any]] = field(default_factory=list)

    def spawn(self, host: Host, argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``host``; the lab ends it at teardown if still running.

        Args:
            host: where to run.
            argv: the command (see :func:`python_module`).
            **popen: extra :class:`subprocess.Popen` arguments (stdin, stdout...).

        Returns:
            The process. ``ip netns exec`` replaces itself with the command, so its pid is
            the command's pid.
        """
        popen.setdefault("cwd", REPO)
        proc = subprocess.Popen(host.command(argv), **popen)
        self.processes.append(proc)
        return proc

    def namespaces(self) -> list[str]:
        return [self.bridge_netns, *(h.netns for h in self.hosts)]


def spawn_on_hosts(
    lab: Lab, argv_for: Callable[[Host], Sequence[str]], **popen: Any
) -> list[subprocess.Popen[Any]]:
    """Start one process per host: the hook for running full nodes in the lab.

    Args:
        lab: the lab.
        argv_for: builds each host's command, e.g.
            ``lambda h: python_module("agents.worker", "--interface", h.address)``.
        **popen: extra :class:`subprocess.Popen` arguments, the same for every host.

    Returns:
        The processes, in host order; the lab reaps them at teardown.
    """
    return [lab.spawn(host, argv_for(host), **popen) for host in lab.hosts]


def python_module(module: str, *args: str) -> list[str]:
    """Return the command that runs ``python -m module args`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def _build(lab: Lab, count: int, third_octet: int) -> None:
    br = lab.bridge_netns
    _ip("netns", "add", br)
    _ip("-n", br, "link", "set", "lo", "up")
    _ip("-n", br, "link", "add", "br0", "type", "bridge")
    # Flood all multicast: there is no IGMP querier in the lab.
    _ip("-n", br, "link", "set", "br0", "type", "bridge", "mcast_snooping", "0")
    _ip("-n", br, "link", "set", "br0", "up")
    hosts = []
    for index in range(count):
        letter = chr(ord("a") + index)
        netns = f"{lab.tag}-{letter}"
        host = Host(netns=netns, address=f"{SUBNET_PREFIX}.{third_octet}.{index + 1}")
        _ip("netns", "add", netns)
        hosts.append(host)
        lab.hosts = tuple(hosts)  # so that teardown sees every namespace made so far
        _ip("-n", netns, "link", "set", "lo", "up")
        port = f"v-{letter}"
        # Both ends are created inside lab namespaces: nothing appears in the root one.
        _ip("-n", br, "link", "add", port, "type", "veth", "peer", "name", host.interface,
            "netns", netns)
        _ip("-n", br, "link", "set", port, "master", "br0")
        _ip("-n", br, "link", "set", port, "multicast", "on", "up")
        _ip("-n", netns, "addr", "add", f"{host.address}/24", "dev", host.interface)
        _ip("-n", netns, "link", "set", host.interface, "multicast", "on", "up")
        _ip("-n", netns, "route", "add", "224.0.0.0/4", "dev", host.interface)


def _teardown(lab: Lab) -> list[str]:
    problems = []
    for proc in lab.processes:
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            problems.append(f"process {proc.pid} did not end")
    for netns in lab.namespaces():
        done = _ip("netns", "del", netns, check=False)
        if done.returncode != 0 and "No such file" not in done.stderr:
            problems.append(f"{netns}: {done.stderr.strip()}")
    return problems


@contextlib.contextmanager
def network_lab(count: int = 3, *, tag: str | None = None) -> Iterator[Lab]:
    """Build ``count`` hosts on one bridge; remove everything afterwards.

    Args:
        count: number of hosts (1-26).
        tag: the prefix of every namespace name; it must start with ``pm-`` (see
            :func:`lab_namespaces_left`). Default ``pm-<random hex>``.

    Yields:
        The lab.

    Raises:
        RuntimeError: the lab cannot be built (the message has the ``ip`` error), or it
            could not be removed completely.
    """
    if not 1 <= count <= 26:
        raise ValueError("count must be 1-26")
    if tag is None:
        tag = f"pm-{secrets.token_hex(3)}"
    elif not tag.startswith("pm-"):
        raise ValueError("a lab tag must start with 'pm-'")
    third_octet = secrets.randbelow(256)
    lab = Lab(tag=tag, subnet=f"{SUBNET_PREFIX}.{third_octet}.0/24", bridge_netns=f"{tag}-br")
    try:
        try:
            _build(lab, count, third_octet)
        except subprocess.CalledProcessError as exc:
            raise RuntimeError(
                f"building the network lab failed: {' '.join(exc.cmd)}: {exc.stderr.strip()}"
            ) from None
        yield lab
    finally:
        problems = _teardown(lab)
        if problems:
            raise RuntimeError("network lab teardown incomplete: " + "; ".join(problems))


def lab_namespaces_left() -> list[str]:
    """Names of lab namespaces present now (to check that a teardown left nothing)."""
    listed = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith("pm-")]
