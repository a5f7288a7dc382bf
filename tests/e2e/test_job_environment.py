"""sbatch's output environment, end to end: a job submitted with gsubmit on a live
cluster writes out ``env`` and its variables are checked against what the controller
says of the job."""

from __future__ import annotations

import os
import subprocess
from datetime import datetime
from pathlib import Path

from gpusched.agent.settings import demo_gpus
from tests.e2e.cluster import BIN, Cluster, wait_for
from tests.e2e.nodes import Node

SCRIPT = """#!/bin/sh
env -0 > "$SLURM_SUBMIT_DIR/env-$SLURM_JOB_ID"
"""


def job_env(path: Path) -> dict[str, str]:
    """The variables ``env -0`` wrote."""
    items = path.read_bytes().decode().split("\0")
    return dict(item.split("=", 1) for item in items if item)


def test_a_job_sees_slurms_output_environment(cluster: Cluster) -> None:
    submit_dir = cluster.work / "sub dir"
    run_dir = cluster.work / "run"
    for directory in (submit_dir, run_dir):
        directory.mkdir(mode=0o777)
    (submit_dir / "job.sh").write_text(SCRIPT)
    first = cluster.submit("--wrap", "true")
    cluster.wait_state(first, "COMPLETED", "FAILED")
    # What a job submitted from inside another would inherit: never the job's own.
    stale = {"SLURM_JOB_PARTITION": "stale", "SLURM_JOB_ACCOUNT": "stale",
             "SLURM_GPUS_ON_NODE": "9", "SLURM_ARRAY_TASK_ID": "7", "MY_VAR": "kept"}
    result = subprocess.run(
        [str(BIN / "gsubmit"), "--parsable", "-J", "env check", "-G", "2", "--mem",
         "100M", "-n", "2", "--time", "10", "-p", "debug", "-D", str(run_dir),
         "-d", f"afterany:{first}", "--export", "ALL", "job.sh"],
        capture_output=True, text=True, env={**cluster.env, **stale}, cwd=submit_dir,
        timeout=60)
    assert result.returncode == 0, result.stderr
    job_id = int(result.stdout)
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=30)
    assert job["state"] == "COMPLETED", (job, cluster.logs())
    path = submit_dir / f"env-{job_id}"
    wait_for(path.exists, 10, str(path))
    env = job_env(path)
    index_of = {gpu.uuid: gpu.index for gpu in demo_gpus(cluster.node, 4)}
    start = int(datetime.fromisoformat(job["start_time"]).timestamp())
    expected = {
        "SLURM_JOB_ID": str(job_id), "SLURM_JOB_NAME": "env check",
        "SLURM_JOB_PARTITION": "debug", "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOB_NODELIST": cluster.node, "SLURM_NODELIST": cluster.node,
        "SLURM_GPUS_ON_NODE": "2",
        "SLURM_JOB_GPUS": ",".join(str(i) for i in sorted(index_of[u] for u in job["gpu_uuids"])),
        "CUDA_VISIBLE_DEVICES": ",".join(job["gpu_uuids"]),
        "SLURM_CPUS_ON_NODE": str(job["cpus"]), "SLURM_JOB_CPUS_PER_NODE": str(job["cpus"]),
        "SLURM_MEM_PER_NODE": "100", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "2",
        "SLURM_SUBMIT_DIR": str(submit_dir), "SLURM_SUBMIT_HOST": os.uname().nodename,
        "SLURM_PRIO_PROCESS": str(os.getpriority(os.PRIO_PROCESS, 0)),
        "SLURM_EXPORT_ENV": "ALL", "SLURM_JOB_DEPENDENCY": f"afterany:{first}",
        "SLURM_JOB_START_TIME": str(start), "SLURM_JOB_END_TIME": str(start + 600),
        "SLURM_JOB_USER": "root", "SLURM_JOB_UID": "0", "SLURM_GPUS": "2",
        "SLURMD_NODENAME": cluster.node, "MY_VAR": "kept", "SLURM_CLUSTER_NAME": "gpusched",
    }
    assert {name: env.get(name) for name in expected} == expected
    assert "SLURM_JOB_ACCOUNT" not in env and "SLURM_ARRAY_TASK_ID" not in env
    assert env["PWD"] == str(run_dir)  # it ran in --chdir's directory
    assert job["cpus"] >= 1


def test_export_none_keeps_what_gsubmit_tells(cluster: Cluster) -> None:
    """--export=NONE sends none of the shell's variables, but still where and how the
    job was submitted, as sbatch does."""
    (cluster.work / "job.sh").write_text(SCRIPT)
    result = subprocess.run(
        [str(BIN / "gsubmit"), "--parsable", "--export=NONE", "job.sh"], capture_output=True,
        text=True, env={**cluster.env, "MY_VAR": "not sent"}, cwd=cluster.work, timeout=60)
    assert result.returncode == 0, result.stderr
    job_id = int(result.stdout)
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=30)
    assert job["state"] == "COMPLETED", (job, cluster.logs())
    path = cluster.work / f"env-{job_id}"
    wait_for(path.exists, 10, str(path))
    env = job_env(path)
    assert (env.get("SLURM_SUBMIT_DIR"), env.get("SLURM_SUBMIT_HOST"),
            env.get("SLURM_EXPORT_ENV"), env.get("SLURM_JOB_PARTITION")) == (
        str(cluster.work), os.uname().nodename, "NONE", "gpu")
    assert "MY_VAR" not in env and "SLURM_GPUS" not in env
    assert (env["SLURM_GPUS_ON_NODE"], env["SLURM_JOB_GPUS"]) == ("0", "")


def test_a_two_node_job_sees_its_first_nodes_share(cluster: Cluster) -> None:
    """The batch script runs on the first node: its GPUs there, every node's name."""
    Node(cluster, "node02", gpus=2).start()
    (cluster.work / "job.sh").write_text(SCRIPT)
    job_id = cluster.submit("-N", "2", "-G", "4", "-n", "3", "job.sh")
    job = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=30)
    assert job["state"] == "COMPLETED", (job, cluster.logs())
    path = cluster.work / f"env-{job_id}"
    wait_for(path.exists, 10, str(path))
    env = job_env(path)
    first = env["SLURMD_NODENAME"]
    assert sorted(job["node_names"]) == ["node01", "node02"] and first in job["node_names"]
    index_of = {gpu.uuid: gpu.index for gpu in demo_gpus(first, 4 if first == "node01" else 2)}
    here = sorted(index_of[u] for u in job["gpu_uuids"] if u in index_of)
    assert len(here) == 2
    expected = {"SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2",
                "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_GPUS_ON_NODE": "2",
                "SLURM_JOB_GPUS": ",".join(map(str, here)), "SLURM_GPUS": "4",
                "SLURM_GPUS_PER_NODE": "2", "SLURM_NTASKS": "3", "SLURM_TASKS_PER_NODE": "2,1"}
    assert {name: env.get(name) for name in expected} == expected
