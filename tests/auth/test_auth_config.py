"""The [auth] table and [controller] admin_group: defaults, the example file, and one
test per class of bad value (each error names the file, the key and what was expected)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpusched.auth.settings import AuthConfig
from gpusched.config import load_config
from gpusched.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "etc" / "gpusched.toml"


def load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "gpusched.toml"
    path.write_text(text)
    return load_config(path)


def test_defaults_are_local_only() -> None:
    config = load_config(None)
    assert config.auth == AuthConfig()
    assert config.auth.method == "none"
    assert config.controller.admin_group is None


def test_example_documents_every_auth_setting() -> None:
    config = load_config(EXAMPLE)
    assert config.auth == AuthConfig()
    assert config.controller.admin_group == "hpcadmin"
    text = EXAMPLE.read_text()
    for field in dataclasses.fields(AuthConfig):
        assert f"\n{field.name} = " in text or f"\n# {field.name} = " in text, field.name


def test_a_key_setup_loads(tmp_path: Path) -> None:
    config = load(tmp_path, '[auth]\nmethod = "key"\nkey_file = "/etc/k/new.key"\n'
                            'previous_key_file = "/etc/k/old.key"\nttl = 30\nskew = 5\n'
                            'replay_cache = 5000\n')
    assert config.auth == AuthConfig(  # type: ignore[attr-defined]
        method="key", key_file=Path("/etc/k/new.key"), previous_key_file=Path("/etc/k/old.key"),
        ttl=30, skew=5, replay_cache=5000)


@pytest.mark.parametrize("text, key, expected", [
    ('[auth]\nmethod = "kerberos"', "auth.method", "one of 'none', 'munge', 'key'"),
    ("[auth]\nttl = 0", "auth.ttl", "from 1 to 3600"),
    ("[auth]\nttl = 1.5", "auth.ttl", "a whole number of seconds"),
    ("[auth]\nskew = -1", "auth.skew", "from 0 to 3600"),
    ("[auth]\nskew = true", "auth.skew", "a whole number of seconds"),
    ('[auth]\nkey_file = "master.key"', "auth.key_file", "an absolute path"),
    ('[auth]\nprevious_key_file = "/etc/gpusched/auth/master.key"', "auth.previous_key_file",
     "a file other than key_file"),
    ("[auth]\nreplay_cache = 10", "auth.replay_cache", "from 1000 to 10000000"),
    ("[auth]\nmunge = 1", "auth.munge", "unknown key"),
    ('[controller]\nadmin_group = "wheel admins"', "controller.admin_group", "a group name"),
    ("[controller]\nadmin_group = 10", "controller.admin_group", "a group name"),
])
def test_bad_values_are_refused_naming_file_and_key(tmp_path: Path, text: str, key: str,
                                                     expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    message = str(info.value)
    assert str(tmp_path / "gpusched.toml") in message
    assert key in message and expected in message
