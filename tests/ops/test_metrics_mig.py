"""Metrics of MIG slices on a real cluster (``mixed_mig.json``: GPU 0 cut into
3g.40gb + 2g.20gb + 2 x 1g.10gb, GPU 1 into 7 x 1g.10gb, GPUs 2 and 3 whole): the
controller counts slices, not the GPUs they are cut from; the agent shows a job on a
slice, and an Xid on a slice, on the slice's GPU."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client.samples import Sample

from tests.e2e.cluster import wait_for
from tests.nvml_fixture import FakeNvml
from tests.ops.metrics_cluster import metrics_cluster, value

pytestmark = pytest.mark.slow


def gpus_by(families: dict[str, list[Sample]], state: str, profile: str) -> float:
    return sum(s.value for s in families["gpusched_gpus"]
               if s.labels["state"] == state and s.labels["mig_profile"] == profile)


def test_a_job_on_a_slice_shows_on_its_gpu(db_url: str,
                                           fake_nvml_factory: Callable[..., FakeNvml]) -> None:
    with metrics_cluster(db_url, fake_nvml_factory, "mixed_mig.json") as mc:
        cluster, inventory = mc.cluster, mc.fake.inventory
        parent = inventory["gpus"][0]["uuid"]
        slice_uuid = inventory["gpus"][0]["mig_devices"][0]["uuid"]  # the 3g.40gb
        idle = mc.controller()
        assert gpus_by(idle, "idle", "1g.10gb") == 9
        assert gpus_by(idle, "idle", "3g.40gb") == 1
        assert gpus_by(idle, "idle", "") == 2  # GPUs 2 and 3; GPUs 0 and 1 are their slices
        assert gpus_by(idle, "idle", "2g.20gb") == 1
        assert sum(s.value for s in idle["gpusched_gpus"]) == 13  # 11 slices, 2 whole

        job = cluster.submit("--gpus", "3g.40gb:1", "--wrap", "sleep 60")
        assert cluster.wait_state(job, "RUNNING")["gpu_uuids"] == [slice_uuid]
        held = mc.controller()
        assert gpus_by(held, "allocated", "3g.40gb") == 1
        assert gpus_by(held, "idle", "3g.40gb") == 0
        mc.fake.inject("xid 0 13 mig 2 0")  # on the 3g.40gb slice (GI 2, CI 0)

        def on_parent() -> dict[str, str] | None:
            families = mc.agent()
            jobs = {s.labels["UUID"]: s.labels["hpc_job"]
                    for s in families.get("DCGM_FI_DEV_GPU_UTIL", [])}
            counted = value(families, "gpusched_gpu_xid_errors", "gpusched_gpu_xid_errors_total",
                            UUID=parent, xid="13")
            return jobs if jobs.get(parent) == str(job) and counted == 1 else None

        jobs = wait_for(on_parent, what="the slice's job and Xid on GPU 0")
        assert set(jobs) == {g["uuid"] for g in inventory["gpus"]}, "whole GPUs only"
        assert [u for u, j in jobs.items() if j] == [parent]
        cluster.run("gcancel", str(job))
