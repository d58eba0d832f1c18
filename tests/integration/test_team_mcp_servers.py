"""An agent's team entry names external MCP servers: their tools join its toolbox, the
model is offered them, and a call reaches the server (real processes: `porter-mesh up`,
an LLM agent on the fake endpoint, a stdio MCP server written with the SDK)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from agents.team import agent_argv, load_team
from tests.integration.cli_proc import Running
from tests.integration.fake_llm import FakeLLM, reply, tool_call
from tests.integration.test_team import _gone, _mesh, _pid, _write
from tests.integration.test_tools_external import ECHO_SERVER

pytest.importorskip("mcp", reason="the mcp extra is not installed")


def test_a_team_entry_passes_its_mcp_servers_to_the_agent(tmp_path: Path) -> None:
    path = _write(tmp_path, f"""
        [mesh]
        name = "m"
        [[agents]]
        name = "w1"
        role = "worker"
        mcp_servers = ["{sys.executable} echo.py", "npx -y some-server --flag"]
        """)
    team = load_team(path)
    argv = agent_argv(team, team.agent("w1"), mesh="m", workspace=tmp_path)
    assert argv.count("--mcp-server") == 2
    assert argv[argv.index("--mcp-server") + 1] == f"{sys.executable} echo.py"


@pytest.mark.network
@pytest.mark.timeout(120)
def test_an_llm_agent_calls_a_tool_of_its_mcp_server(tmp_path: Path) -> None:
    (tmp_path / "echo.py").write_text(ECHO_SERVER)
    builder = [reply(None, tool_call("echo__shout", {"text": "hello mesh"})), reply("Done.")]
    with FakeLLM(when_done=reply("Nothing more."), by_agent={"builder": builder}) as fake:
        path = _write(tmp_path, f"""
            [mesh]
            name = "{_mesh()}"
            [[agents]]
            name = "builder"
            role = "worker"
            brain = "llm"
            endpoint = "{fake.url}"
            model = "team-model"
            workspace = "ws"
            goal = "Shout hello mesh"
            mcp_servers = ["{sys.executable} {tmp_path / 'echo.py'}"]
            """)
        up = Running("up", str(path))
        try:
            pid = _pid(up, "builder", "alive on the mesh")
            assert fake.wait_until(
                lambda got: sum(fake.agent_of(r) == "builder" for r in got) >= 2, 60), up.out
            up.proc.send_signal(signal.SIGINT)
            assert up.proc.wait(30) == 130  # Ctrl-C
        finally:
            up.stop()
    assert _gone([pid]) == []
    first, second = [r for r in fake.requests if fake.agent_of(r) == "builder"][:2]
    offered = {t["function"]["name"] for t in first.body["tools"]}
    assert {"echo__shout", "echo__fail", "bash"} <= offered
    results = [m for m in second.body["messages"] if m.get("role") == "tool"]
    assert results and "HELLO MESH!" in str(results[-1]["content"]), second.body["messages"]
