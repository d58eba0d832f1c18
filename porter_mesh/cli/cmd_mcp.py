"""``porter-mesh mcp``: serve MCP over stdio, so that an MCP host joins the mesh as an agent.

The host (an assistant, an IDE) starts this command as a stdio MCP server; for the
server's lifetime the host is agent ``--name`` on the mesh, with the role's tools (see
:mod:`porter_mesh.gateways.mcp`). Standard output carries MCP's JSON-RPC only; logs
and errors go to standard error. ``--mcp-server`` adds the tools of other stdio MCP
servers (named ``<server>__<tool>``).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import sys
from typing import Any

from porter_mesh.cli.common import (
    add_mesh_options,
    agent_name,
    count,
    install_command,
    node_config,
    seconds,
)
from porter_mesh.entrypoint import add_data_options, data_dir_of
from porter_mesh.gateways.mcp.mesh import DEFAULT_RECENT, DEFAULT_SETTLE, GatewayAgent
from porter_mesh.tools.schemas import ROLE_TOOLS

#: What the node advertises for each role (as ``porter-mesh agent`` does).
_CAPABILITIES = {"architect": (), "worker": ("bash", "files", "git"),
                 "reviewer": ("bash", "read_file")}


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "mcp", help="an MCP server over stdio: an MCP host joins the mesh as an agent",
        description="Serve the Model Context Protocol over stdin/stdout. The MCP host "
        "that starts this command is agent NAME on the mesh while it runs, with the "
        "role's tools, the roster and recent messages as resources. See docs/mcp.md.")
    parser.add_argument("--name", required=True, type=agent_name,
                        help="agent name, unique on the mesh")
    parser.add_argument("--role", choices=sorted(ROLE_TOOLS), default="worker",
                        help="the role, which picks the tools (default %(default)s)")
    parser.add_argument("--workspace", type=pathlib.Path, default=pathlib.Path("."),
                        help="directory the file, shell and git tools are confined to "
                        "(created if missing; default: the current directory)")
    parser.add_argument("--wait", type=seconds, default=DEFAULT_SETTLE, metavar="SECONDS",
                        help="how long after start a first message waits for the mesh "
                        "to be found (default %(default)s)")
    parser.add_argument("--recent", type=count, default=DEFAULT_RECENT, metavar="N",
                        help="messages kept for the mesh://messages resource (default "
                        "%(default)s)")
    parser.add_argument("--mcp-server", action="append", dest="mcp_servers", default=[],
                        metavar="COMMAND",
                        help="also offer the tools of this stdio MCP server (a command "
                        "line; repeatable)")
    add_data_options(parser)
    add_mesh_options(parser)
    parser.set_defaults(func=main)


def _usage(message: str) -> int:
    print(f"porter-mesh mcp: {message}", file=sys.stderr)
    return 2


class _StdoutToStderr:
    """Point file descriptor 1 at standard error while the node starts, so nothing
    started now can write to the host's JSON-RPC stream."""

    def __enter__(self) -> None:
        sys.stdout.flush()
        self._saved = os.dup(1)
        os.dup2(2, 1)

    def __exit__(self, *exc: object) -> None:
        sys.stdout.flush()
        os.dup2(self._saved, 1)
        os.close(self._saved)


def main(args: argparse.Namespace) -> int:
    try:
        from porter_mesh.gateways.mcp.server import McpGateway, seal_descriptors
    except ImportError as exc:
        return _usage(f"the MCP SDK is missing ({exc}); install it with: "
                      f"{install_command('mcp')}")
    # Before anything is started: no command may open the JSON-RPC pipes through /proc.
    seal_descriptors()
    if args.recent < 1:
        return _usage("--recent must be at least 1")
    workspace: pathlib.Path | None = None
    if args.role != "architect":
        workspace = args.workspace.resolve()
        try:
            workspace.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return _usage(f"cannot use the workspace {workspace}: {exc.strerror or exc}")
    config = node_config(
        args, name=args.name, role=args.role,
        data_dir=data_dir_of(args), slots=1 if args.role == "worker" else 0,
        tools=_CAPABILITIES[args.role],
    )
    config.check_protected()
    external = None
    with _StdoutToStderr():
        if args.mcp_servers:
            from porter_mesh.tools.external import ExternalTools

            external = ExternalTools.start(args.mcp_servers)
        try:
            agent = GatewayAgent(config, workspace=workspace, knowledge=not args.no_knowledge,
                                 settle=args.wait, recent=args.recent, external=external)
        except BaseException:
            if external is not None:
                external.close()
            raise
    print(f"porter-mesh mcp: {agent.name} ({agent.role}) on mesh {config.mesh!r}, "
          f"pub {agent.node.node.pub_port}, router {agent.node.node.router_port}; serving "
          "MCP on stdio", file=sys.stderr, flush=True)
    try:
        import anyio

        anyio.run(_serve, McpGateway(agent))
    finally:
        agent.close()
    return 0


async def _serve(gateway: Any) -> None:
    """Serve stdio until the host closes it or SIGINT/SIGTERM arrives."""
    import anyio
    import anyio.to_thread
    from mcp.server.stdio import stdio_server

    async def announce() -> None:
        try:
            await anyio.to_thread.run_sync(gateway.agent.announce, abandon_on_cancel=True)
        except Exception as exc:  # the mesh may be empty: not worth failing over
            print(f"porter-mesh mcp: could not announce on log: {exc}", file=sys.stderr)

    async def on_signal(scope: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                scope.cancel()
                return

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(on_signal, tasks.cancel_scope)
        tasks.start_soon(announce)
        async with stdio_server() as (read_stream, write_stream):
            await gateway.serve(read_stream, write_stream)
        tasks.cancel_scope.cancel()

