"""An agent process: one node, its knowledge shard, its tools, and a brain.

``porter-mesh agent ROLE --name N`` runs :func:`main`. The process joins the mesh,
works until its brain finishes, a ``halt`` arrives, or SIGINT/SIGTERM, then leaves the
mesh gracefully. ``drain`` makes the tools refuse new tasks; ``halt`` stops a running
command at once and ends the agent. Every delivered message is also shown to the tools
as it arrives, so that a withdrawal of the task being worked on (the architect re-offered
it elsewhere) stops that attempt at once, even in the middle of a command.

Every agent keeps a knowledge shard (``--no-knowledge`` to run without one) and its
delivery journal in its data directory: ``--data-dir``, else ``<data root>/<mesh>/<name>``
(see :func:`porter_mesh.node.config.data_root`), locked while the agent runs.

What the brain did is part of the node's view (section ``agent``: for an LLM brain its
model calls, tokens in and out, tool calls, errors and retries), so ``porter-mesh stats
AGENT`` shows it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from agents.context import AgentContext, Brain, TappedPort
from porter_mesh.core import constants as C
from porter_mesh.core.as2 import Activity
from porter_mesh.core.tracecontext import TraceContext, valid_traceparent
from porter_mesh.entrypoint import (
    EXIT_INTERRUPTED,
    add_data_options,
    data_dir_of,
    report_error,
    traceparent_arg,
)
from porter_mesh.errors import ConfigError, OperationTimeout, PorterError
from porter_mesh.node.cancel import LEDGER_FILE, watch_tasks
from porter_mesh.node.config import knowledge_dir
from porter_mesh.node.knowledge import Knowledge, SyncKnowledge, attach_knowledge
from porter_mesh.node.node import Node
from porter_mesh.node.port import NodePort
from porter_mesh.node.sync import SyncNode
from porter_mesh.tools.external import ExternalTools
from porter_mesh.tools.ledger import TaskLedger
from porter_mesh.tools.toolbox import Toolbox
from porter_mesh.tracing.export import start_metrics, start_tracing
from porter_mesh.tracing.tasks import TaskTracer
from porter_mesh.tracing.views import serve_spans

ROLES = ("architect", "worker", "reviewer")
#: Channels an agent may subscribe to (``--subscribe``); ``control`` and its own inbox
#: are always subscribed.
CHANNELS = (C.CHANNEL_LOG, C.CHANNEL_TASK, C.CHANNEL_REVIEW)
#: Where an LLM agent reads its API key unless ``--api-key-env`` names another variable.
DEFAULT_API_KEY_ENV = "PORTER_MESH_LLM_API_KEY"


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 2:
        raise argparse.ArgumentTypeError(f"{text!r} is not a temperature from 0 to 2")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def _tool_names(text: str) -> tuple[str, ...]:
    from porter_mesh.tools.schemas import ALL_TOOLS

    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in ALL_TOOLS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown tool(s) {', '.join(unknown) or '(none given)'}; known tools: "
            f"{', '.join(ALL_TOOLS)}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``porter-mesh agent``."""
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("--name", required=True, help="agent name, unique on the mesh")
    parser.add_argument("--mesh", default=os.environ.get("PORTER_MESH", C.DEFAULT_MESH))
    parser.add_argument("--interface", action="append", dest="interfaces", metavar="IP")
    parser.add_argument("--peer", action="append", dest="peers", default=[],
                        metavar="HOST:PORT")
    parser.add_argument("--workspace", type=pathlib.Path, default=pathlib.Path("."),
                        help="directory the agent's file and shell tools are confined to")
    add_data_options(parser)
    parser.add_argument("--brain", choices=("scripted", "llm"), default="scripted")
    parser.add_argument("--llm-url", help="OpenAI-compatible endpoint, e.g. "
                        "http://127.0.0.1:8000/v1")
    parser.add_argument("--model", default="default", help="model name for --brain llm")
    parser.add_argument("--goal", help="for --brain llm: the first instruction (e.g. the "
                        "architect's task)")
    parser.add_argument("--linger", action="store_true",
                        help="when the brain is done, stay on the mesh (answering stats and "
                        "trace requests) until halted or SIGTERM")
    parser.add_argument("--traceparent", type=traceparent_arg, metavar="TRACEPARENT",
                        help="W3C trace context to continue: the task this agent creates "
                        "first joins that trace (default: a new trace per task)")
    parser.add_argument("--api-key-env", default=DEFAULT_API_KEY_ENV, metavar="VAR",
                        help="for --brain llm: the environment variable holding the API "
                        "key (default %(default)s; unset: no key is sent)")
    parser.add_argument("--temperature", type=_temperature, metavar="T",
                        help="for --brain llm: sampling temperature, 0 to 2 (default: "
                        "the server's)")
    parser.add_argument("--max-tokens", type=_positive, default=4096, metavar="N",
                        help="for --brain llm: the most tokens of one answer (default "
                        "%(default)s)")
    parser.add_argument("--max-steps", type=_positive, default=50, metavar="N",
                        help="for --brain llm: model calls in all before the agent stops "
                        "(default %(default)s)")
    parser.add_argument("--idle-timeout", type=float, default=300.0, metavar="SECONDS",
                        help="for --brain llm: stop after this long with nothing to do "
                        "(default %(default)s; 0: never)")
    prompt = parser.add_mutually_exclusive_group()
    prompt.add_argument("--system-prompt", metavar="TEXT",
                        help="for --brain llm: what the agent is for, instead of its "
                        "role's description")
    prompt.add_argument("--system-prompt-file", type=pathlib.Path, metavar="FILE",
                        help="the same, read from FILE")
    parser.add_argument("--tools", type=_tool_names, metavar="NAME[,NAME]",
                        help="the agent's tools (default: its role's)")
    parser.add_argument("--mcp-server", action="append", dest="mcp_servers", default=[],
                        metavar="COMMAND", help="add the tools of this stdio MCP server to "
                        "the agent's (a command line; repeatable)")
    parser.add_argument("--subscribe", action="append", choices=CHANNELS,
                        metavar="CHANNEL", help="a channel to hear (repeatable; default: "
                        f"{', '.join(CHANNELS)})")
    parser.add_argument("--slots", type=int, default=1, help="tasks a worker holds at once")
    parser.add_argument("--workers", type=int, default=2,
                        help="architect: workers to wait for before offering")
    parser.add_argument("--reviewer", default="reviewer", help="the reviewer's agent name")
    parser.add_argument("--offer-timeout", type=float, default=300.0)
    parser.add_argument("--task-timeout", type=float, default=60.0)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    parser.add_argument("--evasive-after", type=float, default=3.0)
    parser.add_argument("--expire-after", type=float, default=10.0)
    parser.add_argument("--insecure", action="store_true",
                        help="allow binding beyond loopback without keys (see "
                        "docs/security.md)")
    parser.add_argument("--wait-go", action="store_true",
                        help="architect: wait for a 'go' control message before offering")
    parser.add_argument("--fail-after", choices=("accept",),
                        help="fault injection for tests: a worker kills itself (SIGKILL) "
                        "right after accepting a task")
    parser.add_argument("--work-command", metavar="CMD",
                        help="for tests: a shell command a worker runs (bash tool) first "
                        "on every task it accepts, e.g. a long one to pause it in")
    parser.add_argument("--serve", action="store_true",
                        help="architect: no story; delegate each task the human offers "
                        "to a worker as a sub-task, until stopped")
    parser.add_argument("--delegate-to", metavar="AGENT",
                        help="worker: offer AGENT a sub-task of every task it accepts")
    parser.add_argument("--ask", metavar="QUESTION",
                        help="worker: ask the requester QUESTION on every task it accepts "
                        "and wait for the answer before working on")
    parser.add_argument("--withdraw-timeout", type=float, default=600.0,
                        help="architect: seconds a withdrawal sent to a paused or gone "
                        "worker keeps being retried")


