"""systemd/gpusched-authd.service: systemd's verifier accepts it, it runs authd with the
system config, reloads the host key on 'systemctl reload', and provides the root-owned
0755 directory of the socket [auth] authd_socket names by default."""

from __future__ import annotations

from pathlib import Path

from gpusched import paths
from gpusched.auth.settings import AuthConfig
from tests.ops.test_systemd_units import (  # noqa: F401
    SYSTEMD_DIR,
    lines_about,
    parse_unit,
    run_verify,
    setting,
    systemd_analyze,
    verify_root,
)

AUTHD = SYSTEMD_DIR / "gpusched-authd.service"


def test_systemd_analyze_verify_accepts_the_authd_unit(systemd_analyze: str,  # noqa: F811
                                                        tmp_path: Path) -> None:
    copies = verify_root(tmp_path, (AUTHD,))
    # ExecReload= names /bin/kill, which every host has; the throwaway root gets a stub.
    kill = tmp_path / "bin" / "kill"
    kill.parent.mkdir(exist_ok=True)
    kill.write_text("#!/bin/sh\nexit 0\n")
    kill.chmod(0o755)
    result = run_verify(tmp_path, copies)
    assert result.returncode == 0, result.stderr
    assert lines_about(result.stderr, [AUTHD.name]) == [], result.stderr


def test_the_authd_unit_runs_authd_as_root_with_its_socket_directory() -> None:
    unit = parse_unit(AUTHD)
    assert unit["Service"]["ExecStart"] == [f"/usr/bin/gpusched authd --config {paths.SYSTEM_CONFIG}"]
    assert setting(unit, "Service", "User") is None  # root: it reads the root-only host key
    assert setting(unit, "Service", "Restart") == "on-failure"
    assert "HUP" in (setting(unit, "Service", "ExecReload") or "")
    directory = Path("/run") / (setting(unit, "Service", "RuntimeDirectory") or "")
    assert AuthConfig().authd_socket.parent == directory
    assert setting(unit, "Service", "RuntimeDirectoryMode") == "0755"
    assert str(directory) in (setting(unit, "Service", "ReadWritePaths") or "")
