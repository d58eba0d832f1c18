"""Team files and ``porter-mesh up``: the checks of a file, and a team as real processes
(up and alive on the mesh, a kill -9 and the restart, giving up after the limit, Ctrl-C
stopping everything)."""

from __future__ import annotations

import os
import re
import signal
import textwrap
import time
from pathlib import Path

import orjson
import psutil
import pytest

from agents.team import RestartPolicy, agent_argv, load_team, parse_team
from tests.integration.cli_proc import Running, cli
from tests.integration.fake_llm import FakeLLM, Status, reply, tool_call

REPO = Path(__file__).resolve().parents[2]

GOOD = """
[mesh]
name = "{mesh}"

[up]
max_restarts = {max_restarts}
restart_window = 60.0
backoff = 0.2
max_backoff = 1.0
stop_grace = 5.0

[[agents]]
name = "w1"
role = "worker"
slots = 2

[[agents]]
name = "rev"
role = "reviewer"
"""


def _mesh() -> str:
    return f"team{os.getpid()}-{time.monotonic_ns() % 10**9}"


def _write(tmp_path: Path, text: str, name: str = "team.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _good_team(tmp_path: Path) -> tuple[str, Path]:
    """A mesh of its own and the GOOD team file on it."""
    mesh = _mesh()
    return mesh, _write(tmp_path, GOOD.format(mesh=mesh, max_restarts=5))


# -- the file --------------------------------------------------------------------------------

BASE = """
[mesh]
name = "m1"
[[agents]]
name = "a1"
role = "worker"
"""

BAD_FILES = [
    ("unknown key", BASE + 'colour = "red"\n',
     "agents[0].colour: unknown key; expected one of: name, role, brain,"),
    ("misspelt key", BASE + 'brian = "llm"\n',
     'agents[0].brian: unknown key; did you mean "brain"?'),
    ("misspelt table", BASE.replace("[mesh]", "[mesch]"),
     'mesch: unknown key; did you mean "mesh"?'),
    ("wrong type", BASE + 'slots = "2"\n',
     'agents[0].slots: expected an integer, got a string ("2")'),
    ("wrong type in a list", BASE + 'tools = ["bash", 3]\n',
     "agents[0].tools: expected a list of strings, got an array"),
    ("missing field", BASE.replace('role = "worker"\n', ""),
     'agents[0].role: missing; expected a string: "architect", "worker" or "reviewer"'),
    ("missing mesh", '[[agents]]\nname = "a1"\nrole = "worker"\n',
     "mesh: missing; expected a table ([name])"),
    ("no agents", '[mesh]\nname = "m1"\n', "agents: missing; expected an array of tables"),
    ("bad enum", BASE + 'brain = "lm"\n',
     'agents[0].brain: expected "scripted" or "llm", got "lm"'),
    ("bad role", BASE.replace('"worker"', '"boss"'),
     'agents[0].role: expected "architect", "worker" or "reviewer", got "boss"'),
    ("missing prompt file", BASE + 'brain = "llm"\nendpoint = "http://127.0.0.1:8000/v1"\n'
     'system_prompt_file = "prompts/nope.md"\n',
     "agents[0].system_prompt_file: no file 'prompts/nope.md' (looked for "),
    ("duplicate names", BASE + '[[agents]]\nname = "a1"\nrole = "reviewer"\n',
     'agents[1].name: "a1" is already the name of agents[0]; every agent needs its own'),
    ("llm key on a scripted agent", BASE + 'model = "m"\n',
     'agents[0].model: only for brain = "llm" (this agent\'s brain is "scripted")'),
    ("llm without endpoint", BASE + 'brain = "llm"\n',
     'agents[0].endpoint: missing; brain = "llm" needs an OpenAI-compatible endpoint URL'),
    ("bad endpoint", BASE + 'brain = "llm"\nendpoint = "ftp://h/v1"\n',
     "agents[0].endpoint: LLM URL 'ftp://h/v1' must start with http:// or https://"),
    ("a key for a variable", BASE + 'brain = "llm"\nendpoint = "http://h/v1"\n'
     'api_key_env = "sk-123"\n',
     "agents[0].api_key_env: 'sk-123' is not an environment variable name"),
    ("slots for a reviewer", BASE.replace('"worker"', '"reviewer"') + "slots = 1\n",
     'agents[0].slots: only for role = "worker"'),
    ("bad agent name", BASE.replace('name = "a1"', 'name = "a 1"'), "agents[0].name: "),
    ("unknown tool", BASE + 'tools = ["fly"]\n', "agents[0].tools: unknown tool 'fly'"),
    ("bad channel", BASE + 'subscriptions = ["control"]\n',
     "agents[0].subscriptions: unknown channel 'control'; expected some of: log, task, "
     "review"),
    ("bad number", BASE + "[up]\nbackoff = -1\n", "up.backoff: expected a number >= 0"),
    ("cap below start", BASE + "[up]\nbackoff = 4\nmax_backoff = 2\n",
     "up.max_backoff: expected a number >= backoff (4), got 2"),
    ("not TOML", BASE + "name = \n", "not valid TOML: "),
]


@pytest.mark.parametrize(("case", "text", "expected"), BAD_FILES,
                         ids=[case for case, _, _ in BAD_FILES])
def test_bad_team_files_are_one_line_and_status_2(tmp_path: Path, case: str, text: str,
                                                  expected: str) -> None:
    path = _write(tmp_path, text, "TEAM.toml")
    proc = cli("up", str(path), timeout=30)
    assert proc.returncode == 2, (case, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"porter-mesh up: {path}: "), lines[0]
    assert expected in lines[0], lines[0]
    assert proc.stdout == ""


def test_a_missing_team_file_is_one_line() -> None:
    proc = cli("up", "/nonexistent/TEAM.toml", timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("porter-mesh up: /nonexistent/TEAM.toml: cannot read "
                                   "the team file: No such file or directory")


def test_the_examples_are_valid_and_give_the_agents_their_options() -> None:
    demo = load_team(REPO / "examples" / "demo-team.toml")
    assert [(a.role, a.name) for a in demo.agents] == [
        ("architect", "architect"), ("worker", "worker-1"), ("worker", "worker-2"),
        ("reviewer", "reviewer")]
    argv = agent_argv(demo, demo.agent("architect"))
    assert argv[argv.index("--workers") + 1] == "2"
    assert argv[argv.index("--reviewer") + 1] == "reviewer"
    llm = load_team(REPO / "examples" / "llm-team.toml")
    assert {a.brain for a in llm.agents} == {"llm"}
    assert {a.endpoint for a in llm.agents} == {"http://127.0.0.1:8000/v1"}
    architect = llm.agent("architect")
    assert architect.system_prompt_file == REPO / "examples" / "prompts" / "architect.md"
    argv = agent_argv(llm, architect)
    assert argv[argv.index("--api-key-env") + 1] == "LLM_API_KEY"
    assert argv[argv.index("--system-prompt-file") + 1] == str(architect.system_prompt_file)
    check = cli("up", "--check", str(REPO / "examples" / "llm-team.toml"), timeout=30)
    assert check.returncode == 0, check.stderr
    assert len(check.stdout.splitlines()) == 3
    # Every command line that up would run is one that porter-mesh agent accepts.
    for team in (demo, llm):
        for spec in team.agents:
            parsed = cli(*agent_argv(team, spec), "--help", timeout=30)
            assert parsed.returncode == 0, parsed.stderr


def test_paths_are_relative_to_the_team_file(tmp_path: Path) -> None:
    (tmp_path / "p.md").write_text("Be brief.")
    team = parse_team(BASE + 'workspace = "ws"\nbrain = "llm"\nendpoint = "http://h/v1"\n'
                      'system_prompt_file = "p.md"\n', path=tmp_path / "t.toml")
    spec = team.agents[0]
    assert spec.workspace == tmp_path / "ws"
    assert spec.system_prompt_file == tmp_path / "p.md"
    assert parse_team(BASE, path=tmp_path / "t.toml").up == RestartPolicy()


def test_restart_policy_backs_off_and_gives_up() -> None:
    policy = RestartPolicy(max_restarts=5, restart_window=60, backoff=1, max_backoff=8)
    restarts: list[float] = []
    delays = []
    now = 100.0
    while (delay := policy.next_delay(restarts, now)) is not None:
        delays.append(delay)
        restarts.append(now)
        now += delay + 1
    assert delays == [1, 2, 4, 8, 8]
    # Restarts older than the window are forgiven.
    assert policy.next_delay(restarts, now + 60) == 1


# -- porter-mesh up, real processes ----------------------------------------------------------


def _pid(up: Running, name: str, state: str, after: int = 0) -> int:
    """The pid in the first line past ``after`` saying agent ``name`` is in ``state``."""
    pattern = re.compile(rf" {re.escape(name)} +{re.escape(state)} \(pid (\d+)\)")
    found: list[int] = []

    def seen() -> bool:
        for line in up.out[after:]:
            match = pattern.search(line)
            if match:
                found.append(int(match.group(1)))
                return True
        return False

    up.wait_until(seen, 60, f"{name} {state}")
    return found[0]


def _line(up: Running, text: str, timeout: float = 60) -> int:
    """The index of the first output line containing ``text``."""
    up.wait_until(lambda: any(text in line for line in up.out), timeout, repr(text))
    return next(i for i, line in enumerate(up.out) if text in line)


def _gone(pids: list[int], timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


@pytest.mark.network
@pytest.mark.timeout(120)
def test_up_runs_the_team_restarts_a_killed_agent_and_stops_on_ctrl_c(
        tmp_path: Path) -> None:
    mesh, path = _good_team(tmp_path)
    up = Running("up", str(path))
    pids: list[int] = []
    try:
        first = _pid(up, "w1", "alive on the mesh")
        pids += [first, _pid(up, "rev", "alive on the mesh")]
        peers = cli("peers", "--mesh", mesh, "--json", "--wait", "3", timeout=30)
        assert peers.returncode == 0, peers.stderr
        seen = {orjson.loads(line)["name"]: orjson.loads(line) for line in
                peers.stdout.splitlines()}
        assert {"w1", "rev"} <= set(seen), peers.stdout
        assert seen["w1"]["role"] == "worker"

        mark = len(up.out)
        os.kill(first, signal.SIGKILL)
        _line(up, "w1               crashed (killed by SIGKILL)")
        _line(up, "w1               restarting in 0.2s (restart 1)")
        second = _pid(up, "w1", "alive on the mesh", after=mark)
        pids.append(second)
        assert second != first
        assert (tmp_path / "logs" / "w1.log").read_text().count("worker up on mesh") == 2
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(30) == 130  # Ctrl-C
    finally:
        up.stop()
    assert "stopped every agent" in up.out[-1], up.out[-5:]
    assert _gone(pids) == []
    assert not any("gave up" in line for line in up.out)


@pytest.mark.network
@pytest.mark.timeout(120)
def test_a_second_up_refuses_at_once_and_mesh_runs_a_second_copy(tmp_path: Path) -> None:
    mesh, path = _good_team(tmp_path)
    first = Running("up", str(path))
    copy: Running | None = None
    try:
        w1 = _pid(first, "w1", "alive on the mesh")
        rev = _pid(first, "rev", "alive on the mesh")
        started = time.monotonic()
        again = cli("up", str(path), timeout=60)
        took = time.monotonic() - started
        assert again.returncode == 2, (again.returncode, again.stdout, again.stderr)
        assert took < 10, f"the refusal took {took:.1f}s"
        assert again.stdout == "", again.stdout  # no agent was started
        line, = again.stderr.strip().splitlines()
        assert f"this team is already running on mesh '{mesh}'" in line, line
        assert f"w1 pid {w1}" in line and f"rev pid {rev}" in line, line
        assert f"under porter-mesh up pid {first.proc.pid}" in line, line
        assert f"kill {first.proc.pid}" in line, line
        assert f"porter-mesh up {path} --mesh {mesh}-2" in line, line

        copy = Running("up", str(path), "--mesh", f"{mesh}-2")
        copied = [_pid(copy, "w1", "alive on the mesh"), _pid(copy, "rev", "alive on the mesh")]
        assert not {w1, rev} & set(copied)
        assert "worker up on mesh" in (tmp_path / "logs" / f"{mesh}-2" / "w1.log").read_text()
        peers = cli("peers", "--mesh", f"{mesh}-2", "--json", "--wait", "3", timeout=30)
        assert {"w1", "rev"} <= {orjson.loads(row)["name"] for row in peers.stdout.splitlines()}
        for up in (copy, first):
            up.proc.send_signal(signal.SIGINT)
            assert up.proc.wait(30) == 130  # Ctrl-C
    finally:
        for up in (copy, first):
            if up is not None:
                up.stop()
    assert not any("crashed" in line or "restarting" in line for line in first.out + copy.out)
    assert _gone([w1, rev, *copied]) == []


@pytest.mark.network
@pytest.mark.timeout(120)
def test_an_agent_that_refuses_its_settings_is_not_restarted(tmp_path: Path) -> None:
    mesh, path = _good_team(tmp_path)
    # A node of another data directory already holds the name w1 on the mesh: w1 will
    # refuse to start (exit status 2), however often it is started.
    holder = Running("node", "--name", "w1", "--mesh", mesh,
                     "--data-dir", str(tmp_path / "holder"))
    up: Running | None = None
    try:
        holder.wait_until(lambda: any("node w1 up" in line for line in holder.err), 30,
                          "the holder of the name w1")
        up = Running("up", str(path))
        rev = _pid(up, "rev", "alive on the mesh")
        refused = _line(up, "w1               refused its settings (exit status 2), "
                        "not restarted: ")
        assert "duplicate agent name 'w1'" in up.out[refused], up.out[refused]
        assert f"unique per mesh (here '{mesh}')" in up.out[refused], up.out[refused]
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(30) == 130
    finally:
        for proc in (up, holder):
            if proc is not None:
                proc.stop()
    assert up is not None
    assert not any(" w1 " in line and ("restarting" in line or "crashed" in line)
                   for line in up.out), up.out
    assert _gone([rev]) == []


@pytest.mark.network
@pytest.mark.timeout(120)
def test_a_draining_worker_says_so_when_it_refuses_a_task(tmp_path: Path) -> None:
    mesh, path = _good_team(tmp_path)
    up = Running("up", str(path))
    try:
        w1 = _pid(up, "w1", "alive on the mesh")
        drained = cli("control", "drain", "--to", "w1", "--mesh", mesh, timeout=30)
        assert drained.returncode == 0, drained.stderr
        deadline = time.monotonic() + 30
        while True:  # the roster says so once the worker has taken the drain
            peers = cli("peers", "--mesh", mesh, "--json", "--wait", "3", timeout=30)
            rows = {orjson.loads(row)["name"]: orjson.loads(row)
                    for row in peers.stdout.splitlines()}
            if rows.get("w1", {}).get("draining"):
                break
            assert time.monotonic() < deadline, peers.stdout
        asked = cli("request", "task:w1", "Write notes.md", "--mesh", mesh, "--timeout", "20",
                    timeout=60)
        assert asked.returncode == 1, (asked.stdout, asked.stderr)  # a Reject
        reject, = [line for line in asked.stdout.splitlines() if " Reject " in line]
        assert "Draining: I finish the tasks I hold and take no new ones" in reject, reject
        assert "Busy" not in asked.stdout
    finally:
        up.stop()
    assert _gone([w1]) == []


@pytest.mark.network
@pytest.mark.timeout(120)
def test_up_gives_up_on_an_agent_that_keeps_failing(tmp_path: Path) -> None:
    mesh = _mesh()
    with FakeLLM(when_done=Status(401, b'{"error": "bad key"}')) as fake:
        path = _write(tmp_path, f"""
            [mesh]
            name = "{mesh}"
            [up]
            max_restarts = 2
            backoff = 0.1
            max_backoff = 0.2
            [[agents]]
            name = "planner"
            role = "architect"
            brain = "llm"
            endpoint = "{fake.url}"
            api_key_env = "TEAM_TEST_NO_SUCH_KEY"
            goal = "Plan the work"
            [[agents]]
            name = "idler"
            role = "worker"
            brain = "llm"
            endpoint = "{fake.url}"
            idle_timeout = 0.5
            subscriptions = ["review"]  # deaf to the planner's announcements on log
            """)
        up = Running("up", str(path))
        try:
            assert up.proc.wait(90) == 1
        finally:
            up.stop()
        requests = len(fake.requests)
    out = "\n".join(up.out)
    assert "planner          note: $TEAM_TEST_NO_SUCH_KEY is not set" in out
    assert out.count("planner          crashed (exit status 1)") == 3, out
    assert "planner          restarting in 0.1s (restart 1)" in out
    assert "planner          restarting in 0.2s (restart 2)" in out
    assert "planner          gave up after 2 restart(s) within 60s" in out
    assert "idler            exited (status 0): the agent finished" in out
    assert up.out[-1].endswith("no agent left running; gave up on planner")
    assert requests == 3  # one refused request per start: 401 stops an agent at once
    log = (tmp_path / "logs" / "planner.log").read_text()
    assert log.count("HTTP 401") == 3


@pytest.mark.network
@pytest.mark.timeout(120)
def test_an_llm_team_from_a_file_does_its_work_on_the_mesh(tmp_path: Path) -> None:
    mesh = _mesh()
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "lead.md").write_text("You lead. Offer work to builder.\n")
    lead = [
        reply(None, tool_call("send_message", {
            "channel": "task:builder", "message": "Write hello.txt\nPut hello in it.",
            "type": "Offer", "context": None, "tag": None})),
        reply("Offered."),
    ]
    builder = [
        reply(None, tool_call("send_message", {"channel": "task:lead", "message":
                                               "Taking it", "type": "Accept"})),
        reply(None, tool_call("write_file", {"path": "hello.txt", "content": "hello\n"})),
        reply(None, tool_call("send_message", {"channel": "log",
                                               "message": "hello.txt is written"})),
        reply("Done."),
    ]
    with FakeLLM(when_done=reply("Nothing more."),
                 by_agent={"lead": lead, "builder": builder}) as fake:
        path = _write(tmp_path, f"""
            [mesh]
            name = "{mesh}"
            [[agents]]
            name = "lead"
            role = "architect"
            brain = "llm"
            endpoint = "{fake.url}"
            model = "team-model"
            system_prompt_file = "prompts/lead.md"
            goal = "Get hello.txt written"
            [[agents]]
            name = "builder"
            role = "worker"
            brain = "llm"
            endpoint = "{fake.url}"
            model = "team-model"
            workspace = "ws"
            max_tokens = 512
            subscriptions = ["task"]  # its first request is the offer, not lead's "online"
            """)
        up = Running("up", str(path))
        try:
            pids = [_pid(up, "lead", "alive on the mesh"),
                    _pid(up, "builder", "alive on the mesh")]
            deadline = time.monotonic() + 60
            while not (tmp_path / "ws" / "hello.txt").exists():
                assert time.monotonic() < deadline, "builder never wrote hello.txt"
                assert up.proc.poll() is None, up.out
                time.sleep(0.1)
            metrics: dict[str, int] = {}
            while metrics.get("tool_calls", 0) < 3:
                assert time.monotonic() < deadline, f"builder's metrics: {metrics}"
                stats = cli("stats", "builder", "--mesh", mesh, "--json", "--wait", "10",
                            timeout=30)
                assert stats.returncode == 0, stats.stderr
                metrics = orjson.loads(stats.stdout)["agent"]
            up.proc.send_signal(signal.SIGINT)
            assert up.proc.wait(30) == 130  # Ctrl-C
        finally:
            up.stop()
        requests = list(fake.requests)
    assert (tmp_path / "ws" / "hello.txt").read_text() == "hello\n"
    assert _gone(pids) == []
    assert metrics["model_calls"] >= 4 and metrics["errors"] == 0
    first_lead = next(r for r in requests if fake.agent_of(r) == "lead")
    assert first_lead.body["model"] == "team-model"
    assert first_lead.body["messages"][0]["content"].startswith("You lead. Offer work")
    assert first_lead.body["messages"][1]["content"] == "Your goal:\nGet hello.txt written"
    first_builder = next(r for r in requests if fake.agent_of(r) == "builder")
    assert first_builder.body["max_tokens"] == 512
    assert "[task:builder] lead: Write hello.txt -- Put hello in it. (Offer; task " in (
        first_builder.body["messages"][-1]["content"])


def test_an_a2a_entry_joins_with_the_teams_reviewer(tmp_path: Path) -> None:
    team = parse_team(BASE + 'a2a = "http://127.0.0.1:9999"\n'
                      '[[agents]]\nname = "rev-2"\nrole = "reviewer"\n',
                      path=tmp_path / "t.toml")
    argv = agent_argv(team, team.agent("a1"))
    assert argv[:4] == ["a2a", "--join", "http://127.0.0.1:9999", "--name"], argv
    assert argv[argv.index("--reviewer") + 1] == "rev-2"
    parsed = cli(*argv, "--help", timeout=30)
    assert parsed.returncode == 0, parsed.stderr
