"""The user CLIs stay cheap to start: nothing heavy on their import path.

A structural check (which modules get imported), not a timing one; the timing lives in
bench/lifecycle.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

CLI_MODULES = ("gpusched.cli.gsubmit, gpusched.cli.gqueue, gpusched.cli.gcancel, "
               "gpusched.cli.ginfo, gpusched.cli.gcontrol, gpusched.cli.gacct")
HEAVY = ("sqlalchemy", "psycopg", "apscheduler", "http.client", "gpusched.db",
         "gpusched.controller")


def imported_modules(code: str) -> set[str]:
    """Every module ``python -X importtime -c code`` reports importing."""
    env = {**os.environ, "GPUSCHED_SOCKET": "/nonexistent/gpusched-test.sock"}
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                            capture_output=True, text=True, env=env, timeout=60)
    names = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
             if line.startswith("import time:")}
    assert "gpusched.cli.gsubmit" in names or "gpusched.cli.gqueue" in names, result.stderr[-2000:]
    return names


def heavy_in(names: set[str], heavy: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if any(n == h or n.startswith(h + ".") for h in heavy))


def test_importing_the_user_clis_pulls_in_nothing_heavy() -> None:
    names = imported_modules(f"import {CLI_MODULES}")
    assert heavy_in(names, HEAVY) == []


@pytest.mark.parametrize(
    "call",
    [
        "gsubmit.main(['--gpus', '1', '-t', '5', '-p', 'gpu', '--wrap', 'true'])",
        "gqueue.main(['--user', 'alice', '--states', 'PD'])",
        "gcancel.main(['17'])",
    ],
)
def test_running_a_cli_parses_without_pydantic_or_rich(call: str) -> None:
    # typer builds a pydantic TypeAdapter per parameter unless common.py's light
    # coercion takes over (~75 ms); rich is only for tables on a terminal.
    names = imported_modules(f"from gpusched.cli import gsubmit, gqueue, gcancel; {call}")
    assert heavy_in(names, (*HEAVY, "pydantic", "pydantic_core", "rich")) == []


def test_a_bare_gqueue_does_not_load_typer() -> None:
    """``gqueue`` without arguments lists the queue without the command-line framework
    (here it cannot reach a controller, and says so)."""
    env = {**os.environ, "GPUSCHED_SOCKET": "/nonexistent/gpusched-test.sock"}
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c",
         "import sys; from gpusched.cli import console; sys.exit(console.bare_gqueue())"],
        capture_output=True, text=True, env=env, timeout=60)
    names = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
             if line.startswith("import time:")}
    assert "gpusched.cli.listing" in names, result.stderr[-2000:]
    assert heavy_in(names, (*HEAVY, "typer", "click", "rich", "pydantic")) == []
    assert result.returncode == 1 and "gqueue: error: cannot reach the gpusched controller" \
        in result.stderr


def test_the_agent_does_not_import_the_cli_package() -> None:
    """The agent reaches the controller through gpusched.client, never through the CLIs."""
    code = ("import json, sys; import gpusched.agent.main; "
            "print(json.dumps(sorted(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    names = set(json.loads(result.stdout))
    assert "gpusched.agent.main" in names and "gpusched.client" in names
    assert sorted(n for n in names if n == "gpusched.cli" or n.startswith("gpusched.cli.")) == []


@pytest.mark.parametrize("prog, argv, script", [
    ("gsubmit", ["--parsable", "--wrap", "true"], None),
    ("gsubmit", ["-G", "1", "job.sh", "--epochs", "3"], "#!/bin/sh\n#SBATCH -t 5 -p gpu\ntrue\n"),
    ("gqueue", ["--json"], None),
    ("gqueue", ["-u", "alice", "-t", "PD", "--start"], None),
])
def test_common_command_lines_do_not_load_typer(
        tmp_path: Path, prog: str, argv: list[str], script: str | None) -> None:
    """The quick parser takes them: no typer, click or dataclasses; the command runs
    (here it cannot reach a controller, and says so)."""
    if script is not None:
        (tmp_path / "job.sh").write_text(script)
    names, result = console_run(tmp_path, prog, argv)
    assert f"gpusched.cli.{'submission' if prog == 'gsubmit' else 'queuecommand'}" in names
    assert heavy_in(names, (*HEAVY, "typer", "click", "rich", "pydantic", "dataclasses")) == []
    assert result.returncode == 1, result.stderr
    assert f"{prog}: error: cannot reach the gpusched controller" in result.stderr


@pytest.mark.parametrize("argv, script, error", [
    (["--ntasks", "0", "--wrap", "true"], None,
     "Invalid value for '--ntasks' / '-n': 0 is below the minimum of 1"),
    (["job.sh"], "#!/bin/sh\n#SBATCH --bogus\ntrue\n",
     "line 2: #SBATCH --bogus: No such option: --bogus"),
])
def test_other_command_lines_get_typers_answer(
        tmp_path: Path, argv: list[str], script: str | None, error: str) -> None:
    """What the quick parser declines (here a value typer refuses, and a directive it
    does not know) typer parses, with its own error."""
    if script is not None:
        (tmp_path / "job.sh").write_text(script)
    names, result = console_run(tmp_path, "gsubmit", argv)
    assert "typer" in names
    assert result.returncode == 2 and f"gsubmit: error: {error}" in result.stderr
    assert result.stderr.count("\n") == 1 and result.stdout == ""


def console_run(cwd: Path, prog: str, argv: list[str]) -> tuple[set[str], Any]:
    """Run a console entry point with ``argv``; the modules it imported, and the result."""
    env = {**os.environ, "GPUSCHED_SOCKET": "/nonexistent/gpusched-test.sock"}
    env.pop("GPUSCHED_CONTROLLERS", None)
    env.pop("GPUSCHED_CONFIG", None)
    code = f"import sys; sys.argv = [{prog!r}, *{argv!r}]; from gpusched.cli import console; console.{prog}()"
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True,
                            text=True, env=env, cwd=cwd, timeout=60)
    names = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
             if line.startswith("import time:")}
    result.stderr = "".join(line + "\n" for line in result.stderr.splitlines()
                            if not line.startswith("import time:"))
    return names, result


ROOT = Path(__file__).resolve().parents[2]
# What the quick paths of gsubmit and gqueue may load beyond the interpreter's own start
# (python -S) and gpusched's modules: os (and what it stands on), gc, and the C
# modules under json and socket. typing, re, json, socket, pathlib, datetime,
# threading and urllib cost a few milliseconds each, on every call.
QUICK_PATH_STDLIB = frozenset({
    "__future__", "os", "os.path", "posixpath", "genericpath", "stat", "_stat",
    "_collections_abc", "gc", "_json", "_socket",
})
QUICK_PATH_CODE = """
import os, sys
sys.path.insert(0, {root!r})
before = set(sys.modules)
sys.argv = [{prog!r}, *{argv!r}]
from gpusched.cli import console
def leave(code):
    sys.stderr.flush()
    print(" ".join(sorted(set(sys.modules) - before)))
    sys.stdout.flush()
    os._exit(code)
