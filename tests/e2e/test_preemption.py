"""Preemption by QOS on a live cluster: the cheapest victims are requeued and run again."""

from __future__ import annotations

import time

from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.test_admin import admin

ACCOUNTS = """
[[account]]
name = "ops"
[[user]]
name = "root"
accounts = ["ops"]
[[qos]]
name = "normal"
[[qos]]
name = "high"
priority = 100
preempt = ["normal"]
"""


def test_a_high_qos_job_requeues_exactly_the_cheapest_victims(cluster: Cluster) -> None:
    path = cluster.root / "accounts.toml"
    path.write_text(ACCOUNTS)
    assert admin(cluster, str(path)).returncode == 0
    victims = []
    for _ in range(4):  # each starts a little later, so has less work to lose
        job = cluster.submit("-G", "1", "--wrap", 'echo "run $SLURM_RESTART_COUNT"; sleep 60')
        cluster.wait_state(job, "RUNNING")
        victims.append(job)
        time.sleep(0.3)
    high = cluster.submit("-q", "high", "-G", "2", "-t", "1:00", "--wrap", "true")
    done = cluster.wait_state(high, "COMPLETED", timeout=40)
    jobs = {j: cluster.job(j) for j in victims}
    assert [jobs[j]["restarts"] for j in victims] == [0, 0, 1, 1]
    # The two requeued ones kept their submit times and were started again.
    for job_id in victims[2:]:
        again = cluster.wait_state(job_id, "RUNNING")
        assert again["submit_time"] == jobs[job_id]["submit_time"]
        assert datetime_after(again["start_time"], done["start_time"])
        wait_for(lambda j=job_id: (cluster.work / f"gpusched-{j}.out").read_text()
                 == "run 0\nrun 1\n" or None, what="the second run's output")
    for job_id in victims:
        assert cluster.run("gcancel", str(job_id)).returncode == 0
        cluster.wait_state(job_id, "CANCELLED")


def datetime_after(later: str, earlier: str) -> bool:
    from datetime import datetime
    return datetime.fromisoformat(later) > datetime.fromisoformat(earlier)
