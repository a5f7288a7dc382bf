"""The agent's launcher: job dirs, supervisors, cancels, adoption after a restart."""

from __future__ import annotations

import json
import os
import pwd
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpusched.agent.jobends import DISCARDED, NEVER_STARTED, SUPERVISOR_LOST, JobEnd
from gpusched.agent.launcher import Launcher, build_spec
from gpusched.agent.sparedirs import SPARE
from gpusched.agent.supervisor import FORKED
from gpusched.messages import LaunchOrder

WaitFor = Callable[..., Any]
Gone = Callable[[int], bool]

UUIDS = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"]


def launch_object(directory: Path, job_id: int = 7, **overrides: Any) -> dict[str, Any]:
    """A LAUNCH object as /agent/v1/work returns it (docs/api.md), run in directory."""
    launch = {
        "job_id": job_id, "name": "train", "user": "root", "uid": 0, "gid": 0,
        "script": "#!/bin/sh\necho hi\n", "args": [], "work_dir": str(directory),
        "environment": {"PATH": "/usr/bin:/bin", "HOME": "/root"},
        "output": None, "error": None, "time_limit": None, "gpu_uuids": [], "node": "node01",
    }
    launch.update(overrides)
    return launch


def order(directory: Path, job_id: int = 7, **overrides: Any) -> LaunchOrder:
    """launch_object, parsed as the agent parses it."""
    return LaunchOrder.parse(launch_object(directory, job_id, **overrides))


def start(launcher: Launcher, directory: Path, script: str, job_id: int = 7,
          **overrides: Any) -> dict[str, Any]:
    """Build the spec for a job running script and launch it; return the spec."""
    launch = launch_object(directory, job_id, script="#!/bin/sh\n" + script + "\n", **overrides)
    spec = build_spec(LaunchOrder.parse(launch), kill_grace=0.3, node_name="node01", min_uid=0)
    assert launcher.launch(job_id, spec, launch["script"])
    return spec


def wait_end(launcher: Launcher, job_id: int, wait_for: WaitFor) -> JobEnd:
    """Wait until wait_ended reports job_id; return its end."""
    seen: list[JobEnd] = []

    def ended() -> JobEnd | None:
        seen[:] = launcher.wait_ended(timeout=0.5)
        return next((end for end in seen if end.job_id == job_id), None)

    return wait_for(ended, f"job {job_id} to end", seen=lambda: seen)  # type: ignore[no-any-return]


def supervisor_info(jobdir: Path, wait_for: WaitFor) -> dict[str, Any]:
    """supervisor.json, once written: the job runs from the fork on, a little before it."""
    path = jobdir / "supervisor.json"
    wait_for(path.exists, str(path))
    return dict(json.loads(path.read_text()))


# ------------------------------------------------------------ build_spec


def test_build_spec_sets_gpu_and_slurm_variables(work_dir: Path) -> None:
    spec = build_spec(order(work_dir, 42, gpu_uuids=UUIDS, args=["a", "b c"]),
                      kill_grace=30.0, node_name="node01")
    env = spec["env"]
    gpus = ",".join(UUIDS)
    assert env["CUDA_VISIBLE_DEVICES"] == gpus
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    for prefix in ("GPUSCHED", "SLURM"):
        assert env[f"{prefix}_JOB_ID"] == "42"
        assert env[f"{prefix}_JOB_NODELIST"] == "node01"
        assert env[f"{prefix}_SUBMIT_DIR"] == str(work_dir)
    assert env["SLURM_JOBID"] == "42"
    assert env["SLURM_JOB_NAME"] == "train" and "GPUSCHED_JOB_NAME" not in env
    assert env["GPUSCHED_JOB_GPUS"] == gpus  # SLURM_JOB_GPUS: indexes (test_slurm_env)
    assert env["HOME"] == "/root"  # the submit environment is kept
    assert spec["argv"][1:] == ["a", "b c"]
    assert (spec["uid"], spec["gid"], spec["user"], spec["cwd"]) == (0, 0, "root", str(work_dir))
    assert (spec["time_limit"], spec["kill_grace"]) == (None, 30.0)


