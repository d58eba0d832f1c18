"""A team is a file: :func:`load_team` reads ``TEAM.toml`` into a :class:`Team`.

``porter-mesh up TEAM.toml`` starts the team it describes (see :mod:`agents.supervisor`),
and ``porter-mesh demo`` plays its story with ``examples/demo-team.toml``. This module is
the pure part: TOML text in, frozen dataclasses (or one :class:`TeamError`) out, and the
command line each agent runs with. It lives beside the agents, not in the core: a team
names agent programs (roles, brains, models, prompts), which is no protocol matter, and
both the command line and the demo read it.

The file
--------
::

    [mesh]                       # required
    name = "lab"                 # the mesh name
    security = "off"             # "off" (loopback only) or "curve"
    keys = "keys"                # with "curve": key pairs and trusted/ (made if missing)
    interfaces = ["127.0.0.1"]   # addresses to bind and announce on
    peers = []                   # static seeds, HOST:PORT

    [up]                         # optional: how porter-mesh up restarts a crashed agent
    max_restarts = 5             # restarts within restart_window before giving up
    restart_window = 60.0        # seconds
    backoff = 1.0                # first delay, doubled for each restart in the window
    max_backoff = 8.0            # the delay's cap
    stop_grace = 5.0             # seconds between SIGTERM and SIGKILL when stopping

    [otel]                       # optional: spans out to an OTLP/HTTP backend
    endpoint = "http://127.0.0.1:4318"  # OTEL_EXPORTER_OTLP_ENDPOINT for every agent
    headers = "api-key=..."      # OTEL_EXPORTER_OTLP_HEADERS
    sampler = "parentbased_always_on"   # OTEL_TRACES_SAMPLER
    sampler_arg = 0.25           # OTEL_TRACES_SAMPLER_ARG (ratio samplers)

    [[agents]]                   # one table per agent, at least one
    name = "worker-1"            # unique on the mesh
    role = "worker"              # "architect", "worker" or "reviewer"
    brain = "scripted"           # "scripted" (default) or "llm"
    workspace = "workspace"      # directory of its file and shell tools (default)
    slots = 1                    # workers: tasks held at once
    tools = ["read_file", "bash"]            # default: the role's
    mcp_servers = ["python srv.py"]          # stdio MCP servers whose tools it also gets
    a2a = "http://127.0.0.1:9999"            # workers: an outside A2A agent does the work
    subscriptions = ["log", "task", "review"]  # default: all three
    # brain = "llm" only:
    endpoint = "http://127.0.0.1:8000/v1"    # required: an OpenAI-compatible endpoint
    model = "default"
    api_key_env = "LLM_API_KEY"  # the variable holding the key (not the key)
    system_prompt = "..."        # or system_prompt_file = "prompts/worker.md"
    goal = "..."                 # the first instruction (an architect's task)
    temperature = 0.2
    max_tokens = 4096
    max_steps = 50
    idle_timeout = 300.0         # 0: never idle out

Paths are relative to the team file's directory. Validation is strict and stops at the
first problem, which is one line naming the file, the key and what is expected::

    TEAM.toml: agents[2].brain: expected "scripted" or "llm", got "lm"

An unknown key suggests the close spelling (``agents[0].modle: unknown key; did you mean
"model"?``). Indexes count from 0, as in the file's array of tables.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from porter_mesh.core import constants as C
from porter_mesh.core.advert import check_agent_name, check_mesh_name
from porter_mesh.errors import ConfigError
from porter_mesh.node.config import split_seed
from porter_mesh.tools.schemas import ALL_TOOLS

__all__ = [
    "AgentSpec",
    "MeshSpec",
    "RestartPolicy",
    "Team",
    "TeamError",
    "agent_argv",
    "load_team",
    "otel_env",
    "parse_team",
]

ROLES: Final = ("architect", "worker", "reviewer")
BRAINS: Final = ("scripted", "llm")
SECURITY: Final = ("off", "curve")
CHANNELS: Final = (C.CHANNEL_LOG, C.CHANNEL_TASK, C.CHANNEL_REVIEW)


class TeamError(ConfigError):
    """The team file is wrong; the message is the one line to show.

    Attributes:
        where: the key's path (``agents[2].brain``), or ``""`` for the file as a whole.
    """

    def __init__(self, message: str, *, where: str = "") -> None:
        super().__init__(message)
        self.where = where


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """How ``porter-mesh up`` restarts a crashed agent: capped exponential backoff, and
    a limit of restarts within a sliding window, after which it gives up."""

    max_restarts: int = 5
    restart_window: float = 60.0
    backoff: float = 1.0
    max_backoff: float = 8.0
    stop_grace: float = 5.0

    def next_delay(self, restarts: Sequence[float], now: float) -> float | None:
        """The pause before the next restart, or ``None`` to give up.

        Args:
            restarts: the times (monotonic seconds) of the agent's earlier restarts.
            now: the time of the crash.

        Returns:
            ``min(max_backoff, backoff * 2**n)`` for ``n`` restarts within the window,
            or ``None`` once ``n`` has reached ``max_restarts``.
        """
        recent = sum(1 for t in restarts if now - t < self.restart_window)
        if recent >= self.max_restarts:
            return None
        return float(min(self.max_backoff, self.backoff * 2.0 ** recent))


@dataclass(frozen=True, slots=True)
class MeshSpec:
    """The ``[mesh]`` table."""

    name: str
    security: str = "off"
    keys: Path | None = None
    interfaces: tuple[str, ...] = ()
    peers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class AgentSpec:
    """One ``[[agents]]`` table. ``None`` means "the agent's own default"."""

    name: str
    role: str
    brain: str = "scripted"
    workspace: Path | None = None
    slots: int | None = None
    tools: tuple[str, ...] | None = None
    subscriptions: tuple[str, ...] | None = None
    mcp_servers: tuple[str, ...] | None = None
    a2a: str | None = None
    endpoint: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    system_prompt: str | None = None
    system_prompt_file: Path | None = None
    goal: str | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    max_steps: int | None = None
    idle_timeout: float | None = None


@dataclass(frozen=True, slots=True)
class Team:
    """A whole team file."""

    path: Path
    mesh: MeshSpec
    agents: tuple[AgentSpec, ...]
    up: RestartPolicy = field(default_factory=RestartPolicy)
    otel: Mapping[str, Any] = field(default_factory=dict)

    def agent(self, name: str) -> AgentSpec:
        """The entry named ``name``.

        Raises:
            KeyError: no such agent.
        """
        for spec in self.agents:
            if spec.name == name:
                return spec
        raise KeyError(name)


# -- the table of keys ---------------------------------------------------------------------

Check = Callable[[Any], str | None]


@dataclass(frozen=True, slots=True)
class Key:
    """What one key may hold.

    Attributes:
        kind: ``str``, ``int``, ``float``, ``bool``, ``strs`` (a list of strings),
            ``path`` (a string, resolved against the file's directory) or ``file`` (a
            path that must name a readable file).
        required: the table needs it.
        choices: the values allowed (enums).
        check: more checks on the value: an error text, or ``None``.
        llm: only for ``brain = "llm"``.
        role: only for this role.
    """

    kind: str
    required: bool = False
    choices: tuple[str, ...] = ()
    check: Check | None = None
    llm: bool = False
    role: str | None = None


def _config(check: Callable[[str], object]) -> Check:
    """A check from one that raises :class:`ConfigError`."""

    def run(value: Any) -> str | None:
        try:
            check(value)
        except ConfigError as exc:
            return str(exc)
        return None

    return run


def _each(check: Check) -> Check:
    def run(values: Any) -> str | None:
        for value in values:
            problem = check(value)
            if problem:
                return problem
        return None

    return run


def _at_least(low: float) -> Check:
    return lambda v: None if v >= low else f"expected a number >= {low:g}, got {v!r}"


def _between(low: float, high: float) -> Check:
    return lambda v: (None if low <= v <= high
                      else f"expected a number from {low:g} to {high:g}, got {v!r}")


def _more_than(low: float) -> Check:
    return lambda v: None if v > low else f"expected a number > {low:g}, got {v!r}"


def _address(value: str) -> str | None:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return f"{value!r} is not an IP address (e.g. 127.0.0.1)"
    return None


def _mcp_server(value: str) -> str | None:
    from porter_mesh.tools.external import external_server

    return _config(external_server)(value)


def _a2a_url(value: str) -> str | None:
    if value.startswith(("http://", "https://")) and len(value) > len("https://"):
        return None
    return f"expected the A2A agent's base URL, http://host:port, got {value!r}"


def _url(value: str) -> str | None:
    from agents.llm import chat_completions_url

    return _config(chat_completions_url)(value)


_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _env_name(value: str) -> str | None:
    if _ENV_NAME.match(value):
        return None
    return (f"{value!r} is not an environment variable name; give the variable's name "
            "(e.g. LLM_API_KEY), never the key itself")


def _known(choices: tuple[str, ...], what: str) -> Check:
    def run(values: Any) -> str | None:
        for value in values:
            if value not in choices:
                return f"unknown {what} {value!r}; expected some of: {', '.join(choices)}"
        return None

    return run


def _not_blank(value: str) -> str | None:
    return None if value.strip() else "expected a non-empty string"


TOP_KEYS: Final[Mapping[str, Key]] = {
    "mesh": Key("table", required=True),
    "up": Key("table"),
    "otel": Key("table"),
    "agents": Key("tables", required=True),
}
MESH_KEYS: Final[Mapping[str, Key]] = {
    "name": Key("str", required=True, check=_config(check_mesh_name)),
    "security": Key("str", choices=SECURITY),
    "keys": Key("path"),
    "interfaces": Key("strs", check=_each(_address)),
    "peers": Key("strs", check=_each(_config(split_seed))),
}
UP_KEYS: Final[Mapping[str, Key]] = {
    "max_restarts": Key("int", check=_at_least(0)),
    "restart_window": Key("float", check=_more_than(0)),
    "backoff": Key("float", check=_at_least(0)),
    "max_backoff": Key("float", check=_at_least(0)),
    "stop_grace": Key("float", check=_more_than(0)),
}
#: The samplers the OpenTelemetry SDK knows by name (OTEL_TRACES_SAMPLER).
SAMPLERS: Final = ("always_on", "always_off", "traceidratio", "parentbased_always_on",
                   "parentbased_always_off", "parentbased_traceidratio")


def _otlp_url(value: str) -> str | None:
    if value.startswith(("http://", "https://")) and len(value) > len("https://"):
        return None
    return f"expected an http:// or https:// URL (the OTLP/HTTP endpoint), got {value!r}"


OTEL_KEYS: Final[Mapping[str, Key]] = {
    "endpoint": Key("str", check=_otlp_url),
    "headers": Key("str", check=_not_blank),
    "sampler": Key("str", choices=SAMPLERS),
    "sampler_arg": Key("float", check=_at_least(0)),
}
#: The variable each [otel] key sets for the agents (unless the environment sets it).
OTEL_ENV: Final[Mapping[str, str]] = {
    "endpoint": "OTEL_EXPORTER_OTLP_ENDPOINT",
    "headers": "OTEL_EXPORTER_OTLP_HEADERS",
    "sampler": "OTEL_TRACES_SAMPLER",
    "sampler_arg": "OTEL_TRACES_SAMPLER_ARG",
}


def otel_env(team: Team, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``OTEL_*`` variables the team's ``[otel]`` table gives its agents.

    Args:
        team: the team.
        environ: the environment the agents inherit (default ``os.environ``): a variable
            set there wins over the file, as OpenTelemetry's own settings should.

    Returns:
        The variables to add to each agent's environment.
    """
    environ = os.environ if environ is None else environ
    return {OTEL_ENV[key]: str(value) for key, value in team.otel.items()
            if OTEL_ENV[key] not in environ}


