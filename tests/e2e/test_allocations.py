"""Allocations end to end on ``gpusched up --nodes 2`` (its controller started again with
``[scheduler] allocation_grace = 5``): galloc runs a command whose gsrun reaches both
nodes and whose exit status becomes the job's and galloc's, its GPUs then free; gsrun
outside a job makes its own allocation and completes it; Ctrl-C while galloc waits
cancels the allocation; a galloc killed outright leaves an allocation that the
controller ends CANCELLED ("client lost") within the grace and a check."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import wait_for
from tests.e2e.test_steps import BIN, LocalCluster

GRACE = 5.0
CHECK_EVERY = 1.0  # the controller's allocation check: grace/5, at least 1 s


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="gpusched-alloc-"))
    os.chmod(root, 0o755)  # the PostgreSQL user must reach the data directory
    local = LocalCluster(root)
    try:
        started = local.run("gpusched", "up", "--nodes", "2", "--gpus", "2")
        assert started.returncode == 0, started.stdout + started.stderr
        _restart_controller_with_grace(local)
        wait_for(lambda: sum(n["state"] == "UP" for n in local.api("GET", "/v1/nodes")
                             ["nodes"]) == 2, timeout=120, what="both nodes UP")
        yield local
    finally:
        local.run("gpusched", "down")
        shutil.rmtree(root, ignore_errors=True)


def _restart_controller_with_grace(local: LocalCluster) -> None:
    """The controller again, its configuration given a grace of GRACE seconds."""
    state = local.root / "gpusched"
    config = state / "gpusched.toml"
    config.write_text(config.read_text() + f"\n[scheduler]\nallocation_grace = {GRACE}\n")
    pid = int((state / "controller.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not Path(f"/proc/{pid}").exists()
             or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z",
             timeout=30, what="the controller to stop")
    spawn = ("from pathlib import Path; from gpusched.local import LocalCluster, _spawn; "
             f"_spawn(LocalCluster(Path({str(state)!r})), 'controller')")
    subprocess.run([sys.executable, "-c", spawn], env=local.env, check=True, timeout=60)

    def answers() -> bool:
        try:
            return bool(local.api("GET", "/v1/ping")["leader"])
        except Exception:
            return False
    wait_for(answers, timeout=60, what="the controller to lead again")


def _gpu_holders(local: LocalCluster) -> dict[str, Any]:
    return {g["uuid"]: g["job_id"] for n in local.api("GET", "/v1/nodes")["nodes"]
            for g in n["gpus"]}


def _job_named(local: LocalCluster, name: str) -> dict[str, Any]:
    jobs = local.api("GET", f"/v1/jobs?all=1&name={name}")["jobs"]
    assert len(jobs) == 1, jobs
    return jobs[0]


def _read_until(proc: subprocess.Popen[str], needle: str, timeout: float = 60) -> str:
    """galloc's stderr until a line holding ``needle``; all read so far."""
    assert proc.stderr is not None
    # Read the pipe's descriptor itself: the text wrapper's readline may buffer a
    # second line that select would then never see coming.
    fd = proc.stderr.fileno()
    seen, deadline = "", time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {needle!r} from galloc; it said {seen!r}"
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 4096)
            assert chunk, f"galloc closed stderr before {needle!r}; it said {seen!r}"
            seen += chunk.decode()
    return seen


def test_galloc_runs_steps_on_both_nodes_and_ends_with_the_commands_status(
        cluster: LocalCluster) -> None:
    # The first gsrun takes galloc's -n 4 (SLURM_NTASKS) as srun does; -N 2 alone, one
    # task per node.
    command = (f"{BIN}/gsrun -l hostname; {BIN}/gsrun -N 2 -l printenv SLURMD_NODENAME; "
               "echo \"nodes $SLURM_JOB_NODELIST $SLURM_NNODES $SLURM_JOB_NAME\"; exit 3")
    result = cluster.run("galloc", "-N", "2", "-n", "4", "--gpus-per-node", "1",
                         "-J", "salloc-like", "sh", "-c", command)
    assert result.returncode == 3, result.stderr
    lines = result.stdout.splitlines()
    host = os.uname().nodename
    assert sorted(lines[:4]) == [f"{t}: {host}" for t in range(4)], result.stdout
    assert sorted(lines[4:6]) == ["0: node1", "1: node2"], result.stdout
    assert lines[6] == "nodes node[1-2] 2 salloc-like"
    job = _job_named(cluster, "salloc-like")
    # The second step may find the first one's end not yet recorded, and wait for it as
    # srun does ("step creation temporarily disabled, retrying").
    waited = ("gsrun: step creation temporarily disabled",
              f"gsrun: step created for job {job['job_id']}")
    said = [line for line in result.stderr.splitlines() if not line.startswith(waited)]
    assert said == [
        f"galloc: Granted job allocation {job['job_id']}",
        f"galloc: Relinquishing job allocation {job['job_id']}"], result.stderr
    assert (job["state"], job["exit_code"], job["interactive"]) == ("FAILED", 3, True)
    assert job["job_id"] not in _gpu_holders(cluster).values()
    # A step's last node may report after the allocation's end closed it: its report,
    # of tasks that ended on their own, still settles it.
    wait_for(lambda: [(s["step_id"], s["state"]) for s in cluster.api(
        "GET", f"/v1/jobs/{job['job_id']}/steps")["steps"]] == [(0, "COMPLETED"),
                                                                 (1, "COMPLETED")],
             timeout=30, what="both steps COMPLETED",
             seen=lambda: cluster.api("GET", f"/v1/jobs/{job['job_id']}/steps"))


