"""gcontrol on a live cluster: show, requeue, and draining nodes and GPUs."""

from __future__ import annotations

import time
from datetime import datetime

from tests.e2e.cluster import Cluster, wait_for


def node_gpus(cluster: Cluster) -> dict[int, dict[str, object]]:
    return {g["index"]: g for g in cluster.api("GET", "/v1/nodes")["nodes"][0]["gpus"]}


def test_show_job_node_partition_and_gpu(cluster: Cluster) -> None:
    job = cluster.submit("-G", "1", "-J", "shown", "--wrap", "sleep 30")
    running = cluster.wait_state(job, "RUNNING")
    shown = cluster.run("gcontrol", "show", "job", str(job))
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert shown.stdout.startswith(f"JobId={job} Name=shown ")
    assert "State=RUNNING" in text and f"GpuUuids={running['gpu_uuids'][0]}" in text
    assert "Script=" not in text and all(len(line) <= 80 for line in text.splitlines())
    node = cluster.run("gcontrol", "show", "node", "node01").stdout
    assert node.startswith("Name=node01 State=UP")
    assert sum(1 for line in node.splitlines() if line.startswith("Gpu=")) == 4
    part = cluster.run("gcontrol", "show", "partition", "gpu").stdout
    assert part.startswith("Name=gpu State=UP Default=True") and "Nodes=node01" in part
    index = next(i for i, g in node_gpus(cluster).items() if g["job_id"] == job)
    gpu = cluster.run("gcontrol", "show", "gpu", f"node01:{index}", "--json")
    assert '"job_id": %d' % job in gpu.stdout
    missing = cluster.run("gcontrol", "show", "node", "nope")
    assert missing.returncode == 1 and "node nope not found" in missing.stderr
    cluster.run("gcancel", str(job))


def test_requeue_puts_a_running_job_back(cluster: Cluster) -> None:
    job = cluster.submit("--wrap", "sleep 30")
    cluster.wait_state(job, "RUNNING")
    done = cluster.run("gcontrol", "requeue", str(job))
    assert done.returncode == 0, done.stderr
    again = wait_for(lambda: (lambda j: j if j["restarts"] == 1 and j["state"] == "RUNNING"
                              else None)(cluster.job(job)), what="the job back and running")
    assert again["submit_time"] == cluster.job(job)["submit_time"]
    pending = cluster.submit("--hold", "--wrap", "true")
    refused = cluster.run("gcontrol", "requeue", str(pending))
    assert refused.returncode == 1 and "only running and ended batch jobs are requeued" in refused.stderr
    cluster.run("gcancel", str(job), str(pending))


def test_drain_and_resume_a_gpu_and_a_node(cluster: Cluster, job_user: tuple[int, int, str]) -> None:
    assert cluster.run("gcontrol", "drain", "gpu", "node01:1").returncode == 2  # no reason
    drained = cluster.run("gcontrol", "drain", "gpu", "node01:1", "--reason", "bad fan")
    assert drained.returncode == 0, drained.stderr
    assert (node_gpus(cluster)[1]["healthy"], node_gpus(cluster)[1]["health_reason"]) == (
        False, "drained: bad fan")
    four = cluster.submit("-G", "4", "--wrap", "true")
    wait_for(lambda: cluster.job(four)["reason"] == "Resources", what="the job short of a GPU")
    assert cluster.run("gcontrol", "resume", "gpu", "node01:1").returncode == 0
    cluster.wait_state(four, "COMPLETED")
    assert cluster.run("gcontrol", "drain", "node", "node01", "--reason", "maintenance").returncode == 0
    blocked = cluster.submit("--wrap", "true")
    cluster.kill("agent")  # a drained node stays drained when its agent registers again
    cluster.start("agent")
    wait_for(lambda: cluster.api("GET", "/v1/nodes")["nodes"][0]["last_seen"], what="agent back")
    time.sleep(1.0)
    node = cluster.api("GET", "/v1/nodes")["nodes"][0]
    assert (node["state"], node["reason"]) == ("DRAIN", "maintenance")
    assert cluster.job(blocked)["state"] == "PENDING"
    assert cluster.run("gcontrol", "resume", "node", "node01").returncode == 0
    cluster.wait_state(blocked, "COMPLETED")
    uid, gid, _ = job_user
    refused = cluster.api_as(uid, gid, "POST", "/v1/gpus/drain",
                             {"node": "node01", "index": 0, "reason": "x"})
    assert "only an administrator" in refused["error"]


