"""The controller's periodic jobs when the database cannot be reached: one WARNING
line per job and interval, with no traceback, and other errors still raised."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy.exc import OperationalError

from gpusched.controller.main import DatabaseDownLog


def refused() -> None:
    raise OperationalError("SELECT 1", {}, OSError("connection refused\nsecond line"))


def test_a_job_that_cannot_reach_the_database_logs_one_line_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    down = DatabaseDownLog()
    check_nodes = down.around(refused)
    caplog.set_level(logging.WARNING, logger="gpusched.controller.main")
    for _ in range(5):
        check_nodes()  # raises nothing
    lines = [r for r in caplog.records if r.name == "gpusched.controller.main"]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert "refused: the database cannot be reached" in lines[0].getMessage()
    assert "second line" not in lines[0].getMessage()

    def accrue_usage() -> None:
        refused()

    down.around(accrue_usage)()  # another job: its own line
    assert len([r for r in caplog.records if r.name == "gpusched.controller.main"]) == 2
    down.throttle.every = 0.0
    check_nodes()  # the interval passed: logged again
    assert len([r for r in caplog.records if r.name == "gpusched.controller.main"]) == 3


def test_other_errors_of_a_periodic_job_are_raised() -> None:
    def broken() -> None:
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        DatabaseDownLog().around(broken)()
