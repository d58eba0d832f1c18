"""Which logs a command shows: a one-shot command's own node stays quiet unless the user
asks for its logs (``-v``, ``$PORTER_MESH_LOG``); a long-running node keeps warnings."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from porter_mesh.cli.cmd_stats import observer_config
from porter_mesh.cli.common import seat_config
from porter_mesh.cli.main import build_parser

NODE_LOG = logging.getLogger("porter_mesh.node")


@pytest.fixture(autouse=True)
def restore_levels(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("PORTER_MESH_LOG", raising=False)
    package = logging.getLogger("porter_mesh")
    before = package.level
    yield
    package.setLevel(before)



@pytest.mark.parametrize("argv", [
    ["recall", "SELECT * WHERE { ?s ?p ?o }"], ["send", "log", "hi"], ["peers"],
])
def test_a_one_shot_commands_node_logs_only_errors_by_default(argv: list[str]) -> None:
    args = build_parser(argv[0]).parse_args(argv)
    config = observer_config(args, "porter-peers") if argv[0] == "peers" else seat_config(args)
    assert config.mesh
    assert not NODE_LOG.isEnabledFor(logging.WARNING)
    assert NODE_LOG.isEnabledFor(logging.ERROR)


@pytest.mark.parametrize(("flags", "env", "level"), [
    (["-v"], None, logging.INFO), (["-vv"], None, logging.DEBUG),
    ([], "warning", logging.WARNING), ([], "DEBUG", logging.DEBUG),
])
def test_the_level_the_user_chose_shows(flags: list[str], env: str | None, level: int,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    if env is not None:
        monkeypatch.setenv("PORTER_MESH_LOG", env)
    logging.getLogger("porter_mesh").setLevel(logging.NOTSET)
    logging.getLogger().setLevel(level)  # what main's basicConfig sets from the same choice
    args = build_parser("send").parse_args([*flags, "send", "log", "hi"])
    seat_config(args)
    assert NODE_LOG.isEnabledFor(level)
