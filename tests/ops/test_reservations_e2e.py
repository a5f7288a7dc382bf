"""Advance reservations end to end on a real local cluster (controller, agent,
PostgreSQL; one node of four GPUs): a reservation keeps what it holds free of other jobs
(reason ReqNodeNotAvail) while its own users' jobs (--reservation, from the command line,
a directive or galloc) run in it; a MAINT reservation drains the node around it (a job that
would run into it waits, one that ends before it runs) and --explain says why; the
gcontrol and ginfo -T views; refusals are one line and store nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.e2e.cluster import Cluster, wait_for
from tests.pg import ScratchPostgres


@pytest.fixture(scope="module")
def cluster(postgres: ScratchPostgres) -> Iterator[Cluster]:
    c = Cluster(postgres.fresh_database(), gpus=4)
    try:
        yield c.up()
    finally:
        c.close()


def ok(cluster: Cluster, *args: str) -> str:
    result = cluster.run(*args)
    assert result.returncode == 0, result
    return result.stdout


def refused(cluster: Cluster, words: str, *args: str) -> None:
    result = cluster.run(*args)
    assert result.returncode != 0, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], result.stderr


def wait_reason(cluster: Cluster, job_id: int, reason: str) -> None:
    wait_for(lambda: cluster.job(job_id)["reason"] == reason, what=f"reason {reason}",
             seen=lambda: cluster.job(job_id))


def test_a_reservation_keeps_what_it_holds_for_its_users(cluster: Cluster) -> None:
    assert ok(cluster, "ginfo", "-T") == "No reservations in the system\n"
    assert "Reservation created: team" in ok(
        cluster, "gcontrol", "create", "reservation", "ReservationName=team", "StartTime=now",
        "Duration=1:00:00", f"Nodes={cluster.node}", "TRES=gres/gpu=2", "Users=nobody")
    shown = ok(cluster, "gcontrol", "show", "reservation", "team")
    assert "ReservationName=team" in shown and "TRES=gres/gpu=2" in shown
    assert "Users=nobody" in shown and "State=ACTIVE" in shown
    table = ok(cluster, "ginfo", "-T").splitlines()
    assert table[0].split() == ["RESV_NAME", "STATE", "START_TIME", "END_TIME", "DURATION",
                                "NODELIST"]
    assert table[1].split()[:2] == ["team", "ACTIVE"] and table[1].endswith(cluster.node)
    assert "Reservation=team" in ok(cluster, "gcontrol", "show", "node", cluster.node)
    before = len(cluster.jobs())
    refused(cluster, "access denied", "gsubmit", "--reservation=team", "--wrap", "true")
    refused(cluster, "no such reservation", "gsubmit", "--reservation=nope", "--wrap", "true")
    refused(cluster, "exists already", "gcontrol", "create", "reservation",
            "ReservationName=team", "StartTime=now", "Duration=10", "Nodes=ALL", "Users=root")
    refused(cluster, "unknown reservation flag", "gcontrol", "create", "ReservationName=x",
            "Duration=10", "Nodes=ALL", "Users=root", "Flags=SOON")
    assert len(cluster.jobs()) == before
    # Outside it: four GPUs wait (two are held), two run beside it.
    big = cluster.submit("--gpus=4", "--time=5:00", "--wrap", "sleep 60")
    wait_reason(cluster, big, "ReqNodeNotAvail")
    small = cluster.submit("--gpus=2", "--time=1:00", "--wrap", "true")
    cluster.wait_state(small, "COMPLETED")
    # Its users run in it: the command line and a directive.
    ok(cluster, "gcontrol", "update", "ReservationName=team", "Users+=root")
    assert "Users=nobody,root" in ok(cluster, "gcontrol", "show", "reservation", "team")
    inside = cluster.submit("--reservation=team", "--gpus=2", "--time=1:00", "--wrap", "true")
    script = cluster.work / "in-team.sh"
    script.write_text("#!/bin/sh\n#SBATCH --reservation=team\n#SBATCH --gpus=1\n"
                      "#SBATCH --time=1:00\ntrue\n")
    directive = cluster.submit(str(script))
    for job_id in (inside, directive):
        assert cluster.wait_state(job_id, "COMPLETED")["reservation"] == "team"
    # galloc takes it too (salloc's --reservation): an allocation in the reservation.
    held = cluster.run("galloc", "--reservation=team", "-G", "2", "-t", "1:00", "-J",
                       "in-team", "sh", "-c", "echo $SLURM_JOB_ID")
    assert held.returncode == 0, held.stderr
    assert cluster.job(int(held.stdout.split()[-1]))["reservation"] == "team"
    # A job of its own longer than what is left of it runs with its limit cut to the
    # reservation's end (whole minutes), as Slurm ends it there.
    too_long = cluster.submit("--reservation=team", "--gpus=1", "--time=2:00:00", "--wrap",
                              "sleep 60")
    running = cluster.wait_state(too_long, "RUNNING")
    assert 0 < running["time_limit"] <= 3600 and running["time_limit"] % 60 == 0, running
    refused(cluster, "in use by 1", "gcontrol", "delete", "reservation", "team")
    ok(cluster, "gcancel", str(too_long))
    cluster.wait_state(too_long, "CANCELLED")
    assert "Reservation deleted: team" in ok(cluster, "gcontrol", "delete",
                                             "ReservationName=team")
    cluster.wait_state(big, "RUNNING")  # the GPUs are free for everyone again
    assert cluster.api("GET", "/v1/nodes")["nodes"][0]["reservation"] is None
    ok(cluster, "gcancel", str(big))
    cluster.wait_state(big, "CANCELLED")


def test_a_maint_reservation_drains_the_node_around_it(cluster: Cluster) -> None:
    ok(cluster, "gcontrol", "create", "reservation", "ReservationName=maint",
       "StartTime=now+2minutes", "Duration=30:00", "Nodes=ALL", "Users=root",
       "Flags=MAINT,IGNORE_JOBS")
    found = json.loads(ok(cluster, "gcontrol", "show", "reservation", "--json"))
    assert [(r["name"], r["flags"], r["state"]) for r in found] == [
        ("maint", ["IGNORE_JOBS", "MAINT"], "INACTIVE")]
    long = cluster.submit("--gpus=1", "--time=10:00", "--wrap", "sleep 60")
    wait_reason(cluster, long, "ReqNodeNotAvail")
    why = ok(cluster, "gqueue", "--explain", str(long))
    assert "reservation maint (maintenance)" in why and cluster.node in why, why
    short = cluster.submit("--gpus=1", "--time=0:30", "--wrap", "true")
    cluster.wait_state(short, "COMPLETED")  # it ends before the maintenance begins
    assert cluster.job(long)["state"] == "PENDING"
    ok(cluster, "gcontrol", "delete", "reservation", "maint")
    cluster.wait_state(long, "RUNNING")
    ok(cluster, "gcancel", str(long))
    cluster.wait_state(long, "CANCELLED")


def test_gcontrol_update_moves_a_pending_job_into_a_reservation(cluster: Cluster) -> None:
    """scontrol update job ReservationName=: a reservation its user may use, checked as
    at submit (a refusal changes nothing); empty: out of it again."""
    ok(cluster, "gcontrol", "create", "reservation", "ReservationName=upd", "StartTime=now",
       "Duration=30:00", f"Nodes={cluster.node}", "TRES=gres/gpu=1", "Users=root")
    job = cluster.submit("--hold", "--gpus=1", "--time=1:00", "--wrap", "true")
    ok(cluster, "gcontrol", "update", "job", str(job), "ReservationName=upd")
    assert cluster.job(job)["reservation"] == "upd"
    refused(cluster, "no such reservation", "gcontrol", "update", f"JobId={job}",
            "ReservationName=nothere")
    assert cluster.job(job)["reservation"] == "upd"
    ok(cluster, "gcontrol", "update", "job", str(job), "ReservationName=")
    assert cluster.job(job)["reservation"] is None
    ok(cluster, "gcontrol", "update", "job", str(job), "ReservationName=upd")
    ok(cluster, "gcontrol", "release", str(job))
    assert cluster.wait_state(job, "COMPLETED")["reservation"] == "upd"
    ok(cluster, "gcontrol", "delete", "reservation", "upd")
