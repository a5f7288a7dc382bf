"""gcancel on a live cluster: array tasks by id, and jobs chosen by filters."""

from __future__ import annotations

from typing import Any

from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.dbview import open_commands


def tasks_of(cluster: Cluster, array: int) -> dict[int | None, dict[str, Any]]:
    jobs = cluster.api("GET", f"/v1/jobs?all=1&ids={array}")["jobs"]
    return {j["array_task_id"]: j for j in jobs if j["array_job_id"] == array}


def test_array_tasks_by_id(cluster: Cluster) -> None:
    array = cluster.submit("--array", "0-5%1", "--wrap", "sleep 30")
    wait_for(lambda: tasks_of(cluster, array).get(0, {}).get("state") == "RUNNING",
             what="task 0 running")
    done = cluster.run("gcancel", f"{array}_3", f"{array}_[4-5]")
    assert done.returncode == 0, done.stderr
    assert cluster.job(array)["array_tasks"] == "1-2"
    gone = cluster.run("gcancel", f"{array}_9")
    assert gone.returncode == 1
    assert gone.stderr.strip() == (f"gcancel: error: job {array}_9: no task 9 of array job "
                                   f"{array} is pending or running")
    assert cluster.run("gcancel", f"{array}_0").returncode == 0
    assert cluster.wait_state(tasks_of(cluster, array)[0]["job_id"], "CANCELLED")
    wait_for(lambda: tasks_of(cluster, array).get(1, {}).get("state") == "RUNNING",
             what="task 1 started in its place")
    assert cluster.run("gcancel", str(array)).returncode == 0
    wait_for(lambda: all(t["state"] == "CANCELLED" for t in tasks_of(cluster, array).values()),
             what="every task cancelled", seen=lambda: tasks_of(cluster, array))
    started = sorted(k for k in tasks_of(cluster, array) if k is not None)
    assert started == [0, 1]  # 2 was still waiting in the record; 3-5 were cancelled alone
    single = cluster.submit("--wrap", "true", "--hold")
    wrong = cluster.run("gcancel", f"{single}_1")
    assert wrong.returncode == 2 and "is not a job array" in wrong.stderr


def test_filters_choose_the_jobs(cluster: Cluster) -> None:
    keep = cluster.submit("-J", "keep", "--hold", "--wrap", "true")
    drop = cluster.submit("-J", "drop", "--hold", "--wrap", "true")
    other = cluster.submit("-J", "drop", "-p", "debug", "--hold", "--wrap", "true")
    done = cluster.run("gcancel", "-n", "drop", "-p", "gpu")
    assert done.returncode == 0, done.stderr
    states = {j: cluster.job(j)["state"] for j in (keep, drop, other)}
    assert states == {keep: "PENDING", drop: "CANCELLED", other: "PENDING"}
    # Ids and filters: only the ids the filters select.
    assert cluster.run("gcancel", str(keep), str(other), "-n", "keep").returncode == 0
    assert (cluster.job(keep)["state"], cluster.job(other)["state"]) == ("CANCELLED", "PENDING")
    assert cluster.run("gcancel", "--me", "-t", "PD").returncode == 0
    assert cluster.job(other)["state"] == "CANCELLED"


def test_signal_a_running_job_without_ending_it(cluster: Cluster, db_url: str) -> None:
    script = cluster.work / "trap.sh"
    script.write_text("#!/bin/sh\ntrap 'echo got USR1' USR1\necho ready\n"
                      "while true; do sleep 0.05; done\n")
    job = cluster.submit(str(script))
    cluster.wait_state(job, "RUNNING")
    out = cluster.work / f"gpusched-{job}.out"
    wait_for(lambda: out.exists() and "ready" in out.read_text(), what="the trap set")
    sent = cluster.run("gcancel", "--signal", "USR1", str(job))
    assert sent.returncode == 0, sent.stderr
    wait_for(lambda: "got USR1" in out.read_text(), what="the signal delivered")
    assert cluster.job(job)["state"] == "RUNNING"
    wait_for(lambda: open_commands(db_url, "signal") == [], what="the signal acknowledged",
             seen=lambda: open_commands(db_url))
    pending = cluster.submit("--hold", "--wrap", "true")
    refused = cluster.run("gcancel", "-s", "10", str(pending))
    assert refused.returncode == 1
    assert refused.stderr.strip() == f"gcancel: error: job {pending} is not running (PENDING)"
    assert cluster.run("gcancel", str(job), str(pending)).returncode == 0
    assert cluster.wait_state(job, "CANCELLED")


def test_signal_kill_cancels_the_job(cluster: Cluster) -> None:
    # As Slurm's scancel --signal=KILL: the job ends CANCELLED, not FAILED.
    job = cluster.submit("--wrap", "echo ready; while true; do sleep 0.05; done")
    cluster.wait_state(job, "RUNNING")
    out = cluster.work / f"gpusched-{job}.out"
    wait_for(lambda: out.exists() and "ready" in out.read_text(), what="the job running")
    sent = cluster.run("gcancel", "--signal", "KILL", str(job))
    assert sent.returncode == 0, sent.stderr
    ended = cluster.wait_state(job, "CANCELLED", "FAILED", "COMPLETED")
    assert ended["state"] == "CANCELLED", ended
