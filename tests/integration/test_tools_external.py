"""External MCP servers' tools in a toolbox: a real stdio server process, written here
with the SDK's own server API, started, listed, called and stopped."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from porter_mesh.errors import ConfigError, ToolError
from porter_mesh.tools.external import ExternalTools, external_server
from porter_mesh.tools.schemas import to_mcp, to_openai
from porter_mesh.tools.toolbox import Toolbox
from tests.integration.test_tools_messaging import MemoryPort

ECHO_SERVER = textwrap.dedent('''
    """A tiny MCP server over stdio: shout (read-only) and fail."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.types import ToolAnnotations

    app = MCPServer("echo")


    @app.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
    def shout(text: str) -> str:
        """Say it louder."""
        return text.upper() + "!"


    @app.tool()
    def fail(reason: str) -> str:
        """Always fails, with the reason."""
        raise ToolError(reason)


    app.run()
''')


@pytest.fixture
def echo_server(tmp_path: Path) -> list[str]:
    script = tmp_path / "echo.py"
    script.write_text(ECHO_SERVER)
    return [sys.executable, str(script)]


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_external_tools_join_the_toolbox(tmp_path: Path, echo_server: list[str]) -> None:
    before = children()
    with ExternalTools.start([echo_server]) as external:
        started = children() - before
        assert started, "the server runs as a process of its own"
        box = Toolbox(MemoryPort("w1"), tmp_path, external=external)
        names = [s.name for s in box.specs()]
        assert names[-2:] == ["echo__shout", "echo__fail"]
        assert "read_file" in names  # the agent's own tools stay
        assert box.call("echo__shout", {"text": "hello"}) == "HELLO!"
        with pytest.raises(ToolError, match=r"echo__fail: .*no such luck"):
            box.call("echo__fail", {"reason": "no such luck"})
        with pytest.raises(ToolError, match="text"):  # the server checks its arguments
            box.call("echo__shout", {})
        hints = {t["name"]: t["annotations"] for t in to_mcp(box.specs())["tools"]}
        assert hints["echo__shout"]["readOnlyHint"] is True
        assert hints["echo__shout"]["destructiveHint"] is False
        assert hints["echo__fail"]["destructiveHint"] is True  # MCP's default: it may be
        strict = {t["function"]["name"]: t["function"] for t in to_openai(box.specs(),
                                                                          strict=True)}
        assert strict["read_file"]["strict"] is True
        assert strict["echo__shout"]["strict"] is False  # its schema is not strict-ready
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in started), "close stops the server"
    with pytest.raises(ToolError, match="not running"):
        box.call("echo__shout", {"text": "again"})


def test_entries_as_a_team_file_gives_them(echo_server: list[str]) -> None:
    line = " ".join(echo_server)
    assert external_server(line).name == "echo"
    assert external_server("npx -y @modelcontextprotocol/server-github").name == (
        "server-github")
    assert external_server("/opt/bin/srv --port 8").name == "srv"
    named = external_server({"name": "loud", "command": echo_server, "env": {"X": "1"}})
    assert (named.name, named.command, dict(named.env)) == ("loud", tuple(echo_server),
                                                            {"X": "1"})
    with ExternalTools.start([named]) as external:
        assert external.names() == ["loud__shout", "loud__fail"]
    for bad, match in (({"command": ""}, "empty"), ({"cmd": "x"}, "unknown key"),
                       ({"command": ["a", 1]}, "needs a command"),
                       ({"command": "a", "env": {"X": 1}}, "env")):
        with pytest.raises(ConfigError, match=match):
            external_server(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="share the name"):
        ExternalTools.start([echo_server, echo_server])


def test_a_server_that_cannot_start_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"'ghost'.*could not be started"):
        ExternalTools.start([{"name": "ghost", "command": [str(tmp_path / "nope")]}])


def test_a_server_that_never_answers_is_stopped(tmp_path: Path) -> None:
    silent = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    with pytest.raises(ConfigError, match=r"'mute'.*did not list its tools within 2s"):
        ExternalTools.start([{"name": "mute", "command": silent}], timeout=2.0)
    # no_leaks (conftest) fails the test if the silent process is still running


def test_names_cannot_shadow_the_agents_own(tmp_path: Path, echo_server: list[str]) -> None:
    script = Path(echo_server[1])
    clash = script.with_name("clash.py")
    clash.write_text(ECHO_SERVER.replace("def shout", "def read_file"))
    # Namespacing keeps them apart: clash__read_file is not read_file.
    with ExternalTools.start([[sys.executable, str(clash)]]) as external:
        box = Toolbox(MemoryPort("w1"), tmp_path, external=external)
        assert "clash__read_file" in [s.name for s in box.specs()]
        (tmp_path / "f.txt").write_text("mine")
        assert box.call("read_file", {"path": "f.txt"}) == "mine"
