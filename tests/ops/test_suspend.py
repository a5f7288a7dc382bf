"""gcontrol suspend and resume end to end (controller, agent, PostgreSQL, a real job):
a suspended job's processes stop (its output stops growing), gqueue and gcontrol show it
SUSPENDED (S), its GPUs stay held, its time limit does not run while it is suspended,
and it goes on after resume until its limit plus the time suspended; a suspended job
can be cancelled; bad requests are one line each and change nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.e2e.cluster import BIN, Cluster, wait_for
from tests.pg import ScratchPostgres

TICKER = "#!/bin/sh\nwhile true; do echo tick >> {path}; sleep 0.05; done\n"


@pytest.fixture(scope="module")
def cluster(postgres: ScratchPostgres) -> Iterator[Cluster]:
    c = Cluster(postgres.fresh_database(), gpus=2)
    try:
        yield c.up()
    finally:
        c.close()


def _ticks(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except FileNotFoundError:
        return 0


def _ticker(cluster: Cluster, name: str, *args: str, step: bool = False) -> tuple[int, Path]:
    path = cluster.work / f"{name}.ticks"
    script = cluster.work / f"{name}.sh"
    text = TICKER.format(path=path)
    if step:
        script.with_suffix(".loop").write_text(text)
        text = f"#!/bin/sh\n{BIN}/gsrun sh {script.with_suffix('.loop')}\n"
    script.write_text(text)
    job_id = cluster.submit("--gpus=1", *args, str(script))
    wait_for(lambda: _ticks(path) >= 3, what=f"{name} ticking", seen=cluster.logs)
    return job_id, path


def _still(path: Path, seconds: float) -> bool:
    """Whether the file stays the same for ``seconds`` (the job is stopped)."""
    before = _ticks(path)
    time.sleep(seconds)
    return _ticks(path) == before


def test_suspend_stops_the_job_and_its_clock(cluster: Cluster) -> None:
    job_id, ticks = _ticker(cluster, "clock", "--time=0:04")  # four seconds
    began = time.monotonic()
    done = cluster.run("gcontrol", "suspend", str(job_id))
    assert done.returncode == 0 and done.stderr == "", done
    wait_for(lambda: cluster.job(job_id)["state"] == "SUSPENDED", what="SUSPENDED")
    # The agent stops it: once nothing more is written, nothing is for a while.
    wait_for(lambda: _still(ticks, 0.3), what="the job stopped", seen=cluster.logs)
    queue = cluster.run("gqueue", "-j", str(job_id), "-h", "-o", "%i %t %T")
    assert queue.stdout.split() == [str(job_id), "S", "SUSPENDED"], (queue, cluster.job(job_id),
                                                                      cluster.logs())
    only = cluster.run("gqueue", "-t", "S", "-h", "-o", "%i")  # gqueue -t R leaves it out
    assert only.stdout.split() == [str(job_id)], only
    running = cluster.run("gqueue", "-t", "R", "-h", "-o", "%i")
    assert str(job_id) not in running.stdout.split(), running
    shown = cluster.run("gcontrol", "show", "job", str(job_id))
    assert "State=SUSPENDED" in shown.stdout.split(), shown.stdout
    assert cluster.job(job_id)["gpu_uuids"], "a suspended job keeps its GPUs"
    twice = cluster.run("gcontrol", "suspend", str(job_id))
    assert twice.returncode == 1 and "already suspended" in twice.stderr, twice
    # Past its four-second limit while suspended: still there, still stopped.
    while time.monotonic() - began < 5.0:
        time.sleep(0.1)
    assert cluster.job(job_id)["state"] == "SUSPENDED" and _still(ticks, 0.2)
    suspended = time.monotonic()
    resumed = cluster.run("gcontrol", "resume", str(job_id))
    assert resumed.returncode == 0, resumed
    wait_for(lambda: not _still(ticks, 0.2), what="ticking again", seen=cluster.logs)
    job = cluster.wait_state(job_id, "TIMEOUT", timeout=20)
    # It ran its four seconds: about one before, three after the time suspended.
    assert time.monotonic() - suspended >= 2.0
    ran = (datetime.fromisoformat(job["end_time"])
           - datetime.fromisoformat(job["start_time"])).total_seconds()
    assert ran >= 4.0 + job["suspended_seconds"] - 1.0 and job["suspended_seconds"] >= 3


def test_a_suspended_job_can_be_cancelled_and_bad_requests_change_nothing(
        cluster: Cluster) -> None:
    # The ticking runs in a step (gsrun): its tasks, apart from the batch script, stop too.
    job_id, ticks = _ticker(cluster, "cancel", step=True)
    for args, code, words in ((("resume", str(job_id)), 1, "not suspended"),
                              (("suspend", "0"), 2, "invalid job id"),
                              (("suspend", f"{job_id}_x"), 2, "invalid job id"),
                              (("suspend", "999999"), 1, "999999")):
        refused = cluster.run("gcontrol", *args)
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == code and len(lines) == 1 and words in lines[0], refused
    assert cluster.job(job_id)["state"] == "RUNNING"
    steps = cluster.api("GET", f"/v1/jobs/{job_id}/steps")["steps"]
    assert [s["state"] for s in steps] == ["RUNNING"], steps
    assert cluster.run("gcontrol", "suspend", str(job_id)).returncode == 0
    wait_for(lambda: _still(ticks, 0.3), what="the job stopped", seen=cluster.logs)
    # Both its parts here: the batch script and the step.
    assert f"job {job_id}: suspended (2 part(s) here)" in cluster.logs()
    assert cluster.run("gcancel", str(job_id)).returncode == 0
    job = cluster.wait_state(job_id, "CANCELLED", timeout=15)
    assert job["suspended_at"] is not None  # it ended while suspended


def test_a_suspended_job_requeued_runs_again_not_suspended(cluster: Cluster) -> None:
    job_id, ticks = _ticker(cluster, "requeue")
    assert cluster.run("gcontrol", "suspend", str(job_id)).returncode == 0
    wait_for(lambda: _still(ticks, 0.3), what="the job stopped", seen=cluster.logs)
    assert cluster.run("gcontrol", "requeue", str(job_id)).returncode == 0
    job = wait_for(lambda: (lambda j: j if j["restarts"] == 1 and j["state"] == "RUNNING"
                            else None)(cluster.job(job_id)), what="its second run")
    assert (job["suspended_at"], job["suspended_seconds"]) == (None, 0)
    wait_for(lambda: not _still(ticks, 0.2), what="the second run ticking", seen=cluster.logs)
    assert cluster.run("gcancel", str(job_id)).returncode == 0
    cluster.wait_state(job_id, "CANCELLED", timeout=15)