AGENT_KEYS: Final[Mapping[str, Key]] = {
    "name": Key("str", required=True, check=_config(check_agent_name)),
    "role": Key("str", required=True, choices=ROLES),
    "brain": Key("str", choices=BRAINS),
    "workspace": Key("path"),
    "slots": Key("int", check=_at_least(1), role="worker"),
    "tools": Key("strs", check=_known(ALL_TOOLS, "tool")),
    "subscriptions": Key("strs", check=_known(CHANNELS, "channel")),
    "mcp_servers": Key("strs", check=_each(_mcp_server)),
    "a2a": Key("str", check=_a2a_url, role="worker"),
    "endpoint": Key("str", check=_url, llm=True),
    "model": Key("str", check=_not_blank, llm=True),
    "api_key_env": Key("str", check=_env_name, llm=True),
    "system_prompt": Key("str", check=_not_blank, llm=True),
    "system_prompt_file": Key("file", llm=True),
    "goal": Key("str", check=_not_blank, llm=True),
    "temperature": Key("float", check=_between(0, 2), llm=True),
    "max_tokens": Key("int", check=_at_least(1), llm=True),
    "max_steps": Key("int", check=_at_least(1), llm=True),
    "idle_timeout": Key("float", check=_at_least(0), llm=True),
}

