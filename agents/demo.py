"""The demo mesh: an architect, two workers and a reviewer play the profile's story.

The team is a file, ``examples/demo-team.toml`` (see :mod:`agents.team`; ``porter-mesh
demo --team FILE`` takes another). Its agents run with the options the file gives them
(as ``porter-mesh up`` runs them), plus the demo's own: quick heartbeats, one mesh per
run, one workspace and data directory under the output directory, and an architect
that waits for the demo's "go". A file with ``security = "curve"`` runs the demo secured.

The demo process is itself a node (``porter-ui``, the human's seat): it starts the four
agents as separate OS processes on loopback, waits until every one of them is connected
both ways (it has heard each agent's heartbeat, and each agent subscribes to it), then
tells the architect to begin. It prints every activity that crosses the mesh (direct
ones too, through the receivers' observer copies) as a live timeline, writes them to a
JSON-lines log, and ends when the architect has recalled what the team learned. On any
failure it stops every process it started and exits non-zero with the reason.

With ``ui=True`` (``porter-mesh demo --ui``) it also starts the dashboard, ``porter-mesh
ui``, as one more process. That process is the human's seat ``porter-ui``, so the demo's
own node is called ``demo`` then. The demo prints the dashboard's address, waits until the
dashboard hears the whole team before the story begins (so its timeline has the story
from the first Offer), and after the story keeps the workers, the reviewer and the
dashboard running until SIGINT (Ctrl-C) or SIGTERM, so that a person can send a task and
review it from the page; then it stops every process it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson
from opentelemetry import trace

from agents.scripted import LEARNED_HEADING
from agents.team import Team, TeamError, agent_argv, load_team, otel_env
from porter_mesh.core import constants as C
from porter_mesh.node.node import Message, Node
from porter_mesh.node.transcript import message_json
from porter_mesh.tracing.export import start_tracing
from porter_mesh.tracing.tasks import INSTRUMENTATION, trace_of_span
from porter_mesh.tracing.views import serve_spans

#: The demo's team file.
DEMO_TEAM = Path(__file__).resolve().parent.parent / "examples" / "demo-team.toml"
GO = "go"
#: The demo's own node when the dashboard process holds the name ``porter-ui``.
DEMO_SEAT = "demo"
#: The line ``porter-mesh ui`` prints first, followed by its address.
UI_LINE = "porter-ui: open "


@dataclass
class Agent:
    """One agent process the demo started."""

    role: str
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]


class DemoError(Exception):
    """The demo could not complete; the message says why."""


class Timeline:
    """Prints activities as they arrive and appends them to the message log."""

    def __init__(self, log_path: Path, *, stream: IO[str], architect: str = "architect"
                 ) -> None:
        self.architect = architect
        self.online: set[str] = set()
        self.start = time.monotonic()
        self.log = open(log_path, "wb")  # noqa: SIM115 - closed by close()
        self.stream = stream
        self.count = 0
        self.learned: str | None = None
        self.offered = False

    def __call__(self, msg: Message) -> None:
        self.count += 1
        if msg.activity.type == "Announce" and msg.activity.summary.startswith(
                f"{msg.sender} online"):
            self.online.add(msg.sender)
        self.log.write(message_json(msg).encode() + b"\n")
        act = msg.activity
        self.offered = self.offered or (act.type == "Offer" and msg.sender == self.architect)
        to = ""
        if msg.direct:
            to = f" -> {msg.channel[len(C.DIRECT_PREFIX):]}"
        elif act.target:
            to = f" -> {act.target}"
        context = f" [{act.context.rsplit(':', 1)[-1]}]" if act.context else ""
        when = time.monotonic() - self.start
        who = f"{msg.sender}{to}"
        line = f"{when:6.2f}s  {msg.channel:<15} {who:<24} {act.type:<9} {act.summary}{context}"
        print(line, file=self.stream, flush=True)
        if act.type == "Announce" and msg.sender == self.architect and act.summary.startswith(
                "Task done"):
            content = act.content or ""
            obj = act.object
            if not content and obj is not None and not isinstance(obj, str):
                content = obj.content or ""
            # The rows alone: the demo prints its own heading above them.
            self.learned = content.partition(LEARNED_HEADING + "\n")[2] or content

    def close(self) -> None:
        self.log.close()


def demo_team(path: Path | None = None) -> Team:
    """The demo's team (``examples/demo-team.toml`` unless ``path`` names another).

    Raises:
        DemoError: the file is missing or wrong, or has no architect.
    """
    try:
        team = load_team(path or DEMO_TEAM)
    except TeamError as exc:
        raise DemoError(str(exc)) from None
    if not any(spec.role == "architect" for spec in team.agents):
        raise DemoError(f"{path or DEMO_TEAM}: the demo needs an agent with role "
                        '"architect"')
    return team


def _start(role: str, name: str, args: list[str], *, out: Path,
           env_extra: dict[str, str] | None = None) -> Agent:
    """Run ``porter-mesh ARGS`` as a process whose output goes to ``out/agents/NAME.log``."""
    log_path = out / "agents" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_file = open(log_path, "wb")  # noqa: SIM115 - closed when the agent is reaped
    cmd = [sys.executable, "-m", "porter_mesh.cli.main", *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env_extra or {}))
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                            stdin=subprocess.DEVNULL)
    return Agent(role, name, proc, log_path, log_file)


def _stop_all(agents: list[Agent], grace: float = 5.0) -> None:
    for agent in agents:
        if agent.proc.poll() is None:
            agent.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for agent in agents:
        try:
            agent.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            agent.proc.kill()
            agent.proc.wait(5)
        agent.log_file.close()


def _tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in text[-lines:])


async def _wait_connected(node: Node, timeline: Timeline, names: list[str],
                          agents: list[Agent], timeout: float, *, need_online: bool = True
                          ) -> None:
    """Until every agent said it is online, the demo hears every agent, and every agent
    subscribes to the demo. ``need_online=False`` (secured demo): an agent announces
    itself once, right after start-up, and with CurveZMQ the demo's subscription (a
    handshake answered by the agent's own ZAP handler) often arrives after that
    announcement; its heartbeats prove the connection instead."""
    deadline = time.monotonic() + timeout
    while True:
        for agent in agents:
            if agent.proc.poll() is not None:
                raise DemoError(f"{agent.name} exited with status {agent.proc.returncode} "
                                f"while starting; its log:\n{_tail(agent.log_path)}")
        heard = {p.name for p in node.peers() if p.last_heard > p.joined_at}
        online = timeline.online if need_online else heard
        if (set(names) <= heard and set(names) <= online
                and node.subscriber_count(C.CHANNEL_CONTROL) >= len(names)):
            return
        if time.monotonic() > deadline:
            missing = sorted((set(names) - heard) | (set(names) - online))
            raise DemoError(f"the team did not connect within {timeout:.0f}s "
                            f"(not heard: {missing or 'none'}; "
                            f"subscribers: {node.subscriber_count(C.CHANNEL_CONTROL)})")
        await asyncio.sleep(0.05)


def _check_running(agents: list[Agent]) -> None:
    for agent in agents:
        if agent.proc.poll() is not None:
            raise DemoError(f"{agent.name} exited with status {agent.proc.returncode}; "
                            f"its log:\n{_tail(agent.log_path)}")


async def _ui_address(ui: Agent, timeout: float) -> str:
    """The address ``porter-mesh ui`` printed (its first line), once it is serving."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            for line in ui.log_path.read_text(errors="replace").splitlines():
                if line.startswith(UI_LINE):
                    return line[len(UI_LINE):].strip()
        _check_running([ui])
        if time.monotonic() > deadline:
            raise DemoError(f"the dashboard printed no address within {timeout:.0f}s; "
                            f"its log:\n{_tail(ui.log_path)}")
        await asyncio.sleep(0.05)


