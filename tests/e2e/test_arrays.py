"""Job arrays through the real CLIs, controller and agent."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tests.e2e.cluster import Cluster, wait_for

SCRIPT = """#!/bin/sh
#SBATCH --array=0-5%2
#SBATCH -G 1 -o sweep_%A_%a.out
echo "$SLURM_ARRAY_JOB_ID $GPUSCHED_ARRAY_TASK_ID $SLURM_ARRAY_TASK_COUNT $CUDA_VISIBLE_DEVICES"
sleep 0.4
"""


def _tasks(cluster: Cluster, array: int) -> list[dict[str, Any]]:
    return [j for j in cluster.jobs() if j["array_job_id"] == array]


def _most_at_once(tasks: list[dict[str, Any]]) -> int:
    """The largest number of tasks whose [start, end] intervals overlap."""
    edges = sorted((datetime.fromisoformat(t[key]), step)
                   for t in tasks for key, step in (("start_time", 1), ("end_time", -1)))
    most = now = 0
    for _, step in edges:  # at equal times, ends (-1) sort before starts
        now += step
        most = max(most, now)
    return most


def test_an_array_with_a_cap_of_two_never_runs_more_than_two(cluster: Cluster) -> None:
    (cluster.work / "sweep.sh").write_text(SCRIPT)
    array = cluster.submit("sweep.sh")
    # Until the first pass the record waits with no reason yet: wait for the pass's.
    folded = wait_for(lambda: (lambda out: out if f"{array}_[" in out and "JobArrayTaskLimit"
                               in out else None)(cluster.run("gqueue").stdout),
                      what="a folded pending line held by the cap")
    assert "%2]" in folded
    done = wait_for(lambda: (lambda ts: ts if len(ts) == 6 and all(
        t["state"] == "COMPLETED" for t in ts) else None)(_tasks(cluster, array)),
        timeout=40, what="six completed tasks", seen=lambda: _tasks(cluster, array))
    assert sorted(t["array_task_id"] for t in done) == [0, 1, 2, 3, 4, 5]
    assert _most_at_once(done) == 2  # the cap, and the cluster had 4 GPUs for more
    for task in done:
        out = (cluster.work / f"sweep_{array}_{task['array_task_id']}.out").read_text().split()
        assert out[:3] == [str(array), str(task["array_task_id"]), "6"]
        assert out[3] == task["gpu_uuids"][0]


def test_cancelling_an_array_cancels_its_running_and_pending_tasks(cluster: Cluster) -> None:
    array = cluster.submit("--array", "0-9%3", "--wrap", "sleep 30")
    wait_for(lambda: sum(t["state"] == "RUNNING" for t in _tasks(cluster, array)) == 3,
             what="three running tasks", seen=lambda: _tasks(cluster, array))
    result = cluster.run("gcancel", str(array))
    assert result.returncode == 0, result.stderr
    ended = wait_for(lambda: (lambda ts: ts if all(t["state"] == "CANCELLED" for t in ts)
                              else None)(_tasks(cluster, array)),
                     what="every task cancelled", seen=lambda: _tasks(cluster, array))
    assert len(ended) == 4  # three started tasks and the record of the seven never started
    bad = cluster.run("gsubmit", "--array", "9-0", "--wrap", "true")
    assert bad.returncode == 2 and "--array: invalid array '9-0'" in bad.stderr