def test_update_a_pending_job(cluster: Cluster, job_user: tuple[int, int, str]) -> None:
    job = cluster.submit("--hold", "-t", "2:00:00", "--wrap", "true")
    lowered = cluster.run("gcontrol", "update", "job", str(job), "TimeLimit=30:00")
    assert lowered.returncode == 0, lowered.stderr
    assert cluster.job(job)["time_limit"] == 1800
    moved = cluster.run("gcontrol", "update", "job", str(job), "Partition=debug", "timelimit=1:00:00")
    assert moved.returncode == 0, moved.stderr  # root is an administrator
    assert (cluster.job(job)["partition"], cluster.job(job)["time_limit"]) == ("debug", 3600)
    too_long = cluster.run("gcontrol", "update", "job", str(job), "Partition=gpu", "TimeLimit=2-00:00:00")
    assert too_long.returncode == 2 and "exceeds the MaxTime" in too_long.stderr
    assert cluster.job(job)["partition"] == "debug"  # nothing changed
    bad = cluster.run("gcontrol", "update", "job", str(job), "Colour=5")
    assert bad.returncode == 2 and "Colour=5" in bad.stderr, bad.stderr
    uid, gid, user = job_user
    theirs = cluster.api_as(uid, gid, "POST", "/v1/jobs", {
        "script": "#!/bin/sh\ntrue\n", "work_dir": "/tmp", "hold": True, "time_limit": 600})
    raised = cluster.api_as(uid, gid, "POST", f"/v1/jobs/{theirs['job_id']}/update",
                            {"time_limit": 1200})
    assert "only an administrator may raise a time limit" in raised["error"]
    moved_theirs = cluster.api_as(uid, gid, "POST", f"/v1/jobs/{theirs['job_id']}/update",
                                  {"partition": "debug"})
    assert moved_theirs["partition"] == "debug"  # as scontrol: an owner may move a pending job
    down = cluster.api_as(uid, gid, "POST", f"/v1/jobs/{theirs['job_id']}/update",
                          {"time_limit": 300})
    assert down["time_limit"] == 300
    cluster.run("gcancel", str(job), str(theirs["job_id"]))


def test_priority_and_a_running_jobs_time_limit(cluster: Cluster,
                                                job_user: tuple[int, int, str]) -> None:
    """An admin's Priority= puts a job first among equals; Priority=none gives the
    computed one back. A running job's lowered TimeLimit ends it by its agent."""
    blocker = cluster.submit("-G", "4", "--wrap", "sleep 60")
    cluster.wait_state(blocker, "RUNNING")
    first, second = (cluster.submit("-G", "1", "--wrap", "true") for _ in range(2))

    def order() -> list[int]:
        return [row["job_id"] for row in cluster.api("GET", "/v1/priority")["jobs"]]

    assert order() == [first, second]
    raised = cluster.run("gcontrol", "update", "job", str(second), "Priority=5")
    assert raised.returncode == 0 and "priority 5" in raised.stdout, raised.stderr
    assert order() == [second, first] and cluster.job(second)["admin_priority"] == 5
    assert cluster.api("GET", f"/v1/priority?ids={second}")["jobs"][0]["priority"] == 5
    bad = cluster.run("gcontrol", "update", "job", str(second), "Priority=-1")
    assert bad.returncode == 2 and "invalid Priority='-1'" in bad.stderr
    uid, gid, _ = job_user
    theirs = cluster.api_as(uid, gid, "POST", "/v1/jobs", {
        "script": "#!/bin/sh\ntrue\n", "work_dir": "/tmp", "hold": True})
    denied = cluster.api_as(uid, gid, "POST", f"/v1/jobs/{theirs['job_id']}/update",
                            {"priority": 9})
    assert "only an administrator may set a job's priority" in denied["error"]
    cluster.run("gcontrol", "update", "job", str(second), "Priority=none")
    assert order()[:2] == [first, second] and cluster.job(second)["admin_priority"] is None
    busy = cluster.run("gcontrol", "update", "job", str(blocker), "Partition=debug")
    assert busy.returncode != 0 and "only its time limit and name can change" in busy.stderr
    cut = cluster.run("gcontrol", "update", "job", str(blocker), "TimeLimit=0:03")
    assert cut.returncode == 0, cut.stderr
    ended = cluster.wait_state(blocker, "TIMEOUT", timeout=20)
    ran = (datetime.fromisoformat(ended["end_time"])
           - datetime.fromisoformat(ended["start_time"])).total_seconds()
    assert 3.0 <= ran < 15 and ended["time_limit"] == 3
    cluster.run("gcancel", str(first), str(second), str(theirs["job_id"]))