def _ui_peers(url: str) -> dict[str, str]:
    """Name -> state of every peer on the dashboard's roster (its own API, with its token)."""
    base, _, token = url.partition("/?token=")
    request = urllib.request.Request(f"{base}/api/peers",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=5) as response:
        body = orjson.loads(response.read())
    return {p["name"]: p["state"] for p in body["peers"]}


async def _wait_ui_hears(ui: Agent, url: str, names: list[str], timeout: float) -> None:
    """Until the dashboard's roster has every agent alive: it hears them, so it sees the
    story from its start."""
    deadline = time.monotonic() + timeout
    seen: dict[str, str] = {}
    while True:
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError, KeyError):
            seen = await asyncio.to_thread(_ui_peers, url)
            if all(seen.get(name) == "alive" for name in names):
                return
        _check_running([ui])
        if time.monotonic() > deadline:
            raise DemoError(f"the dashboard did not hear the team within {timeout:.0f}s "
                            f"(its roster: {seen or 'empty'}); its log:\n{_tail(ui.log_path)}")
        await asyncio.sleep(0.1)


def _secure_mesh(out: Path, names: list[str]) -> dict[str, dict[str, str]]:
    """Keys for every node the demo starts (its own seat included), all trusted: the
    environment each process runs with (``--secure``)."""
    from porter_mesh.adapters.security import provision_mesh
    from porter_mesh.node.config import ENV_KEY, ENV_TRUSTED

    trusted, secrets = provision_mesh(out / "keys", names)
    return {name: {ENV_KEY: str(path), ENV_TRUSTED: str(trusted)}
            for name, path in secrets.items()}