def _knowledge(node: SyncNode, data_dir: pathlib.Path | None) -> SyncKnowledge | None:
    if data_dir is None:
        return None
    return attach_knowledge(node, knowledge_dir(data_dir))


def system_prompt(args: argparse.Namespace) -> str | None:
    """The agent's own system prompt, if the options give one.

    Raises:
        ConfigError: the prompt file cannot be read.
    """
    if args.system_prompt_file is None:
        text: str | None = args.system_prompt
        return text
    try:
        return pathlib.Path(args.system_prompt_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read --system-prompt-file {args.system_prompt_file}: "
                          f"{getattr(exc, 'strerror', None) or exc}") from None


def make_brain(args: argparse.Namespace) -> Brain:
    """The brain the options ask for."""
    if args.brain == "llm":
        if not args.llm_url:
            raise ConfigError("--brain llm needs --llm-url (an OpenAI-compatible endpoint, "
                              "e.g. http://127.0.0.1:8000/v1)")
        from agents.llm import LLMBrain

        # The key comes from the environment only when asked for an LLM brain, and only
        # goes to the endpoint the operator named.
        return LLMBrain(url=args.llm_url, model=args.model,
                        api_key=os.environ.get(args.api_key_env) or None,
                        temperature=args.temperature, max_tokens=args.max_tokens,
                        max_steps=args.max_steps,
                        idle_timeout=args.idle_timeout or None)
    from agents.scripted import BRAINS

    brain: Brain = BRAINS[args.role]()
    return brain


