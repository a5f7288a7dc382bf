"""A job whose node's state disk has room for the job directory's reserve but not for
its script waits on that node (its launch tried again at every round, its half-made
directory gone each time) and runs there once the disk has room again, instead of being
taken for launched already and left RUNNING. Found by the chaos soak (bench/chaos.py
--faults disk_full --seed 20)."""

from __future__ import annotations

import time
from collections.abc import Callable

from gpusched.agent.jobfiles import RESERVE_BYTES
from tests.chaos.cluster import ChaosCluster
from tests.chaos.workload import JobPlan, script


def _wait(check: Callable[[], object], timeout: float, what: str,
          cluster: ChaosCluster) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}\n"
                                 f"{cluster.logs()}")
        time.sleep(0.1)


def test_a_job_the_full_disk_could_not_prepare_runs_there_once_the_disk_has_room() -> None:
    cluster = ChaosCluster(nodes=2, state_disk_mb=8)
    try:
        cluster.start()
        cluster.fill_disk("node1", leave=RESERVE_BYTES)  # the reserve fits, the script not
        plan = JobPlan(0, "plain", {"name": "full-disk", "work_dir": str(cluster.work),
                                    "output": "/dev/null", "gpus": 1, "nodelist": ["node1"]},
                       run_s=0.2, exit_code=0)
        job_id = cluster.api("POST", "/v1/jobs", {**plan.body,
                                                   "script": script(cluster.records, plan)})[
            "job_id"]

        def job() -> dict[str, object]:
            return cluster.api("GET", f"/v1/jobs/{job_id}")

        def refused() -> int:
            log = (cluster.root / "agent-node1.log").read_text()
            return log.count(f"job {job_id}: launch failed: OSError(28")

        _wait(lambda: refused() >= 2, 30, "the launch to wait for room", cluster)
        assert not list(cluster.records.iterdir())  # nothing of it ran
        assert int(job()["restarts"]) == 0  # it waits on the node, not in the queue
        cluster.free_disk("node1")
        _wait(lambda: job()["state"] == "COMPLETED", 30, "the job to run", cluster)
        runs = sorted(cluster.records.iterdir())
        assert len(runs) == 1 and runs[0].read_text().split()[:2] == ["start", "node1"]
        assert int(job()["restarts"]) == 0
    finally:
        cluster.close()
