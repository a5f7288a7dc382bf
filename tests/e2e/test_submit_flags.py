"""gsubmit's -W/--wait, --open-mode=truncate, --deadline and --nice on a live cluster:
gsubmit -W exits with the job's exit code, a truncated output file holds only this
run's output (an appended one keeps what was there), a pending job that can no longer
end by its deadline ends DEADLINE, and a niced job is shown with its nice."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.e2e.cluster import Cluster
from tests.pg import ScratchPostgres


@pytest.fixture(scope="module")
def cluster(postgres: ScratchPostgres) -> Iterator[Cluster]:
    c = Cluster(postgres.fresh_database(), schedule_interval=0.5)
    try:
        yield c.up()
    finally:
        c.close()


def test_wait_exits_with_the_jobs_exit_code(cluster: Cluster) -> None:
    started = time.monotonic()
    result = cluster.run("gsubmit", "-W", "--wrap", "sleep 1; exit 3")
    assert result.returncode == 3, (result.stdout, result.stderr)
    assert result.stdout.startswith("Submitted batch job ")
    job_id = int(result.stdout.split()[-1])
    assert cluster.job(job_id)["state"] == "FAILED"  # it had ended when gsubmit returned
    assert time.monotonic() - started >= 1.0
    ok = cluster.run("gsubmit", "--parsable", "--wait", "--wrap", "true")
    assert ok.returncode == 0, ok.stderr


def test_open_mode_truncate_empties_the_output_first(cluster: Cluster) -> None:
    for name in ("kept.out", "fresh.out"):
        (cluster.work / name).write_text("from before\n")
        (cluster.work / name).chmod(0o666)
    appended = cluster.submit("-o", "kept.out", "--wrap", "echo this run")
    truncated = cluster.submit("-o", "fresh.out", "--open-mode=truncate", "--wrap",
                               "echo this run")
    for job_id in (appended, truncated):
        assert cluster.wait_state(job_id, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    assert (cluster.work / "kept.out").read_text() == "from before\nthis run\n"
    assert (cluster.work / "fresh.out").read_text() == "this run\n"
    assert cluster.job(truncated)["open_mode"] == "truncate"


def test_a_job_that_cannot_end_by_its_deadline_ends_deadline(cluster: Cluster) -> None:
    # Held, with 5 minutes to run and a deadline 5 minutes and 3 seconds away: it can
    # end in time for three seconds, then never.
    job_id = cluster.submit("--hold", "-t", "5", "--deadline", "now+303", "--nice=50",
                            "--wrap", "true")
    job = cluster.job(job_id)
    assert (job["state"], job["nice"]) == ("PENDING", 50)
    ended = cluster.wait_state(job_id, "DEADLINE", timeout=30)
    assert (ended["reason"], ended["start_time"]) == ("DeadLine", None)
    listed = cluster.run("gqueue", "--all", "-j", str(job_id), "-o", "%i %t %r", "-h")
    assert listed.stdout.split() == [str(job_id), "DL", "DeadLine"], listed