def test_build_spec_hides_all_gpus_from_a_job_without_gpus(work_dir: Path) -> None:
    spec = build_spec(order(work_dir), kill_grace=1.0, node_name="n")
    assert spec["env"]["CUDA_VISIBLE_DEVICES"] == ""
    assert spec["env"]["SLURM_JOB_GPUS"] == ""


def test_build_spec_sets_array_variables_and_names(work_dir: Path) -> None:
    spec = build_spec(order(work_dir, 42, array_job_id=40, array_task_id=20,
                                    array_spec="0-30:10", output="o-%A_%a-%j"),
                      kill_grace=1.0, node_name="n")
    for prefix in ("GPUSCHED_", "SLURM_"):
        assert {k[len(prefix):]: v for k, v in spec["env"].items()
                if k.startswith(prefix + "ARRAY_")} == {
            "ARRAY_JOB_ID": "40", "ARRAY_TASK_ID": "20", "ARRAY_TASK_COUNT": "4",
            "ARRAY_TASK_MIN": "0", "ARRAY_TASK_MAX": "30", "ARRAY_TASK_STEP": "10"}
    assert spec["stdout"] == str(work_dir / "o-40_20-42")
    listed = build_spec(order(work_dir, 42, array_job_id=40, array_task_id=3,
                                      array_spec="1,3,5-9"), kill_grace=1.0, node_name="n")
    assert listed["env"]["SLURM_ARRAY_TASK_COUNT"] == "7"
    assert "SLURM_ARRAY_TASK_STEP" not in listed["env"]
    plain = build_spec(order(work_dir, 42), kill_grace=1.0, node_name="n")
    assert not any("ARRAY" in key for key in plain["env"])


def test_build_spec_names_every_node_of_a_multi_node_job(work_dir: Path) -> None:
    spec = build_spec(order(work_dir, 42, node_names=["gpu01", "gpu02"]),
                      kill_grace=1.0, node_name="gpu01")
    assert spec["env"]["SLURM_JOB_NODELIST"] == "gpu[01-02]"
    assert spec["env"]["GPUSCHED_JOB_NUM_NODES"] == "2"
    assert build_spec(order(work_dir, 42), kill_grace=1.0,
                      node_name="n")["env"]["SLURM_JOB_NUM_NODES"] == "1"


def test_build_spec_output_paths(work_dir: Path) -> None:
    default = build_spec(order(work_dir, 5), kill_grace=1.0, node_name="n")
    assert default["stdout"] == default["stderr"] == str(work_dir / "gpusched-5.out")

    split = build_spec(order(work_dir, 5, output="logs/%x-%j.out", error="/abs/%u.err"),
                       kill_grace=1.0, node_name="n")
    assert split["stdout"] == str(work_dir / "logs" / "train-5.out")
    assert split["stderr"] == "/abs/root.err"


# ------------------------------------------------------------ running jobs


def test_job_sees_its_gpus_and_slurm_variables(
        launcher: Launcher, work_dir: Path, wait_for: WaitFor) -> None:
    script = 'echo "$CUDA_VISIBLE_DEVICES|$SLURM_JOB_ID|$SLURM_JOBID|$SLURM_JOB_NODELIST|$1"'
    spec = start(launcher, work_dir, script, job_id=3, gpu_uuids=UUIDS, args=["arg1"])
    end = wait_end(launcher, 3, wait_for)
    assert (end.outcome, end.exit_code, end.signal, end.error) == ("completed", 0, None, None)
    assert end.start_time is not None and end.start_time <= end.end_time
    assert Path(spec["stdout"]).read_text() == f"{','.join(UUIDS)}|3|3|node01|arg1\n"


def test_failed_job_is_reported_with_its_exit_code(
        launcher: Launcher, work_dir: Path, wait_for: WaitFor) -> None:
    start(launcher, work_dir, "exit 4")
    end = wait_end(launcher, 7, wait_for)
    assert (end.outcome, end.exit_code, end.signal) == ("failed", 4, None)


