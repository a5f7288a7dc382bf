"""sbatch's forms and flags through the real ``gsubmit`` console script to a live
controller on PostgreSQL: what each asks for is what the stored job holds, from the
command line and from #SBATCH lines; each refusal exits 2 with one line and stores
nothing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.cluster import Cluster


@pytest.fixture
def cluster(db_url: str) -> Iterator[Cluster]:
    c = Cluster(db_url, schedule_interval=30.0)
    try:
        yield c.up()
    finally:
        c.close()


def stored(cluster: Cluster, *args: str, script: str = "") -> dict[str, object]:
    """Submit held (it stays as stored) and return the stored job."""
    if script:
        (cluster.work / "job.sh").write_text(f"#!/bin/sh\n{script}true\n")
        args = (*args, "job.sh")
    else:
        args = (*args, "--wrap", "true")
    result = cluster.run("gsubmit", "--parsable", "--hold", *args)
    assert result.returncode == 0, result.stderr
    return cluster.job(int(result.stdout.strip().split(";")[0]))


def test_forms_and_flags_reach_the_stored_job(cluster: Cluster) -> None:
    job = stored(cluster, "--array=1,")
    assert job["array_tasks"] == "1"
    job = stored(cluster, script="#SBATCH --array=2-3,\n")
    assert job["array_tasks"] == "2-3"
    job = stored(cluster, "--gres=gpu:2,")
    assert job["gpus"] == 2
    job = stored(cluster, script="#SBATCH --gres=gpu:gpu:1,\n")
    assert (job["gpus"], job["gpu_types"]) == (1, ["gpu"])
    job = stored(cluster, "--gpus-per-node=gpu")  # the demo GPUs' type, alone: one
    assert (job["gpus"], job["gpu_types"]) == (1, ["gpu"])
    job = stored(cluster, script="#SBATCH --gpus=1\n#SBATCH --gpus=3\n")
    assert job["gpus"] == 3
    job = stored(cluster, "--gpus", "1", "--gpus", "2")
    assert job["gpus"] == 2
    job = stored(cluster, "-G", "1", "--gres=gpumem:20g")
    assert (job["gpus"], job["gpu_mem_mb"]) == (1, 20 * 1024)
    job = stored(cluster, script="#SBATCH -G 1\n#SBATCH --gres=gpumem:20g\n")
    assert (job["gpus"], job["gpu_mem_mb"]) == (1, 20 * 1024)
    assert stored(cluster, "--overcommit", "-n", "8")["cpus"] == 1
    assert stored(cluster, script="#SBATCH -O\n#SBATCH -n 8 -c 2\n")["cpus"] == 2
    assert stored(cluster, "--mincpus=2")["cpus"] == 2  # the demo node has two CPUs
    assert stored(cluster, script="#SBATCH --mincpus 2\n")["cpus"] == 2
    assert stored(cluster, "-N", "1-4", "-G", "2")["nodes"] == 1
    assert stored(cluster, script="#SBATCH --nodes=1-2\n")["nodes"] == 1
    assert stored(cluster, "-M", "gpusched", "-k", "--get-user-env=5L")["state"] == "PENDING"
    assert stored(cluster, script="#SBATCH --clusters=gpusched --no-kill\n")["state"] == "PENDING"
    assert stored(cluster, "--nice")["nice"] == 100
    assert stored(cluster, script="#SBATCH --nice=-5 --open-mode=truncate\n")["nice"] == -5


def test_refusals_store_nothing(cluster: Cluster) -> None:
    (cluster.work / "nice.sh").write_text("#!/bin/sh\n#SBATCH --nice=ten\ntrue\n")
    (cluster.work / "excl.sh").write_text("#!/bin/sh\n#SBATCH --exclusive=user\ntrue\n")
    cases = [(["--nice=", "--wrap", "true"], "--nice"),
             (["--nice=1e3", "--wrap", "true"], "--nice"),
             (["nice.sh"], "line 2: #SBATCH: invalid --nice"),
             (["-M", "elsewhere", "--wrap", "true"], "'elsewhere'"),
             (["--exclusive=user", "--wrap", "true"], "--exclusive=user"),
             (["excl.sh"], "--exclusive=user"),
             (["-k", "-N", "2", "--wrap", "true"], "-k/--no-kill"),
             (["--array=,", "--wrap", "true"], "--array"),
             (["-N", "3-2", "--wrap", "true"], "--nodes")]
    for args, named in cases:
        result = cluster.run("gsubmit", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
        assert result.stderr.startswith("gsubmit: error: ") and named in result.stderr, (
            args, result.stderr)
    assert cluster.jobs() == []
