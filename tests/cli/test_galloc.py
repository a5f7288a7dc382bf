"""galloc's command line and the allocation body it (and gsrun outside a job) sends:
salloc's options first, the command untouched; the job's shape as gsubmit reads it;
each bad value one error line naming its option, exit 2, nothing sent; and the
job's variables a command in the allocation gets."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpusched.cli import galloc
from gpusched.cli.allocation import Allocation, allocation_body, exit_status
from gpusched.cli.gsrunalloc import allocation_options
from gpusched.cli.gsrunargs import parse_args as gsrun_args
from gpusched.messages.jobs import JobRequest

NOWHERE = "/nonexistent/gpusched-galloc-test.sock"


def test_options_come_first_and_the_command_is_left_as_it_is() -> None:
    options, command = galloc.parse_args(
        ["-N2", "--gpus-per-node=1", "-t", "10", "-J", "dbg", "--exclusive", "-w",
         "node[1-2]", "sh", "-c", "gsrun -N 5 hostname"])
    assert options == {"nodes": 2, "gpus_per_node": "1", "time": "10", "job_name": "dbg",
                       "exclusive": True, "nodelist": "node[1-2]"}
    assert command == ["sh", "-c", "gsrun -N 5 hostname"]
    assert galloc.parse_args(["--", "-weird"]) == ({}, ["-weird"])
    assert galloc.parse_args([]) == ({}, [])


def test_the_body_is_an_allocation_of_the_shape_asked_for(tmp_path: Path) -> None:
    options, _ = galloc.parse_args(["-N", "2", "--gpus-per-node", "a100:2", "-n", "4", "-c",
                                    "3", "--mem", "8G", "-t", "1:00:00", "-p", "gpu",
                                    "-x", "n[3-4]"])
    body = allocation_body(options, "bash", str(tmp_path), {"SLURM_NTASKS": "4"})
    request = JobRequest.parse(body)
    assert (request.interactive, request.nodes, request.gpus, request.gpu_types,
            request.cpus, request.mem_mb, request.time_limit, request.partition,
            request.exclude, request.work_dir, request.name) == (
        True, 2, 4, ("a100",), 6, 8192, 3600, "gpu", ("n3", "n4"), str(tmp_path), "bash")
    assert request.environment == {"SLURM_NTASKS": "4"}
    assert len(str(request.submit_key)) == 32 and request.umask is not None
    unlimited = allocation_body({"time": "UNLIMITED"}, "x", "/", {})
    assert unlimited["time_limit"] == "UNLIMITED"
    assert allocation_body({}, "x", "/", {})["time_limit"] is None


def test_gsrun_outside_a_job_shapes_its_allocation_from_the_step() -> None:
    args = gsrun_args(["-N", "2", "-n", "4", "--gpus-per-task", "1", "-c", "2", "-p", "gpu",
                       "-t", "5", "--exclusive", "hostname"])
    assert args.allocation == {"partition": "gpu", "time": "5", "exclusive": True}
    assert args.command == ["hostname"]
    body = allocation_body(allocation_options(args), "hostname", "/tmp", {})
    # Two tasks per node, one GPU and two CPUs each (CPUs are counted per node).
    assert (body["nodes"], body["gpus"], body["cpus"], body["time_limit"],
            body["exclusive"]) == (2, 4, 4, 300, True)


@pytest.mark.parametrize(("argv", "message"), [
    (["-N", "0"], "-N: expected a whole number from 1 to"),
    (["--ntasks=x"], "--ntasks: expected a whole number from 1 to"),
    (["--time="], "--time: expected a value"),
    (["--exclusive=yes"], "--exclusive takes no value"),
    (["--gpu", "1"], "unrecognized option '--gpu'"),
    (["-Z"], "unrecognized option '-Z'"),
    (["-t", "soon"], "--time"),
    (["--gpus", "3", "-N", "2"], "--gpus 3 cannot be spread evenly over 2 nodes"),
    (["--mem", "lots"], "lots"),
    (["-G", "1", "--gpus-per-node", "1"], "give only one of --gpus"),
    (["-w", "n[1-"], "invalid --nodelist"),
    (["--begin", "someday"], "--begin"),
])
def test_a_bad_option_is_one_error_line_and_exit_2(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSCHED_SOCKET", NOWHERE)  # nothing may be sent anyway
    assert galloc.main([*argv, "true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("galloc: error: ") and message in err, err
    assert err.count("\n") == 1


def test_help_is_shown_and_nothing_is_asked(capsys: pytest.CaptureFixture[str]) -> None:
    assert galloc.main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("Usage: galloc [OPTIONS] [COMMAND [ARGS]...]")


def test_an_unreachable_controller_is_one_error_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUSCHED_SOCKET", NOWHERE)
    monkeypatch.delenv("GPUSCHED_CONTROLLERS", raising=False)
    assert galloc.main(["true"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("galloc: error: cannot reach the gpusched controller"), err
    assert err.count("\n") == 1


def test_the_job_variables_of_a_granted_allocation() -> None:
    allocation = Allocation("galloc")
    allocation.job_id = 42
    allocation.granted = {"state": "RUNNING", "name": "bash", "partition": "gpu",
                          "node_names": ["node1", "node2"]}
    got = allocation.variables("/home/a")
    both = {"JOB_ID": "42", "JOBID": "42", "JOB_NODELIST": "node[1-2]", "NNODES": "2",
            "JOB_NUM_NODES": "2", "JOB_PARTITION": "gpu", "SUBMIT_DIR": "/home/a"}
    for prefix, expected in (("SLURM_", {**both, "JOB_NAME": "bash"}), ("GPUSCHED_", both)):
        assert {k.removeprefix(prefix): v for k, v in got.items()
                if k.startswith(prefix)} == expected
    assert len(got) == 15  # GPUSCHED_JOB_NAME is gsubmit's input: never set here


def test_exit_status_as_a_shell_gives_it() -> None:
    assert [exit_status(c) for c in (0, 3, -9, -15)] == [0, 3, 137, 143]
    assert os.WEXITSTATUS  # the convention used above is the shell's 128+N


def test_galloc_and_gsrun_outside_a_job_load_nothing_heavy() -> None:
    """Started at a prompt: no typer, rich, pydantic or database modules on their path."""
    import subprocess
    import sys

    code = ("import sys; from gpusched.cli import galloc, gsrunalloc; "
            "galloc.main(['-N', '2', '--gpus-per-node', '1', '-t', '5', 'true']); "
            "print(' '.join(sorted(sys.modules)))")
    env = {**os.environ, "GPUSCHED_SOCKET": NOWHERE}
    env.pop("GPUSCHED_CONTROLLERS", None)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=60)
    loaded = set(result.stdout.split())
    assert "gpusched.cli.allocation" in loaded, result.stderr
    assert "cannot reach the gpusched controller" in result.stderr
    heavy = ("typer", "click", "rich", "pydantic", "sqlalchemy", "psycopg", "gpusched.db",
             "gpusched.controller")
    assert sorted(n for n in loaded if n.split(".")[0] in heavy or
                  any(n.startswith(h + ".") or n == h for h in heavy)) == []
