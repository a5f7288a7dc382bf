"""Jobs through a real controller and agent: start, placement, ends, cancel, time limit."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.dbview import open_commands, query

HOLD = 'while [ ! -e "{flag}" ]; do sleep 0.05; done'


def _release(cluster: Cluster, name: str) -> None:
    (cluster.work / name).touch()


def _env_of(output: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in output.read_text().splitlines() if "=" in line)
    return {k: v for k, v in pairs}


def test_job_runs_to_completion_with_its_gpus_visible(cluster: Cluster) -> None:
    job_id = cluster.submit("--gpus", "2", "--job-name", "envcheck", "--wrap", "env")
    job = cluster.wait_state(job_id, "COMPLETED")
    assert job["exit_code"] == 0 and job["signal"] is None
    assert len(job["gpu_uuids"]) == 2 and job["node"] == "node01"
    env = _env_of(cluster.work / f"gpusched-{job_id}.out")
    assert env["CUDA_VISIBLE_DEVICES"] == ",".join(job["gpu_uuids"])
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    for prefix in ("GPUSCHED", "SLURM"):
        assert env[f"{prefix}_JOB_ID"] == str(job_id)
        assert env[f"{prefix}_JOB_NODELIST"] == "node01"
        assert env[f"{prefix}_SUBMIT_DIR"] == str(cluster.work)
    assert env["SLURM_JOB_NAME"] == "envcheck" and "GPUSCHED_JOB_NAME" not in env
    assert job["start_time"] <= job["end_time"]
    stats = cluster.api("GET", "/v1/ping")["scheduler"]
    assert stats["passes"] >= 1 and stats["total_started"] >= 1


def test_two_jobs_share_a_node_on_disjoint_gpus_and_a_third_waits(cluster: Cluster) -> None:
    first = cluster.submit("--gpus", "2", "--wrap", HOLD.format(flag="go1"))
    second = cluster.submit("--gpus", "2", "--wrap", HOLD.format(flag="go2"))
    a = cluster.wait_state(first, "RUNNING")
    b = cluster.wait_state(second, "RUNNING")
    assert set(a["gpu_uuids"]).isdisjoint(b["gpu_uuids"])
    third = cluster.submit("--gpus", "2", "--wrap", "echo $CUDA_VISIBLE_DEVICES")
    wait_for(lambda: cluster.job(third)["reason"] == "Resources", what="reason Resources",
             seen=lambda: cluster.job(third))
    assert cluster.job(third)["state"] == "PENDING"
    _release(cluster, "go2")
    c = cluster.wait_state(third, "COMPLETED")
    assert sorted(c["gpu_uuids"]) == sorted(b["gpu_uuids"])
    assert cluster.job(first)["state"] == "RUNNING"
    _release(cluster, "go1")
    cluster.wait_state(first, "COMPLETED")


def test_failing_script_is_failed_with_its_exit_code(cluster: Cluster) -> None:
    job_id = cluster.submit("--wrap", "echo oops >&2; exit 3")
    job = cluster.wait_state(job_id, "FAILED")
    assert job["exit_code"] == 3
    assert "oops" in (cluster.work / f"gpusched-{job_id}.out").read_text()


def test_cancel_pending_and_running(cluster: Cluster) -> None:
    running = cluster.submit("--gpus", "4", "--wrap", "trap 'echo got TERM; exit 143' TERM; "
                             "echo started; while :; do sleep 0.05; done")
    cluster.wait_state(running, "RUNNING")
    pending = cluster.submit("--gpus", "4", "--wrap", "true")
    wait_for(lambda: cluster.job(pending)["reason"] == "Resources", what="pending job")
    result = cluster.run("gcancel", str(pending))
    assert result.returncode == 0, result.stderr
    assert cluster.job(pending)["state"] == "CANCELLED"
    out = cluster.work / f"gpusched-{running}.out"
    wait_for(lambda: out.exists() and "started" in out.read_text(), what="job output")
    assert cluster.run("gcancel", str(running)).returncode == 0
    job = cluster.wait_state(running, "CANCELLED")
    assert "got TERM" in out.read_text()
    assert job["gpu_uuids"]  # it held GPUs; they are free again:
    nodes = cluster.api("GET", "/v1/nodes")["nodes"]
    assert all(g["job_id"] is None for g in nodes[0]["gpus"])
    again = cluster.run("gcancel", str(pending))
    assert again.returncode == 1 and "already ended" in again.stderr


def test_time_limit_ends_a_job_as_timeout(cluster: Cluster) -> None:
    job_id = cluster.submit("--time", "0:01", "--wrap", "trap '' TERM; sleep 60")
    job = cluster.wait_state(job_id, "TIMEOUT", timeout=30)
    assert job["signal"] == 9  # it ignored SIGTERM, so the grace period ended in SIGKILL


def test_job_of_another_user_runs_as_that_user(cluster: Cluster, job_user: tuple[int, int, str]) -> None:
    uid, gid, name = job_user
    body = {"script": "#!/bin/sh\nid -u; id -g; id -un\n", "work_dir": str(cluster.work),
            "environment": {"PATH": "/usr/bin:/bin"}, "name": "whoami"}
    job_id = cluster.api_as(uid, gid, "POST", "/v1/jobs", body)["job_id"]
    job = cluster.wait_state(job_id, "COMPLETED")
    assert (job["user"], job["uid"]) == (name, uid)
    out = cluster.work / f"gpusched-{job_id}.out"
    assert out.read_text().split() == [str(uid), str(gid), name]
    assert out.stat().st_uid == uid
    roots = cluster.submit("--wrap", "sleep 30")
    refused = cluster.api_as(uid, gid, "POST", f"/v1/jobs/{roots}/cancel")
    assert "only your own" in refused["error"]
    assert cluster.job(roots)["state"] in ("PENDING", "RUNNING")
    assert cluster.run("gcancel", str(roots)).returncode == 0  # root may cancel any job


def test_job_without_gpus_sees_none_and_still_has_its_node(cluster: Cluster) -> None:
    job_id = cluster.submit("--partition", "debug", "--wrap", "echo \"[$CUDA_VISIBLE_DEVICES]\"")
    job = cluster.wait_state(job_id, "COMPLETED")
    assert (job["node"], job["gpu_uuids"], job["partition"]) == ("node01", [], "debug")
    assert (cluster.work / f"gpusched-{job_id}.out").read_text() == "[]\n"


def test_launches_are_acknowledged_by_the_agents_next_poll(cluster: Cluster,
                                                           db_url: str) -> None:
    jobs = [cluster.submit("--gpus", "1", "--wrap", HOLD.format(flag="go")) for _ in range(3)]
    for job_id in jobs:
        cluster.wait_state(job_id, "RUNNING")
    # Each launch is done (the job's launched_at set) while the jobs still run, so by an
    # acknowledgement, not by the jobs' ends; none came by a request of its own.
    wait_for(lambda: not open_commands(db_url, "launch"), timeout=20,
             what="the launches acknowledged", seen=cluster.logs)
    launched = query(db_url, "SELECT id FROM jobs WHERE launched_at IS NOT NULL ORDER BY id")
    assert [job_id for (job_id,) in launched] == sorted(jobs)
    routes = {(r["method"], r["route"]) for r in cluster.api("GET", "/v1/diag")["api"]}
    assert ("GET", "/agent/v1/work") in routes
    assert ("POST", "/agent/v1/commands/done") not in routes
    _release(cluster, "go")
    for job_id in jobs:
        assert cluster.wait_state(job_id, "COMPLETED")["exit_code"] == 0
