"""The idle-GPU policy end to end: a real controller and agent on the fake NVML library,
whose A100s report 0 % utilisation and whose L4s report 95 %. Jobs on idle GPUs are
warned (a line in their output file, ``(IdleWarned)`` in gqueue), then requeued or
cancelled with the reason recorded and shown; busy and exempt jobs are never warned;
the warning is written as the job's user, so a job that swaps its output file for a
link cannot have root write through it."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, wait_for
from tests.e2e.conftest import job_user  # noqa: F401 - a fixture
from tests.nvml_fixture import FakeNvml

HEALTH = "[agent.health]\ninterval = 0.5\n"
# The gpu partition requeues, the debug partition cancels; QOS idlecancel cancels
# (winning over the gpu partition's requeue) and QOS exempt turns the policy off.
ADMIN = """
[[partition]]
name = "gpu"
default = true
max_time = "1-00:00:00"
idle_warn_after = "0:02"
idle_action = "requeue"
idle_action_after = "0:04"

[[partition]]
name = "debug"
nodes = ["node01"]
idle_warn_after = "0:02"
idle_action = "cancel"
idle_action_after = "0:03"

[[qos]]
name = "idlecancel"
idle_warn_after = "0:02"
idle_action = "cancel"
idle_action_after = "0:02"

