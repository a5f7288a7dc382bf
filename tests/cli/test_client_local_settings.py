"""A client with nothing to configure it reads no settings; one with something does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpusched.client import ApiClient
from gpusched.client.settings import local_socket_only
from gpusched.errors import ConfigError


def imported_by_a_client(env: dict[str, str]) -> set[str]:
    """The modules ``ApiClient()`` imports in a fresh process with this environment."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c",
         "from gpusched.client import ApiClient; print(ApiClient().socket_path)"],
        capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == env["GPUSCHED_SOCKET"]
    return {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
            if line.startswith("import time:")}


def test_a_client_of_the_local_socket_reads_no_settings(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("GPUSCHED_CONFIG",
                                                             "GPUSCHED_CONTROLLERS")}
    env["GPUSCHED_SOCKET"] = str(tmp_path / "c.sock")
    assert local_socket_only(env) == (not Path("/etc/gpusched/gpusched.toml").exists())
    names = imported_by_a_client(env)
    if local_socket_only(env):
        assert not names & {"dataclasses", "tomllib", "gpusched.auth.settings",
                            "gpusched.configfile", "gpusched.client.endpoints"}
    config = tmp_path / "client.toml"
    config.write_text('[auth]\nmethod = "munge"\n')
    env["GPUSCHED_CONFIG"] = str(config)
    assert not local_socket_only(env)
    assert {"gpusched.configfile", "gpusched.auth.settings"} <= imported_by_a_client(env)


@pytest.mark.parametrize("variable, value", [
    ("GPUSCHED_CONFIG", "/nonexistent/gpusched-client.toml"),
    ("GPUSCHED_CONTROLLERS", "ctl1:6820"),
])
def test_a_named_configuration_is_still_read_and_checked(
        monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> None:
    monkeypatch.delenv("GPUSCHED_CONFIG", raising=False)
    monkeypatch.delenv("GPUSCHED_CONTROLLERS", raising=False)
    monkeypatch.setenv(variable, value)
    assert not local_socket_only()
    with pytest.raises(ConfigError):
        ApiClient()
