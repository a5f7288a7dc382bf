"""Crashes lose nothing: a killed controller or agent comes back to the same truth."""

from __future__ import annotations

import signal

from tests.e2e.cluster import Cluster, wait_for

# Each job appends one line per start to starts.log, so a double start shows up.
JOB = 'echo "$GPUSCHED_JOB_ID" >> starts.log; while [ ! -e release ]; do sleep 0.05; done'


def _starts(cluster: Cluster) -> list[str]:
    log = cluster.work / "starts.log"
    return log.read_text().split() if log.exists() else []


def test_controller_killed_while_jobs_run(cluster: Cluster) -> None:
    running = [cluster.submit("--gpus", "1", "--wrap", JOB) for _ in range(4)]
    waiting = [cluster.submit("--gpus", "1", "--wrap", JOB) for _ in range(2)]
    for job_id in running:
        cluster.wait_state(job_id, "RUNNING")
    wait_for(lambda: len(_starts(cluster)) == 4, what="four jobs started", seen=lambda: _starts(cluster))

    cluster.kill("controller", signal.SIGKILL)
    (cluster.work / "release").touch()  # the jobs end while no controller is there
    cluster.start("controller")
    cluster.wait_controller()

    for job_id in running + waiting:
        cluster.wait_state(job_id, "COMPLETED", timeout=40)
    starts = _starts(cluster)
    assert sorted(starts) == sorted(str(j) for j in running + waiting), starts
    assert len(cluster.jobs()) == 6


def test_agent_killed_and_restarted_readopts_running_jobs(cluster: Cluster) -> None:
    jobs = [cluster.submit("--gpus", "2", "--wrap", JOB) for _ in range(2)]
    for job_id in jobs:
        cluster.wait_state(job_id, "RUNNING")
    wait_for(lambda: len(_starts(cluster)) == 2, what="two jobs started")

    cluster.kill("agent", signal.SIGKILL)
    cluster.start("agent")
    cluster.wait_node_up()
    assert [cluster.job(j)["state"] for j in jobs] == ["RUNNING", "RUNNING"]

    (cluster.work / "release").touch()
    for job_id in jobs:
        assert cluster.wait_state(job_id, "COMPLETED")["exit_code"] == 0
    assert sorted(_starts(cluster)) == sorted(str(j) for j in jobs)


def test_agent_stopped_gracefully_leaves_jobs_running(cluster: Cluster) -> None:
    job_id = cluster.submit("--wrap", JOB)
    cluster.wait_state(job_id, "RUNNING")
    wait_for(lambda: _starts(cluster), what="job started")
    cluster.kill("agent", signal.SIGTERM)
    (cluster.work / "release").touch()
    cluster.start("agent")
    assert cluster.wait_state(job_id, "COMPLETED")["exit_code"] == 0


def test_standby_controller_takes_over_scheduling(db_url: str) -> None:
    # A long poll: a launch reaches the agent before it times out only if the standby's
    # decision travels to the agent's controller as a NOTIFY.
    cluster = Cluster(db_url, poll_wait=50.0).up()
    try:
        standby = cluster.start_standby()
        wait_for(lambda: cluster.try_api("GET", "/v1/ping", socket=standby), what="standby")
        leaders = [cluster.api("GET", "/v1/ping")["leader"],
                   cluster.api("GET", "/v1/ping", socket=standby)["leader"]]
        assert leaders == [True, False]

        cluster.kill("controller", signal.SIGKILL)
        wait_for(lambda: cluster.api("GET", "/v1/ping", socket=standby)["leader"],
                 what="the standby to become leader")
        body = {"script": "#!/bin/sh\ntrue\n", "work_dir": str(cluster.work), "gpus": 1}
        first = cluster.api("POST", "/v1/jobs", body, socket=standby)["job_id"]
        wait_for(lambda: cluster.api("GET", f"/v1/jobs/{first}", socket=standby)["state"]
                 == "RUNNING", what="the standby to schedule")

        cluster.start("controller")  # back, as a non-leader serving the agent
        cluster.wait_controller()
        assert cluster.api("GET", "/v1/ping")["leader"] is False
        cluster.wait_state(first, "COMPLETED")
        second = cluster.api("POST", "/v1/jobs", body, socket=standby)["job_id"]
        cluster.wait_state(second, "COMPLETED", timeout=30)
    finally:
        cluster.close()
