"""Shares of one GPU end to end: a real controller places MPS jobs on one GPU of a
partition that shares it by MPS, a real agent starts that GPU's (fake) MPS control
daemon, its jobs get their percentages and memory limits, a third that does not fit
waits, and the daemon is told to quit after the last of them; a daemon that cannot
start fails its job with the reason."""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import BIN, Cluster, wait_for
from tests.fakemps.fixture import FakeMps, fake_mps_in


@pytest.fixture
def fake_mps(tmp_path: Path) -> Iterator[FakeMps]:
    with fake_mps_in(tmp_path) as fake:
        yield fake


@pytest.fixture
def cluster(db_url: str, fake_mps: FakeMps, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """One node with one GPU; partition "shared" shares it by MPS (or as the test's
    parameter says)."""
    sharing = getattr(request, "param", "mps")
    c = Cluster(db_url, gpus=1, schedule_interval=0.5, poll_wait=1.0,
                agent_toml=f'mps_control = "{fake_mps.program}"\n')
    try:
        c.up()
        partitions = c.root / "partitions.toml"
        partitions.write_text(f"""
[[partition]]
name = "gpu"
default = true
[[partition]]
name = "shared"
nodes = "{c.node}"
sharing = "{sharing}"
""")
        applied = c.run("gpusched", "admin", "apply", str(partitions))
        assert applied.returncode == 0, applied.stderr
        yield c
    finally:
        c.close()


def _job(cluster: Cluster, name: str, *gres: str) -> int:
    work = cluster.work
    return cluster.submit("-p", "shared", "-J", name, *gres, "--wrap",
                          f"env > {work}/env-{name}.tmp && mv {work}/env-{name}.tmp "
                          f"{work}/env-{name}; while [ ! -e {work}/go-{name} ]; do sleep 0.05; "
                          f"done")


def _env(cluster: Cluster, name: str) -> dict[str, str]:
    path = cluster.work / f"env-{name}"
    wait_for(path.exists, what=f"job {name} to write its environment", seen=cluster.logs)
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def test_mps_jobs_on_one_gpu_get_their_limits_and_one_daemon(
        cluster: Cluster, fake_mps: FakeMps) -> None:
    first = _job(cluster, "a", "--gres=mps:30", "--gpu-mem=20G")
    second = _job(cluster, "b", "--gres=mps:50")
    a, b = _env(cluster, "a"), _env(cluster, "b")
    (gpu,) = cluster.wait_state(first, "RUNNING")["gpu_uuids"]
    assert cluster.wait_state(second, "RUNNING")["gpu_uuids"] == [gpu]
    pipe = str(cluster.agent_state / "mps" / gpu / "pipe")
    assert (a["CUDA_VISIBLE_DEVICES"], a["CUDA_MPS_PIPE_DIRECTORY"]) == (gpu, pipe)
    assert (b["CUDA_VISIBLE_DEVICES"], b["CUDA_MPS_PIPE_DIRECTORY"]) == (gpu, pipe)
    assert (a["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], a["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
            a["GPUSCHED_GPU_SHARE"]) == ("30", "0=20480M", "mps:30/100")
    assert (b["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], b["GPUSCHED_GPU_SHARE"]) == ("50", "mps:50/100")
    # Without --gpu-mem the memory limit is what the controller granted with the share.
    limit = b.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=0M")
    assert re.fullmatch(r"0=\d+M", limit) and int(limit[2:-1]) <= 81920 - 20480, limit
    (started,) = fake_mps.events("run")
    assert started["argv"] == ["-d"] and started["env"]["CUDA_VISIBLE_DEVICES"] == gpu
    (daemon,) = fake_mps.live_daemons()

    third = _job(cluster, "c", "--gres=mps:30")  # 30 + 50 + 30 > 100: it waits
    waiting: dict[str, Any] = cluster.wait_state(third, "PENDING")
    (cluster.work / "go-a").touch()
    cluster.wait_state(first, "COMPLETED")
    c = _env(cluster, "c")  # it starts in the room the first one left
    assert (c["CUDA_MPS_PIPE_DIRECTORY"], c["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) == (pipe, "30")
    assert waiting["state"] == "PENDING"
    assert fake_mps.live_daemons() == [daemon] and fake_mps.events("command") == []

    for name, job_id in (("b", second), ("c", third)):
        (cluster.work / f"go-{name}").touch()
        cluster.wait_state(job_id, "COMPLETED")
    wait_for(lambda: fake_mps.events("quit"), what="the daemon to be told to quit",
             seen=lambda: (fake_mps.events(), cluster.logs()))
    assert [e["command"] for e in fake_mps.events("command")] == ["quit"]
    assert len(fake_mps.events("daemon")) == 1  # started once for the three jobs


def test_a_daemon_that_cannot_start_fails_its_job_with_the_reason(
        cluster: Cluster, fake_mps: FakeMps) -> None:
    fake_mps.fail_start()
    job_id = _job(cluster, "a", "--gres=mps:30")
    job = cluster.wait_state(job_id, "FAILED")
    (gpu,) = job["gpu_uuids"]
    assert job["reason"] == "LaunchFailed", job
    assert job["error_message"] == (
        f"cannot start the MPS control daemon for GPU {gpu}: {fake_mps.program} -d exited "
        f"with status 1: fake MPS control: cannot start the daemon (fail-start)"), job
    assert not (cluster.work / "env-a").exists()
    assert [e["event"] for e in fake_mps.events()] == ["run", "start_failed"]
    assert [n["state"] for n in cluster.api("GET", "/v1/nodes")["nodes"]] == ["UP"]


@pytest.mark.parametrize("cluster", ["shard"], indirect=True)
def test_a_shard_job_gets_the_gpu_with_no_limit_and_no_daemon(
        cluster: Cluster, fake_mps: FakeMps) -> None:
    job_id = _job(cluster, "a", "--gres=shard:2")
    env = _env(cluster, "a")
    (gpu,) = cluster.wait_state(job_id, "RUNNING")["gpu_uuids"]
    assert (env["CUDA_VISIBLE_DEVICES"], env["GPUSCHED_GPU_SHARE"],
            env["SLURM_SHARDS_ON_NODE"]) == (gpu, "shard:2/4", "2")
    assert not [key for key in env if key.startswith("CUDA_MPS_")]
    (cluster.work / "go-a").touch()
    cluster.wait_state(job_id, "COMPLETED")
    assert fake_mps.events() == []


def test_the_daemon_outlives_an_agent_restart_while_its_job_runs(
        cluster: Cluster, fake_mps: FakeMps) -> None:
    job_id = _job(cluster, "a", "--gres=mps:40")
    _env(cluster, "a")
    (daemon,) = fake_mps.live_daemons()
    cluster.kill("agent", signal.SIGTERM)
    assert fake_mps.live_daemons() == [daemon]  # the agent stops; job and daemon run on
    cluster.start("agent")
    cluster.wait_node_up()
    assert cluster.job(job_id)["state"] == "RUNNING"
    assert fake_mps.live_daemons() == [daemon] and fake_mps.events("command") == []
    (cluster.work / "go-a").touch()
    cluster.wait_state(job_id, "COMPLETED")
    wait_for(lambda: not fake_mps.live_daemons(), what="the daemon to quit",
             seen=lambda: (fake_mps.events(), cluster.logs()))
    assert [e["command"] for e in fake_mps.events("command")] == ["quit"]
    assert len(fake_mps.events("daemon")) == 1


def test_a_step_of_an_mps_job_keeps_its_limits(cluster: Cluster, fake_mps: FakeMps) -> None:
    work = cluster.work
    job_id = cluster.submit("-p", "shared", "--gres=mps:25", "--wrap",
                            f"{BIN}/gsrun sh -c 'env > {work}/step.tmp && mv {work}/step.tmp "
                            f"{work}/env-step'")
    cluster.wait_state(job_id, "COMPLETED", timeout=40)
    env = _env(cluster, "step")
    assert (env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["GPUSCHED_GPU_SHARE"]) == (
        "25", "mps:25/100")
    assert env["CUDA_MPS_PIPE_DIRECTORY"].startswith(str(cluster.agent_state / "mps"))
    wait_for(lambda: not fake_mps.live_daemons(), what="the daemon to quit")
