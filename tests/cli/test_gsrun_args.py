"""gsrun's flags as a StepRequest: srun's options, the defaults it takes from the job's
environment, bad flags, --export, where the job comes from, and the bounds it checks
before the controller would (tests/cli/test_gsrun.py runs the command itself)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.cli import gsrun
from gpusched.cli.gsrunargs import export_environment, parse_args
from gpusched.errors import UsageError
from gpusched.messages.steps import StepRequest

IO = {"host": "127.0.0.1", "port": 4000, "token": "ab" * 32}


# -- flags -> StepRequest -------------------------------------------------------------
def request(argv: list[str], env: dict[str, str] | None = None) -> StepRequest:
    args = parse_args(argv)
    return StepRequest.parse(gsrun.step_request(args, env or {"HOME": "/root"}, IO,
                                                cwd="/work/here"))


def test_srun_flags_become_the_step_request() -> None:
    req = request(["-N2", "-n", "8", "--ntasks-per-node=4", "--gpus-per-task", "1", "-c", "3",
                   "--exact", "--overlap", "-K", "-J", "train", "-D", "sub", "-o", "out.%t",
                   "-i", "none", "python", "train.py", "-N", "5", "--label"])
    assert (req.nodes, req.ntasks, req.ntasks_per_node) == (2, 8, 4)
    assert (req.gpus_per_task, req.cpus_per_task) == (1, 3)
    assert req.exact and req.overlap and req.kill_on_bad_exit and not req.pty
    assert req.name == "train" and req.work_dir == "/work/here/sub"
    # The command's own options are its own, after the first word that is no option.
    assert req.argv == ("python", "train.py", "-N", "5", "--label")
    # -o alone sends stderr to the same file, as srun does.
    assert (req.output, req.error, req.input) == ("out.%t", "out.%t", "none")
    assert req.io.token == "ab" * 32 and req.io.port == 4000


def test_defaults_grouped_flags_and_double_dash() -> None:
    req = request(["hostname"])
    assert (req.nodes, req.ntasks, req.gpus_per_task) == (None, None, None)
    assert req.name == "hostname" and req.work_dir == "/work/here"
    assert req.output is None and req.error is None and not req.kill_on_bad_exit
    args = parse_args(["-lKN2", "-v", "-uv", "--kill-on-bad-exit=0", "--", "-x", "y"])
    assert args.label and args.nodes == 2 and args.verbose == 2 and args.unbuffered
    assert not args.kill_on_bad_exit and args.command == ["-x", "y"]
    assert request(["-D", "/abs", "/bin/true"]).name == "true"


def test_the_jobs_ntasks_is_the_default_task_count() -> None:
    """As srun: SLURM_NTASKS (gsubmit -n, galloc -n) when no shape is given."""
    env = {"HOME": "/root", "SLURM_NTASKS": "3"}
    assert request(["hostname"], env).ntasks == 3
    assert request(["-n", "2", "hostname"], env).ntasks == 2
    assert request(["-N", "1", "hostname"], env).ntasks is None
    assert request(["--ntasks-per-node", "2", "hostname"], env).ntasks is None
    assert request(["--pty", "bash"], env).ntasks is None
    assert request(["hostname"], {"HOME": "/root", "SLURM_NTASKS": ""}).ntasks is None
    for bad in ("0", "x", "99999999", "\u00b3"):
        with pytest.raises(UsageError, match="SLURM_NTASKS: expected 1 to 65536 tasks"):
            request(["hostname"], {"HOME": "/root", "SLURM_NTASKS": bad})


@pytest.mark.parametrize("argv, message", [
    (["--bogus", "x"], "unrecognized option '--bogus'"),
    (["-Z", "x"], "unrecognized option '-Z'"),
    (["-N", "0", "x"], "-N: expected a whole number from 1 to 65536, got '0'"),
    (["--ntasks=abc", "x"], "--ntasks: expected a whole number"),
    (["-n"], "-n expects a value"),
    (["-l"], "expected a command to run"),
    (["--label=1", "x"], "--label takes no value"),
    (["--export=NONE,A", "x"], "--export: NONE takes no variables"),
])
def test_bad_flags_are_one_line_and_exit_2(argv: list[str], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert gsrun.main(argv, {"SLURM_JOB_ID": "7"}) == 2
    err = capsys.readouterr().err
    assert err.startswith("gsrun: error: ") and message in err and err.count("\n") == 1


def test_export_chooses_the_tasks_environment() -> None:
    env = {"A": "1", "B": "2", "PATH": "/bin"}
    assert export_environment(None, env) == env
    assert export_environment("ALL", env) == env
    assert export_environment("NONE", env) == {}
    assert export_environment("A,C=3,MISSING", env) == {"A": "1", "C": "3"}
    assert export_environment("ALL,B=9", env) == {"A": "1", "B": "9", "PATH": "/bin"}
    with pytest.raises(UsageError):
        export_environment("A,ALL", env)
    assert request(["--export=NONE,", "true"], env).environment == {}


def test_where_the_job_comes_from(capsys: pytest.CaptureFixture[str]) -> None:
    assert gsrun.job_from({"SLURM_JOB_ID": "12", "GPUSCHED_JOB_ID": "13"}) == 12
    assert gsrun.job_from({"GPUSCHED_JOB_ID": "13"}) == 13
    assert gsrun.job_from({"PATH": "/bin"}) is None
    assert gsrun.main(["true"], {"SLURM_JOB_ID": "12x"}) == 2
    assert "SLURM_JOB_ID: expected a job id, got '12x'" in capsys.readouterr().err
    # Inside a job, the options that shape an allocation (outside one) are refused.
    assert gsrun.main(["-p", "gpu", "--exclusive", "true"], {"SLURM_JOB_ID": "12"}) == 2
    assert capsys.readouterr().err == (
        "gsrun: error: --exclusive, --partition: only for the allocation gsrun gets outside "
        "a job; this step runs in its job's\n")


def test_a_bound_the_controller_would_refuse_is_refused_here(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    huge = {"X": "y" * (2 * 1024 * 1024)}
    with pytest.raises(UsageError, match="environment"):
        gsrun.step_request(parse_args(["true"]), huge, IO, cwd=str(tmp_path))




def test_the_task_bound_is_the_layouts() -> None:
    from gpusched.cli import gsrunargs
    from gpusched.core.steps import MAX_TASKS_PER_STEP

    assert gsrunargs.MAX_TASKS_PER_STEP == MAX_TASKS_PER_STEP
