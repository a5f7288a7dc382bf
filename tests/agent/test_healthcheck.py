"""The node health check against real programs: pass, failure with its reason, timeout,
what the program is given, and the loop that reports every interval through failures."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpusched.agent.healthcheck import CHECK_PATH, HealthCheck
from gpusched.errors import Unavailable
from gpusched.messages.agent import MAX_HEALTH_REASON, NodeHealth


def program(tmp_path: Path, body: str, name: str = "healthcheck") -> Path:
    """An executable /bin/sh script with ``body``."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


def test_a_passing_check_reports_ok(tmp_path: Path) -> None:
    check = HealthCheck(program(tmp_path, "echo fine; exit 0"), 60, 10, "node07")
    assert check.last is None
    health = check.check()
    assert health == NodeHealth(node="node07", ok=True, reason=None)
    assert check.last == health


def test_a_failing_check_gives_its_first_line(tmp_path: Path) -> None:
    check = HealthCheck(program(tmp_path, "echo 'GPU 2 fell off the bus'; echo more; exit 1"),
                        60, 10, "node07")
    assert check.check() == NodeHealth(node="node07", ok=False,
                                       reason="GPU 2 fell off the bus")


def test_a_check_past_its_timeout_fails(tmp_path: Path) -> None:
    prog = program(tmp_path, "sleep 300")
    health = HealthCheck(prog, 60, 0.3, "node07").check()
    assert not health.ok
    assert health.reason == f"health check {prog} timed out after 0.3 s"


def test_a_check_that_cannot_run_fails_within_the_reports_bound(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 200) / ("e" * 200) / "healthcheck"
    health = HealthCheck(deep, 60, 10, "node07").check()
    assert not health.ok and health.reason is not None
    assert len(health.reason) <= MAX_HEALTH_REASON
    assert health.reason.startswith("health check ...")
    assert health.reason.endswith("/healthcheck cannot run: No such file or directory")
    assert NodeHealth.parse(health.to_json()) == health  # what the controller accepts


def test_the_check_gets_a_small_clean_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSCHED_AGENT_ONLY", "not for the check")
    seen = tmp_path / "environ"
    check = HealthCheck(program(tmp_path, f"tr '\\000' '\\n' < /proc/$$/environ > {seen}"),
                        60, 10, "gpu-a17")
    assert check.check().ok
    assert dict(line.split("=", 1) for line in seen.read_text().splitlines()) == {
        "PATH": CHECK_PATH, "GPUSCHED_NODE": "gpu-a17", "SLURMD_NODENAME": "gpu-a17",
        "HOSTNAME": socket.gethostname()}


def run_loop(check: HealthCheck, report: Callable[[NodeHealth], None],
             stop: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=check.run, args=(report, stop), daemon=True)
    thread.start()
    return thread


def test_the_loop_reports_every_interval_and_follows_the_program(
        tmp_path: Path, wait_for: Callable[..., Any]) -> None:
    broken = tmp_path / "broken"
    prog = program(tmp_path, f"if [ -e {broken} ]; then cat {broken}; exit 1; fi")
    check = HealthCheck(prog, 0.05, 10, "node07")
    reports: list[NodeHealth] = []
    stop = threading.Event()
    thread = run_loop(check, reports.append, stop)
    try:
        wait_for(lambda: len(reports) >= 3, "three reports")
        assert all(r.ok for r in reports)
        broken.write_text("fan 3 stopped\n")
        wait_for(lambda: not reports[-1].ok, "a failure reported", seen=lambda: reports[-3:])
        assert reports[-1].reason == "fan 3 stopped"
        broken.unlink()
        wait_for(lambda: reports[-1].ok, "a pass reported again", seen=lambda: reports[-3:])
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_the_loop_survives_failed_reports_and_logs_a_streak_once(
        tmp_path: Path, wait_for: Callable[..., Any], caplog: pytest.LogCaptureFixture) -> None:
    check = HealthCheck(program(tmp_path, "exit 0"), 0.05, 10, "node07")
    attempts: list[NodeHealth] = []
    delivered: list[NodeHealth] = []

    def report(health: NodeHealth) -> None:
        attempts.append(health)
        if len(attempts) <= 4:
            raise Unavailable("controller unreachable")
        if len(attempts) == 5:
            raise RuntimeError("a fault nobody foresaw")
        delivered.append(health)

    stop = threading.Event()
    with caplog.at_level(logging.INFO, logger="gpusched.agent.healthcheck"):
        thread = run_loop(check, report, stop)
        try:
            wait_for(lambda: len(delivered) >= 2, "reports delivered after the failures")
        finally:
            stop.set()
            thread.join(timeout=10)
    assert not thread.is_alive()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "controller unreachable" in warnings[0].getMessage()
    assert [r.getMessage() for r in caplog.records].count(
        "node health check's result reported again") == 1


def test_stopping_ends_the_loop_without_waiting_for_the_interval(tmp_path: Path) -> None:
    check = HealthCheck(program(tmp_path, "exit 0"), 3600, 10, "node07")
    stop = threading.Event()
    thread = run_loop(check, lambda health: None, stop)
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive() and check.last is None
