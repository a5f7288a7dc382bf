"""The systemd units in systemd/: systemd's own verifier accepts them, and they say what
the architecture needs (jobs survive agent restarts, the controller's socket directory
survives controller restarts, restart on failure, a hardened controller).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from gpusched import paths

SYSTEMD_DIR = Path(__file__).resolve().parents[2] / "systemd"
CONTROLLER = SYSTEMD_DIR / "gpusched-controller.service"
AGENT = SYSTEMD_DIR / "gpusched-agent.service"
UNITS = (CONTROLLER, AGENT)

# Units our units (and systemd's implicit DefaultDependencies=) refer to; verify needs them
# to exist in the root it checks against. Units only named in Wants=/After= (postgresql,
# nvidia-persistenced) may be missing, as on a real node without them.
TARGETS = ("sysinit.target", "basic.target", "shutdown.target",
           "network-online.target", "multi-user.target")

# Settings that sandbox the agent's processes; jobs inherit them, so each would break
# setuid to the job's owner, access to /home, /tmp or /dev/nvidia*, or setuid programs.
SANDBOXING = ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp",
              "PrivateDevices", "PrivateUsers", "DynamicUser", "RestrictSUIDSGID",
              "CapabilityBoundingSet", "SystemCallFilter", "ProtectKernelTunables")


# --- a small reader of systemd's unit syntax ---------------------------------------------


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections → key → values in order, as systemd reads them.

    Unlike configparser, a key may repeat (After= twice accumulates; for single-valued
    settings the last one wins), '#' and ';' start comments only at the start of a line,
    and a trailing backslash continues a line.
    """
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip()
        pending = ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and current is not None, f"{path}: not 'Key=value' inside a section: {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def setting(unit: dict[str, dict[str, list[str]]], section: str, key: str) -> str | None:
    """The effective value of a single-valued setting (the last assignment)."""
    values = unit.get(section, {}).get(key)
    return values[-1] if values else None


def words(unit: dict[str, dict[str, list[str]]], section: str, key: str) -> list[str]:
    """A list-valued setting (After=, Wants=, ...): all assignments, split on spaces."""
    return [w for value in unit.get(section, {}).get(key, []) for w in value.split()]


def is_yes(value: str | None) -> bool:
    return value is not None and value.lower() in {"1", "yes", "y", "true", "t", "on"}


# --- systemd-analyze verify --------------------------------------------------------------


def verify_root(root: Path, units: tuple[Path, ...]) -> list[Path]:
    """Lay out a file-system root for `systemd-analyze verify --root` and copy units in.

    verify refuses a unit whose ExecStart= binary does not exist, and /usr/bin/gpusched is
    not installed on development or CI machines. Rather than rewriting ExecStart= in a
    copy (which would verify a different line than the one we ship), the units are checked
    byte for byte inside a throwaway root that holds a stub executable at the path they
    name, plus the few targets they depend on. This also keeps the check independent of
    which units the host happens to have installed.
    """
    unit_dir = root / "etc" / "systemd" / "system"
    lib_dir = root / "usr" / "lib" / "systemd" / "system"
    unit_dir.mkdir(parents=True)
    lib_dir.mkdir(parents=True)
    for target in TARGETS:
        (lib_dir / target).write_text(f"[Unit]\nDescription=stub {target}\n")
    copies = []
    for unit_path in units:
        for exec_start in parse_unit(unit_path)["Service"]["ExecStart"]:
            binary = root / shlex.split(exec_start.lstrip("-@:+!"))[0].lstrip("/")
            binary.parent.mkdir(parents=True, exist_ok=True)
            binary.write_text("#!/bin/sh\nexit 0\n")
            binary.chmod(0o755)
        copy = unit_dir / unit_path.name
        shutil.copyfile(unit_path, copy)
        copies.append(copy)
    return copies


def run_verify(root: Path, units: list[Path]) -> subprocess.CompletedProcess[str]:
    """Run systemd-analyze verify the way that works without systemd as PID 1.

    - SYSTEMD_LOG_TARGET=console: otherwise, when stderr is a journal stream (tests run
      from a systemd service or CI agent), the warnings go to the journal and stderr is
      empty, and the check would pass without looking.
    - SYSTEMD_LOG_LEVEL=notice: warnings and errors about the units still show; debug
      and info chatter does not.
    - --man=no: do not run man(1) for Documentation= pages (man may not be installed).
    - --generators=no: do not run the host's unit generators (they need PID 1's context).
    - --recursive-errors=no: report only the units named, not every unit they pull in.
    - --root: see verify_root().
    """
    env = {**os.environ, "SYSTEMD_LOG_TARGET": "console", "SYSTEMD_LOG_LEVEL": "notice",
           "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": "", "LC_ALL": "C"}
    return subprocess.run(
        ["systemd-analyze", "verify", "--man=no", "--generators=no", "--recursive-errors=no",
         f"--root={root}", *map(str, units)],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )


def lines_about(stderr: str, unit_names: list[str]) -> list[str]:
    """The stderr lines that name one of our unit files."""
    return [line for line in stderr.splitlines() if any(name in line for name in unit_names)]


@pytest.fixture
def systemd_analyze() -> str:
    tool = shutil.which("systemd-analyze")
    assert tool is not None, "the unit checks need systemd-analyze (Debian package systemd)"
    return tool