def test_launch_is_idempotent(launcher: Launcher, work_dir: Path, wait_for: WaitFor) -> None:
    runs = work_dir / "runs"
    spec = start(launcher, work_dir, f"echo ran >> {runs}")
    assert not launcher.launch(7, spec, f"#!/bin/sh\necho ran >> {runs}\n")
    end = wait_end(launcher, 7, wait_for)
    assert end.outcome == "completed"
    assert launcher.launch(7, spec, f"#!/bin/sh\necho ran >> {runs}\n") is False
    assert runs.read_text() == "ran\n"
    assert [e.job_id for e in launcher.unreported()] == [7]


def test_script_and_job_dir_permissions(launcher: Launcher, jobs_dir: Path, work_dir: Path,
                                        wait_for: WaitFor) -> None:
    start(launcher, work_dir, "exit 0")
    jobdir = jobs_dir / "7"
    assert jobdir.stat().st_mode & 0o777 == 0o711
    assert (jobdir / "script").stat().st_mode & 0o777 == 0o700
    assert (jobdir / "spec.json").stat().st_mode & 0o077 == 0
    assert json.loads((jobdir / "spec.json").read_text())["argv"][0] == str(jobdir / "script")
    wait_end(launcher, 7, wait_for)
    for name in ("status.json", "supervisor.json", "supervisor.lock", "supervisor.log"):
        if (jobdir / name).exists():
            assert (jobdir / name).stat().st_mode & 0o077 == 0, name
    assert (jobdir / "status.json").exists() and (jobdir / "supervisor.json").exists()
    assert (jobdir / "supervisor.lock").read_bytes() == FORKED  # it got as far as the fork


def test_job_of_a_uid_below_the_minimum_never_runs(
        launcher: Launcher, work_dir: Path, wait_for: WaitFor) -> None:
    marker = work_dir / "ran"
    launch = launch_object(work_dir, 7, script=f"#!/bin/sh\ntouch {marker}\n")
    # The supervisor checks again what the agent checked: a spec below its min_uid
    # (root's job under the default of 1) fails at launch.
    spec = build_spec(LaunchOrder.parse(launch), kill_grace=0.3, node_name="n")
    assert launcher.launch(7, spec, launch["script"])
    end = wait_end(launcher, 7, wait_for)
    assert end.outcome == "launch_failed"
    assert "uid 0" in (end.error or "") and "min_job_uid" in (end.error or "")
    assert not marker.exists()


@pytest.mark.parametrize(("umask", "expected"), [(0o077, 0o600), (0o022, 0o644), (0o002, 0o664)])
def test_job_runs_with_the_submitters_umask(
        launcher: Launcher, test_user: pwd.struct_passwd, user_dir: Path, wait_for: WaitFor,
        umask: int, expected: int) -> None:
    spec = start(launcher, user_dir, "umask; touch made", user=test_user.pw_name,
                 uid=test_user.pw_uid, gid=test_user.pw_gid, umask=umask)
    assert wait_end(launcher, 7, wait_for).outcome == "completed"
    assert Path(spec["stdout"]).read_text().strip() == f"{umask:04o}"
    assert Path(spec["stdout"]).stat().st_mode & 0o777 == expected
    assert (user_dir / "made").stat().st_mode & 0o777 == expected


def test_a_job_that_cannot_be_prepared_fails_alone(
        launcher: Launcher, work_dir: Path, wait_for: WaitFor) -> None:
    launch = launch_object(work_dir, 7)
    spec = build_spec(LaunchOrder.parse(launch), kill_grace=0.3, node_name="n", min_uid=0)
    spec["env"] = {"BAD": object()}  # cannot be written as JSON
    assert launcher.launch(7, spec, launch["script"])
    end = wait_end(launcher, 7, wait_for)
    assert end.outcome == "launch_failed" and "cannot prepare the job" in (end.error or "")
    start(launcher, work_dir, "exit 0", job_id=8)
    assert wait_end(launcher, 8, wait_for).outcome == "completed"