def test_gsrun_outside_a_job_makes_and_completes_its_own_allocation(
        cluster: LocalCluster) -> None:
    result = cluster.run("gsrun", "-N", "2", "-l", "printenv", "SLURM_PROCID")
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["0: 0", "1: 1"]
    assert result.stderr == ""  # srun says nothing of an allocation it gets at once
    job = _job_named(cluster, "printenv")
    assert job["state"] == "COMPLETED"
    shown = cluster.run("gacct", "-j", str(job["job_id"]))
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines()
               if line.split() and line.split()[0] == str(job["job_id"]))
    assert "COMPLETED" in row, shown.stdout
    failed = cluster.run("gsrun", "-J", "fails", "sh", "-c", "exit 4")
    assert failed.returncode == 4
    assert (_job_named(cluster, "fails")["state"], _job_named(cluster, "fails")["exit_code"]) \
        == ("FAILED", 4)


def test_ctrl_c_while_waiting_cancels_the_allocation(cluster: LocalCluster) -> None:
    blocker = cluster.submit_script("blocker", "sleep 300\n")
    wait_for(lambda: cluster.job(blocker)["state"] == "RUNNING", timeout=60,
             what="the job holding every GPU to run")
    proc = subprocess.Popen([str(BIN / "galloc"), "-J", "waits", "--gpus", "1", "sleep", "300"],
                            env=cluster.env, cwd=cluster.root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        said = _read_until(proc, "queued and waiting for resources")
        job = _job_named(cluster, "waits")
        assert said.splitlines() == [
            f"galloc: Pending job allocation {job['job_id']}",
            f"galloc: job {job['job_id']} queued and waiting for resources"]
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 1
        assert err == f"galloc: Job allocation {job['job_id']} has been revoked.\n"
        assert cluster.job(job["job_id"])["state"] == "CANCELLED"
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.run("gcancel", str(blocker))
        cluster.wait_ended(blocker)


def test_a_galloc_killed_outright_loses_its_allocation_after_the_grace(
        cluster: LocalCluster) -> None:
    proc = subprocess.Popen([str(BIN / "galloc"), "-J", "orphan", "--gpus", "2", "sleep", "300"],
                            env=cluster.env, cwd=cluster.root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _read_until(proc, "Granted job allocation")
        job = _job_named(cluster, "orphan")
        assert job["state"] == "RUNNING"
        # Beats keep it alive past the grace while galloc lives.
        time.sleep(GRACE + 2 * CHECK_EVERY)
        assert cluster.job(job["job_id"])["state"] == "RUNNING"
        os.killpg(proc.pid, signal.SIGKILL)  # galloc and its command, no goodbye
        proc.wait(timeout=10)
        ended = wait_for(lambda: (seen := cluster.job(job["job_id"]))["state"] != "RUNNING"
                         and seen, timeout=GRACE + 2 * CHECK_EVERY + 3,
                         what="the allocation to end after the grace")
        assert ended["state"] == "CANCELLED"
        assert ended["error_message"].startswith("client lost"), ended
        assert job["job_id"] not in _gpu_holders(cluster).values()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_gsrun_pty_outside_a_job_gets_a_terminal_on_a_new_allocation(
        cluster: LocalCluster) -> None:
    result = subprocess.run([str(BIN / "gsrun"), "-J", "ptyshell", "--pty", "sh", "-c",
                             "tty; echo \"procid $SLURM_PROCID\"; exit 5"],
                            env=cluster.env, cwd=cluster.root, capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 5, result.stderr
    lines = result.stdout.replace("\r\n", "\n").splitlines()
    assert lines[0].startswith("/dev/pts/") and lines[1] == "procid 0", result.stdout
    job = _job_named(cluster, "ptyshell")
    assert (job["state"], job["exit_code"], job["interactive"]) == ("FAILED", 5, True)
