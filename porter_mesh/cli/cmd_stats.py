"""``porter-mesh stats [AGENT]``: a node's own view, asked over the mesh.

The command joins as an observer (on no roster), finds the agent, and sends it a
``stats`` request over its direct path; the node answers with its
:meth:`~porter_mesh.node.node.Node.view`: its roster with states, per-peer lost
(broadcast sequence gaps) and dropped counts, queue depths, knowledge size and digest,
uptime and version. Without AGENT, every agent found within ``--wait`` is asked.
``--json`` prints each view as one JSON object per line. An agent adds what its brain
did (section ``agent``): for an LLM brain, its model calls, tokens in and out, tool
calls, errors and retries.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import orjson

from porter_mesh.cli.common import (
    add_mesh_options,
    ephemeral_name,
    node_config,
    quiet_node_logs,
    refuse_negative,
    run,
)
from porter_mesh.cli.seat import wait_for_peers
from porter_mesh.core import constants as C
from porter_mesh.errors import PorterError
from porter_mesh.node.node import Node
from porter_mesh.node.views import ViewClient

DEFAULT_WAIT = 3.0


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "stats", help="show a node's own view of the mesh (roster, loss, queues, knowledge)",
        description="Ask AGENT (or every agent found) for its own view over the mesh: "
        "its roster with states, per-peer lost and dropped counts, queue depths, "
        "knowledge size and digest, uptime, version.")
    parser.add_argument("agent", metavar="AGENT", nargs="?",
                        help="the agent to ask (default: every agent found within --wait)")
    parser.add_argument("--json", action="store_true", help="one JSON object per agent")
    add_asking_options(parser, wait=DEFAULT_WAIT)
    parser.set_defaults(func=main)


def add_asking_options(parser: argparse.ArgumentParser, *, wait: float = DEFAULT_WAIT,
                       ) -> None:
    """``--wait``, ``--timeout`` and the mesh options of a command that asks the agents
    over the mesh (``stats``, ``tasks``, ``trace``)."""
    parser.add_argument("--wait", type=float, default=wait, metavar="SECONDS",
                        help="how long to look for agents (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                        help="how long an agent may take to answer (default %(default)s)")
    add_mesh_options(parser)


def observer_config(args: argparse.Namespace, prefix: str) -> Any:
    """An observer's config: on no roster, announced nowhere (``peers``, ``stats``)."""
    quiet_node_logs(args)
    return node_config(args, name=ephemeral_name(prefix), role="observer", observer=True,
                       channels=(), inbox_size=0)


async def find_agents(node: Node, agent: str | None, wait: float) -> list[str]:
    """``[agent]`` once it is found, or every agent (seats aside) found within ``wait``.

    Raises:
        PorterError: nobody (or not ``agent``) found in time; the message says what to do.
    """
    mesh = node.config.mesh
    if agent is not None:
        try:
            await wait_for_peers(node, [agent], wait)
        except TimeoutError:
            seen = ", ".join(sorted(p.name for p in node.peers())) or "none"
            raise PorterError(f"no agent {agent!r} found on mesh {mesh!r} within {wait}s "
                              f"(seen: {seen}); check the name, --mesh and --peer") from None
        return [agent]
    await asyncio.sleep(wait)  # the listening period the user chose
    names = sorted(p.name for p in node.peers() if p.advert.role != C.ROLE_SEAT)
    if not names:
        raise PorterError(f"no agents seen on mesh {mesh!r} within {wait}s; start one, or "
                          "check --mesh, --interface and --peer")
    return names


def format_brain(brain: dict[str, Any]) -> str:
    """The ``agent`` section of a view as one line."""
    if brain.get("brain") != "llm":
        return f"brain      {brain.get('brain', '?')}"
    return (f"brain      llm, model {brain.get('model')!r}: {brain.get('model_calls', 0)} "
            f"model call(s), tokens {brain.get('tokens_in', 0)} in / "
            f"{brain.get('tokens_out', 0)} out, {brain.get('tool_calls', 0)} tool call(s), "
            f"{brain.get('errors', 0)} error(s), {brain.get('retries', 0)} retry(ies), "
            f"{brain.get('abandoned_calls', 0)} abandoned (task stopped)")


