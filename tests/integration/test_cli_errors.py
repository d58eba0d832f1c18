"""Every sub-command, fed bad values, says what is wrong in one line and exits 2.

The table is built from the parser, so a new sub-command or option is covered as soon
as it exists. Each case runs the real ``main()``; none may reach the mesh (a bad value is
refused before joining, so a case that tried to join would hang and time out). A
handful of cases also run as real processes.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import subprocess
from collections.abc import Iterator

import pytest

from porter_mesh.cli import common
from porter_mesh.cli.main import build_parser, main
from tests.integration.cli_proc import Running, cli

pytestmark = pytest.mark.timeout(60)

#: Bad values for each kind of option, by its ``type=`` function.
BAD: dict[object, tuple[str, ...]] = {
    common.seconds: ("-1", "nan", "inf", "soon"),
    common.count: ("-3", "many", "2.5"),
    common.seed: ("foo", "127.0.0.1", "127.0.0.1:99999", "127.0.0.1:abc", ":5555",
                  "127.0.0.1:0"),
    common.agent_name: ("Bad Name", "-x", ""),
    common.mesh_name: ("Bad Mesh", ""),
    common.interface: ("not-an-ip", "127.0.0.1:5555"),
    common.task_context: ("urn:porter:task:", "has space"),
    common.channel_name: ("control", "task:Bad Name", "a b"),
}
#: A valid value for a required option or positional, by type.
GOOD: dict[object, str] = {common.agent_name: "ok-name", common.channel_name: "log",
                          common.task_context: "t1"}


def _commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
              ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, parser
        return
    for name, child in subs[0].choices.items():
        yield from _commands(child, (*prefix, name))


def _base(parser: argparse.ArgumentParser) -> list[str]:
    """The positionals and required options with valid values."""
    argv: list[str] = []
    for action in parser._actions:
        if action.option_strings and not action.required:
            continue
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        value = (str(next(iter(action.choices))) if action.choices
                 else GOOD.get(action.type, "x"))
        if action.option_strings:
            argv += [action.option_strings[-1], value]
        elif action.nargs not in ("?", "*"):
            argv.append(value)
    return argv


def _cases() -> Iterator[object]:
    for path, parser in _commands(build_parser()):
        base = _base(parser)
        for action in parser._actions:
            for bad in BAD.get(action.type, ()):
                if action.option_strings:
                    argv = [*path, *base, f"{action.option_strings[-1]}={bad}"]
                else:  # a positional: replace its valid value
                    argv = [*path, *[bad if v == GOOD.get(action.type) else v for v in base]]
                yield pytest.param(argv, bad, id=" ".join([*path, action.dest, repr(bad)]))


CASES = list(_cases())


def test_the_table_covers_the_commands_that_join_a_mesh() -> None:
    covered = {c.values[0][0] for c in CASES}  # type: ignore[attr-defined]
    assert {"send", "request", "tail", "peers", "node", "control", "remember",
            "recall"} <= covered


@pytest.mark.parametrize(("argv", "bad"), CASES)
def test_a_bad_value_is_one_line_and_exit_2(argv: list[str], bad: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = main(argv)
    except SystemExit as exc:
        status = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert status == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert not bad or repr(bad) in err or bad in err, err


@pytest.mark.parametrize("argv", [
    ["peers", "--peer", "foo"],
    ["send", "log", "hi", "--peer", "nope"],
    ["node", "--name", "Bad Name"],
    ["agent", "worker", "--name", "Bad Name"],
    ["send", "log"],
    ["send", "log", "hi", "--json", "-"],
    ["send", "log", "--json", "/nonexistent/activity.json"],
    ["validate", "/nonexistent/file.jsonl"],
    ["request", "task:w1", "hi", "--type", "Note"],
    ["send", "log", "hi", "--type", "Shout"],
    ["send", "lgo", "hello"],
    ["request", "lgo", "anyone?", "--context", "abc"],
    ["tail", "log", "reveiw"],
    ["nosuchcommand"],
])
def test_as_a_process(argv: list[str]) -> None:
    out = cli(*argv, timeout=30)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_channel_outside_the_profile_is_a_mistake_unless_meant(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["send", "lgo", "hello"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("porter-mesh send: 'lgo' is not a channel of the profile (log, task, "
                   "review or task:<agent>); did you mean 'log'? give --any-channel to use "
                   "it all the same"), err
    assert main(["tail", "control", "logs"]) == 2  # tail may watch control
    assert "'logs' is not a channel of the profile" in capsys.readouterr().err
    # Meant: it goes on to look for the mesh, which is empty.
    mesh = f"anychannel{os.getpid()}"
    assert main(["send", "lgo", "hello", "--any-channel", "--wait", "0", "--mesh", mesh]) == 1
    assert f"nobody on mesh '{mesh}'" in capsys.readouterr().err


def test_recall_names_an_unknown_prefix() -> None:
    out = cli("recall", "SELECT ?x WHERE { ?x foo:bar ?y }", timeout=30)
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("porter-mesh recall: unknown prefix foo: declare it with "
                                 "PREFIX foo: <...> (line 1, column "), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.parametrize("action", ["stats", "export"])
def test_kg_without_a_shard_named_is_a_usage_mistake(action: str) -> None:
    out = cli("kg", action, timeout=30)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert out.stderr.startswith("porter-mesh kg: say which shard: --data-dir DIR, or "
                                 "--agent NAME"), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_the_mcp_install_hint_works_where_the_command_runs() -> None:
    import sys

    # The SDK masked, as if the extra were not installed: the command says what to run.
    masked = ("import sys; sys.modules['mcp'] = None\n"
              "from porter_mesh.cli.main import main\n"
              "sys.exit(main(['mcp', '--name', 'x']))")
    out = subprocess.run([sys.executable, "-c", masked], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    repo = pathlib.Path(__file__).resolve().parents[2]
    # This interpreter's pip (the venv's, whatever 'pip' the shell finds) and this
    # checkout (the project is on no package index).
    assert out.stderr.strip().endswith(
        f"install it with: {sys.executable} -m pip install -e '{repo}[mcp]'"), out.stderr


@pytest.mark.network
def test_a_second_dashboard_is_told_to_use_another_mesh() -> None:
    mesh = f"twoui{os.getpid()}"
    first = Running("ui", "--mesh", mesh, "--port", "0")
    try:
        first.wait_until(lambda: any("porter-ui: open" in line for line in first.out), 60,
                         "the first dashboard's address")
        second = cli("ui", "--mesh", mesh, "--port", "0", timeout=60)
    finally:
        first.stop()
    assert second.returncode == 2, second.stderr
    line, = second.stderr.strip().splitlines()
    assert line.startswith(f"porter-mesh ui: another porter-mesh ui (pid {first.proc.pid}) "
                           f"already serves mesh {mesh!r} from "), line
    assert line.endswith(f": open the address it printed, stop it (kill {first.proc.pid}), "
                         "or run this one on another --mesh"), line
    assert "--data-dir" not in line, line


def test_bad_files_and_data_directories(tmp_path: pathlib.Path) -> None:
    not_json = tmp_path / "a.json"
    not_json.write_text("hello")
    a_file = tmp_path / "file"
    a_file.write_text("")
    runs = [
        cli("send", "log", "--json", str(not_json), timeout=30),
        cli("send", "log", "--json", "-", stdin='{"type": "Note", "actor": "mallory"}',
            timeout=30),
        cli("send", "log", "--json", "-", stdin="[1, 2]", timeout=30),
        cli("node", "--name", "n1", "--data-dir", str(a_file / "sub"), "--no-discovery",
            timeout=30),
    ]
    for out in runs:
        assert isinstance(out, subprocess.CompletedProcess)
        assert out.returncode == 2, (out.args, out.stderr)
        assert "Traceback" not in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_help_lists_the_exit_codes() -> None:
    out = cli("--help", timeout=30)
    assert "exit status:" in out.stdout
    for code, _ in common.EXIT_CODES:
        assert f"  {code} " in out.stdout


def test_bash_completion_completes_sub_commands_and_options(tmp_path: pathlib.Path) -> None:
    import os
    import shutil
    import sys

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "porter-mesh").write_text(
        f"#!/bin/sh\nexec {sys.executable} -m porter_mesh.cli.main \"$@\"\n")
    (bindir / "porter-mesh").chmod(0o755)
    script = (
        'eval "$(porter-mesh completion bash)"\n'
        'fn=$(complete -p porter-mesh | sed "s/.*-F \\([^ ]*\\).*/\\1/")\n'
        'complete_line() { COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}; read -ra COMP_WORDS <<< "$1 ";'
        ' [[ "$1" == *" " ]] && COMP_WORDS+=(""); COMP_CWORD=$((${#COMP_WORDS[@]}-1));'
        ' COMPREPLY=(); $fn porter-mesh "${COMP_WORDS[-1]}" "${COMP_WORDS[-2]}";'
        ' echo "${COMPREPLY[@]}"; }\n'
        'complete_line "porter-mesh req"\n'
        'complete_line "porter-mesh send log hi --ti"\n'
    )
    out = subprocess.run([bash, "-c", script], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}"))
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["request"], out
    assert "--timeout" in lines[1].split(), out


@pytest.mark.network
@pytest.mark.parametrize("argv", [
    ["peers", "--wait", "30"],
    ["tail"],
    ["request", "log", "anyone?", "--context", "ctrl-c", "--wait", "30"],
    ["send", "log", "hello", "--wait", "30"],
    ["agent", "worker", "--name", "ctrl-c-worker", "--no-knowledge"],
], ids=lambda argv: argv[0])
def test_ctrl_c_exits_130(argv: list[str]) -> None:
    """An interrupted command is told apart from one that finished (status 0)."""
    mesh = f"ctrlc{os.getpid()}-{argv[0]}"
    running = Running("-v", *argv, "--mesh", mesh)  # a mesh of its own: nobody answers
    # An agent is ready for Ctrl-C once it says so (after its node, its toolbox and its
    # signal handlers); a command, once its node is up.
    ready = " up on mesh " if argv[0] == "agent" else " up: pub "
    try:
        running.wait_until(lambda: any(ready in line for line in running.err), 30,
                           "the command's node up")
        running.proc.send_signal(signal.SIGINT)
        status = running.proc.wait(30)
    finally:
        running.stop()
    assert status == 130, (status, running.err[-5:])
    assert not any("Traceback" in line for line in running.err), running.err