_KIND_WORDS: Final = {
    "str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
    "strs": "a list of strings", "path": "a path (a string)", "file": "a file path (a string)",
    "table": "a table ([name])", "tables": "an array of tables ([[name]])",
}


def _type_word(value: Any) -> str:
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return f'a string ("{value}")' if len(value) < 40 else "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


def _has_kind(kind: str, value: Any) -> bool:
    if kind in ("str", "path", "file"):
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "strs":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "table":
        return isinstance(value, dict)
    if kind == "tables":
        return isinstance(value, list) and all(isinstance(v, dict) for v in value)
    raise AssertionError(kind)


def _choices_word(choices: tuple[str, ...]) -> str:
    quoted = [f'"{c}"' for c in choices]
    return " or ".join(quoted) if len(quoted) <= 2 else ", ".join(quoted[:-1]) + \
        f" or {quoted[-1]}"


class _Reader:
    """Checks one file's tables against the key tables; raises on the first problem."""

    def __init__(self, shown: str, base: Path) -> None:
        self.shown = shown
        self.base = base

    def fail(self, where: str, text: str) -> TeamError:
        prefix = f"{self.shown}: {where}: " if where else f"{self.shown}: "
        return TeamError(prefix + text, where=where)

    def table(self, where: str, data: Mapping[str, Any], keys: Mapping[str, Key],
              *, brain: str | None = None, role: str | None = None) -> dict[str, Any]:
        """The table's values, converted (paths resolved); missing keys are absent."""
        at = f"{where}." if where else ""
        for name in data:
            if name not in keys:
                close = difflib.get_close_matches(name, list(keys), n=1, cutoff=0.6)
                hint = (f'did you mean "{close[0]}"?' if close
                        else f"expected one of: {', '.join(keys)}")
                raise self.fail(f"{at}{name}", f"unknown key; {hint}")
        for name, key in keys.items():
            if key.required and name not in data:
                raise self.fail(f"{at}{name}", f"missing; expected {_KIND_WORDS[key.kind]}"
                                + (f": {_choices_word(key.choices)}" if key.choices else ""))
        out: dict[str, Any] = {}
        for name, key in keys.items():  # in the table's order: name, role, brain first
            if name in data:
                out[name] = self.value(f"{at}{name}", key, data[name], brain=brain, role=role)
        return out

    def value(self, where: str, key: Key, value: Any, *, brain: str | None,
              role: str | None) -> Any:
        if not _has_kind(key.kind, value):
            raise self.fail(where, f"expected {_KIND_WORDS[key.kind]}, got {_type_word(value)}")
        if key.choices and value not in key.choices:
            raise self.fail(where, f"expected {_choices_word(key.choices)}, got \"{value}\"")
        if key.llm and brain != "llm":
            raise self.fail(where, 'only for brain = "llm" (this agent\'s brain is '
                            f'"{brain}")')
        if key.role is not None and role != key.role:
            raise self.fail(where, f'only for role = "{key.role}"')
        if key.check is not None:
            problem = key.check(value)
            if problem:
                raise self.fail(where, problem)
        if key.kind == "float":
            return float(value)
        if key.kind == "strs":
            return tuple(value)
        if key.kind in ("path", "file"):
            path = (self.base / value).resolve()
            if key.kind == "file" and not path.is_file():
                raise self.fail(where, f"no file {value!r} (looked for {path}; paths are "
                                "relative to the team file)")
            return path
        return value