def format_service(service: dict[str, Any]) -> list[str]:
    """The ``service`` section of a view (tasks, tool and model calls) as lines."""
    kinds = service.get("kinds") or {}
    if not isinstance(kinds, dict) or not kinds:
        return ["service    nothing handled yet"]
    lines = [f"service    tokens {service.get('tokens_in', 0)} in / "
             f"{service.get('tokens_out', 0)} out"]
    for name, k in kinds.items():
        if isinstance(k, dict):
            lines.append(f"  {name:22} {k.get('count', 0):>6} done {k.get('errors', 0):>4} "
                         f"failed  avg {k.get('avg_ms', 0):>9.1f}ms  p50 "
                         f"{k.get('p50_ms', 0):>9.1f}ms  p99 {k.get('p99_ms', 0):>9.1f}ms")
    return lines


def format_storage(storage: dict[str, Any]) -> str:
    """The ``storage`` section of a view (the delivery journal) as one line."""
    refused = storage.get("refused", 0)
    if storage.get("state") == "full":
        return (f"storage    full: cannot write {storage.get('path')} "
                f"({storage.get('free_bytes')} bytes free); {refused} direct message(s) "
                "refused so far (their senders retry): free space there")
    return (f"storage    ok, journal {storage.get('size')} bytes"
            + (f", {refused} direct message(s) refused earlier for want of space"
               if refused else ""))


def format_view(view: dict[str, Any]) -> str:
    """A view as lines for people."""
    kg = view.get("knowledge")
    queues = view.get("queues", {})
    lines = [
        f"agent      {view.get('name')} ({view.get('role')}) on mesh {view.get('mesh')!r}, "
        f"porter-mesh {view.get('version')} (protocol {view.get('protocol')}), "
        f"up {view.get('uptime')}s, incarnation {view.get('incarnation')}"
        + (", draining" if view.get("draining") else ""),
        f"queues     inbox {queues.get('inbox')}, outbox {queues.get('outbox')}, "
        f"subscribers {queues.get('subscribers')}",
        "knowledge  " + ("none (started with --no-knowledge)" if not isinstance(kg, dict) else
                         f"{kg.get('observations')} observation(s), {kg.get('retractions')} "
                         f"retraction(s) from {kg.get('origins')} origin(s), digest "
                         f"{str(kg.get('digest'))[:16]}, in {kg.get('data_dir')}"),
        f"loss       {view.get('lost')} broadcast(s) lost, {view.get('dropped')} "
        "message(s) dropped",
    ]
    storage = view.get("storage")
    if isinstance(storage, dict):
        lines.append(format_storage(storage))
    brain = view.get("agent")
    if isinstance(brain, dict):
        lines.append(format_brain(brain))
    service = view.get("service")
    if isinstance(service, dict):
        lines += format_service(service)
    peers = view.get("peers") or []
    if not peers:
        lines.append("peers      none")
        return "\n".join(lines)
    lines.append(f"{'PEER':24} {'ROLE':12} {'STATE':8} {'DRAIN':5} {'HEARD':>7} "
                 f"{'LOST':>8} {'DROPPED':>8}")
    for p in peers:
        lines.append(f"{p.get('name', '?'):24} {p.get('role', '?'):12} "
                     f"{p.get('state', '?'):8} {'yes' if p.get('draining') else 'no':5} "
                     f"{p.get('last_heard', 0):>6.1f}s {p.get('lost', 0):>8} "
                     f"{p.get('dropped', 0):>8}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    refused = refuse_negative(args, "wait", "timeout")
    if refused is not None:
        return refused
    config = observer_config(args, "porter-stats")

    async def body() -> int:
        async with Node(config) as node:
            client = ViewClient(node)
            names = await find_agents(node, args.agent, args.wait)
            answers = await client.ask_all(names, args.timeout)
        status = 0
        for name, view in answers.items():
            if isinstance(view, BaseException):
                why = (f"no answer within {args.timeout}s" if isinstance(view, TimeoutError)
                       else str(view))
                print(f"porter-mesh stats: {name}: {why}", file=sys.stderr)
                status = 1
            elif args.json:
                print(orjson.dumps(view).decode())
            else:
                print(format_view(view) + ("\n" if len(answers) > 1 else ""))
        return status

    return run(body)
