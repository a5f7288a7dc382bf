"""Holds and begin times through the real CLIs."""

from __future__ import annotations

from tests.e2e.cluster import Cluster, wait_for


def _reason(cluster: Cluster, job_id: int, reason: str) -> None:
    wait_for(lambda: cluster.job(job_id)["reason"] == reason, what=reason,
             seen=lambda: cluster.job(job_id))


def test_user_hold_and_release(cluster: Cluster) -> None:
    held = cluster.submit("--hold", "--wrap", "true")
    after = cluster.submit("--wrap", "true")
    _reason(cluster, held, "JobHeldUser")
    cluster.wait_state(after, "COMPLETED")  # a held job blocks nobody
    assert cluster.job(held)["state"] == "PENDING" and cluster.job(held)["hold"] == "user"
    result = cluster.run("gcontrol", "release", str(held))
    assert result.returncode == 0, result.stderr
    cluster.wait_state(held, "COMPLETED")
    again = cluster.run("gcontrol", "hold", str(held))
    assert again.returncode == 1 and "only pending jobs" in again.stderr


def test_admin_hold_needs_an_admin_to_release(cluster: Cluster, job_user: tuple[int, int, str]) -> None:
    uid, gid, _ = job_user
    body = {"script": "#!/bin/sh\ntrue\n", "work_dir": str(cluster.work), "hold": True}
    job_id = cluster.api_as(uid, gid, "POST", "/v1/jobs", body)["job_id"]
    _reason(cluster, job_id, "JobHeldUser")
    assert cluster.run("gcontrol", "hold", str(job_id)).returncode == 0  # root: admin hold
    _reason(cluster, job_id, "JobHeldAdmin")
    refused = cluster.api_as(uid, gid, "POST", f"/v1/jobs/{job_id}/release")
    assert "held by an administrator" in refused["error"]
    assert cluster.run("gcontrol", "release", str(job_id)).returncode == 0
    cluster.wait_state(job_id, "COMPLETED")


def test_begin_time_waits_then_runs(cluster: Cluster) -> None:
    later = cluster.submit("--begin", "now+2", "--wrap", "true")
    _reason(cluster, later, "BeginTime")
    job = cluster.wait_state(later, "COMPLETED", timeout=30)
    assert job["start_time"] >= job["begin_time"]
    bad = cluster.run("gsubmit", "--begin", "whenever", "--wrap", "true")
    assert bad.returncode == 2 and "--begin" in bad.stderr
    assert cluster.run("gcontrol", "hold", "abc").returncode == 2


def test_dependencies_chain_and_a_failed_parent(cluster: Cluster) -> None:
    parent = cluster.submit("--wrap", "while [ ! -e go ]; do sleep 0.05; done; exit 1")
    child_ok = cluster.submit("--dependency", f"afterok:{parent}", "--wrap", "true")
    child_any = cluster.submit("-d", f"afterany:{parent}", "--wrap", "true")
    child_not = cluster.submit(f"--dependency=afternotok:{parent}", "--wrap", "true")
    for job_id in (child_ok, child_any, child_not):
        _reason(cluster, job_id, "Dependency")
    (cluster.work / "go").touch()
    assert cluster.wait_state(parent, "FAILED")["exit_code"] == 1
    cluster.wait_state(child_any, "COMPLETED")
    cluster.wait_state(child_not, "COMPLETED")
    _reason(cluster, child_ok, "DependencyNeverSatisfied")
    assert cluster.job(child_ok)["dependency"] == f"afterok:{parent}"
    bad = cluster.run("gsubmit", "-d", "afterok:99999", "--wrap", "true")
    assert bad.returncode == 2 and "job 99999 does not exist" in bad.stderr
    bad = cluster.run("gsubmit", "-d", "whenever:1", "--wrap", "true")
    assert bad.returncode == 2 and "invalid dependency" in bad.stderr
