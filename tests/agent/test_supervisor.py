"""The per-job supervisor, run as the agent runs it: a real process per job."""

from __future__ import annotations

import json
import pwd
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpusched.agent.spawn import SUPERVISOR

MakeJob = Callable[..., Path]
WaitFor = Callable[..., Any]
Gone = Callable[[int], bool]


def supervise(jobdir: Path) -> dict[str, Any]:
    """Run the supervisor to the end, as the launcher starts it; return status.json."""
    subprocess.run([sys.executable, "-I", "-S", str(SUPERVISOR), str(jobdir)],
                   check=True, timeout=30, start_new_session=True)
    return dict(json.loads((jobdir / "status.json").read_text()))


def start_supervisor(jobdir: Path) -> subprocess.Popen[bytes]:
    """Start the supervisor in the background."""
    return subprocess.Popen([sys.executable, "-I", "-S", str(SUPERVISOR), str(jobdir)],
                            start_new_session=True)


def output_of(jobdir: Path) -> str:
    spec = json.loads((jobdir / "spec.json").read_text())
    return Path(spec["stdout"]).read_text()


def test_completed_job_records_exit_0_and_writes_its_output(make_job: MakeJob) -> None:
    jobdir = make_job('echo "hello $1"', args=["world"])

    status = supervise(jobdir)

    assert status["outcome"] == "completed"
    assert (status["exit_code"], status["signal"], status["error"]) == (0, None, None)
    assert status["start_time"] <= status["end_time"]
    assert output_of(jobdir) == "hello world\n"
    info = json.loads((jobdir / "supervisor.json").read_text())
    assert info["start_time"] == status["start_time"]
    assert info["job_pid"] != info["supervisor_pid"]
    assert isinstance(info["supervisor_starttime"], int) and info["supervisor_starttime"] > 0


def test_failing_job_records_its_exit_code(make_job: MakeJob) -> None:
    status = supervise(make_job("echo about to fail; exit 3"))
    assert status["outcome"] == "failed"
    assert (status["exit_code"], status["signal"]) == (3, None)


def test_job_killed_by_a_signal_records_the_signal(make_job: MakeJob) -> None:
    status = supervise(make_job("kill -KILL $$"))
    assert status["outcome"] == "failed"
    assert (status["exit_code"], status["signal"]) == (None, signal.SIGKILL)


def test_time_limit_terminates_the_job(make_job: MakeJob) -> None:
    status = supervise(make_job("sleep 60", time_limit=1, kill_grace=5))
    assert status["outcome"] == "timeout"
    # It died of the TERM, well before the grace ran out and a KILL came.
    assert (status["exit_code"], status["signal"]) == (None, signal.SIGTERM)
    assert status["end_time"] - status["start_time"] >= 1.0


def test_job_ignoring_term_is_killed_after_the_grace_period(make_job: MakeJob) -> None:
    jobdir = make_job("trap 'echo caught TERM' TERM\nwhile :; do sleep 0.1; done",
                      time_limit=1, kill_grace=0.5)
    status = supervise(jobdir)
    assert status["outcome"] == "timeout"
    assert (status["exit_code"], status["signal"]) == (None, signal.SIGKILL)
    assert "caught TERM" in output_of(jobdir)
    assert status["end_time"] - status["start_time"] >= 1.0 + 0.5


def test_sigterm_to_the_supervisor_cancels_the_whole_process_group(
        make_job: MakeJob, work_dir: Path, wait_for: WaitFor, process_gone: Gone) -> None:
    # The grandchild ignores TERM, so only the final KILL of the group can end it.
    jobdir = make_job(f"(trap '' TERM; exec sleep 300) &\necho $! > {work_dir}/grandchild\n"
                      "sleep 300", kill_grace=0.2)
    proc = start_supervisor(jobdir)
    pid_file = work_dir / "grandchild"
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), "the grandchild pid")
    # The job runs from the fork on; the supervisor writes supervisor.json just after.
    wait_for((jobdir / "supervisor.json").exists, "supervisor.json")
    grandchild = int(pid_file.read_text())
    job_pid = json.loads((jobdir / "supervisor.json").read_text())["job_pid"]

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 0

    status = json.loads((jobdir / "status.json").read_text())
    assert status["outcome"] == "cancelled"
    assert status["signal"] == signal.SIGTERM
    assert process_gone(grandchild)
    assert process_gone(job_pid)


def test_backgrounded_leftovers_are_killed_when_the_job_exits(
        make_job: MakeJob, work_dir: Path, process_gone: Gone) -> None:
    jobdir = make_job(f"sleep 300 &\necho $! > {work_dir}/leftover\nexit 0")
    status = supervise(jobdir)
    assert status["outcome"] == "completed"
    assert process_gone(int((work_dir / "leftover").read_text()))


def test_environment_is_exactly_the_spec_env(make_job: MakeJob) -> None:
    jobdir = make_job("env", env={"PATH": "/usr/bin:/bin", "ONLY_THIS": "x y"})
    status = supervise(jobdir)
    assert status["outcome"] == "completed"
    lines = set(output_of(jobdir).splitlines())
    assert "ONLY_THIS=x y" in lines
    assert "PYTHONPATH" not in output_of(jobdir)


def test_stdout_and_stderr_to_separate_files(make_job: MakeJob, work_dir: Path) -> None:
    out, err = work_dir / "o.txt", work_dir / "e.txt"
    out.write_text("earlier\n")  # appended to, like Slurm's --open-mode=append
    status = supervise(make_job("echo to-out; echo to-err >&2",
                                stdout=str(out), stderr=str(err)))
    assert status["outcome"] == "completed"
    assert out.read_text() == "earlier\nto-out\n"
    assert err.read_text() == "to-err\n"


