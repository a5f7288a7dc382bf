"""Backfill on a live cluster: a short job runs ahead without delaying a reserved one."""

from __future__ import annotations

from datetime import datetime, timedelta

from tests.e2e.cluster import Cluster, wait_for


def test_a_short_job_backfills_and_a_long_one_waits_for_the_reservation(cluster: Cluster) -> None:
    big = cluster.submit("-G", "3", "-t", "1:00", "--wrap", "sleep 60")
    running = cluster.wait_state(big, "RUNNING")
    head = cluster.submit("-G", "4", "-t", "1:00", "--wrap", "true")
    long = cluster.submit("-G", "1", "-t", "5:00", "--wrap", "true")
    short = cluster.submit("-G", "1", "-t", "0:30", "--wrap", "true")
    done = cluster.wait_state(short, "COMPLETED")
    assert done["start_kind"] == "backfilled"
    reserved = wait_for(lambda: (lambda j: j if j["expected_start"] else None)(cluster.job(head)),
                        what="a reservation for the head job")
    expected = datetime.fromisoformat(reserved["expected_start"])
    big_end = datetime.fromisoformat(running["start_time"]) + timedelta(seconds=60)
    assert abs((expected - big_end).total_seconds()) < 1.0
    assert reserved["reason"] == "Resources"
    waiting = cluster.job(long)
    assert (waiting["state"], waiting["reason"]) == ("PENDING", "Priority")
    # 5 minutes would overlap the head job's reservation: expected once that one ends.
    after_head = datetime.fromisoformat(waiting["expected_start"])
    assert abs((after_head - expected).total_seconds() - 60) < 1.0
    table = cluster.run("gqueue", "--start").stdout.splitlines()
    assert table[0].split() == ["JOBID", "PARTITION", "NAME", "USER", "ST", "START_TIME",
                                "NODES", "NODELIST(REASON)"]
    rows = {line.split()[0]: line.split() for line in table[1:]}
    assert set(rows) == {str(head), str(long)}
    assert rows[str(head)][5] == expected.astimezone().strftime("%Y-%m-%dT%H:%M:%S")
    assert rows[str(long)][5] == after_head.astimezone().strftime("%Y-%m-%dT%H:%M:%S")
    assert cluster.run("gcancel", str(big)).returncode == 0
    assert cluster.wait_state(head, "COMPLETED")["start_kind"] == "immediate"
    cluster.wait_state(long, "COMPLETED")


def test_typed_and_oversized_requests(cluster: Cluster) -> None:
    typed = cluster.run("gsubmit", "--gpus", "a100:1", "--wrap", "true")
    assert typed.returncode == 2 and "no node in partition gpu has that" in typed.stderr
    job = cluster.submit("--gres", "gpu:gpu:2", "--cpus-per-gpu", "0", "--wrap",
                         "echo $CUDA_VISIBLE_DEVICES")
    ended = cluster.wait_state(job, "COMPLETED")
    assert ended["gpu_types"] == ["gpu"] and len(ended["gpu_uuids"]) == 2
    two_nodes = cluster.run("gsubmit", "-N", "2", "--gpus-per-node", "1", "--wrap", "true")
    assert two_nodes.returncode == 2 and "has only 1 such node(s)" in two_nodes.stderr
