"""``[controller]`` idle_timeout, max_connections and max_connections_per_user: read,
checked, documented in the example, and passed on to the API server."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.config import ControllerConfig, load_config
from gpusched.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "etc" / "gpusched.toml"


def test_the_defaults_and_the_example_agree() -> None:
    example = load_config(EXAMPLE).controller
    for config in (ControllerConfig(), example):
        assert (config.idle_timeout, config.max_connections,
                config.max_connections_per_user) == (30.0, 256, 32)
    text = EXAMPLE.read_text()
    for key in ("idle_timeout", "max_connections", "max_connections_per_user"):
        assert f"\n{key} = " in text


def test_the_keys_are_read(tmp_path: Path) -> None:
    path = tmp_path / "gpusched.toml"
    path.write_text("[controller]\nidle_timeout = 2\nmax_connections = 10\n"
                    "max_connections_per_user = 3\n")
    config = load_config(path).controller
    assert (config.idle_timeout, config.max_connections,
            config.max_connections_per_user) == (2.0, 10, 3)


@pytest.mark.parametrize(("line", "expected"), [
    ("idle_timeout = 0", "a positive number of seconds"),
    ("idle_timeout = -1.5", "a positive number of seconds"),
    ("idle_timeout = nan", "a positive number of seconds"),
    ('idle_timeout = "30s"', "a positive number of seconds"),
    ("max_connections = 0", "a number of connections from 1 to 100000"),
    ("max_connections = 100001", "a number of connections from 1 to 100000"),
    ("max_connections = 2.5", "a number of connections from 1 to 100000"),
    ("max_connections_per_user = -1", "a number of connections from 1 to 100000"),
    ("max_connections_per_user = true", "a number of connections from 1 to 100000"),
])
def test_bad_values_name_the_file_and_the_key(tmp_path: Path, line: str, expected: str) -> None:
    path = tmp_path / "gpusched.toml"
    path.write_text(f"[controller]\n{line}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    key = line.split(" = ")[0]
    assert f"{path}: controller.{key}: expected {expected}" in str(info.value)
