"""The MCP side: a low-level MCP SDK server over a :class:`~.mesh.GatewayAgent`.

What the host sees
------------------
* **tools**: the agent's toolbox (its role's tools, ``peers``, and any external MCP
  servers' tools), listed from the same specs as ``porter-mesh tools --format mcp``,
  with annotations saying what each does. A call runs the toolbox in a worker thread
  (one call at a time, as in an agent's own loop); a
  :class:`~porter_mesh.errors.ToolError` becomes a result with ``isError: true`` and
  the message for the model. A call the host cancels stops the command it was running.
* **resources**: ``mesh://roster`` (this agent and its peers) and ``mesh://messages``
  (the recent messages, newest last), both JSON. A host that subscribes to one
  (``resources/subscribe``, or ``subscriptions/listen`` on the 2026 protocol) gets
  ``notifications/resources/updated`` when it changes: a message arrived, a peer came,
  went or changed state.
* **instructions**: the profile's messaging section and who this agent is.

Nothing but JSON-RPC is written to standard output: the SDK's stdio transport points
file descriptor 1 at standard error while it serves, and the node starts only after
that, so neither a stray ``print`` nor a child process can corrupt the stream. Logs go
to standard error.

A command the host's model runs (``bash``) could still reach the stream another way:
through ``/proc/<server pid>/fd/N``, which opens the server's own pipes anew, for
writing too, to any process of the same user. :func:`seal_descriptors` closes that way:
it marks the server not "dumpable" (``prctl(PR_SET_DUMPABLE, 0)``), after which the
kernel lets only processes with ``CAP_SYS_PTRACE`` (root) open the server's ``/proc``
entries. Children are not affected (``execve`` makes each dumpable again), so the tools'
own bookkeeping of the commands they start works as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any, Final

import anyio
import anyio.to_thread
import mcp_types as types
import orjson
from mcp.server.lowlevel import Server
from mcp.server.session import ServerSession
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ResourceUpdated
from mcp.shared.exceptions import MCPError

from porter_mesh import __version__
from porter_mesh.core.tracecontext import TraceContext, valid_traceparent, valid_tracestate
from porter_mesh.errors import PorterError, ToolError
from porter_mesh.gateways.mcp.mesh import MESSAGES, ROSTER, GatewayAgent
from porter_mesh.tools.prompt import MESSAGING_SECTION
from porter_mesh.tools.schemas import to_mcp

__all__ = ["RESOURCE_URIS", "McpGateway", "seal_descriptors"]

_log = logging.getLogger("porter_mesh.gateways.mcp")

#: The resources, by the name the agent's listeners use.
RESOURCE_URIS: Final = {ROSTER: "mesh://roster", MESSAGES: "mesh://messages"}

_DESCRIPTIONS: Final = {
    ROSTER: "This agent and the agents on the mesh now: name, role, state "
            "(alive/evasive), draining.",
    MESSAGES: "The messages this agent received recently, oldest first (read_messages "
              "drains the inbox; this list is not drained).",
}

#: JSON-RPC error code for an unknown resource (the MCP specification's).
RESOURCE_NOT_FOUND: Final = -32002
#: ``prctl`` option (``<linux/prctl.h>``).
_PR_SET_DUMPABLE: Final = 4


def seal_descriptors() -> bool:
    """Make this process's descriptors unreachable through ``/proc`` by other processes
    of the same user, so that no command the server runs can open its JSON-RPC pipes.

    Root (``CAP_SYS_PTRACE``) can still open them: see ``docs/mcp.md``. Core dumps of
    the server are disabled as a side effect.

    Returns:
        True when the process is sealed; False where ``prctl`` is unavailable (not
        Linux) or refused, which is logged once as a warning.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        failed = libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0
        error = os.strerror(ctypes.get_errno()) if failed else ""
    except (OSError, AttributeError) as exc:  # no libc prctl: not Linux
        failed, error = True, str(exc)
    if failed:
        _log.warning("cannot seal the MCP server's descriptors (prctl(PR_SET_DUMPABLE): "
                     "%s): a command it runs as the same user can write into its JSON-RPC "
                     "stream through /proc", error)
    return not failed


def instructions(agent: GatewayAgent) -> str:
    """The server's instructions: the messaging section and who the agent is."""
    return (
        f"{MESSAGING_SECTION}\n\n## Team\nYou are {agent.name} ({agent.role}) on the "
        f"porter-mesh mesh {agent.node.node.config.mesh!r}. Call peers (or read "
        f"{RESOURCE_URIS[ROSTER]}) for the live team. Messages from porter-ui come from "
        "the human user running the team; their instructions come first."
    )


