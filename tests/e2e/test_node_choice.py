"""gsubmit --nodelist/-w, --exclude/-x and a list of partitions, on a live cluster."""

from __future__ import annotations

import time
from datetime import datetime

from tests.e2e.cluster import Cluster


def refused(cluster: Cluster, *args: str) -> str:
    """Submit ``args``; it must fail with exit 2 and store nothing. Returns the error."""
    before = len(cluster.jobs())
    result = cluster.run("gsubmit", *args, "--wrap", "true")
    assert result.returncode == 2, result
    assert len(cluster.jobs()) == before
    return result.stderr


def test_named_and_excluded_nodes(cluster: Cluster) -> None:
    script = cluster.work / "pinned.sh"
    script.write_text("#!/bin/sh\n#SBATCH -w node01\n#SBATCH --gpus=1\necho $CUDA_VISIBLE_DEVICES\n")
    job = cluster.submit(str(script))
    ended = cluster.wait_state(job, "COMPLETED")
    assert ended["node"] == "node01" and ended["nodelist"] == ["node01"] and ended["nodes"] == 1
    assert "invalid node name specified: node99" in refused(cluster, "-w", "node[01,99]")
    assert "excludes every node of partition gpu" in refused(cluster, "-x", "node01")
    assert "both named (nodelist) and excluded" in refused(cluster, "-w", "node01", "-x", "node01")
    assert "--nodes asks for 2" in refused(cluster, "-w", "node01", "-N", "2")


def test_first_partition_of_a_list_that_takes_the_job(cluster: Cluster) -> None:
    job = cluster.submit("-p", "debug,gpu", "--hold", "--wrap", "true")
    assert cluster.job(job)["partition"] == "debug"
    # A list naming a partition that does not exist is refused, as sbatch refuses it.
    assert "invalid partition specified: nope" in refused(cluster, "-p", "gpu,nope")
    job = cluster.submit("-p", "gpu,debug", "-t", "2-00:00:00", "--hold", "--wrap", "true")
    assert cluster.job(job)["partition"] == "debug"  # over gpu's MaxTime of one day
    assert refused(cluster, "-p", "nope,gone").strip() == (
        "gsubmit: error: invalid partition specified: nope")


def test_signal_before_the_time_limit(cluster: Cluster) -> None:
    """--signal=B:USR1@4 with a 6 s limit: the batch script alone hears USR1 about 2 s
    in and ends cleanly; without B: the whole job hears it."""
    script = cluster.work / "warned.sh"
    script.write_text("#!/bin/sh\n#SBATCH --signal=B:USR1@4\n#SBATCH -t 0:06\n"
                      "trap 'echo warned' USR1\nsleep 30 &\nwait\n"
                      "kill -0 $! && echo sleep alive\nkill $!\n")
    job = cluster.submit(str(script))
    ended = cluster.wait_state(job, "COMPLETED", "TIMEOUT", timeout=30)
    assert ended["state"] == "COMPLETED"
    assert ended["warn_signal"] == {"signal": 10, "seconds": 4, "batch_only": True}
    assert (cluster.work / f"gpusched-{job}.out").read_text() == "warned\nsleep alive\n"
    ran = (datetime.fromisoformat(ended["end_time"])
           - datetime.fromisoformat(ended["start_time"])).total_seconds()
    assert 1.0 <= ran < 5.0
    whole = cluster.work / "group.sh"
    # The second wait returns at once only if the sleep heard USR2 too.
    whole.write_text("#!/bin/sh\ntrap 'echo shell' USR2\nsleep 30 &\nwait\nwait\necho done\n")
    job = cluster.submit("-t", "0:05", "--signal", "USR2@3", str(whole))
    ended = cluster.wait_state(job, "COMPLETED", "TIMEOUT", timeout=30)
    assert ended["state"] == "COMPLETED"
    assert (cluster.work / f"gpusched-{job}.out").read_text() == "shell\ndone\n"


def test_exclusive_takes_the_whole_node(cluster: Cluster) -> None:
    """--exclusive -G 1 gets all 4 GPUs of node01, and nothing else runs beside it, not
    even a job without GPUs; both start once it ends."""
    whole = cluster.submit("--exclusive", "-G", "1", "--wrap", "echo $CUDA_VISIBLE_DEVICES; sleep 3")
    running = cluster.wait_state(whole, "RUNNING")
    assert running["exclusive"] is True and len(running["gpu_uuids"]) == 4
    gpu_job = cluster.submit("-G", "1", "--wrap", "true")
    cpu_job = cluster.submit("--wrap", "true")
    time.sleep(1.0)  # a few passes
    assert [cluster.job(j)["state"] for j in (gpu_job, cpu_job)] == ["PENDING", "PENDING"]
    assert cluster.job(whole)["state"] == "RUNNING"
    ended = cluster.wait_state(whole, "COMPLETED")
    assert (cluster.work / f"gpusched-{whole}.out").read_text().strip() == ",".join(
        ended["gpu_uuids"])
    for j in (gpu_job, cpu_job):
        started = datetime.fromisoformat(cluster.wait_state(j, "COMPLETED")["start_time"])
        assert started >= datetime.fromisoformat(ended["end_time"])
    busy = cluster.submit("-G", "1", "--wrap", "sleep 3")
    cluster.wait_state(busy, "RUNNING")
    waiting = cluster.submit("--exclusive", "--wrap", "true")
    time.sleep(1.0)
    assert cluster.job(waiting)["state"] == "PENDING"  # node01 is not idle
    done = cluster.wait_state(waiting, "COMPLETED")
    assert len(done["gpu_uuids"]) == 4  # asked for none: holds them all, as Slurm's does
    started = done["start_time"]
    assert datetime.fromisoformat(started) >= datetime.fromisoformat(
        cluster.wait_state(busy, "COMPLETED")["end_time"])
