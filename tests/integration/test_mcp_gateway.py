"""``porter-mesh mcp`` as a real process, driven by the MCP SDK's own stdio client.

A node process is on the mesh first; the gateway starts, and the host's very first
call, a ``send_message`` on ``log``, must reach it. Then the host lists the tools and
their annotations, reads what the node sent to ``task:m1``, is refused a file outside
the workspace as an ``isError`` result, reads the roster, gets
``notifications/resources/updated`` when a message arrives, and calls a tool of an
external MCP server given with ``--mcp-server``. The SDK client fails on any line of
standard output that is not JSON-RPC; the stray-output test shows that it does.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
import orjson
import psutil
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from porter_mesh.core import constants as C
from porter_mesh.core.as2 import Activity
from porter_mesh.gateways.mcp.mesh import SettlingPort
from porter_mesh.node.sync import SyncNode
from porter_mesh.tools.schemas import specs_for
from tests.integration.harness import NodeProcess
from tests.integration.test_tools_external import ECHO_SERVER

pytestmark = pytest.mark.network

DEADLINE = 30.0


@dataclass
class Host:
    """What the host side saw: notifications and transport faults (stray output)."""

    session: ClientSession
    updated: list[str] = field(default_factory=list)
    faults: list[Exception] = field(default_factory=list)
    changed: anyio.Event = field(default_factory=anyio.Event)

    async def handle(self, message: Any) -> None:
        if isinstance(message, Exception):
            self.faults.append(message)
        elif isinstance(message, types.ResourceUpdatedNotification):
            self.updated.append(str(message.params.uri))
            self.changed.set()
            self.changed = anyio.Event()

    async def wait_updated(self, uri: str, since: int) -> None:
        with anyio.fail_after(DEADLINE):
            while uri not in self.updated[since:]:
                await self.changed.wait()

    async def text(self, name: str, arguments: dict[str, Any] | None = None,
                   *, error: bool = False) -> str:
        result = await self.session.call_tool(name, arguments or {})
        assert result.is_error is error, (name, result)
        [block] = result.content
        assert isinstance(block, types.TextContent)
        return block.text

    async def resource(self, uri: str) -> Any:
        result = await self.session.read_resource(uri)
        [content] = result.contents
        assert isinstance(content, types.TextResourceContents)
        return orjson.loads(content.text)


@asynccontextmanager
async def connect(command: list[str]) -> AsyncIterator[Host]:
    params = StdioServerParameters(command=command[0], args=command[1:])
    holder: list[Host] = []

    async def handle(message: Any) -> None:
        await holder[0].handle(message)

    async with stdio_client(params) as (read, write), \
            ClientSession(read, write, message_handler=handle) as session:
        host = Host(session)
        holder.append(host)
        yield host


def gateway_command(tmp_path: Path, mesh: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "porter_mesh.cli.main", "mcp", "--name", "m1",
            "--mesh", mesh, "--workspace", str(tmp_path / "ws"),
            "--data-dir", str(tmp_path / "m1-data"), "--wait", "10", *extra]


async def in_thread(func: Callable[[], Any]) -> Any:
    return await anyio.to_thread.run_sync(func)


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
def test_a_host_joins_the_mesh_as_an_agent(tmp_path: Path, mesh: str,
                                            procs: list[NodeProcess]) -> None:
    n1 = NodeProcess("n1", mesh=mesh)
    procs.append(n1)
    (tmp_path / "secret.txt").write_text("not for agents")
    echo = tmp_path / "echo.py"
    echo.write_text(ECHO_SERVER)
    command = gateway_command(tmp_path, mesh, "--mcp-server", f"{sys.executable} {echo}")

    async def host_side() -> None:
        async with connect(command) as host:
            init = await host.session.initialize()
            assert init.capabilities.resources is not None
            assert init.capabilities.resources.subscribe is True
            assert init.instructions is not None and "You are m1 (worker)" in init.instructions
            # The very first thing the host does: a message to the team, while the
            # gateway may not have found the mesh yet.
            sent = await host.text("send_message", {"channel": "log",
                                                    "message": "hello from the host"})
            assert sent == "Sent Announce on log."
            await in_thread(lambda: n1.wait_for(
                lambda e: e["ev"] == "msg" and e["sender"] == "m1"
                and e["text"] == "hello from the host", DEADLINE, "the host's message"))

            listed = (await host.session.list_tools()).tools
            names = [t.name for t in listed]
            assert names == [s.name for s in specs_for("worker")] + ["echo__shout",
                                                                     "echo__fail"]
            hints = {t.name: t.annotations for t in listed}
            assert hints["read_messages"].read_only_hint is False  # it drains the inbox
            assert hints["read_file"].read_only_hint is True
            assert hints["bash"].destructive_hint is True
            assert hints["grep"].idempotent_hint is True
            assert hints["echo__shout"].read_only_hint is True

            await host.session.subscribe_resource("mesh://messages")
            seen = len(host.updated)
            n1.command(op="send", to="m1", n=1)  # a direct message, text "m0"
            await host.wait_updated("mesh://messages", seen)
            inbox = await host.text("read_messages")
            assert "n1" in inbox and "m0" in inbox and "[task:m1]" in inbox
            assert await host.text("read_messages") == "No new messages."
            recent = (await host.resource("mesh://messages"))["messages"]
            assert any(m["sender"] == "n1" and m["direct"] and m["channel"] == "task:m1"
                       for m in recent)

            roster = await host.resource("mesh://roster")
            assert roster["me"] == {"name": "m1", "role": "worker", "mesh": mesh}
            assert "n1" in [p["name"] for p in roster["peers"]]
            assert "n1" in await host.text("peers")

            for path in ("../secret.txt", str(tmp_path / "secret.txt")):
                refused = await host.text("read_file", {"path": path}, error=True)
                assert "outside the workspace" in refused and "not for agents" not in refused
            wrong = await host.text("bash", {"command": 42}, error=True)
            assert "'command' must be string" in wrong
            unknown = await host.text("rm_rf", error=True)
            assert "unknown tool" in unknown and "send_message" in unknown
            assert await host.text("echo__shout", {"text": "mesh"}) == "MESH!"
            with pytest.raises(Exception, match="no resource"):
                await host.session.read_resource("mesh://nothing")
            assert host.faults == []  # nothing but JSON-RPC arrived on stdout

    anyio.run(host_side)
    # The host closed the connection: the gateway leaves the mesh gracefully.
    n1.wait_for(lambda e: e["ev"] == "peer" and e["peer"] == "m1" and e["kind"] == "left"
                and e["reason"] == "goodbye", DEADLINE, "m1's goodbye")


def test_stray_stdout_is_what_the_host_would_catch(tmp_path: Path) -> None:
    """The fault check above can fail: a server that prints a line of its own first."""
    noisy = tmp_path / "noisy.py"
    noisy.write_text(textwrap.dedent('''
        import sys
        print("starting up...", flush=True)
    ''') + ECHO_SERVER)

    async def host_side() -> None:
        async with connect([sys.executable, str(noisy)]) as host:
            await host.session.initialize()
            await host.session.list_tools()
            assert host.faults, "a line that is not JSON-RPC reaches the host as a fault"

    anyio.run(host_side)


def test_an_architect_has_no_workspace_tools(tmp_path: Path, mesh: str) -> None:
    command = gateway_command(tmp_path, mesh, "--role", "architect", "--wait", "0")

    async def host_side() -> None:
        async with connect(command) as host:
            await host.session.initialize()
            names = [t.name for t in (await host.session.list_tools()).tools]
            assert names == [s.name for s in specs_for("architect")]
            refused = await host.text("bash", {"command": "true"}, error=True)
            assert "unknown tool 'bash'" in refused
            assert host.faults == []

    anyio.run(host_side)


def test_the_first_broadcast_waits_for_the_mesh(mesh: str) -> None:
    """Right after the node starts, nobody has found it yet (here it reaches the mesh
    through a seed, which is slower than mDNS); a send in the settling window returns
    only once the peer already on the mesh has subscribed, and the peer gets it."""
    with SyncNode(name="n1", mesh=mesh) as n1, SyncNode(
            name="m1", mesh=mesh, discovery=False,
            seeds=(f"127.0.0.1:{n1.node.router_port}",)) as m1:
        port = SettlingPort(m1, None, settle=DEADLINE)
        port.send(C.CHANNEL_LOG, Activity.from_dict(
            {"type": "Announce", "actor": "m1", "summary": "first words"}))
        assert "n1" in m1.call_in_loop(lambda: m1.node.subscribers(C.CHANNEL_CONTROL))
        msg = n1.receive(5.0)
        while msg.sender != "m1":
            msg = n1.receive(5.0)
        assert msg.activity.summary == "first words"


# -- the JSON-RPC stream against the commands the server runs ------------------------------

NOBODY = 65534
#: Written into every descriptor a command can open: not JSON-RPC, so a host that read it
#: would report a fault.
FORGED = "garbage-from-a-command"


def _as_nobody(workdir: Path, command: list[str]) -> list[str]:
    """``command`` run as the unprivileged user ``nobody``.

    The interpreter of this machine may live under a directory only root can enter
    (``/root``), so the command runs in a mount namespace of its own in which that
    directory is an empty tmpfs with only the interpreter's tree bound back in; nothing
    changes for any other process.
    """
    python = Path(sys.executable).resolve()
    root = next((p for p in python.parents if p.parent == Path("/")), None)
    mounts = ""
    if root is not None and root.stat().st_mode & 0o005 != 0o005:
        keep = next(p for p in python.parents if p.parent == root)
        hold = workdir / "hold"
        mounts = (f"mkdir -p {hold} && mount --bind {keep} {hold} && "
                  f"mount -t tmpfs -o mode=755,size=1m tmpfs {root} && mkdir {keep} && "
                  f"mount --bind {hold} {keep} && ")
    env = f"env HOME={workdir} PYTHONPATH={os.environ.get('PYTHONPATH', '')}"
    inner = (f"{mounts}exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups "
             f"{env} {shlex.join(command)}")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner]


def _server_pid(workspace: Path) -> int:
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            line = child.cmdline()
            if "porter_mesh.cli.main" in line and str(workspace) in line:
                return int(child.pid)
    raise AssertionError("the gateway process was not found among this test's children")


def test_a_command_cannot_write_into_the_json_rpc_stream(mesh: str) -> None:
    """A ``bash`` command of the host's model, running as the same ordinary user as the
    server, tries to open the server's descriptors through ``/proc/<pid>/fd``: standard
    input and output, and every pipe it can list. Each attempt is refused, and the host
    sees nothing but JSON-RPC."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("unshare") is None:
        pytest.skip("needs root (to run the server as 'nobody'), setpriv and unshare")
    workdir = Path(tempfile.mkdtemp(prefix="porter-mcp-nobody-"))
    try:
        workdir.chmod(0o755)
        (workdir / "ws").mkdir()
        os.chown(workdir, NOBODY, NOBODY)
        os.chown(workdir / "ws", NOBODY, NOBODY)
        probe = subprocess.run(_as_nobody(workdir, [sys.executable, "-c", "import mcp"]),
                               capture_output=True, text=True, timeout=60)
        if probe.returncode != 0:
            pytest.skip(f"cannot run this interpreter as 'nobody': {probe.stderr[-300:]}")
        command = _as_nobody(workdir, gateway_command(workdir, mesh, "--no-discovery",
                                                      "--wait", "0"))
        _try_to_write(command, workdir / "ws")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _try_to_write(command: list[str], workspace: Path) -> None:
    async def host_side() -> None:
        async with connect(command) as host:
            await host.session.initialize()
            pid = await in_thread(lambda: _server_pid(workspace))
            attack = textwrap.dedent(f"""\
                id -u
                for n in $( (echo 0; echo 1; ls /proc/{pid}/fd 2>/dev/null) | sort -un); do
                  fd=/proc/{pid}/fd/$n
                  case $n in 0|1) ;; *) case $(readlink $fd 2>/dev/null) in
                    pipe:*) ;; *) continue ;; esac ;; esac
                  if printf '%s\\n' {FORGED} 2>/dev/null >$fd; then
                    echo "wrote $n"; else echo "refused $n"; fi
                done
                """)
            out = await host.text("bash", {"command": attack})
            assert out.splitlines()[0] == str(NOBODY), out  # an ordinary user, not root
            assert "refused 0" in out and "refused 1" in out, out
            assert "wrote" not in out, out
            # The stream is intact: the next call is answered, and nothing else came.
            assert "m1" in await host.text("peers")
            assert host.faults == [], host.faults

    anyio.run(host_side)
