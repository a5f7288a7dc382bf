"""Site programs (prolog, epilog, health check) run for real: what they are given, what
their failure says, and that a program past its timeout is gone with what it started."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.agent.siteprog import MAX_OUTPUT, MAX_REASON, first_line, run_site_program

ENV = {"PATH": "/usr/bin:/bin", "GPUSCHED_NODE": "node07"}


@pytest.fixture
def script(tmp_path: Path) -> Callable[[str], str]:
    """script(body) -> the path of an executable /bin/sh script with that body."""
    counter = iter(range(1000))

    def make(body: str) -> str:
        path = tmp_path / f"prog{next(counter)}"
        path.write_text("#!/bin/sh\n" + body + "\n")
        path.chmod(0o755)
        return str(path)

    return make


@pytest.fixture
def leftover_pids() -> Iterator[list[int]]:
    """Pids a test started through a program; killed afterwards if still there."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def read_pids(path: Path, count: int, wait_for: Callable[..., Any]) -> list[int]:
    """The ``count`` pids a program wrote to ``path``, one a line."""
    wait_for(lambda: path.exists() and len(path.read_text().split()) >= count,
             f"{count} pids in {path}")
    return [int(p) for p in path.read_text().split()[:count]]


def test_a_program_that_exits_0_passes(script: Callable[[str], str]) -> None:
    assert run_site_program(script("echo all good; exit 0"), ENV, 10) is None


def test_a_failure_gives_its_first_line_of_output(script: Callable[[str], str]) -> None:
    prog = script("echo; echo '   '; echo 'GPU 3: ECC errors past limit'; echo second; exit 1")
    assert run_site_program(prog, ENV, 10) == "GPU 3: ECC errors past limit"


def test_standard_error_counts_as_output(script: Callable[[str], str]) -> None:
    prog = script("echo 'disk /scratch full' >&2; exit 2")
    assert run_site_program(prog, ENV, 10) == "disk /scratch full"


def test_control_characters_are_removed_from_the_reason(script: Callable[[str], str]) -> None:
    prog = script(r"printf 'bad\033[31m\tlink\001\177 down\r\n'; exit 1")
    reason = run_site_program(prog, ENV, 10)
    assert reason is not None
    assert all(c.isprintable() for c in reason)
    assert reason.startswith("bad") and reason.endswith("link down")


def test_a_long_first_line_is_cut(script: Callable[[str], str]) -> None:
    prog = script("printf 'x%.0s' $(seq 1 300); echo; exit 1")
    reason = run_site_program(prog, ENV, 10)
    assert reason is not None
    assert len(reason) == MAX_REASON and reason.endswith("...")
    assert reason[:MAX_REASON - 3] == "x" * (MAX_REASON - 3)


def test_a_failure_without_output_gives_its_status(script: Callable[[str], str]) -> None:
    prog = script("exit 3")
    assert run_site_program(prog, ENV, 10, "health check") == (
        f"health check {prog} exited with status 3")


def test_a_program_killed_by_a_signal_says_so(script: Callable[[str], str]) -> None:
    prog = script("kill -TERM $$")
    assert run_site_program(prog, ENV, 10, "prolog") == (
        f"prolog {prog} killed by signal {int(signal.SIGTERM)}")


def test_past_its_timeout_the_program_and_its_children_are_killed(
        script: Callable[[str], str], tmp_path: Path, wait_for: Callable[..., Any],
        process_gone: Callable[[int], bool], leftover_pids: list[int]) -> None:
    pids = tmp_path / "pids"
    prog = script(f"sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; "
                  "echo still working; sleep 300")
    began = time.monotonic()
    reason = run_site_program(prog, ENV, 0.5, "epilog")
    assert reason == f"epilog {prog} timed out after 0.5 s"
    assert time.monotonic() - began < 30  # nowhere near the sleeps it was killed in
    child, program = read_pids(pids, 2, wait_for)
    leftover_pids.extend([child, program])
    wait_for(lambda: process_gone(program) and process_gone(child),
             "the program and its child gone")


