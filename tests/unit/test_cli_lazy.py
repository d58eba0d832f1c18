"""A command imports only what it needs: ``porter-mesh node`` runs for days, and every
module the command line loads for the others (the dashboard's web server, the query
engine) would stay in its memory. Checked in fresh interpreters, since this test
process has long imported everything."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

#: Modules a bare node (``node --no-knowledge``) must not load.
HEAVY = ("aiohttp", "pyoxigraph", "rdflib", "porter_mesh.gateways")


def build_in_fresh_interpreter(command: str | None) -> tuple[list[str], list[str]]:
    """``build_parser(command)`` in a new process: (modules loaded, commands registered)."""
    script = ("import argparse, json, sys\n"
              "from porter_mesh.cli.main import build_parser\n"
              f"parser = build_parser({command!r})\n"
              "sub = next(a for a in parser._actions\n"
              "           if isinstance(a, argparse._SubParsersAction))\n"
              "print(json.dumps([sorted(sys.modules), sorted(sub.choices)]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    modules, commands = json.loads(done.stdout.splitlines()[-1])
    return modules, commands


def test_the_node_command_alone_leaves_the_heavy_modules_out() -> None:
    modules, _ = build_in_fresh_interpreter("node")
    heavy = [m for m in modules if m.split(".")[0] in HEAVY or m.startswith(HEAVY)]
    assert heavy == []
    assert "porter_mesh.cli.cmd_node" in modules
    assert "porter_mesh.cli.cmd_ui" not in modules


def test_a_node_with_its_shard_leaves_the_toolbox_and_tracing_out() -> None:
    """What `porter-mesh node` loads to run with its knowledge shard: the agent tools,
    the task tracing and OpenTelemetry are not among it (each node of a mesh would hold
    them in memory; measured, some 1.2 MB per node)."""
    script = ("import json, sys\n"
              "from porter_mesh.cli.main import build_parser\n"
              "build_parser('node')\n"
              "import porter_mesh.cli.cmd_node\n"
              "from porter_mesh.adapters.shard import Shard\n"
              "from porter_mesh.node.knowledge import Knowledge\n"
              "from porter_mesh.node.transcript import message_json\n"
              "print(json.dumps(sorted(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=True)
    modules = json.loads(done.stdout.splitlines()[-1])
    assert "porter_mesh.node.knowledge" in modules
    assert "porter_mesh.tools.port" in modules  # the query result type, and nothing more
    unwanted = ("opentelemetry", "porter_mesh.tracing", "porter_mesh.tools.toolbox",
                "porter_mesh.tools.external", "mcp")
    assert [m for m in modules if m.split(".")[0] in unwanted or m.startswith(unwanted)] == []


@pytest.mark.parametrize(("command", "expected"), [
    ("node", ["node"]),
    ("stats", ["stats"]),
    ("no-such-command", None),  # unknown: every command, so the error can list them
    (None, None),
])
def test_build_parser_registers_the_named_command_or_all(command: str | None,
                                                         expected: list[str] | None) -> None:
    _, got = build_in_fresh_interpreter(command)
    if expected is None:
        assert {"node", "stats", "ui", "tail", "remember"} <= set(got)
    else:
        assert got == expected


def test_options_before_the_command_still_find_it() -> None:
    from porter_mesh.cli.main import _command_named

    assert _command_named(["-v", "-v", "node", "--name", "x"]) == "node"
    assert _command_named(["--version"]) is None
    assert _command_named([]) is None


def test_an_unknown_command_is_a_user_error_naming_the_real_ones() -> None:
    done = subprocess.run([sys.executable, "-m", "porter_mesh.cli.main", "nod"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "node" in done.stderr and "Traceback" not in done.stderr


def test_help_of_one_command_is_complete() -> None:
    done = subprocess.run([sys.executable, "-m", "porter_mesh.cli.main", "node", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    for option in ("--name", "--no-knowledge", "--peer", "--heartbeat"):
        assert option in done.stdout