def test_cancel_ends_the_job_and_its_process_group(
        launcher: Launcher, jobs_dir: Path, work_dir: Path, wait_for: WaitFor,
        process_gone: Gone) -> None:
    pid_file = work_dir / "grandchild"
    start(launcher, work_dir, f"sleep 300 &\necho $! > {pid_file}\nwait")
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), "the job to start")
    assert launcher.running() == [7]

    assert launcher.cancel(7)

    end = wait_end(launcher, 7, wait_for)
    assert end.outcome == "cancelled"
    # SIGKILL went to the group before the end was written; dying takes a moment.
    grandchild = int(pid_file.read_text())
    wait_for(lambda: process_gone(grandchild), "the backgrounded grandchild to be killed")
    job_pid = json.loads((jobs_dir / "7" / "supervisor.json").read_text())["job_pid"]
    assert process_gone(job_pid)
    wait_for(lambda: launcher.running() == [], "running() to drop the job",
             seen=launcher.running)
    assert not launcher.cancel(7)


def test_cancel_of_an_unknown_job_is_false(launcher: Launcher) -> None:
    assert launcher.cancel(99) is False


def test_time_limit_is_reported_as_timeout(
        launcher: Launcher, work_dir: Path, wait_for: WaitFor) -> None:
    start(launcher, work_dir, "trap '' TERM\nwhile :; do sleep 0.1; done", time_limit=1)
    end = wait_end(launcher, 7, wait_for)
    assert (end.outcome, end.exit_code, end.signal) == ("timeout", None, signal.SIGKILL)


def test_missing_work_dir_is_reported_as_launch_failed(
        launcher: Launcher, work_dir: Path, wait_for: WaitFor) -> None:
    missing = work_dir / "gone"
    start(launcher, work_dir, "exit 0", work_dir=str(missing), output=str(work_dir / "o"))
    end = wait_end(launcher, 7, wait_for)
    assert end.outcome == "launch_failed"
    assert end.error == f"cannot change to working directory {missing}: No such file or directory"


def test_supervisor_that_cannot_start_is_a_launch_failure(
        jobs_dir: Path, work_dir: Path, wait_for: WaitFor) -> None:
    launcher = Launcher(jobs_dir, python=str(work_dir / "no-such-python"))
    try:
        start(launcher, work_dir, "exit 0")
        end = wait_end(launcher, 7, wait_for)
    finally:
        launcher.close()
    assert end.outcome == "launch_failed"
    assert end.error is not None and end.error.startswith("cannot start the job supervisor")


def test_mark_reported_forgets_the_job(
        launcher: Launcher, jobs_dir: Path, work_dir: Path, wait_for: WaitFor) -> None:
    start(launcher, work_dir, "exit 0")
    wait_end(launcher, 7, wait_for)
    launcher.mark_reported(7)
    assert not (jobs_dir / "7").exists()
    assert launcher.unreported() == []
    assert launcher.wait_ended(timeout=0.05) == []


def test_mark_reported_keeps_a_running_job(
        launcher: Launcher, jobs_dir: Path, work_dir: Path) -> None:
    start(launcher, work_dir, "sleep 300")
    launcher.mark_reported(7)
    assert (jobs_dir / "7" / "spec.json").exists()


def test_a_new_run_clears_what_an_ended_run_left_but_never_a_live_one(
        launcher: Launcher, jobs_dir: Path, work_dir: Path, wait_for: WaitFor) -> None:
    start(launcher, work_dir, "sleep 300")
    assert not launcher.clear_stale(7)  # its supervisor is alive: nothing removed
    assert (jobs_dir / "7" / "spec.json").exists()
    launcher.cancel(7)
    wait_end(launcher, 7, wait_for)
    # An ended run whose end was never recorded, or a directory a launch left with no
    # status at all: a new run of the job clears it and starts.
    (jobs_dir / "7" / "status.json").unlink()
    assert launcher.clear_stale(7) and not (jobs_dir / "7").exists()
    start(launcher, work_dir, f"touch {work_dir}/again", job_id=7)
    assert wait_end(launcher, 7, wait_for).outcome == "completed"
    assert (work_dir / "again").exists()


def test_wait_ended_leaves_out_the_jobs_skipped(
        launcher: Launcher, work_dir: Path, wait_for: WaitFor) -> None:
    """What a second reporter asks: the ends another is reporting are not its own."""
    start(launcher, work_dir, "exit 0", job_id=7)
    start(launcher, work_dir, "exit 0", job_id=8)
    wait_for(lambda: len(launcher.unreported()) == 2, "both jobs to end",
             seen=launcher.unreported)
    assert [end.job_id for end in launcher.wait_ended(timeout=0.05, skip={7})] == [8]
    assert launcher.wait_ended(timeout=0.05, skip={7, 8}) == []
    assert sorted(end.job_id for end in launcher.wait_ended(timeout=0.05)) == [7, 8]


