"""Batch scripts as researchers write them for Slurm (tests/data/sbatch/), submitted
unchanged to a live cluster: a multi-GPU training job, an array sweep, a dependency
chain and MIG inference."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from tests.e2e.cluster import Cluster, wait_for
from tests.nvml_fixture import FakeNvml

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "sbatch"


def copy(cluster: Cluster, name: str) -> str:
    shutil.copy(SCRIPTS / name, cluster.work / name)
    return name


def test_multi_gpu_training(cluster: Cluster) -> None:
    result = cluster.run("gsubmit", "--parsable", copy(cluster, "ddp_train.sh"))
    assert result.returncode == 0, result.stderr
    assert "mail" not in result.stderr  # its --mail-type is honoured, not ignored
    job = cluster.wait_state(int(result.stdout), "COMPLETED", "FAILED", timeout=30)
    assert job["state"] == "COMPLETED", job
    assert (job["name"], job["gpus"], job["cpus"], job["mem_mb"], job["requeue"]) == (
        "resnet50-ddp", 2, 2, 512, True)
    assert job["warn_signal"] == {"signal": 10, "seconds": 120, "batch_only": True}
    out = (cluster.work / f"resnet50-ddp-{job['job_id']}.out").read_text().splitlines()
    assert out[:2] == [f"job {job['job_id']} (resnet50-ddp) on node01",
                       "tasks 2, per node 2, cpus per task 1"]
    assert out[2:] == [f"rank {i} of 2 on {uuid}" for i, uuid in enumerate(job["gpu_uuids"])]
    assert (cluster.work / f"resnet50-ddp-{job['job_id']}.err").read_text() == "training done\n"


def test_array_sweep(cluster: Cluster) -> None:
    array = cluster.submit(copy(cluster, "lr_sweep.sh"))

    def tasks() -> list[dict[str, object]]:
        return [j for j in cluster.jobs() if j["array_job_id"] == array]

    done = wait_for(lambda: (lambda ts: ts if len(ts) == 4 and all(
        t["state"] == "COMPLETED" for t in ts) else None)(tasks()), timeout=40,
        what="four completed tasks", seen=tasks)
    rates = ["0.1", "0.03", "0.01", "0.003"]
    for task in done:
        i = task["array_task_id"]
        assert isinstance(i, int)
        line = (cluster.work / f"sweep_{array}_{i}.out").read_text().strip()
        assert line == f"task {i} of 4 (array {array}) lr={rates[i]} gpu={task['gpu_uuids'][0]}"  # type: ignore[index]
    assert {t["array_max_running"] for t in done} == {2}


def test_dependency_chain(cluster: Cluster) -> None:
    prep = cluster.submit(copy(cluster, "preprocess.sh"))
    train = cluster.submit(f"--dependency=afterok:{prep}", copy(cluster, "train_after.sh"))
    evaluate = cluster.submit("-d", f"afterok:{train}", copy(cluster, "evaluate.sh"))
    ended = {j: cluster.wait_state(j, "COMPLETED", "FAILED", timeout=30)
             for j in (prep, train, evaluate)}
    assert [ended[j]["state"] for j in (prep, train, evaluate)] == ["COMPLETED"] * 3
    for before, after in ((prep, train), (train, evaluate)):
        assert (datetime.fromisoformat(ended[after]["start_time"])
                >= datetime.fromisoformat(ended[before]["end_time"]))
    assert (cluster.work / "train.out").read_text() == (
        f"trained on 5 samples with {ended[train]['gpu_uuids'][0]}\n")
    assert (cluster.work / "eval.out").read_text() == "evaluated\n"
    # Without its data set the training step fails, and evaluation can never start.
    (cluster.work / "dataset.txt").unlink()
    failed = cluster.submit("train_after.sh")
    stuck = cluster.submit("-d", f"afterok:{failed}", "evaluate.sh")
    assert cluster.wait_state(failed, "FAILED")["exit_code"] == 3
    wait_for(lambda: cluster.job(stuck)["reason"] == "DependencyNeverSatisfied",
             what="DependencyNeverSatisfied", seen=lambda: cluster.job(stuck))
    cluster.run("gcancel", str(stuck))


def test_mig_inference(db_url: str, fake_nvml_factory: Callable[..., FakeNvml]) -> None:
    fake = fake_nvml_factory("mixed_mig.json")
    cluster = Cluster(db_url, nvml=fake.variables())
    try:
        cluster.up()
        job = cluster.submit(copy(cluster, "mig_infer.sh"))
        ended = cluster.wait_state(job, "COMPLETED", "FAILED", timeout=30)
        assert ended["state"] == "COMPLETED" and ended["gpu_types"] == ["1g.10gb"]
        (uuid,) = ended["gpu_uuids"]
        assert uuid.startswith("MIG-")
        assert (cluster.work / f"infer-{job}.out").read_text() == f"serving on {uuid}\n"
    finally:
        cluster.close()
