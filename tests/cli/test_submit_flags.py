"""gsubmit's --nice, --priority, --open-mode, --time-min, --deadline, -W/--wait,
--ntasks-per-gpu, the dependency forms and --export=NONE's SLURM_* variables: each from
the command line and from a directive, by both of gsubmit's parsers, reaching the
submission and its POST /v1/jobs body; each refusal one line naming the option, exit 2,
nothing sent."""

from __future__ import annotations

import socket
from datetime import datetime

import pytest

from gpusched.cli import shell
from gpusched.cli.jobwait import exit_code_of
from gpusched.cli.submission import submission_body
from tests.cli.test_parity_options import refused, script, submission, typer_submission


def _body(args: list[str]) -> dict[str, object]:
    return submission_body(submission(args), work_dir="/w", environment={})


def test_priority_open_mode_and_time_min(listener: socket.socket,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    sub = submission(["--priority", "5", "--open-mode=truncate", "--time-min", "30",
                      "-t", "2:00:00", "--wrap", "x"])
    assert (sub.priority, sub.open_mode, sub.time_min) == (5.0, "truncate", 1800)
    body = _body(["--priority=0.5", "--open-mode", "append", "--time-min=1-0", "--wrap", "x"])
    assert (body["priority"], body["open_mode"], body["time_min"]) == (0.5, "append", 86400)
    sub = submission([script("--priority=7", "--open-mode=truncate", "--time-min=10")])
    assert (sub.priority, sub.open_mode, sub.time_min) == (7.0, "truncate", 600)
    assert not {"nice", "priority", "open_mode", "time_min", "deadline"} & set(
        _body(["--wrap", "x"]))  # a job without them sends the body it always did
    refused(["--priority=top", "--wrap", "x"], listener, capsys, "--priority", "gcontrol top")
    refused(["--priority=-1", "--wrap", "x"], listener, capsys, "--priority")
    refused([script("--open-mode=replace")], listener, capsys, "--open-mode", "line 2")
    refused(["--time-min=UNLIMITED", "--wrap", "x"], listener, capsys, "--time-min")
    refused(["--time-min=soon", "--wrap", "x"], listener, capsys, "--time-min")


def test_deadline_takes_begins_forms(listener: socket.socket,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    before = datetime.now().astimezone()
    sub = typer_submission(["--deadline", "now+2hours", "--wrap", "x"])  # now moves
    assert sub.deadline is not None
    seconds = (datetime.fromisoformat(sub.deadline) - before).total_seconds()
    assert 7190 <= seconds <= 7210
    assert submission([script("--deadline=2031-01-02T03:04:05")]).deadline.startswith(
        "2031-01-02T03:04:05")
    refused(["--deadline=whenever", "--wrap", "x"], listener, capsys, "--deadline")


def test_wait_from_either_place(listener: socket.socket) -> None:
    assert submission(["-W", "--wrap", "x"]).wait is True
    assert submission(["--wait", "--wrap", "x"]).wait is True
    assert submission([script("-W")]).wait is True
    assert submission(["--wrap", "x"]).wait is False


def test_the_exit_code_of_a_waited_job() -> None:
    def job(state: str, code: int | None = None, signal: int | None = None) -> dict[str, object]:
        return {"state": state, "exit_code": code, "signal": signal}

    assert exit_code_of([job("COMPLETED", 0)]) == 0
    assert exit_code_of([job("FAILED", 3)]) == 3
    assert exit_code_of([job("TIMEOUT", 0, 15)]) == 1  # a signal: 1, as sbatch -W
    assert exit_code_of([job("CANCELLED")]) == 1  # never ran
    assert exit_code_of([job("DEADLINE")]) == 1
    assert exit_code_of([job("FAILED", 9, 9)]) == 1
    assert exit_code_of([job("COMPLETED", 0), job("FAILED", 4), job("FAILED", 2)]) == 4


def test_ntasks_per_gpu(listener: socket.socket, capsys: pytest.CaptureFixture[str]) -> None:
    sub = submission(["-G", "2", "--ntasks-per-gpu", "3", "--wrap", "x"])
    assert (sub.gpus, sub.ntasks, sub.ntasks_per_gpu, sub.cpus) == (2, 6, 3, 6)
    sub = submission(["-n", "5", "--ntasks-per-gpu=2", "--wrap", "x"])
    assert (sub.gpus, sub.ntasks) == (3, 5)  # GPUs for the tasks: ceil(5 / 2)
    sub = submission([script("-N 2", "--gpus-per-node=2", "--ntasks-per-gpu=1")])
    assert (sub.gpus, sub.ntasks) == (4, 4)
    assert submission(["-n", "8", "-G", "2", "--ntasks-per-gpu=2", "--wrap", "x"]).ntasks == 8
    refused(["--ntasks-per-gpu=2", "--wrap", "x"], listener, capsys, "--ntasks-per-gpu")
    refused(["-N", "2", "-n", "5", "--ntasks-per-gpu=2", "--wrap", "x"], listener, capsys,
            "--ntasks-per-gpu", "2 nodes")
    refused(["--gpus-per-task=1", "-n", "2", "--ntasks-per-gpu=1", "--wrap", "x"], listener,
            capsys, "--ntasks-per-gpu", "--gpus-per-task")
    refused(["--ntasks-per-gpu=0", "-G", "1", "--wrap", "x"], listener, capsys,
            "--ntasks-per-gpu")


def test_dependency_forms(listener: socket.socket, capsys: pytest.CaptureFixture[str]) -> None:
    for text in ("after:5+10", "afterok:12_3:12_4", "aftercorr:9", "afterok:5?afterany:6",
                 "afterany:7,singleton"):
        assert submission(["-d", text, "--wrap", "x"]).dependency == text
    assert submission([script("--dependency=afterok:12_3,")]).dependency == "afterok:12_3"
    refused(["-d", "afterok:5,afterok:6?afterany:7", "--wrap", "x"], listener, capsys,
            "--dependency", "not both")
    refused(["-d", "afterburstbuffer:5", "--wrap", "x"], listener, capsys, "--dependency",
            "not supported")


def test_export_none_keeps_the_slurm_variables() -> None:
    env = {"SLURM_CONF": "/etc/slurm.conf", "SLURM_JOB_ID": "4", "HOME": "/h", "A": "1"}
    slurm = {"SLURM_CONF": "/etc/slurm.conf", "SLURM_JOB_ID": "4"}
    assert shell.exported("NONE", env) == slurm
    assert shell.exported("A,B=2", env) == {**slurm, "A": "1", "B": "2"}
    assert shell.exported("ALL", env) == env
