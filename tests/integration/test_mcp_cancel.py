"""An MCP host cancels a task it offered: ``porter-mesh mcp`` as a real process driven by
the MCP SDK's stdio client, a scripted worker process running a long command."""

from __future__ import annotations

import os
import selectors
import time
from pathlib import Path

import anyio
import psutil
import pytest

from tests.integration.cli_proc import Running, cli
from tests.integration.test_mcp_gateway import connect, gateway_command, in_thread

pytestmark = [pytest.mark.network, pytest.mark.timeout(180)]


def _wait_fifo(fd: int, timeout: float) -> None:
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        assert sel.select(timeout), f"the long command did not start within {timeout}s"
    assert os.read(fd, 64)


def _long_command(tmp_path: Path, n: int) -> tuple[int, int, Path, str]:
    """A FIFO the test reads (and a writer kept open, so the command never blocks on it),
    the pid file, and a long command that records its pids and says it runs."""
    fifo, pids = tmp_path / "running", tmp_path / "pids"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    keep = os.open(fifo, os.O_WRONLY)
    command = (f"setsid sleep {n} & echo $! >> {pids}; echo $$ >> {pids}; "
               f"echo up > {fifo}; wait")
    return reader, keep, pids, command


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
def test_a_host_cancels_the_task_it_offered(tmp_path: Path, mesh: str) -> None:
    reader, keep, pids, long_command = _long_command(tmp_path, 3017)
    worker = Running("agent", "worker", "--name", "w1", "--mesh", mesh, "--workspace",
                     str(tmp_path / "w1"), "--data-dir", str(tmp_path / "w1.data"),
                     "--work-command", long_command)
    try:
        assert cli("peers", "--mesh", mesh, "--wait", "3").returncode == 0

        async def host_side() -> None:
            async with connect(gateway_command(tmp_path, mesh)) as host:
                await host.session.initialize()
                await host.session.subscribe_resource("mesh://messages")
                sent = await host.text("send_message", {
                    "channel": "task:w1", "type": "Offer", "context": "mcp1",
                    "message": "Index the archive"})
                assert "urn:porter:task:mcp1" in sent
                await in_thread(lambda: _wait_fifo(reader, 60))
                running = [int(x) for x in pids.read_text().split()]
                refused = await host.text("cancel_task", {"context": "nosuch"}, error=True)
                assert "not a task you offered" in refused
                done = await host.text("cancel_task", {"context": "mcp1",
                                                       "reason": "wrong archive"})
                assert done.startswith("Cancelled task urn:porter:task:mcp1: w1 was told")
                _, alive = await in_thread(lambda: psutil.wait_procs(
                    [psutil.Process(p) for p in running if psutil.pid_exists(p)], timeout=10))
                assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive
                # The holder's confirmation reaches the host's inbox.
                seen = ""
                while "Cancelled urn:porter:task:mcp1: stopped" not in seen:
                    since = len(host.updated)
                    seen += await host.text("read_messages")
                    if "Cancelled urn:porter:task:mcp1: stopped" not in seen:
                        await host.wait_updated("mesh://messages", since)
                again = await host.text("cancel_task", {"context": "mcp1"}, error=True)
                assert "already cancelled" in again

        started = time.monotonic()
        anyio.run(host_side)
        print(f"MCP cancel round trip in {time.monotonic() - started:.1f}s")
    finally:
        worker.stop()
        os.close(reader)
        os.close(keep)


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
def test_a_host_holding_a_task_stops_its_command_when_the_human_cancels(
        tmp_path: Path, mesh: str) -> None:
    reader, keep, pids, long_command = _long_command(tmp_path, 3019)
    request: Running | None = None

    async def host_side() -> None:
        nonlocal request
        async with connect(gateway_command(tmp_path, mesh)) as host:
            await host.session.initialize()
            await host.session.subscribe_resource("mesh://messages")
            since = len(host.updated)
            request = Running("request", "task:m1", "Crunch the numbers", "--type", "Offer",
                              "--context", "held1", "--mesh", mesh, "--timeout", "60",
                              "--wait", "20")
            await host.wait_updated("mesh://messages", since)
            inbox = await host.text("read_messages")
            assert "Crunch the numbers" in inbox and "Offer" in inbox, inbox
            async with anyio.create_task_group() as tasks:
                results: list[str] = []

                async def run_long() -> None:
                    results.append(await host.text("bash", {"command": long_command,
                                                            "timeout": 300}, error=True))

                tasks.start_soon(run_long)
                await in_thread(lambda: _wait_fifo(reader, 60))
                running = [int(x) for x in pids.read_text().split()]
                out = await in_thread(lambda: cli("cancel", "held1", "--mesh", mesh,
                                                  "--timeout", "20"))
                assert out.returncode == 0, (out.stdout, out.stderr)
                assert "m1 stopped, confirmed" in out.stdout
            [result] = results
            assert "was withdrawn from you" in result and "cancelled by porter-ui" in result
            _, alive = await in_thread(lambda: psutil.wait_procs(
                [psutil.Process(p) for p in running if psutil.pid_exists(p)], timeout=10))
            assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive

    try:
        anyio.run(host_side)
    finally:
        if request is not None:
            request.stop()
        os.close(reader)
        os.close(keep)