[[qos]]
name = "exempt"
idle_action = "off"
"""


def _gpu(index: int, name: str, util: int) -> dict[str, Any]:
    return {"uuid": f"GPU-{index:08x}-0000-4000-8000-{index:012x}", "name": name,
            "memory_mb": 81920 if "A100" in name else 23034,
            "pci_bus_id": f"00000000:{index + 16:02X}:00.0", "utilization": util}


@pytest.fixture
def idle_cluster(db_url: str, tmp_path: Path, fake_nvml_factory: Callable[..., FakeNvml]
                 ) -> Iterator[tuple[Cluster, FakeNvml]]:
    inventory = tmp_path / "idle.json"
    inventory.write_text(json.dumps({"gpus": [
        *(_gpu(i, "NVIDIA A100-SXM4-80GB", 0) for i in range(5)),
        *(_gpu(i, "NVIDIA L4", 95) for i in range(5, 7))]}))
    fake = fake_nvml_factory(inventory)
    cluster = Cluster(db_url, nvml=fake.variables(), agent_toml=HEALTH)
    try:
        cluster.up()
        admin = cluster.root / "idle.toml"
        admin.write_text(ADMIN)
        applied = cluster.run("gpusched", "admin", "apply", str(admin))
        assert applied.returncode == 0, applied.stderr
        yield cluster, fake
    finally:
        for job in cluster.jobs():
            if job["state"] in ("PENDING", "RUNNING"):
                cluster.run("gcancel", str(job["job_id"]))
        cluster.close()


def _output(cluster: Cluster, job: int) -> str:
    path = cluster.work / f"gpusched-{job}.out"
    return path.read_text() if path.exists() else ""


def _notices(cluster: Cluster, job: int) -> list[str]:
    return [line for line in _output(cluster, job).splitlines()
            if line.startswith(f"gpusched: job {job}: ")]


def test_idle_jobs_are_warned_then_requeued_or_cancelled(
        idle_cluster: tuple[Cluster, FakeNvml]) -> None:
    cluster, _ = idle_cluster
    requeued = cluster.submit("-G", "a100-80gb:1", "--wrap", "sleep 300")
    cancelled = cluster.submit("-G", "a100-80gb:1", "--qos", "idlecancel", "--wrap", "sleep 300")
    busy = cluster.submit("-G", "l4:1", "--wrap", "sleep 300")
    exempt = cluster.submit("-G", "a100-80gb:1", "--qos", "exempt", "--wrap", "sleep 300")
    for job in (requeued, cancelled, busy, exempt):
        cluster.wait_state(job, "RUNNING")

    # The warning: in the output file, in gqueue's table and in gcontrol show job.
    wait_for(lambda: any(": warning: its GPUs idle" in n for n in _notices(cluster, requeued)),
             what="the warning in the output file", seen=lambda: _output(cluster, requeued))
    warning = _notices(cluster, requeued)[0]
    assert "(partition gpu idle policy)" in warning and "requeued in 0:04" in warning
    row = wait_for(lambda: next((line for line in cluster.run("gqueue").stdout.splitlines()
                                 if line.split()[0] == str(requeued)
                                 and "(IdleWarned)" in line), None),
                   what="(IdleWarned) in gqueue", seen=lambda: cluster.run("gqueue").stdout)
    assert "node01 (IdleWarned)" in row
    shown = cluster.run("gcontrol", "show", "job", str(requeued))
    assert "IdleWarnedAt=20" in shown.stdout and "IdleAction=(null)" in shown.stdout

    # Then the action, with its reason recorded on the job and shown.
    again = wait_for(lambda: (lambda j: j if j["restarts"] >= 1 else None)(cluster.job(requeued)),
                     timeout=30, what="the idle job requeued", seen=lambda: cluster.job(requeued))
    assert again["idle_action"] == "requeue"
    assert again["idle_reason"].startswith("GPUs idle (at most 1% busy) for ")
    assert again["idle_reason"].endswith("after the warning (partition gpu idle policy)")
    assert again["error_message"] == f"requeued: {again['idle_reason']}"
    assert any(n.split(": ", 3)[3].startswith("requeued: its GPUs idle")
               for n in _notices(cluster, requeued))
    shown = cluster.run("gcontrol", "show", "job", str(requeued)).stdout
    assert "IdleAction=requeue" in shown and "IdleReason=GPUs idle" in shown

    ended = cluster.wait_state(cancelled, "CANCELLED", timeout=30)
    assert ended["idle_action"] == "cancel" and "(QOS idlecancel idle policy)" in ended["idle_reason"]
    lines = _notices(cluster, cancelled)
    assert [n.split(": ", 3)[3].split(":")[0] for n in lines] == ["warning", "cancelled"], lines
    listed = cluster.run("gqueue", "--all").stdout
    assert any(line.split()[0] == str(cancelled) and "(IdleCancelled)" in line
               for line in listed.splitlines()), listed
    acct = cluster.run("gacct", "-X", "-j", str(cancelled))
    assert acct.returncode == 0, acct.stderr
    assert "CANCELLED (idle cancel)" in acct.stdout
    assert f"{cancelled}: cancel: {ended['idle_reason']}" in acct.stdout

    # Busy GPUs are never idle; an exempt QOS is idle but never warned.
    busy_job, exempt_job = cluster.job(busy), cluster.job(exempt)
    assert busy_job["state"] == "RUNNING" and busy_job["gpu_util_peak"] == 95
    assert (busy_job["idle_since"], busy_job["idle_warned_at"], busy_job["idle_action"]) \
        == (None, None, None)
    assert _notices(cluster, busy) == []
    assert exempt_job["idle_since"] is not None and exempt_job["state"] == "RUNNING"
    assert (exempt_job["idle_warned_at"], exempt_job["idle_action"]) == (None, None)
    assert _notices(cluster, exempt) == []


def test_a_busy_gpu_lifts_the_warning(idle_cluster: tuple[Cluster, FakeNvml]) -> None:
    cluster, fake = idle_cluster
    job = cluster.submit("-p", "debug", "-G", "a100-80gb:1", "--wrap", "sleep 300")
    uuid = cluster.wait_state(job, "RUNNING")["gpu_uuids"][0]
    wait_for(lambda: cluster.job(job)["idle_warned_at"], what="the warning",
             seen=lambda: cluster.job(job))
    fake.inject(f"util {int(uuid[4:12], 16)} 70 1000")  # the index is in the UUID
    wait_for(lambda: any("busy again" in n for n in _notices(cluster, job)),
             what="the warning lifted", seen=lambda: (cluster.job(job), _output(cluster, job)))
    now = cluster.job(job)
    assert (now["state"], now["idle_warned_at"], now["idle_since"]) == ("RUNNING", None, None)
    assert now["idle_action"] is None


def test_notices_are_written_as_the_job_user(idle_cluster: tuple[Cluster, FakeNvml],
                                             job_user: tuple[int, int, str]) -> None:  # noqa: F811
    cluster, _ = idle_cluster
    uid, gid, _ = job_user
    victim = cluster.root / "victim"
    victim.write_text("root's file\n")
    os.chmod(victim, 0o644)

    def submit(script: str) -> int:
        answer = cluster.api_as(uid, gid, "POST", "/v1/jobs", {
            "script": f"#!/bin/sh\n{script}\n", "work_dir": str(cluster.work),
            "partition": "debug", "gpus": 1, "gpu_types": ["a100-80gb"]})
        assert "job_id" in answer, answer
        return int(answer["job_id"])

    # One job removes its output file (the notice makes it again, as the user); the other
    # puts a link to a root-owned file in its place (the notice cannot open it).
    removes = submit('rm -f "gpusched-$SLURM_JOB_ID.out"; sleep 300')
    links = submit(f'rm -f "gpusched-$SLURM_JOB_ID.out"; '
                   f'ln -s {victim} "gpusched-$SLURM_JOB_ID.out"; sleep 300')
    for job in (removes, links):
        assert cluster.wait_state(job, "CANCELLED", timeout=40)["idle_action"] == "cancel"
    made = cluster.work / f"gpusched-{removes}.out"
    wait_for(lambda: len(_notices(cluster, removes)) == 2, what="both notices",
             seen=lambda: _output(cluster, removes))
    assert made.stat().st_uid == uid and not made.is_symlink()
    link = cluster.work / f"gpusched-{links}.out"
    assert link.is_symlink()
    assert victim.read_text() == "root's file\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o644 and victim.stat().st_uid == 0