async def run_demo(out: Path, *, timeout: float = 30.0, extra: dict[str, list[str]] | None
                   = None, stream: IO[str] = sys.stdout, secure: bool = False,
                   ui: bool = False, ui_port: int = 0, team_file: Path | None = None,
                   on_start: Callable[[dict[str, int]], None] | None = None,
                   mesh: str | None = None, stay: bool = False) -> int:
    """Run the demo; returns the exit status.

    Args:
        out: output directory (made fresh).
        team_file: the team (default :data:`DEMO_TEAM`).
        timeout: seconds for the whole story.
        extra: additional command-line options per agent name (tests use this for fault
            injection).
        stream: where the timeline goes.
        secure: run every node with CurveZMQ (keys made in ``out/keys``, all trusted).
        ui: also run the dashboard (``porter-mesh ui``), print its address, and keep the
            mesh running after the story until SIGINT or SIGTERM.
        ui_port: the dashboard's HTTP port (0: a free one).
        on_start: called with each agent's pid once all are started (tests use this to
            pause or kill one).
        mesh: the mesh name (default: the team file's, with this process's pid, so that
            every run has a mesh of its own).
        stay: keep the whole team (the architect too) on the mesh after the story until
            SIGINT or SIGTERM, so that ``porter-mesh trace`` and ``stats`` can ask it.
    """
    started = time.monotonic()
    try:
        team = demo_team(team_file)
    except DemoError as exc:
        print(f"porter-mesh demo FAILED: {exc}", file=stream, flush=True)
        return 2
    secure = secure or team.mesh.security == "curve"
    architect_name = next(s.name for s in team.agents if s.role == "architect")
    names = [spec.name for spec in team.agents]
    if out.exists():
        shutil.rmtree(out)
    (out / "workspace").mkdir(parents=True)
    mesh = mesh or f"{team.mesh.name}-{os.getpid()}"
    timeline = Timeline(out / "messages.jsonl", stream=stream, architect=architect_name)
    agents: list[Agent] = []
    print(f"porter-mesh demo: mesh {mesh!r} on 127.0.0.1, output in {out}", file=stream)
    envs: dict[str, dict[str, str]] = {}
    keys: dict[str, Any] = {}
    seat_name = DEMO_SEAT if ui else C.HUMAN_AGENT
    if secure:
        ui_seat = [C.HUMAN_AGENT] if ui else []
        envs = _secure_mesh(out, [seat_name, *ui_seat, *names])
        seat = envs.pop(seat_name)
        keys = {"secret_key_file": Path(seat["PORTER_MESH_KEY"]),
                "trusted_dir": Path(seat["PORTER_MESH_TRUSTED"])}
        print(f"secured with CurveZMQ: keys and trusted directory in {out / 'keys'}",
              file=stream)
    node = Node(name=seat_name, role="human" if not ui else "demo", mesh=mesh,
                heartbeat_interval=0.25, evasive_after=2.0, expire_after=6.0, inbox_size=0,
                **keys)
    node.add_handler(timeline)
    # The human's request (the go) is the root of the story's trace: it starts when the
    # team is connected, and the go carries its context.
    tracing = start_tracing(seat_name, settings=team.otel)
    tracer = tracing.tracer if tracing is not None else trace.get_tracer(INSTRUMENTATION)
    request: trace.Span = trace.INVALID_SPAN
    go_body: dict[str, Any] = {}
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    dashboard: Agent | None = None
    url = ""
    stopped_by: list[signal.Signals] = []
    keep = ui or stay  # the mesh outlives the story

    def on_signal(sig: signal.Signals) -> None:
        stopped_by.append(sig)
        stop.set()

    def interrupted() -> int:
        """Ctrl-C is 130, as for every command; SIGTERM, a request to stop, is 0."""
        return 130 if stopped_by[:1] == [signal.SIGINT] else 0

    if keep:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
    try:
        await node.astart()
        node.observe_direct()
        if tracing is not None:
            serve_spans(node, tracing.ring)  # the request's span, for porter-mesh trace
        if ui:
            dashboard = _start("human", C.HUMAN_AGENT, [
                "ui", "--mesh", mesh, "--port", str(ui_port),
                "--data-dir", str(out / "data" / C.HUMAN_AGENT)],
                out=out, env_extra=envs.get(C.HUMAN_AGENT))
            agents.append(dashboard)
            url = await _ui_address(dashboard, timeout=max(10.0, timeout / 2))
            print(f"dashboard: open {url}", file=stream, flush=True)
        for spec in team.agents:
            options = [*agent_argv(team, spec, mesh=mesh, workspace=out / "workspace"),
                       "--data-dir", str(out / "data" / spec.name),
                       "--heartbeat", "0.25", "--evasive-after", "2", "--expire-after", "6",
                       "--offer-timeout", "10", "--task-timeout", str(timeout)]
            if spec.role == "architect":
                options += ["--wait-go", *(["--linger"] if keep else [])]
            options += (extra or {}).get(spec.name, [])
            agents.append(_start(spec.role, spec.name, options, out=out,
                                 env_extra={**otel_env(team), **envs.get(spec.name, {})}))
        if on_start is not None:
            on_start({agent.name: agent.proc.pid for agent in agents})
        await _wait_connected(node, timeline, names, agents, timeout=max(5.0, timeout / 2),
                              need_online=not secure)
        if dashboard is not None:
            await _wait_ui_hears(dashboard, url, names, timeout=max(5.0, timeout / 2))
        print(f"{time.monotonic() - timeline.start:6.2f}s  team connected: "
              f"{', '.join(names)}; the architect begins", file=stream, flush=True)
        request = tracer.start_span(f"request {architect_name}", kind=trace.SpanKind.CLIENT,
                                    attributes={"gen_ai.agent.name": architect_name,
                                                "messaging.destination.name": C.CHANNEL_CONTROL})
        request_trace = trace_of_span(request)
        if request_trace is not None:
            go_body["traceparent"] = request_trace.traceparent
            print(f"trace: {request_trace.trace_id} (porter-mesh trace "
                  f"{request_trace.trace_id})", file=stream, flush=True)
        node.async_control(GO, target=architect_name, body=go_body)
        last_go = time.monotonic()
        architect = next(agent for agent in agents if agent.name == architect_name)
        while architect.proc.poll() is None and not (keep and timeline.learned is not None):
            if stop.is_set():
                print("\ninterrupted: stopping every process the demo started", file=stream)
                return interrupted()
            if dashboard is not None:
                _check_running([dashboard])
            if time.monotonic() - started > timeout:
                raise DemoError(f"the story did not finish within {timeout:.0f}s; "
                                f"architect log:\n{_tail(architect.log_path)}")
            if secure and not timeline.offered and time.monotonic() - last_go > 1.0:
                # Without its "online" announcement the architect may not have been
                # listening yet; "go" is idempotent, so say it again until it offers.
                node.async_control(GO, target=architect_name, body=go_body)
                last_go = time.monotonic()
            await asyncio.sleep(0.05)
        request.end()  # the story is told: the architect recalled what was learned
        if architect.proc.poll() not in (None, 0):
            raise DemoError(f"the architect failed (status {architect.proc.returncode}); "
                            f"its log:\n{_tail(architect.log_path)}")
        if keep:
            print(f"\nThe team learned:\n{timeline.learned or '(nothing recalled)'}",
                  file=stream)
            if dashboard is not None:
                print(f"\nThe story is over; the mesh keeps running. On the dashboard "
                      f"({url}), send a task to @worker-1 from Compose (type Offer) and "
                      "approve its review on its task card. Ctrl-C stops every process.",
                      file=stream, flush=True)
            else:
                print(f"\nThe story is over; the team stays on mesh {mesh!r} (try "
                      f"porter-mesh trace or stats --mesh {mesh}). Ctrl-C stops every "
                      "process.", file=stream, flush=True)
            while not stop.is_set():
                # An agent may end after the story (a crash is its own to report); only
                # the dashboard is the demo's to watch.
                _check_running([dashboard] if dashboard is not None else [])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.2)
            print("\nstopping every process the demo started", file=stream, flush=True)
            return interrupted()
        node.async_control("halt")
        for agent in agents:
            deadline = time.monotonic() + 5.0
            while agent.proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
    except DemoError as exc:
        request.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)[:200]))
        print(f"\nporter-mesh demo FAILED: {exc}", file=stream, flush=True)
        return 1
    finally:
        if request.is_recording():  # not yet ended: the story failed
            request.end()
        if keep:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
        _stop_all(agents)
        await node.aclose()
        timeline.close()
        if tracing is not None:
            tracing.close()
    elapsed = time.monotonic() - started
    print(f"\nThe team learned:\n{timeline.learned or '(nothing recalled)'}", file=stream)
    print(f"\ndemo complete in {elapsed:.1f}s: {timeline.count} activities", file=stream)
    print(f"  message log : {out / 'messages.jsonl'}", file=stream)
    print(f"  workspace   : {out / 'workspace'}", file=stream)
    print(f"  agent logs  : {out / 'agents'}", file=stream)
    return 0


def summary_of(log_path: Path) -> list[dict[str, Any]]:
    """The message log as a list of dicts (for tests and tools)."""
    return [orjson.loads(line) for line in log_path.read_bytes().splitlines() if line]