@pytest.mark.parametrize("unit_path", UNITS, ids=lambda p: p.name)
def test_systemd_analyze_verify_accepts_the_unit(
    systemd_analyze: str, tmp_path: Path, unit_path: Path
) -> None:
    copies = verify_root(tmp_path, (unit_path,))
    result = run_verify(tmp_path, copies)

    complaints = lines_about(result.stderr, [unit_path.name])
    assert result.returncode == 0, result.stderr
    assert complaints == [], result.stderr


def test_verify_check_reports_a_broken_unit(systemd_analyze: str, tmp_path: Path) -> None:
    """The check above can fail: a bad setting (which verify only warns about, exit 0)
    shows up in the lines we filter for."""
    broken = tmp_path / "src" / AGENT.name
    broken.parent.mkdir()
    broken.write_text(AGENT.read_text().replace("KillMode=process", "KillMode=procss"))
    root = tmp_path / "root"
    result = run_verify(root, verify_root(root, (broken,)))

    complaints = lines_about(result.stderr, [AGENT.name])
    assert any("kill mode" in line.lower() and "procss" in line for line in complaints), result.stderr


def test_verify_check_reports_a_missing_binary(systemd_analyze: str, tmp_path: Path) -> None:
    """Without the stub executable verify fails, so the stub is what makes it pass."""
    copies = verify_root(tmp_path, (CONTROLLER,))
    (tmp_path / "usr" / "bin" / "gpusched").unlink()
    result = run_verify(tmp_path, copies)

    assert result.returncode != 0
    assert any("not executable" in line for line in lines_about(result.stderr, [CONTROLLER.name]))


# --- what the units must say -------------------------------------------------------------


@pytest.mark.parametrize(("unit_path", "role"), [(CONTROLLER, "controller"), (AGENT, "agent")],
                         ids=["controller", "agent"])
def test_unit_starts_its_daemon_with_the_system_config(unit_path: Path, role: str) -> None:
    unit = parse_unit(unit_path)
    assert unit["Service"]["ExecStart"] == [
        f"/usr/bin/gpusched {role} --config {paths.SYSTEM_CONFIG}"
    ]
    assert words(unit, "Install", "WantedBy") == ["multi-user.target"]


@pytest.mark.parametrize("unit_path", UNITS, ids=lambda p: p.name)
def test_unit_restarts_on_failure(unit_path: Path) -> None:
    assert setting(parse_unit(unit_path), "Service", "Restart") == "on-failure"


def test_agent_stop_signals_only_its_main_process_and_owns_its_cgroups() -> None:
    unit = parse_unit(AGENT)
    assert setting(unit, "Service", "KillMode") == "process"
    assert is_yes(setting(unit, "Service", "Delegate"))  # per-job cgroups under cgroup v2


def test_agent_runs_as_root_without_sandboxing() -> None:
    service = parse_unit(AGENT)["Service"]
    assert service.get("User", ["root"])[-1] == "root"
    assert [key for key in SANDBOXING if key in service] == []


def test_agent_does_not_depend_on_the_controller() -> None:
    unit = parse_unit(AGENT)
    hard_or_soft = [w for key in ("Requires", "Requisite", "BindsTo", "PartOf", "Wants")
                    for w in words(unit, "Unit", key)]
    assert CONTROLLER.name not in hard_or_soft
    assert CONTROLLER.name in words(unit, "Unit", "After")  # ordering only, when co-located


def test_controller_runs_as_gpusched_with_a_preserved_socket_directory() -> None:
    unit = parse_unit(CONTROLLER)
    assert setting(unit, "Service", "User") == "gpusched"
    assert setting(unit, "Service", "RuntimeDirectory") == paths.SYSTEM_SOCKET.parent.name
    assert paths.SYSTEM_SOCKET.parent == Path("/run") / "gpusched"
    assert setting(unit, "Service", "RuntimeDirectoryPreserve") in ("yes", "restart")


def test_controller_is_hardened_but_can_write_its_socket() -> None:
    unit = parse_unit(CONTROLLER)
    assert is_yes(setting(unit, "Service", "NoNewPrivileges"))
    assert is_yes(setting(unit, "Service", "PrivateTmp"))
    assert setting(unit, "Service", "ProtectSystem") == "strict"
    assert str(paths.SYSTEM_SOCKET.parent) in words(unit, "Service", "ReadWritePaths")


def test_controller_starts_after_network_and_postgresql() -> None:
    unit = parse_unit(CONTROLLER)
    for dependency in ("network-online.target", "postgresql.service"):
        assert dependency in words(unit, "Unit", "Wants")
        assert dependency in words(unit, "Unit", "After")
    assert "postgresql.service" not in words(unit, "Unit", "Requires")  # the DB may be remote


def test_parse_unit_reads_repeats_and_continuations(tmp_path: Path) -> None:
    path = tmp_path / "x.service"
    path.write_text("[Unit]\n# KillMode=control-group\nAfter=a.target\nAfter=b.target \\\n"
                    "  c.target\n[Service]\nKillMode=mixed\nKillMode=process\n")
    unit = parse_unit(path)
    assert words(unit, "Unit", "After") == ["a.target", "b.target", "c.target"]
    assert setting(unit, "Service", "KillMode") == "process"
