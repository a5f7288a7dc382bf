"""The stage log (gpusched/stages.py): silent unless turned on, one bounded line per
stamp in the shape bench/stage_report.py reads."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpusched import stages

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def stage_log(caplog: pytest.LogCaptureFixture):  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG, logger="gpusched.stages")
    return caplog


def test_off_by_default_in_a_daemon_environment() -> None:
    env = {k: v for k, v in os.environ.items() if k != "GPUSCHED_LOG_STAGES"}
    code = ("import logging; logging.basicConfig(level=logging.INFO); "
            "from gpusched import stages; stages.stamp('committed', (1,)); "
            "print(stages.on())")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "False"
    assert "stage" not in done.stderr


def test_turned_on_by_the_environment() -> None:
    code = ("import logging; logging.basicConfig(level=logging.INFO); "
            "from gpusched import stages; stages.stamp('committed', (7,), when=12.5)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT,
                          env={**os.environ, "GPUSCHED_LOG_STAGES": "1"},
                          capture_output=True, text=True, timeout=60)
    assert "stage committed t=12.500000 jobs=7" in done.stderr


def test_one_line_with_times_ids_and_fields(stage_log) -> None:  # type: ignore[no-untyped-def]
    stages.stamp("pass", [3, 4], when=100.25, woken=99.5, began=None, node="n 1")
    assert [r.getMessage() for r in stage_log.records] == [
        "stage pass t=100.250000 jobs=3,4 woken=99.500000 began=- node=n_1"]


def test_a_long_id_list_is_cut(stage_log) -> None:  # type: ignore[no-untyped-def]
    stages.stamp("sent", range(stages.MAX_IDS + 5), when=1.0)
    message = stage_log.records[0].getMessage()
    ids = message.split("jobs=")[1].split(",")
    assert len(ids) == stages.MAX_IDS + 1 and ids[-1] == "+5"