def run(args: argparse.Namespace) -> int:
    """Run one agent until its brain finishes or it is told to stop."""
    workspace = args.workspace.resolve()
    workspace.mkdir(parents=True, exist_ok=True)
    tools = {"architect": (), "worker": ("bash", "files"), "reviewer": ("bash", "read_file")}
    extra: dict[str, Any] = {"insecure": True} if args.insecure else {}
    data_dir = data_dir_of(args)
    prompt = system_prompt(args)
    brain = make_brain(args)  # a bad setting fails here, before the agent joins
    if args.subscribe:
        extra["channels"] = tuple(dict.fromkeys(args.subscribe))
    # Tracing before the node: a command's seat may hand this agent its spans
    # (spans-keep) as soon as it is reached, and the exporter's import takes a while.
    tracing = start_tracing(args.name)
    traces = TaskTracer(args.name, tracing.tracer if tracing is not None else None)

    def prepare(mesh_node: Node) -> None:
        # Before the node starts: the dashboard asks a newcomer for its view as soon as
        # it joins, and a command's seat may hand it its spans at once.
        mesh_node.view_sections["agent"] = _metrics_of(brain)
        mesh_node.view_sections["service"] = traces.metrics.snapshot
        if tracing is not None:
            serve_spans(mesh_node, tracing.ring)
        if data_dir is not None:
            Knowledge.expect(mesh_node)  # the shard attaches once the node is on the mesh

    node = SyncNode(
        prepare=prepare,
        name=args.name, role=args.role, mesh=args.mesh,
        interfaces=tuple(args.interfaces or ("127.0.0.1",)), seeds=tuple(args.peers),
        data_dir=data_dir, slots=args.slots if args.role == "worker" else 0,
        tools=tools[args.role], heartbeat_interval=args.heartbeat,
        evasive_after=args.evasive_after, expire_after=args.expire_after,
        **extra,
    )
    metrics = start_metrics(args.name, traces.metrics.snapshot)  # OTLP, when configured
    if args.traceparent:
        traces.adopt(TraceContext(args.traceparent))
    stop = threading.Event()
    go = threading.Event() if args.wait_go else None
    toolbox_ref: list[Toolbox] = []
    stopped_by: list[int] = []

    def on_control(kind: str, sender: str, body: dict[str, Any]) -> None:
        # Registered before anything else, so no control message is missed while the
        # agent starts up.
        if kind == "go" and go is not None:
            # The go may carry the human's request's trace context: the task continues it.
            traceparent = body.get("traceparent")
            if isinstance(traceparent, str) and valid_traceparent(traceparent):
                traces.adopt(TraceContext(traceparent))
            go.set()
        elif kind == "drain":
            print(f"[{args.name}] drain requested by {sender}", file=sys.stderr, flush=True)
            for tb in toolbox_ref:
                tb.drain()
        elif kind == "halt":
            print(f"[{args.name}] halt requested by {sender}", file=sys.stderr, flush=True)
            for tb in toolbox_ref:
                tb.halt(f"halted by {sender}")
            stop.set()

    node.add_control_listener(on_control)
    knowledge: SyncKnowledge | None = None
    external: ExternalTools | None = None
    try:
        knowledge = _knowledge(node, None if args.no_knowledge else data_dir)
        port = NodePort(node, knowledge, traces=traces)
        tapped = TappedPort(port)
        if args.mcp_servers:
            external = ExternalTools.start(args.mcp_servers)
        toolbox = Toolbox(tapped, workspace if args.role != "architect" else None,
                          role=args.role, tools=args.tools, external=external,
                          ledger=TaskLedger(args.name, path=data_dir / LEDGER_FILE),
                          traces=traces)
        toolbox_ref.append(toolbox)
        if stop.is_set():
            toolbox.halt("halted while starting")
        if node.node.draining:
            toolbox.drain()  # a drain that came while the agent was starting
        watch_tasks(node, toolbox, args.name)
        options: dict[str, Any] = {
            "workers": args.workers, "reviewer": args.reviewer, "slots": args.slots,
            "offer_timeout": args.offer_timeout, "task_timeout": args.task_timeout,
            "fail_after": args.fail_after, "go": go, "goal": args.goal,
            "system_prompt": prompt,
            "work_command": args.work_command, "withdraw_timeout": args.withdraw_timeout,
            "delegate_to": args.delegate_to, "ask": args.ask, "serve": args.serve,
        }
        ctx = AgentContext(args.name, args.role, toolbox, tapped, stop, options)
        def on_signal(signum: int, _frame: object) -> None:
            stopped_by.append(signum)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
        ctx.say(f"{args.role} up on mesh {args.mesh!r} "
                f"(pub {node.node.pub_port}, router {node.node.router_port})")
        slots = f", {args.slots} slot(s)" if args.role == "worker" else ""
        # Say "online" once the peers already known subscribe to us, so that they hear it.
        with contextlib.suppress(TimeoutError, OperationTimeout):
            node.run_coroutine(node.node.wait_for_subscribers(
                C.CHANNEL_LOG, len(node.peers()), 5.0), 10.0)
        node.publish(C.CHANNEL_LOG, Activity.from_dict({
            "type": "Announce", "actor": args.name,
            "summary": f"{args.name} online as {args.role}{slots}"}))
        status = brain.run(ctx)
        if args.linger and not stop.is_set():
            ctx.say("done; staying on the mesh until halted")
            stop.wait()
        # Ctrl-C is 130, as for every porter-mesh command; SIGTERM (a supervisor's way
        # of asking) is the brain's own status.
        return EXIT_INTERRUPTED if stopped_by[:1] == [signal.SIGINT] else status
    finally:
        traces.close()
        if external is not None:
            external.close()
        if knowledge is not None:
            knowledge.close()
        node.close()
        if tracing is not None:
            tracing.close()  # after the node: the last spans are exported
        if metrics is not None:
            metrics.close()  # a last export: the numbers as the agent stops


def _metrics_of(brain: Brain) -> Callable[[], dict[str, Any]]:
    """The ``agent`` section of the node's view: the brain's own metrics when it keeps
    them (called on the node's loop thread)."""
    metrics = getattr(brain, "metrics", None)
    if callable(metrics):
        return lambda: dict(metrics())
    return lambda: {"brain": "scripted"}


def main(args: argparse.Namespace) -> int:
    """Entry point used by ``porter-mesh agent``: a bad setting is exit status 2, what
    the mesh did is 1 (see :func:`~porter_mesh.entrypoint.report_error`)."""
    try:
        return run(args)
    except (PorterError, OSError) as exc:
        return report_error("agent", exc)