def parse_team(text: str, *, path: Path, shown: str | None = None) -> Team:
    """A team from TOML text.

    Args:
        text: the file's content.
        path: where it is (paths in it are relative to its directory).
        shown: how to name the file in errors (default: ``path`` as given).

    Returns:
        The team.

    Raises:
        TeamError: the one line that says what is wrong.
    """
    reader = _Reader(shown if shown is not None else str(path), path.parent)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise reader.fail("", f"not valid TOML: {exc}") from None
    top = reader.table("", data, TOP_KEYS)
    mesh = reader.table("mesh", top["mesh"], MESH_KEYS)
    up = reader.table("up", top.get("up", {}), UP_KEYS)
    otel = reader.table("otel", top.get("otel", {}), OTEL_KEYS)
    if not top["agents"]:
        raise reader.fail("agents", "expected at least one [[agents]] table")
    agents: list[AgentSpec] = []
    seen: dict[str, int] = {}
    for index, entry in enumerate(top["agents"]):
        where = f"agents[{index}]"
        brain = entry.get("brain", "scripted")
        brain = brain if isinstance(brain, str) else None
        role = entry.get("role") if isinstance(entry.get("role"), str) else None
        values = reader.table(where, entry, AGENT_KEYS, brain=brain, role=role)
        name = values["name"]
        if name in seen:
            raise reader.fail(f"{where}.name", f'"{name}" is already the name of '
                              f"agents[{seen[name]}]; every agent needs its own")
        seen[name] = index
        if values.get("brain") == "llm" and "endpoint" not in values:
            raise reader.fail(f"{where}.endpoint", 'missing; brain = "llm" needs an '
                              'OpenAI-compatible endpoint URL (e.g. "http://127.0.0.1:8000/v1")')
        if "system_prompt" in values and "system_prompt_file" in values:
            raise reader.fail(f"{where}.system_prompt_file", "give system_prompt or "
                              "system_prompt_file, not both")
        agents.append(AgentSpec(**values))
    if mesh.get("security") == "curve" and "keys" not in mesh:
        mesh["keys"] = (path.parent / "keys").resolve()
    policy = RestartPolicy(**up)
    if policy.max_backoff < policy.backoff:
        raise reader.fail("up.max_backoff", f"expected a number >= backoff "
                          f"({policy.backoff:g}), got {policy.max_backoff:g}")
    return Team(path=path, mesh=MeshSpec(**mesh), agents=tuple(agents), up=policy,
                otel=otel)


