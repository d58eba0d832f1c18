"""``porter-mesh up TEAM.toml``: run a team's agents and keep them running.

Theory of operation
-------------------
Each agent of the :class:`~agents.team.Team` runs as its own process,
``python -m porter_mesh.cli.main agent ROLE --name NAME ...`` (the arguments of
:func:`~agents.team.agent_argv`), in a session of its own, so that a Ctrl-C reaches the
supervisor only, which then stops every agent in order. Its output (stdout and stderr)
goes to ``LOGS/NAME.log``. The supervisor is itself an observer node on the mesh (on no
roster), which is how it sees an agent alive. Each agent moves through::

    starting (pid) --its "up on mesh" line--> up --heard alive on the mesh--> alive
        |                                       |                               |
        +---------------------------------------+-------- exit != 0 ------------+
                                                |
                            crashed (status) --> restarting in Xs --> starting ...
                                             \\-> gave up after N restarts
    exit 0: exited (the agent finished: idle, or halted)

A crashed agent is restarted after a capped exponential backoff; after
``max_restarts`` restarts within ``restart_window`` seconds the supervisor gives up on
it and says so (:class:`~agents.team.RestartPolicy`). An agent that exits with status 2
refused its settings (its data directory is held by another process, its name is taken
on the mesh, a key is missing): a restart would meet the same refusal, so the supervisor
gives up on it at once and shows the reason, the last line of its log. Every change is
one line on the console, ``HH:MM:SS NAME state``. The supervisor ends when no agent is
left running (status 0; 1 when it gave up on a crashing agent; 2 when it gave up on one
that refused its settings), or on SIGINT/SIGTERM: every agent gets SIGTERM, then SIGKILL
after ``stop_grace`` seconds, and the status is 130 after SIGINT (Ctrl-C), 0 after
SIGTERM.

Before it starts anything, :func:`refuse_if_running` looks at the data directories of
the team's agents: when another process holds one (the same team is already up), the
supervisor refuses in one line naming those processes, instead of starting agents that
could only fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from agents.team import AgentSpec, Team, TeamError, otel_env
from porter_mesh.adapters.dirlock import lock_holder
from porter_mesh.core.peers import PeerState
from porter_mesh.entrypoint import EXIT_INTERRUPTED, EXIT_SETTINGS
from porter_mesh.node.config import ENV_KEY, ENV_TRUSTED, NodeConfig, default_data_dir
from porter_mesh.node.node import DATA_DIR_LOCK, Node

#: The line an agent prints once it has joined the mesh (see agents/runtime.py).
UP_MARK = " up on mesh "
#: The supervisor's own node name with ``security = "curve"`` (its key is made once).
SUPERVISOR_NAME = "porter-up"


@dataclass
class Running:
    """One agent as the supervisor keeps it."""

    spec: AgentSpec
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    state: str = "waiting"
    proc: asyncio.subprocess.Process | None = None
    restarts: list[float] = field(default_factory=list)
    up: bool = False
    alive: bool = False
    #: Incarnations of its earlier processes: a roster entry of one of them is not news.
    old_incarnations: set[int] = field(default_factory=set)
    incarnation: int | None = None
    gave_up: bool = False
    #: It exited with :data:`EXIT_SETTINGS`: restarting would not help.
    refused: bool = False
    #: The last complaint it printed (``porter-mesh ...: why``): the reason, when it
    #: refused its settings.
    last_line: str = ""


def _exit_words(status: int) -> str:
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


def _parent_of(pid: str) -> str | None:
    """The parent pid of ``pid`` when the system says (Linux's /proc), else None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name in parentheses may hold spaces: the fields after it are plain.
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[1] if len(fields) > 1 else None


def refuse_if_running(team: Team, *, shown: str) -> None:
    """Refuse to start ``team`` when its agents already run on its mesh on this host.

    An agent's data directory (``<data root>/<mesh>/<name>``) is locked by the process
    that uses it, so a held lock is a running agent: starting another would only fail.

    Args:
        team: the team (its mesh name already the one to run on).
        shown: the team file as the user named it, for the suggested command.

    Raises:
        TeamError: some of its agents run; one line naming their pids (and the
            ``porter-mesh up`` above them, when there is one), how to stop them, and
            how to run a second copy on another mesh.
    """
    mesh = team.mesh.name
    held = {spec.name: holder for spec in team.agents
            if (holder := lock_holder(default_data_dir(mesh, spec.name),
                                      filename=DATA_DIR_LOCK)) is not None}
    if not held:
        return
    parents = {_parent_of(pid) for pid in held.values()}
    parent = parents.pop() if len(parents) == 1 else None
    who = ", ".join(f"{name} pid {pid}" for name, pid in held.items())
    if parent is not None and parent != "1" and _is_up(parent):
        who += f", under porter-mesh up pid {parent}"
        stop = f"Ctrl-C where it runs, or kill {parent}"
    else:
        stop = "kill " + " ".join(sorted(set(held.values())))
    raise TeamError(f"{shown}: this team is already running on mesh {mesh!r} ({who}); "
                    f"stop it ({stop}), or run a second copy on another mesh: "
                    f"porter-mesh up {shown} --mesh {mesh}-2")


def _is_up(pid: str) -> bool:
    """Whether process ``pid`` is a ``porter-mesh up`` (read from /proc when there)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"up" in argv


def ensure_keys(team: Team) -> dict[str, dict[str, str]]:
    """With ``security = "curve"``: a key pair for every agent (and the supervisor), made
    when missing and trusted; the environment each process runs with.

    Raises:
        SecurityError: a key cannot be written.
    """
    if team.mesh.security != "curve" or team.mesh.keys is None:
        return {}
    from porter_mesh.adapters.security import SECRET_SUFFIX, create_key_pair, trust_key

    keys = team.mesh.keys
    trusted = keys / "trusted"
    envs: dict[str, dict[str, str]] = {}
    for name in [SUPERVISOR_NAME, *(spec.name for spec in team.agents)]:
        secret = keys / f"{name}{SECRET_SUFFIX}"
        if not secret.exists():
            public, secret = create_key_pair(keys, name)
            trust_key(public, trusted)
        envs[name] = {ENV_KEY: str(secret), ENV_TRUSTED: str(trusted)}
    return envs


class Supervisor:
    """Runs a team until every agent is done, or until stopped.

    Args:
        team: the team.
        logs: directory of the agents' logs (made if missing).
        stream: where the state lines go.
        python: the interpreter that runs the agents.
        workspace: the workspace of the agents whose entry names none (default:
            ``workspace/`` beside the team file).
    """

    def __init__(self, team: Team, *, logs: Path, stream: IO[str] = sys.stdout,
                 python: str = sys.executable, workspace: Path | None = None) -> None:
        self.team = team
        self.logs = logs
        self.workspace = workspace
        self.stream = stream
        self.python = python
        self.policy = team.up
        self.stopping = asyncio.Event()
        self.stop_signal: signal.Signals | None = None
        self.agents: list[Running] = []

    def say(self, running: Running | None, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        who = f"{running.spec.name:<16} " if running is not None else ""
        print(f"{stamp} {who}{text}", file=self.stream, flush=True)

    def set_state(self, running: Running, state: str) -> None:
        running.state = state
        self.say(running, state)

    async def run(self) -> int:
        """Start the team, keep it running, stop it; the exit status."""
        from agents.team import agent_argv

        self.logs.mkdir(parents=True, exist_ok=True)
        envs = ensure_keys(self.team)
        base_env = dict(os.environ, PYTHONUNBUFFERED="1")
        for spec in self.team.agents:
            self.agents.append(Running(
                spec, agent_argv(self.team, spec,
                                 workspace=None if spec.workspace else self.workspace),
                {**base_env, **otel_env(self.team), **envs.get(spec.name, {})},
                self.logs / f"{spec.name}.log"))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._stop_on, sig)
        mesh = self.team.mesh
        self.say(None, f"porter-mesh up: {len(self.agents)} agent(s) of {self.team.path} "
                 f"on mesh {mesh.name!r}; logs in {self.logs}; Ctrl-C stops them all")
        for running in self.agents:
            if running.spec.brain == "llm" and running.spec.api_key_env and \
                    not os.environ.get(running.spec.api_key_env):
                self.say(running, f"note: ${running.spec.api_key_env} is not set; its "
                         "requests go without an API key")
        secure = envs.get(SUPERVISOR_NAME)
        config = NodeConfig(
            name=SUPERVISOR_NAME if secure else f"porter-up-{os.getpid()}", role="observer",
            mesh=mesh.name, interfaces=mesh.interfaces or ("127.0.0.1",), seeds=mesh.peers,
            observer=True, channels=(), inbox_size=0,
            secret_key_file=Path(secure[ENV_KEY]) if secure else None,
            trusted_dir=Path(secure[ENV_TRUSTED]) if secure else None)
        try:
            async with Node(config) as node:
                keepers = [asyncio.create_task(self._keep(r)) for r in self.agents]
                watcher = asyncio.create_task(self._watch(node))
                stop = asyncio.create_task(self.stopping.wait())
                everyone = asyncio.ensure_future(asyncio.gather(*keepers))
                waiting: list[asyncio.Future[Any]] = [stop, everyone]
                await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                interrupted = self.stopping.is_set()
                self.stopping.set()
                await self._stop_all()
                await asyncio.gather(*keepers, return_exceptions=True)
                for task in (watcher, stop):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            await self._stop_all()
        if interrupted:
            self.say(None, "stopped every agent")
            return EXIT_INTERRUPTED if self.stop_signal is signal.SIGINT else 0
        gave_up = [r.spec.name for r in self.agents if r.gave_up]
        refused = [r.spec.name for r in self.agents if r.refused]
        if refused and len(refused) == len(gave_up):
            self.say(None, f"no agent left running; {', '.join(refused)} refused "
                     "their settings (the reasons are above)")
            return EXIT_SETTINGS
        if gave_up:
            self.say(None, f"no agent left running; gave up on {', '.join(gave_up)}")
            return 1
        self.say(None, "no agent left running; every one finished")
        return 0

    def _stop_on(self, sig: signal.Signals) -> None:
        if self.stop_signal is None:
            self.stop_signal = sig
        self.stopping.set()

    async def _keep(self, running: Running) -> None:
        """Run one agent, restarting it after a crash until the policy gives up."""
        while not self.stopping.is_set():
            status = await self._run_once(running)
            if self.stopping.is_set() or status is None:
                return
            if status == 0:
                self.set_state(running, "exited (status 0): the agent finished")
                return
            if status == EXIT_SETTINGS:
                running.gave_up = running.refused = True
                self.set_state(running, f"refused its settings (exit status 2), not "
                               f"restarted: {running.last_line or 'see its log'} (its log: "
                               f"{running.log_path})")
                return
            now = time.monotonic()
            self.set_state(running, f"crashed ({_exit_words(status)}); its log: "
                           f"{running.log_path}")
            delay = self.policy.next_delay(running.restarts, now)
            if delay is None:
                running.gave_up = True
                self.set_state(running, f"gave up after {self.policy.max_restarts} "
                               f"restart(s) within {self.policy.restart_window:g}s")
                return
            running.restarts.append(now)
            self.set_state(running, f"restarting in {delay:g}s (restart "
                           f"{len(running.restarts)})")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)

    async def _run_once(self, running: Running) -> int | None:
        """Start the agent's process and wait for it; its exit status (``None`` when it
        could not be started)."""
        running.up = running.alive = False
        if running.incarnation is not None:
            running.old_incarnations.add(running.incarnation)
        try:
            log = open(running.log_path, "ab")  # noqa: SIM115 - closed below
        except OSError as exc:
            self.set_state(running, f"cannot write its log {running.log_path}: {exc}")
            running.gave_up = True
            return None
        try:
            try:
                proc = await asyncio.create_subprocess_exec(
                    self.python, "-m", "porter_mesh.cli.main", *running.argv,
                    stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT, env=running.env,
                    start_new_session=True)
            except OSError as exc:
                self.set_state(running, f"cannot start: {exc}")
                running.gave_up = True
                return None
            running.proc = proc
            self.set_state(running, f"starting (pid {proc.pid})")
            if self.stopping.is_set():  # stopped while it was being started
                proc.terminate()
            assert proc.stdout is not None
            async for line in proc.stdout:
                log.write(line)
                log.flush()
                text = line.decode(errors="replace")
                if text.startswith("porter-mesh "):  # a command's one-line complaint
                    running.last_line = text.strip()
                if not running.up and UP_MARK in text:
                    running.up = True
                    self.set_state(running, f"up (pid {proc.pid})")
            return await proc.wait()
        finally:
            log.close()

    async def _watch(self, node: Node) -> None:
        """Mark agents alive once the supervisor's node hears them (a new incarnation)."""
        while True:
            peers = {p.name: p for p in node.peers()}
            for running in self.agents:
                peer = peers.get(running.spec.name)
                if (running.up and not running.alive and peer is not None
                        and peer.state is PeerState.ALIVE
                        and peer.incarnation not in running.old_incarnations
                        and peer.last_heard > peer.joined_at):
                    running.alive = True
                    running.incarnation = peer.incarnation
                    pid = running.proc.pid if running.proc is not None else "?"
                    self.set_state(running, f"alive on the mesh (pid {pid})")
            await asyncio.sleep(0.2)

    async def _stop_all(self) -> None:
        """SIGTERM to every agent still running, SIGKILL after the grace period."""
        live = [r.proc for r in self.agents
                if r.proc is not None and r.proc.returncode is None]
        if not live:
            return
        for proc in live:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        deadline = time.monotonic() + self.policy.stop_grace
        for proc in live:
            try:
                await asyncio.wait_for(proc.wait(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for running in self.agents:
            if running.proc in live:
                self.set_state(running, f"stopped ({_exit_words(running.proc.returncode)})"
                               if running.proc is not None and running.proc.returncode
                               else "stopped")