def test_a_program_stuck_in_the_kernel_past_its_timeout_does_not_hold_the_caller(
        script: Callable[[str], str], tmp_path: Path, wait_for: Callable[..., Any],
        process_gone: Callable[[int], bool]) -> None:
    # A check of a hung file system sleeps uninterruptibly, where SIGKILL waits; a frozen
    # cgroup v1 freezer does the same to a program.
    pids = tmp_path / "pid"
    prog = script(f"echo $$ > {pids}; exec sleep 300")
    freezer = Path("/sys/fs/cgroup/freezer") / f"gpusched-test-siteprog-{os.getpid()}"
    freezer.mkdir()
    results: list[str | None] = []
    caller = threading.Thread(
        target=lambda: results.append(run_site_program(prog, ENV, 2, "health check")),
        daemon=True)
    caller.start()
    try:
        (pid,) = read_pids(pids, 1, wait_for)
        (freezer / "cgroup.procs").write_text(str(pid))
        (freezer / "freezer.state").write_text("FROZEN")
        caller.join(timeout=30)
        assert not caller.is_alive(), "the caller waited for a program it could not kill"
        assert results == [f"health check {prog} timed out after 2 s"]
        assert not process_gone(pid)  # still there, killed once it leaves the kernel
    finally:
        (freezer / "freezer.state").write_text("THAWED")
        caller.join(timeout=60)
        wait_for(lambda: not (freezer / "cgroup.procs").read_text().split(),
                 "the stuck program gone once thawed")
        freezer.rmdir()


def test_a_background_child_holding_the_output_does_not_hold_the_result(
        script: Callable[[str], str], tmp_path: Path, wait_for: Callable[..., Any],
        process_gone: Callable[[int], bool], leftover_pids: list[int]) -> None:
    pids = tmp_path / "pids"
    prog = script(f"sleep 120 & echo $! > {pids}; echo started; exit 0")
    assert run_site_program(prog, ENV, 60) is None
    (child,) = read_pids(pids, 1, wait_for)
    leftover_pids.append(child)
    # Returned while the child, which still holds the pipe, runs on.
    assert not process_gone(child)


def test_a_missing_program_cannot_run(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here"
    reason = run_site_program(str(missing), ENV, 10, "health check")
    assert reason is not None
    assert reason.startswith(f"health check {missing} cannot run:")


def test_a_long_path_is_shortened_in_the_reason(tmp_path: Path) -> None:
    deep = tmp_path / ("p" * 250) / ("q" * 250) / "prolog"
    reason = run_site_program(str(deep), ENV, 10, "prolog")
    assert reason is not None and len(reason) <= MAX_REASON
    assert reason.startswith("prolog ...")
    assert reason.endswith("q/prolog cannot run: No such file or directory")


def test_a_program_that_is_not_executable_cannot_run(tmp_path: Path) -> None:
    prog = tmp_path / "not-executable"
    prog.write_text("#!/bin/sh\nexit 0\n")
    prog.chmod(0o644)
    reason = run_site_program(str(prog), ENV, 10, "prolog")
    assert reason is not None and reason.startswith(f"prolog {prog} cannot run:")
    assert "Permission denied" in reason


def test_the_program_sees_only_the_environment_it_is_given(
        script: Callable[[str], str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSCHED_SECRET_OF_THE_CALLER", "do not pass on")
    seen, where = tmp_path / "environ", tmp_path / "cwd"
    prog = script(f"tr '\\000' '\\n' < /proc/$$/environ > {seen}; pwd > {where}")
    assert run_site_program(prog, ENV, 10) is None
    assert sorted(seen.read_text().splitlines()) == sorted(f"{k}={v}" for k, v in ENV.items())
    assert where.read_text().strip() == "/"


def test_standard_input_is_empty(script: Callable[[str], str]) -> None:
    # cat would wait for ever on an inherited terminal or pipe.
    prog = script("if [ -n \"$(cat)\" ]; then echo got input; exit 1; fi")
    assert run_site_program(prog, ENV, 20) is None


def test_huge_output_is_bounded_and_does_not_hang(script: Callable[[str], str]) -> None:
    # Only the first MAX_OUTPUT bytes are read for the reason: a line past them is unseen.
    prog = script(f"head -c {MAX_OUTPUT + 100} /dev/zero | tr '\\000' '\\n'; "
                  "echo 'too late to be seen'; head -c 50000000 /dev/zero; exit 4")
    assert run_site_program(prog, ENV, 60, "epilog") == f"epilog {prog} exited with status 4"


def test_endless_output_still_times_out(script: Callable[[str], str]) -> None:
    prog = script("yes 'the same line for ever'")
    assert run_site_program(prog, ENV, 0.5) == f"program {prog} timed out after 0.5 s"


def test_first_line_of_bytes_that_are_not_utf8() -> None:
    line = first_line(b"\xff\xfe broken \xc3\n")
    assert "broken" in line and all(c.isprintable() for c in line)
    assert first_line(b"\n \t \n") == ""