console._leave = leave
console.{prog}()
"""


@pytest.mark.parametrize("prog, argv, script", [
    ("gsubmit", ["--wrap", "true"], None),
    ("gsubmit", ["-G", "2", "-t", "1:00:00", "-p", "gpu", "--parsable", "--wrap", "true"], None),
    ("gsubmit", ["job.sh"], "#!/bin/sh\ntrue\n"),
    ("gqueue", [], None),
    ("gqueue", ["--json"], None),
    ("gqueue", ["-u", "alice", "-t", "PD,R", "-p", "gpu", "-h"], None),
    ("gcancel", ["17", " 18"], None),
])
def test_the_quick_paths_load_only_an_allowed_list(
        tmp_path: Path, prog: str, argv: list[str], script: str | None) -> None:
    """Started without site (so that nothing site or an editable install's finder loads
    hides a module), a common command line loads gpusched's modules and the short list
    above, nothing else; the command runs (here it cannot reach a controller)."""
    if script is not None:
        (tmp_path / "job.sh").write_text(script)
    check_quick_path(prog, QUICK_PATH_CODE.format(root=str(ROOT), prog=prog, argv=argv),
                     tmp_path)


def check_quick_path(prog: str, code: str, cwd: Path | None = None) -> None:
    """``python -S -c code`` (which prints the modules it loaded) runs ``prog`` without
    reaching a controller, and loads gpusched's modules and QUICK_PATH_STDLIB alone."""
    env = {**os.environ, "GPUSCHED_SOCKET": "/nonexistent/gpusched-test.sock"}
    env.pop("GPUSCHED_CONTROLLERS", None)
    env.pop("GPUSCHED_CONFIG", None)
    result = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True,
                            text=True, env=env, cwd=cwd, timeout=60)
    assert result.returncode == 1, result.stderr
    assert f"{prog}: error: cannot reach the gpusched controller" in result.stderr
    loaded = set(result.stdout.split())
    assert "gpusched.client.api" in loaded
    assert sorted(n for n in loaded if n.split(".")[0] != "gpusched"
                  and n not in QUICK_PATH_STDLIB) == []


