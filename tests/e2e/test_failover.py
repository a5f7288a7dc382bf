"""Two controllers on one database: a frozen leader is replaced by the standby, which
opens the next epoch; when the old leader wakes up it applies nothing, and no job
starts twice. Asserted on the database."""

from __future__ import annotations

import signal

from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.dbview import launches, leader, query
from tests.e2e.failover import one_round
from tests.pg import ScratchPostgres

JOB = 'echo "$SLURM_JOB_ID $SLURM_RESTART_COUNT" >> starts.log'


def _starts(cluster: Cluster) -> list[str]:
    log = cluster.work / "starts.log"
    return log.read_text().split("\n")[:-1] if log.exists() else []


def test_a_frozen_leader_is_replaced_and_applies_nothing_when_it_wakes(db_url: str) -> None:
    cluster = Cluster(db_url, gpus=4, poll_wait=2.0).up()
    try:
        standby = cluster.start_standby()
        wait_for(lambda: cluster.try_api("GET", "/v1/ping", socket=standby), what="standby")
        first = cluster.procs["controller"]
        epoch, holder = leader(db_url)
        assert holder is not None and holder.endswith(f":{first.pid}")
        before = [cluster.submit("--wrap", JOB) for _ in range(3)]
        for job in before:
            cluster.wait_state(job, "COMPLETED")

        first.send_signal(signal.SIGSTOP)  # the leader stops, its connections stay open
        try:
            wait_for(lambda: leader(db_url)[0] == epoch + 1, timeout=30,
                     what="the standby's epoch", seen=lambda: leader(db_url))
            assert leader(db_url)[1].endswith(f":{cluster.procs['standby'].pid}")  # type: ignore[union-attr]
            body = {"script": f"#!/bin/sh\n{JOB}\n", "work_dir": str(cluster.work)}
            during = [cluster.api("POST", "/v1/jobs", body, socket=standby)["job_id"]
                      for _ in range(3)]
            wait_for(lambda: all(cluster.api("GET", f"/v1/jobs/{j}", socket=standby)["state"]
                                 == "RUNNING" for j in during), what="the standby to start them")
        finally:
            first.send_signal(signal.SIGCONT)
        # The old leader wakes up: its next look at the database shows the term is over.
        wait_for(lambda: cluster.try_api("GET", "/v1/ping") and
                 cluster.api("GET", "/v1/ping")["leader"] is False, what="the old leader to step down")
        after = [cluster.submit("--wrap", JOB) for _ in range(3)]  # through the old leader
        for job in before + during + after:
            cluster.wait_state(job, "COMPLETED", timeout=30)

        assert leader(db_url)[0] == epoch + 1  # nobody took it back
        started = launches(db_url)
        assert sorted(job for job, *_ in started) == sorted(before + during + after)
        assert {job: e for job, _, _, e, _ in started if job in during + after} == {
            job: epoch + 1 for job in during + after}  # all applied by the standby
        assert query(db_url, "SELECT count(*) FROM node_commands WHERE epoch = :e AND "
                     "created_at >= (SELECT since FROM leader)", e=epoch) == [(0,)]
        assert sorted(_starts(cluster)) == sorted(f"{j} 0" for j in before + during + after)
        assert "stepping down" in (cluster.root / "controller.log").read_text()
    finally:
        cluster.close()


def test_a_leader_killed_during_a_stream_of_submissions_loses_nothing(
        postgres: ScratchPostgres) -> None:
    """kill -9 of the leader while a client submits ten jobs a second, turning to the
    standby when the leader stops answering: every acknowledged submission is stored
    and runs exactly once, and the standby starts jobs within 10 s."""
    result = one_round(postgres, "kill9", rate=10.0)
    assert result["acknowledged"] >= 20, result
    assert result["lost"] == 0, result
    assert result["twice"] == 0, result
    assert result["not_run"] == 0, result
    assert result["failover"] < 10.0, result