def load_team(path: Path | str) -> Team:
    """Read and check a team file.

    Raises:
        TeamError: the file cannot be read or is wrong (one line, naming the file).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise TeamError(f"{path}: cannot read the team file: {why}") from None
    return parse_team(text, path=path.resolve(), shown=str(path))


# -- the agents' command lines ---------------------------------------------------------------


def default_workspace(team: Team) -> Path:
    """Where agents without a ``workspace`` work: ``workspace/`` beside the team file."""
    return team.path.parent / "workspace"


def agent_argv(team: Team, spec: AgentSpec, *, mesh: str | None = None,
               workspace: Path | None = None) -> list[str]:
    """The ``porter-mesh`` arguments that run ``spec`` (after ``python -m
    porter_mesh.cli.main``).

    With the scripted brain, an architect is told how many workers to wait for, and an
    architect or a worker who reviews, from the team.

    Args:
        team: the team.
        spec: one of its agents.
        mesh: another mesh name than the file's (the demo makes one per run).
        workspace: a workspace for every agent, instead of theirs (the demo's).
    """
    where: list[str] = []
    for address in team.mesh.interfaces:
        where += ["--interface", address]
    for peer in team.mesh.peers:
        where += ["--peer", peer]
    reviewers = [a.name for a in team.agents if a.role == "reviewer"]
    if spec.a2a is not None:  # an outside A2A agent, joined as this worker
        return ["a2a", "--join", spec.a2a, "--name", spec.name, "--mesh",
                mesh or team.mesh.name, *where,
                *(["--slots", str(spec.slots)] if spec.slots is not None else []),
                *(["--reviewer", reviewers[0]] if reviewers else [])]
    argv = ["agent", spec.role, "--name", spec.name, "--mesh", mesh or team.mesh.name,
            "--workspace", str(workspace or spec.workspace or default_workspace(team)), *where]
    if spec.brain != "scripted":
        argv += ["--brain", spec.brain]
    if spec.brain == "scripted" and spec.role in ("architect", "worker"):
        if spec.role == "architect":
            workers = [a for a in team.agents if a.role == "worker"]
            argv += ["--workers", str(len(workers))]
        if reviewers:
            argv += ["--reviewer", reviewers[0]]
    if spec.tools is not None:
        argv += ["--tools", ",".join(spec.tools)]
    for channel in spec.subscriptions or ():
        argv += ["--subscribe", channel]
    for command in spec.mcp_servers or ():
        argv += ["--mcp-server", command]
    options: list[tuple[str, object]] = [
        ("--slots", spec.slots), ("--llm-url", spec.endpoint), ("--model", spec.model),
        ("--api-key-env", spec.api_key_env), ("--system-prompt", spec.system_prompt),
        ("--system-prompt-file", spec.system_prompt_file), ("--goal", spec.goal),
        ("--temperature", spec.temperature), ("--max-tokens", spec.max_tokens),
        ("--max-steps", spec.max_steps), ("--idle-timeout", spec.idle_timeout),
    ]
    for option, value in options:
        if value is not None:
            argv += [option, str(value)]
    return argv