def test_the_client_opens_the_local_socket_without_the_socket_module() -> None:
    """ApiClient over the Unix socket: no socket.py, threading, json or pathlib."""
    code = ("import sys; sys.path.insert(0, %r); before = set(sys.modules)\n"
            "from gpusched.client import ApiClient\n"
            "try:\n    ApiClient().request('GET', '/v1/ping')\nexcept Exception as exc:\n"
            "    print(type(exc).__name__)\n"
            "print(' '.join(sorted(set(sys.modules) - before)))" % str(ROOT))
    env = {**os.environ, "GPUSCHED_SOCKET": "/nonexistent/gpusched-test.sock"}
    env.pop("GPUSCHED_CONTROLLERS", None)
    env.pop("GPUSCHED_CONFIG", None)
    result = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True,
                            text=True, env=env, timeout=60)
    error, loaded = result.stdout.splitlines()
    assert error == "Unavailable"
    assert sorted(set(loaded.split()) & {"socket", "threading", "json", "pathlib", "typing",
                                         "re", "selectors", "enum"}) == []


SCRIPT_PATH_CODE = """
import os, sys
sys.path.insert(0, {root!r})
before = set(sys.modules)
sys.argv = [{script!r}, *{argv!r}]
real_exit = os._exit
def leave(code):
    sys.stderr.flush()
    print(" ".join(sorted(set(sys.modules) - before)))
    sys.stdout.flush()
    real_exit(code)
os._exit = leave
with open({script!r}) as f:
    source = f.read()
exec(compile(source, {script!r}, "exec"), {{"__name__": "__main__"}})
"""


@pytest.mark.parametrize("prog, argv", [
    ("gsubmit", ["--wrap", "true"]),
    ("gqueue", []),
    ("gcancel", ["17"]),
])
def test_the_installed_scripts_add_nothing_to_the_quick_paths(prog: str, argv: list[str]) -> None:
    """scripts/PROG, what the install puts on PATH, loads only what the quick path does:
    a generated console-script wrapper would load re (and enum) first."""
    script = ROOT / "scripts" / prog
    check_quick_path(prog, SCRIPT_PATH_CODE.format(root=str(ROOT), script=str(script),
                                                   argv=argv))


def test_every_user_command_is_installed_as_a_script() -> None:
    """pyproject's script-files names each of scripts/, and each runs its command's entry
    point with nothing else imported."""
    import tomllib
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["script-files"]
    present = sorted(f"scripts/{p.name}" for p in (ROOT / "scripts").iterdir())
    assert sorted(listed) == present
    assert {"scripts/gsubmit", "scripts/gqueue", "scripts/gsrun", "scripts/galloc"} <= set(listed)
    for name in listed:
        text = (ROOT / name).read_text()
        assert text.startswith("#!/usr/bin/env python3\n")
        imports = [line for line in text.splitlines() if line.startswith(("import ", "from "))]
        assert len(imports) == 1 and imports[0].startswith("from gpusched.cli."), (name, imports)


@pytest.mark.parametrize("argv, quick, code, error", [
    (["0"], True, 2, "invalid job id '0': a job id is a positive integer"),
    (["12_x"], False, 2, "invalid job id '12_x'"),
    (["--me", "-t", "XX"], False, 2, "XX"),
    ([], False, 2, "nothing to cancel"),
])
def test_gcancel_takes_plain_ids_quickly_and_the_rest_through_typer(
        tmp_path: Path, argv: list[str], quick: bool, code: int, error: str) -> None:
    """Plain ids skip typer (a bad one gets the same one line as through typer); any
    other command line is typer's."""
    names, result = console_run(tmp_path, "gcancel", argv)
    assert ("typer" not in names) is quick
    assert result.returncode == code and "gcancel: error: " in result.stderr
    assert error in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr
