"""Tools of external MCP servers, added to an agent's toolbox: :class:`ExternalTools`.

An agent's team entry may name MCP servers to run beside it (stdio commands, such as
``npx @modelcontextprotocol/server-github`` or ``python my_server.py``).
:meth:`ExternalTools.start` starts each one, lists its tools with the MCP SDK's client,
and keeps the sessions open; :class:`~porter_mesh.tools.toolbox.Toolbox` takes the
result as ``external=`` and offers the tools as ``<server>__<tool>`` (both parts cut
down to letters, digits, ``_`` and ``-``, so that the name is also a valid OpenAI
function name). A call is forwarded to the server as it is (the server checks its own
arguments) and its result becomes text for the model; a result the server marks as an
error becomes a :class:`~porter_mesh.errors.ToolError`.

The SDK is asynchronous and the toolbox is not: the sessions live on an event loop in
a daemon thread owned by :class:`ExternalTools` (as :class:`~porter_mesh.node.sync.SyncNode`
runs the node), and each call waits for its answer with a timeout. :meth:`close` ends
the sessions, which stops the server processes. The servers' standard error goes to
this process's standard error.

The SDK (``pip install 'porter-mesh[mcp]'``) is imported only when a server is started.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import re
import shlex
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import orjson

from porter_mesh import eventloop
from porter_mesh.errors import ConfigError, ToolError
from porter_mesh.tools.schemas import ToolSpec

if TYPE_CHECKING:
    from mcp import ClientSession

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_START_TIMEOUT",
    "ExternalServer",
    "ExternalTools",
    "external_server",
]

_log = logging.getLogger("porter_mesh.tools")

#: Seconds a server has to start and list its tools.
DEFAULT_START_TIMEOUT: Final = 30.0
#: Seconds one forwarded call may take.
DEFAULT_CALL_TIMEOUT: Final = 120.0
#: Characters of a forwarded result kept for the model.
RESULT_LIMIT: Final = 64 * 1024

_SEPARATOR: Final = "__"
#: Seconds a cancelled server task has to stop its process.
_CANCEL_WAIT: Final = 10.0
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_-]+")
_NAME_LIMIT: Final = 64


def _safe(text: str) -> str:
    return _UNSAFE.sub("_", text).strip("_") or "tool"


@dataclass(frozen=True, slots=True)
class ExternalServer:
    """One MCP server to run over stdio.

    Attributes:
        name: the prefix of its tools' names.
        command: the program and its arguments.
        env: extra environment variables for it (merged over the SDK's safe default
            environment: ``HOME``, ``PATH``, ``USER``...).
        cwd: its working directory (default: this process's).
    """

    name: str
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None


def external_server(entry: str | Sequence[str] | Mapping[str, Any] | ExternalServer
                    ) -> ExternalServer:
    """An :class:`ExternalServer` from a team-file entry.

    Args:
        entry: a command line (``"python srv.py --flag"``, split as a shell would), an
            argument list, a mapping ``{"name", "command", "env", "cwd"}`` (``command`` a
            string or a list), or an :class:`ExternalServer`. Without a name, the
            program's file name is used (for ``python``, ``node``, ``npx``, ``uvx``...,
            the file name of what they run, without its extension).

    Raises:
        ConfigError: the entry has no command or is of the wrong shape.
    """
    if isinstance(entry, ExternalServer):
        return entry
    name: str | None = None
    env: Mapping[str, str] = {}
    cwd: str | None = None
    if isinstance(entry, Mapping):
        unknown = set(entry) - {"name", "command", "env", "cwd"}
        if unknown:
            raise ConfigError(f"MCP server entry: unknown key(s) {', '.join(sorted(unknown))}; "
                              "the keys are name, command, env, cwd")
        name = entry.get("name")
        command: Any = entry.get("command")
        env = entry.get("env") or {}
        cwd = entry.get("cwd")
        if not isinstance(env, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ConfigError("MCP server entry: 'env' must map names to strings")
        if cwd is not None and not isinstance(cwd, str | os.PathLike):
            raise ConfigError("MCP server entry: 'cwd' must be a directory path")
    else:
        command = entry
    if isinstance(command, str):
        try:
            argv = tuple(shlex.split(command))
        except ValueError as exc:
            raise ConfigError(f"MCP server command {command!r}: {exc}") from None
    elif isinstance(command, Sequence) and all(isinstance(a, str) for a in command):
        argv = tuple(command)
    else:
        raise ConfigError("an MCP server needs a command: a command line or a list of "
                          "arguments")
    if not argv:
        raise ConfigError("an MCP server's command is empty; give the program to run")
    if name is None:
        name = _default_name(argv)
    if not isinstance(name, str) or not name.strip():
        raise ConfigError("MCP server entry: 'name' must be a non-empty string")
    return ExternalServer(_safe(name), argv, dict(env), None if cwd is None else os.fspath(cwd))


#: Programs that run another one: the server's name comes from what they run.
_LAUNCHERS: Final = frozenset({
    "python", "python3", "node", "npx", "uv", "uvx", "pipx", "deno", "bun", "bunx", "sh",
    "bash", "docker", "podman",
})
_LAUNCHER_VERBS: Final = frozenset({"run", "x", "exec", "tool", "dlx"})


def _default_name(argv: Sequence[str]) -> str:
    """``srv`` for ``srv --x``, ``my_server`` for ``python my_server.py``,
    ``server-github`` for ``npx -y @modelcontextprotocol/server-github``."""
    program = os.path.basename(argv[0])
    if program.rstrip("0123456789.") in _LAUNCHERS or program in _LAUNCHERS:
        for arg in argv[1:]:
            if not arg.startswith("-") and arg not in _LAUNCHER_VERBS:
                program = arg.rstrip("/").rsplit("/", 1)[-1]
                break
    stem, ext = os.path.splitext(program)
    return stem if ext in (".py", ".js", ".mjs", ".ts", ".sh", ".exe") else program


@dataclass(frozen=True, slots=True)
class _Route:
    server: str
    tool: str


def result_text(result: Any) -> str:
    """A ``CallToolResult`` as text for the model: its text blocks, other blocks named,
    the structured content as JSON when there is no text."""
    parts: list[str] = []
    for block in result.content or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource_link":
            parts.append(f"[resource: {block.uri}]")
        elif kind == "resource":
            inner = block.resource
            text = getattr(inner, "text", None)
            parts.append(text if text is not None else f"[resource: {inner.uri}]")
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {getattr(block, 'mime_type', '') or 'binary'}]")
        else:
            parts.append(f"[{kind or 'content'}]")
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(orjson.dumps(structured).decode())
    text = "\n".join(parts) if parts else "(no output)"
    if len(text) > RESULT_LIMIT:
        text = text[:RESULT_LIMIT] + f"\n[... cut at {RESULT_LIMIT} characters]"
    return text


class ExternalTools:
    """The tools of running external MCP servers (see the module docstring).

    Build it with :meth:`start`; close it with :meth:`close` (or ``with``).

    Args:
        call_timeout: seconds one forwarded call may take.
    """

    def __init__(self, *, call_timeout: float = DEFAULT_CALL_TIMEOUT) -> None:
        self.call_timeout = call_timeout
        self._loop = eventloop.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="porter-mesh-mcp-clients",
                                        daemon=True)
        self._thread.start()
        self._stop: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._starting: dict[str, asyncio.Task[None]] = {}
        self._sessions: dict[str, ClientSession] = {}
        self._specs: dict[str, ToolSpec] = {}
        self._routes: dict[str, _Route] = {}
        self._closed = False

    @classmethod
    def start(
        cls,
        servers: Iterable[str | Sequence[str] | Mapping[str, Any] | ExternalServer],
        *,
        timeout: float = DEFAULT_START_TIMEOUT,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> ExternalTools:
        """Start the servers and list their tools.

        Args:
            servers: entries as :func:`external_server` takes them.
            timeout: seconds each server has to start and list its tools.
            call_timeout: seconds one forwarded call may take.

        Returns:
            The running tools; the caller closes them.

        Raises:
            ConfigError: an entry is malformed, two servers share a name, a server
                cannot be started or does not answer in time (the others are stopped).
            ImportError: the MCP SDK is not installed.
        """
        entries = [external_server(s) for s in servers]
        names = [e.name for e in entries]
        doubles = sorted({n for n in names if names.count(n) > 1})
        if doubles:
            raise ConfigError(f"MCP servers share the name(s) {', '.join(doubles)}; give "
                              "each a distinct 'name'")
        import mcp  # noqa: F401  (fail here, with the SDK's own message, when missing)

        tools = cls(call_timeout=call_timeout)
        try:
            for entry in entries:
                tools._start_one(entry, timeout)
        except BaseException:
            tools.close()
            raise
        return tools

    # -- the toolbox's interface ---------------------------------------------------------

    def names(self) -> list[str]:
        """The namespaced tool names."""
        return list(self._specs)

    def specs(self) -> list[ToolSpec]:
        """The tools, as the toolbox describes them to a model."""
        return list(self._specs.values())

    def call(self, name: str, arguments: Mapping[str, Any] | None) -> str:
        """Forward one call to its server.

        Raises:
            ToolError: unknown tool, arguments not an object, the server reported an
                error, did not answer in time, or is gone.
        """
        route = self._routes.get(name)
        if route is None:
            raise ToolError(f"unknown tool {name!r}; the external tools are: "
                            f"{', '.join(self._specs) or 'none'}")
        if arguments is not None and not isinstance(arguments, Mapping):
            raise ToolError(f"{name}: arguments must be a JSON object")
        session = self._sessions.get(route.server)
        if session is None or self._closed:
            raise ToolError(f"{name}: the MCP server {route.server!r} is not running")
        args = dict(arguments or {})
        future = asyncio.run_coroutine_threadsafe(session.call_tool(route.tool, args),
                                                  self._loop)
        try:
            result = future.result(self.call_timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ToolError(f"{name}: the MCP server {route.server!r} did not answer within "
                            f"{self.call_timeout:g}s; try again or do without it") from None
        except Exception as exc:
            raise ToolError(f"{name}: the MCP server {route.server!r} failed: "
                            f"{type(exc).__name__}: {exc}") from exc
        text = result_text(result)
        if result.is_error:
            raise ToolError(f"{name}: {text}")
        return text

    # -- life cycle ------------------------------------------------------------------------

    def close(self, timeout: float = 10.0) -> None:
        """End the sessions (which stops the servers) and the loop thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._tasks:
            done = asyncio.run_coroutine_threadsafe(self._shutdown(timeout), self._loop)
            try:
                done.result(timeout + _CANCEL_WAIT + 1.0)
            except concurrent.futures.TimeoutError:
                _log.warning("MCP servers still stopping after %.0fs", timeout + _CANCEL_WAIT)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)

    async def _shutdown(self, timeout: float) -> None:
        """Let each session end (which stops its server); cancel the ones that do not
        within ``timeout`` (a server still starting), and wait for them too."""
        if self._stop is not None:
            self._stop.set()
        for name, task in self._starting.items():
            if name not in self._sessions:  # still starting: nothing to end gracefully
                task.cancel()
        _, pending = await asyncio.wait(self._tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=_CANCEL_WAIT)

    def __enter__(self) -> ExternalTools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()
        self._loop.close()

    def _start_one(self, entry: ExternalServer, timeout: float) -> None:
        ready: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()

        async def spawn() -> None:
            if self._stop is None:
                self._stop = asyncio.Event()
            task = asyncio.ensure_future(self._serve(entry, ready, self._stop))
            self._tasks.append(task)
            self._starting[entry.name] = task

        asyncio.run_coroutine_threadsafe(spawn(), self._loop).result(timeout)
        shown = shlex.join(entry.command)
        try:
            listed = ready.result(timeout)
        except concurrent.futures.TimeoutError:
            raise ConfigError(f"MCP server {entry.name!r} ({shown}) did not list its tools "
                              f"within {timeout:g}s; check that it speaks MCP over stdio"
                              ) from None
        except Exception as exc:
            raise ConfigError(f"MCP server {entry.name!r} ({shown}) could not be started: "
                              f"{type(exc).__name__}: {exc}") from None
        for tool in listed:
            self._add(entry.name, tool)

    def _add(self, server: str, tool: Any) -> None:
        name = f"{server}{_SEPARATOR}{_safe(tool.name)}"[:_NAME_LIMIT]
        if name in self._specs:
            raise ConfigError(f"MCP server {server!r}: two tools map to the name {name!r}")
        hints = tool.annotations
        schema = dict(tool.input_schema or {"type": "object", "properties": {}})
        self._specs[name] = ToolSpec(
            name,
            (tool.description or tool.title or f"{tool.name} (from MCP server {server})"),
            schema,
            destructive=bool(hints is None or hints.destructive_hint in (None, True))
            and not bool(hints is not None and hints.read_only_hint),
            read_only=bool(hints is not None and hints.read_only_hint),
            idempotent=bool(hints is not None and hints.idempotent_hint),
            open_world=bool(hints is None or hints.open_world_hint in (None, True)),
            group="external",
        )
        self._routes[name] = _Route(server, tool.name)

    async def _serve(self, entry: ExternalServer,
                     ready: concurrent.futures.Future[list[Any]], stop: asyncio.Event) -> None:
        """Run one server's session until :meth:`close` (a task of its own, since the
        SDK's contexts must be left by the task that entered them)."""
        from mcp import ClientSession, StdioServerParameters, stdio_client

        params = StdioServerParameters(command=entry.command[0], args=list(entry.command[1:]),
                                       env=dict(entry.env) or None, cwd=entry.cwd)
        try:
            async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
                await session.initialize()
                listed: list[Any] = []
                cursor: str | None = None
                while True:
                    page = await session.list_tools(
                        params=None if cursor is None else _page(cursor))
                    listed.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                self._sessions[entry.name] = session
                ready.set_result(listed)
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception)
                                    else RuntimeError("stopped while starting"))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._sessions.pop(entry.name, None)


def _page(cursor: str) -> Any:
    from mcp import types

    return types.PaginatedRequestParams(cursor=cursor)
