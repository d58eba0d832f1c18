"""Node settings are checked once, with messages that say what to do."""

from __future__ import annotations

import pytest

from porter_mesh.errors import ConfigError
from porter_mesh.node.config import NodeConfig


def test_defaults_are_loopback_and_valid() -> None:
    cfg = NodeConfig(name="worker-1")
    assert cfg.interfaces == ("127.0.0.1",) and cfg.loopback_only
    assert cfg.pub_port == 0 and cfg.router_port == 0
    # Lab clocks off by minutes or hours are adopted; a partition heals within 5 s.
    assert cfg.max_clock_skew == 86_400.0 and cfg.recontact_max == 5.0


@pytest.mark.parametrize(("settings", "needle"), [
    ({"name": "Bad Name"}, "name"),
    ({"name": "w", "interfaces": ("eth0",)}, "not an IP address"),
    ({"name": "w", "interfaces": ()}, "interfaces is empty"),
    ({"name": "w", "pub_port": 70000}, "TCP port"),
    ({"name": "w", "seeds": ("nohost",)}, "HOST:PORT"),
    ({"name": "w", "heartbeat_interval": 5.0}, "timings"),
    ({"name": "w", "batch_max": 0}, "batch_max"),
    ({"name": "w", "inbox_size": -1}, "inbox_size"),
    ({"name": "w", "recontact_max": 0.5}, "recontact_max"),
    ({"name": "w", "max_clock_skew": -1.0}, "max_clock_skew"),
    ({"name": "w", "max_clock_skew": 400 * 86_400.0}, "a year"),
    ({"name": "w", "max_clock_skew": float("nan")}, "max_clock_skew"),
])
def test_bad_settings_are_refused_clearly(settings: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        NodeConfig(**settings)  # type: ignore[arg-type]


def test_non_loopback_is_noticed() -> None:
    assert not NodeConfig(name="w", interfaces=("10.0.0.5",)).loopback_only


@pytest.mark.parametrize("field", ["data_dir", "secret_key_file", "trusted_dir"])
def test_paths_given_as_strings_become_paths(field: str) -> None:
    import pathlib

    config = NodeConfig(name="a", **{field: "some/str"})  # type: ignore[arg-type]
    assert getattr(config, field) == pathlib.Path("some/str")
    assert isinstance(getattr(config, field), pathlib.Path)


@pytest.mark.parametrize("value", [5, b"bytes", "", ["a"]])
def test_a_data_dir_that_is_no_path_is_refused_at_once(value: object) -> None:
    with pytest.raises(ConfigError, match="data_dir must be a path"):
        NodeConfig(name="a", data_dir=value)  # type: ignore[arg-type]