def test_stdout_and_stderr_to_one_file_keep_their_order(make_job: MakeJob) -> None:
    jobdir = make_job("echo 1; echo 2 >&2; echo 3; echo 4 >&2")
    assert supervise(jobdir)["outcome"] == "completed"
    assert output_of(jobdir) == "1\n2\n3\n4\n"


def test_job_runs_in_its_cwd_with_stdin_from_dev_null(make_job: MakeJob, work_dir: Path) -> None:
    sub = work_dir / "sub dir"
    sub.mkdir()
    jobdir = make_job("pwd; cat; echo read-done", cwd=str(sub))
    assert supervise(jobdir)["outcome"] == "completed"
    assert output_of(jobdir) == f"{sub}\nread-done\n"


def test_missing_cwd_is_a_launch_failure_noted_in_the_output(
        make_job: MakeJob, work_dir: Path) -> None:
    jobdir = make_job("echo should not run", cwd=str(work_dir / "missing"))
    status = supervise(jobdir)
    assert status["outcome"] == "launch_failed"
    assert status["error"] == (f"cannot change to working directory {work_dir / 'missing'}: "
                               "No such file or directory")
    assert (status["exit_code"], status["signal"]) == (None, None)
    assert output_of(jobdir) == f"gpusched: error: {status['error']}\n"


def test_script_that_cannot_be_executed_is_a_launch_failure(make_job: MakeJob) -> None:
    jobdir = make_job("echo hi")
    (jobdir / "script").chmod(0o600)
    status = supervise(jobdir)
    assert status["outcome"] == "launch_failed"
    assert status["error"] == f"cannot execute {jobdir / 'script'}: Permission denied"


def test_output_the_user_may_not_write_is_a_launch_failure(
        make_job: MakeJob, test_user: pwd.struct_passwd, user_dir: Path,
        work_dir: Path) -> None:
    # work_dir is root's: the job, running as the test user, must not create files there.
    forbidden = work_dir / "out.txt"
    allowed = user_dir / "err.txt"
    jobdir = make_job("echo should not run", uid=test_user.pw_uid, gid=test_user.pw_gid,
                      user=test_user.pw_name, owner=test_user, cwd=str(user_dir),
                      stdout=str(forbidden), stderr=str(allowed))
    status = supervise(jobdir)
    assert status["outcome"] == "launch_failed"
    assert status["error"] == f"cannot open output file {forbidden}: Permission denied"
    assert not forbidden.exists()
    assert allowed.read_text() == f"gpusched: error: {status['error']}\n"


def test_job_runs_as_its_user(make_job: MakeJob, test_user: pwd.struct_passwd,
                              user_dir: Path) -> None:
    out = user_dir / "id.out"
    jobdir = make_job("id -u; id -g", uid=test_user.pw_uid, gid=test_user.pw_gid,
                      user=test_user.pw_name, owner=test_user, cwd=str(user_dir),
                      stdout=str(out), stderr=str(out))
    assert supervise(jobdir)["outcome"] == "completed"
    assert out.read_text().split() == [str(test_user.pw_uid), str(test_user.pw_gid)]
    assert (out.stat().st_uid, out.stat().st_gid) == (test_user.pw_uid, test_user.pw_gid)


def test_existing_status_means_nothing_is_run_again(make_job: MakeJob, work_dir: Path) -> None:
    jobdir = make_job(f"echo ran >> {work_dir}/runs")
    first = supervise(jobdir)
    second = supervise(jobdir)
    assert first == second
    assert (work_dir / "runs").read_text() == "ran\n"


def test_second_supervisor_on_a_live_job_exits_without_starting_it(
        make_job: MakeJob, work_dir: Path, wait_for: WaitFor) -> None:
    jobdir = make_job(f"echo ran >> {work_dir}/runs\nsleep 300", kill_grace=0.1)
    first = start_supervisor(jobdir)
    wait_for(lambda: (work_dir / "runs").exists(), "the first run to start")

    again = subprocess.run([sys.executable, "-I", "-S", str(SUPERVISOR), str(jobdir)],
                           timeout=30)

    assert again.returncode == 0
    assert first.poll() is None
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=15) == 0
    assert (work_dir / "runs").read_text() == "ran\n"
    assert json.loads((jobdir / "status.json").read_text())["outcome"] == "cancelled"


def test_unreadable_spec_is_recorded_as_a_launch_failure(jobs_dir: Path) -> None:
    jobdir = jobs_dir / "9"
    jobdir.mkdir()
    (jobdir / "spec.json").write_text("{not json")
    status = supervise(jobdir)
    assert status["outcome"] == "launch_failed"
    assert status["error"].startswith("bad job spec: ")


def test_the_launcher_blocks_what_the_supervisor_waits_for() -> None:
    from gpusched.agent import supervisor
    from gpusched.agent.spawn import SUPERVISOR_SIGMASK

    assert set(SUPERVISOR_SIGMASK) == supervisor._WATCHED


def test_a_new_time_limit_applies_to_the_running_job(make_job: MakeJob, wait_for: WaitFor) -> None:
    from gpusched.agent.supervisor import LIMIT_FILE, LIMIT_SIGNAL

    jobdir = make_job("sleep 60", time_limit=60, kill_grace=0.5)
    proc = start_supervisor(jobdir)
    wait_for((jobdir / "supervisor.json").exists, "supervisor.json")
    (jobdir / LIMIT_FILE).write_text(json.dumps({"time_limit": 1}))
    proc.send_signal(LIMIT_SIGNAL)
    assert proc.wait(timeout=15) == 0
    status = json.loads((jobdir / "status.json").read_text())
    assert status["outcome"] == "timeout"
    assert 1.0 <= status["end_time"] - status["start_time"] < 10