def test_wait_ended_in_another_thread_sees_a_job_launched_later(
        launcher: Launcher, work_dir: Path) -> None:
    result: list[JobEnd] = []
    waiter = threading.Thread(target=lambda: result.extend(launcher.wait_ended(timeout=60)))
    waiter.start()
    start(launcher, work_dir, "exit 0")
    # Without the wake-up the waiter would not watch the new supervisor for 60 s.
    waiter.join(timeout=20)
    assert not waiter.is_alive()
    assert [(e.job_id, e.outcome) for e in result] == [(7, "completed")]


# ------------------------------------------------------------ agent restarts


def test_adopt_after_a_restart_watches_running_jobs(
        jobs_dir: Path, work_dir: Path, wait_for: WaitFor) -> None:
    first = Launcher(jobs_dir)
    started = work_dir / "started"
    start(first, work_dir, f"touch {started}\nsleep 300", job_id=1)
    start(first, work_dir, "exit 5", job_id=2)
    wait_for(started.exists, "job 1 to start")
    wait_end(first, 2, wait_for)
    first.close()  # the agent goes away; the supervisors, in their own sessions, stay
    del first

    second = Launcher(jobs_dir)
    try:
        assert second.adopt() == [1]
        assert second.running() == [1]
        assert [(e.job_id, e.exit_code) for e in second.unreported()] == [(2, 5)]
        assert second.cancel(1)
        end = wait_end(second, 1, wait_for)
    finally:
        second.close()
    assert end.outcome == "cancelled"


def ends_after_adoption(jobs_dir: Path) -> list[JobEnd]:
    """What a new launcher over ``jobs_dir`` reports ended, once it has adopted nothing
    running there."""
    second = Launcher(jobs_dir)
    try:
        assert second.adopt() == []
        return second.unreported()
    finally:
        second.close()


def test_adopt_reports_a_lost_supervisor_and_kills_its_job(
        jobs_dir: Path, work_dir: Path, wait_for: WaitFor, process_gone: Gone) -> None:
    first = Launcher(jobs_dir)
    started = work_dir / "started"
    start(first, work_dir, f"touch {started}\nsleep 300")
    wait_for(started.exists, "the job to start")
    first.close()
    info = supervisor_info(jobs_dir / "7", wait_for)
    os.kill(info["supervisor_pid"], signal.SIGKILL)
    wait_for(lambda: process_gone(info["supervisor_pid"]), "the supervisor to die")

    ends = ends_after_adoption(jobs_dir)
    assert [(e.job_id, e.outcome, e.error) for e in ends] == [(7, "failed", SUPERVISOR_LOST)]
    assert ends[0].start_time == info["start_time"]
    wait_for(lambda: process_gone(info["job_pid"]), "the orphaned job to be killed")


def test_a_job_whose_supervisor_never_forked_it_is_reported_not_started(
        jobs_dir: Path, work_dir: Path, wait_for: WaitFor, process_gone: Gone) -> None:
    """An agent killed between making the job's directory and starting its supervisor
    (or a supervisor killed before it forked the job): nothing of the job ran, and the
    end says so (the controller requeues it). One killed after the fork stays lost."""
    first = Launcher(jobs_dir)
    first._spawn_supervisor = lambda jobdir: os.getpid()  # type: ignore[method-assign]
    try:
        start(first, work_dir, "touch never")
    finally:
        first.close()
    assert (jobs_dir / "7" / "spec.json").exists()
    assert not (jobs_dir / "7" / "supervisor.json").exists()
    ends = ends_after_adoption(jobs_dir)
    assert [(e.job_id, e.outcome, e.error, e.start_time) for e in ends] == [
        (7, "not_started", NEVER_STARTED, None)]
    assert not (work_dir / "never").exists()