class McpGateway:
    """Serve one :class:`GatewayAgent` to an MCP host.

    Args:
        agent: the agent (the gateway does not close it).
    """

    def __init__(self, agent: GatewayAgent) -> None:
        self.agent = agent
        self._call_lock = threading.Lock()
        self._subscribed: dict[str, set[ServerSession]] = {u: set() for u in
                                                          RESOURCE_URIS.values()}
        self._bus = InMemorySubscriptionBus()
        self._listen = ListenHandler(self._bus)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._dirty: set[str] = set()
        self._wake: asyncio.Event | None = None
        self.server: Server[Any] = Server(
            "porter-mesh",
            version=__version__,
            title=f"porter-mesh agent {agent.name}",
            instructions=instructions(agent),
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
            on_list_resources=self._list_resources,
            on_read_resource=self._read_resource,
            on_subscribe_resource=self._subscribe,
            on_unsubscribe_resource=self._unsubscribe,
            on_subscriptions_listen=self._listen,
        )

    async def serve(self, read_stream: Any, write_stream: Any) -> None:
        """Serve one connection until its read side closes."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self.agent.add_listener(self._on_change)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._notify_loop)
            try:
                await self.server.run(read_stream, write_stream,
                                      self.server.create_initialization_options())
            finally:
                self._listen.close()
                tasks.cancel_scope.cancel()

    # -- tools -----------------------------------------------------------------------------

    async def _list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None
                          ) -> types.ListToolsResult:
        listed = to_mcp(self.agent.toolbox.specs())["tools"]
        return types.ListToolsResult(tools=[types.Tool.model_validate(t) for t in listed])

    def _run_tool(self, name: str, arguments: Mapping[str, Any] | None) -> str:
        with self._call_lock:
            return self.agent.toolbox.call(name, arguments)

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams
                         ) -> types.CallToolResult:
        # W3C trace context in the request's _meta (as OpenTelemetry's MCP conventions
        # carry it): a task the host creates with this call joins the host's trace. The
        # MCP SDK's own instrumentation may also make it the current context; this does
        # not depend on that.
        trace = _trace_of_meta(params.meta)
        if trace is not None:
            self.agent.traces.adopt(trace)
        try:
            text = await anyio.to_thread.run_sync(self._run_tool, params.name,
                                                  params.arguments, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            # The host gave up on this call: stop what it runs (the worker thread then
            # returns on its own and releases the lock).
            self.agent.toolbox.interrupt()
            raise
        except ToolError as exc:
            return _text_result(str(exc), error=True)
        except PorterError as exc:
            return _text_result(f"{params.name}: {exc}", error=True)
        except Exception as exc:
            _log.exception("tool %s failed", params.name)
            return _text_result(f"{params.name}: internal error ({type(exc).__name__}: "
                                f"{exc}); try another way, and tell the team on 'log'",
                                error=True)
        return _text_result(text, error=False)

    # -- resources -------------------------------------------------------------------------

    async def _list_resources(self, ctx: Any, params: types.PaginatedRequestParams | None
                              ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[
            types.Resource(uri=uri, name=name, description=_DESCRIPTIONS[name],
                           mime_type="application/json")
            for name, uri in RESOURCE_URIS.items()])

    async def _read_resource(self, ctx: Any, params: types.ReadResourceRequestParams
                             ) -> types.ReadResourceResult:
        uri = str(params.uri)
        if uri == RESOURCE_URIS[ROSTER]:
            data: Any = await anyio.to_thread.run_sync(self.agent.roster)
        elif uri == RESOURCE_URIS[MESSAGES]:
            data = {"messages": self.agent.recent()}
        else:
            raise MCPError(RESOURCE_NOT_FOUND, f"no resource {uri!r}; the resources are "
                           f"{', '.join(RESOURCE_URIS.values())}")
        text = orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()
        return types.ReadResourceResult(contents=[
            types.TextResourceContents(uri=uri, mime_type="application/json", text=text)])

    def _known(self, uri: str) -> str:
        if uri not in self._subscribed:
            raise MCPError(RESOURCE_NOT_FOUND, f"no resource {uri!r}; the resources are "
                           f"{', '.join(RESOURCE_URIS.values())}")
        return uri

    async def _subscribe(self, ctx: Any, params: types.SubscribeRequestParams
                         ) -> types.EmptyResult:
        self._subscribed[self._known(str(params.uri))].add(ctx.session)
        return types.EmptyResult()

    async def _unsubscribe(self, ctx: Any, params: types.UnsubscribeRequestParams
                           ) -> types.EmptyResult:
        self._subscribed[self._known(str(params.uri))].discard(ctx.session)
        return types.EmptyResult()

    def _on_change(self, resource: str) -> None:
        """On the node's thread: mark the resource changed and wake the notifier."""
        loop, wake = self._loop, self._wake
        if loop is None or wake is None or loop.is_closed():
            return
        uri = RESOURCE_URIS[resource]

        def mark() -> None:
            self._dirty.add(uri)
            wake.set()

        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(mark)

    async def _notify_loop(self) -> None:
        """Send ``notifications/resources/updated`` for what changed (a burst of
        messages becomes one notification per resource)."""
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            dirty, self._dirty = self._dirty, set()
            for uri in sorted(dirty):
                await self._bus.publish(ResourceUpdated(uri=uri))
                for session in tuple(self._subscribed[uri]):
                    try:
                        await session.send_resource_updated(uri)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        self._subscribed[uri].discard(session)


def _trace_of_meta(meta: Any) -> TraceContext | None:
    """The ``traceparent``/``tracestate`` of an MCP request's ``_meta``, if valid."""
    if meta is None:
        return None
    fields = meta.model_dump() if hasattr(meta, "model_dump") else dict(meta)
    traceparent = fields.get("traceparent")
    if not valid_traceparent(traceparent):
        return None
    tracestate = fields.get("tracestate")
    return TraceContext(str(traceparent),
                        str(tracestate) if valid_tracestate(tracestate) else None)


def _text_result(text: str, *, error: bool) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                is_error=error)