def test_a_job_whose_supervisor_died_right_after_forking_it_is_reported_lost(
        jobs_dir: Path, work_dir: Path) -> None:
    """Its lock says it forked (FORKED), but it never named the job in supervisor.json:
    the job may have run, so it is lost, not never started."""
    first = Launcher(jobs_dir)
    first._spawn_supervisor = lambda jobdir: os.getpid()  # type: ignore[method-assign]
    try:
        start(first, work_dir, "true")
    finally:
        first.close()
    (jobs_dir / "7" / "supervisor.lock").write_bytes(FORKED)
    ends = ends_after_adoption(jobs_dir)
    assert [(e.job_id, e.outcome, e.error) for e in ends] == [(7, "failed", SUPERVISOR_LOST)]


def test_an_interrupted_removal_of_a_reported_job_is_finished_at_adoption(
        launcher: Launcher, jobs_dir: Path, work_dir: Path, wait_for: WaitFor) -> None:
    start(launcher, work_dir, "exit 0")
    wait_end(launcher, 7, wait_for)
    launcher.mark_reported(7)
    assert sorted(os.listdir(jobs_dir)) == [f"{SPARE}0"]  # kept for a later run
    left = jobs_dir / f"{DISCARDED}8"  # as a removal cut short leaves it
    left.mkdir()
    (left / "status.json").write_text('{"outcome": "completed", "end_time": 1}')
    assert launcher.unreported() == []  # not a job's directory
    # A new agent's launcher: the spares of the last are removed with the leftovers.
    assert Launcher(jobs_dir, spawner=False).adopt() == []
    assert sorted(os.listdir(jobs_dir)) == []


def test_supervisor_killed_while_watched_is_reported_lost(
        launcher: Launcher, jobs_dir: Path, work_dir: Path, wait_for: WaitFor) -> None:
    started = work_dir / "started"
    start(launcher, work_dir, f"touch {started}\nsleep 300")
    wait_for(started.exists, "the job to start")
    info = supervisor_info(jobs_dir / "7", wait_for)
    os.kill(info["supervisor_pid"], signal.SIGKILL)
    end = wait_end(launcher, 7, wait_for)
    assert (end.outcome, end.error) == ("failed", SUPERVISOR_LOST)


def test_adopt_right_after_launch_finds_the_starting_supervisor(
        jobs_dir: Path, work_dir: Path, wait_for: WaitFor) -> None:
    # The supervisor's python waits at a gate, so adopt() surely runs before it has
    # written supervisor.json: only its lock can identify it.
    gate = work_dir / "gate"
    python = work_dir / "gated-python"
    # Python, not sh: dash clears the signal mask the launcher set before it execs.
    python.write_text(f"#!{sys.executable} -I\nimport os, sys, time\n"
                      f"while not os.path.exists({str(gate)!r}):\n    time.sleep(0.01)\n"
                      "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n")
    python.chmod(0o755)
    first = Launcher(jobs_dir, python=str(python), spawner=False)  # a fresh interpreter per job
    start(first, work_dir, "sleep 300")
    first.close()
    second = Launcher(jobs_dir)
    try:
        assert second.adopt() == [7]
        assert not (jobs_dir / "7" / "supervisor.json").exists()
        assert second.cancel(7)  # stays pending while the supervisor starts
        gate.touch()
        end = wait_end(second, 7, wait_for)
    finally:
        second.close()
    assert end.outcome == "cancelled"


# ------------------------------------------------------------ as another user


def test_job_runs_as_its_user_and_owns_its_output(
        launcher: Launcher, test_user: pwd.struct_passwd, user_dir: Path,
        wait_for: WaitFor) -> None:
    spec = start(launcher, user_dir, "id -u; id -g", user=test_user.pw_name,
                 uid=test_user.pw_uid, gid=test_user.pw_gid)
    end = wait_end(launcher, 7, wait_for)
    assert (end.outcome, end.error) == ("completed", None)
    out = Path(spec["stdout"])
    assert out.read_text().split() == [str(test_user.pw_uid), str(test_user.pw_gid)]
    assert (out.stat().st_uid, out.stat().st_gid) == (test_user.pw_uid, test_user.pw_gid)


def test_job_user_cannot_write_output_where_it_may_not(
        launcher: Launcher, test_user: pwd.struct_passwd, user_dir: Path, work_dir: Path,
        wait_for: WaitFor) -> None:
    forbidden = work_dir / "out"  # root's directory
    start(launcher, user_dir, "echo should not run", user=test_user.pw_name,
          uid=test_user.pw_uid, gid=test_user.pw_gid, output=str(forbidden))
    end = wait_end(launcher, 7, wait_for)
    assert end.outcome == "launch_failed"
    assert end.error == f"cannot open output file {forbidden}: Permission denied"
    assert not forbidden.exists()


def test_output_pattern_is_expanded_for_the_job(
        launcher: Launcher, work_dir: Path, wait_for: WaitFor) -> None:
    start(launcher, work_dir, "echo patterned", output="%x_%u.log")
    wait_end(launcher, 7, wait_for)
    assert (work_dir / "train_root.log").read_text() == "patterned\n"


# ------------------------------------------------------------ the spawner


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _spawner_pids() -> set[int]:
    return {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()
            and _cmdline(p).endswith("--spawner 3")}


def _cmdline(proc: Path) -> str:
    try:
        return proc.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def test_supervisors_are_forked_by_the_spawner_not_started_afresh(
        launcher: Launcher, jobs_dir: Path, work_dir: Path, wait_for: WaitFor) -> None:
    start(launcher, work_dir, "sleep 300")
    info = supervisor_info(jobs_dir / "7", wait_for)
    spawner = _parent_of(info["supervisor_pid"])
    assert spawner != os.getpid() and spawner in _spawner_pids()
    assert _parent_of(spawner) == os.getpid()
    start(launcher, work_dir, "sleep 300", job_id=8)
    assert _parent_of(supervisor_info(jobs_dir / "8", wait_for)["supervisor_pid"]) == spawner


def test_a_dead_spawner_is_replaced_and_its_supervisors_live_on(
        launcher: Launcher, jobs_dir: Path, work_dir: Path, wait_for: WaitFor) -> None:
    start(launcher, work_dir, "sleep 300")
    first = supervisor_info(jobs_dir / "7", wait_for)
    spawner = _parent_of(first["supervisor_pid"])
    os.kill(spawner, signal.SIGKILL)
    wait_for(lambda: spawner not in _spawner_pids(), "the spawner to die")
    start(launcher, work_dir, "echo second", job_id=8)
    assert wait_end(launcher, 8, wait_for).outcome == "completed"
    assert launcher.running() == [7]  # the first job's supervisor did not die with it
    assert launcher.cancel(7)
    assert wait_end(launcher, 7, wait_for).outcome == "cancelled"


def test_closing_the_launcher_ends_the_spawner_but_not_the_jobs(
        jobs_dir: Path, work_dir: Path, wait_for: WaitFor) -> None:
    first = Launcher(jobs_dir)
    start(first, work_dir, "sleep 300")
    info = supervisor_info(jobs_dir / "7", wait_for)
    spawner = _parent_of(info["supervisor_pid"])
    first.close()
    wait_for(lambda: spawner not in _spawner_pids(), "the spawner to leave")
    second = Launcher(jobs_dir)
    try:
        assert second.adopt() == [7]
        assert second.cancel(7)
        assert wait_end(second, 7, wait_for).outcome == "cancelled"
    finally:
        second.close()


def test_signal_reaches_the_job_and_leaves_it_running(
        launcher: Launcher, work_dir: Path, wait_for: WaitFor) -> None:
    got = work_dir / "got"
    ready = work_dir / "ready"
    start(launcher, work_dir, f"trap 'echo usr1 >> {got}' USR1\ntouch {ready}\n"
          "while true; do sleep 0.05; done")
    wait_for(ready.exists, "the job to set its trap")
    assert launcher.signal(7, signal.SIGUSR1)
    wait_for(lambda: got.exists() and got.read_text() == "usr1\n", "the trap to run")
    assert launcher.running() == [7]  # still going
    assert not launcher.signal(8, signal.SIGUSR1)  # unknown job
    assert launcher.cancel(7)
    assert wait_end(launcher, 7, wait_for).outcome == "cancelled"
    assert not launcher.signal(7, signal.SIGUSR1)  # ended
