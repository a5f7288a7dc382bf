"""Dynamic MIG end to end: a real controller, a real agent on the fake NVML library. A
job waiting for a MIG profile that no slice offers gets an idle GPU re-partitioned by the
agent, and runs on the new slice; a GPU a job holds is never changed."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, pool, text

from tests.e2e.cluster import Cluster, wait_for
from tests.nvml_fixture import FakeNvml

BIN = Path(sys.executable).parent
SMALL = "GPU-5a0b7c1d-0000-4000-8000-00000000a100"  # one 1g.10gb slice
SMALL_SLICE = "MIG-5a0b7c1d-0000-4000-8000-00000000a101"
GPU = "GPU-5a0b7c1d-0000-4000-8000-00000000a200"  # one 7g.80gb slice (the whole GPU)
WHOLE = "MIG-5a0b7c1d-0000-4000-8000-00000000a207"


def _inventory(path: Path) -> Path:
    """Two A100 80GB in MIG mode: GPU 0 with one 1g.10gb slice, GPU 1 with one 7g.80gb
    slice."""
    def gpu(uuid: str, bus: int, slice_uuid: str, profile: str, slices: int, mb: int,
            gi: int) -> dict[str, Any]:
        return {"uuid": uuid, "name": "NVIDIA A100 80GB PCIe", "memory_mb": 81920,
                "pci_bus_id": f"00000000:{bus:02X}:00.0", "mig": True,
                "mig_devices": [{"uuid": slice_uuid, "profile": profile, "slices": slices,
                                 "memory_mb": mb, "gi": gi, "ci": 0}]}

    path.write_text(json.dumps({"gpus": [
        gpu(SMALL, 0x17, SMALL_SLICE, "1g.10gb", 1, 9728, 7),
        gpu(GPU, 0x65, WHOLE, "7g.80gb", 7, 80896, 0)]}))
    return path


@pytest.fixture
def mig_cluster(db_url: str, tmp_path: Path, fake_nvml_factory: Callable[..., FakeNvml]
                ) -> Iterator[tuple[Cluster, FakeNvml]]:
    fake = fake_nvml_factory(_inventory(tmp_path / "a100_mig.json"))
    cluster = Cluster(db_url, nvml=fake.variables(), poll_wait=1.0,
                      gpus_toml="rediscover_interval = 60\n")
    try:
        cluster.up()
        parts = cluster.root / "parts.toml"
        parts.write_text('[[partition]]\nname = "gpu"\ndefault = true\n'
                         'dynamic_mig = true\nmig_min_interval = "1:00"\n')
        applied = subprocess.run([str(BIN / "gpusched"), "admin", "apply", str(parts)],
                                 capture_output=True, text=True, env=cluster.env, timeout=60)
        assert applied.returncode == 0, applied.stderr
        assert "dynamic_mig False -> True; mig_min_interval 10:00 -> 1:00" in applied.stdout
        yield cluster, fake
    finally:
        cluster.close()


def _slices(cluster: Cluster) -> dict[str, str]:
    """The node's MIG slices now: UUID -> profile."""
    nodes = cluster.api("GET", "/v1/nodes")["nodes"]
    return {g["uuid"]: g["mig_profile"] for g in nodes[0]["gpus"] if g.get("mig_profile")}


def _query(url: str, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            result = conn.execute(text(sql), params)
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()


def _mig_log(fake: FakeNvml) -> list[str]:
    log = Path(str(fake.fault_path) + ".mig")
    return log.read_text().splitlines() if log.exists() else []


def test_a_waiting_1g_10gb_job_gets_an_idle_gpu_re_partitioned_and_runs_on_the_new_slice(
        mig_cluster: tuple[Cluster, FakeNvml], db_url: str) -> None:
    cluster, fake = mig_cluster
    assert _slices(cluster) == {SMALL_SLICE: "1g.10gb", WHOLE: "7g.80gb"}
    # The one 1g.10gb slice is taken: a second 1g.10gb job waits for one.
    holder = cluster.submit("--gpus", "1g.10gb:1", "--wrap", "sleep 300")
    assert cluster.wait_state(holder, "RUNNING")["gpu_uuids"] == [SMALL_SLICE]
    out = cluster.work / "visible.txt"
    job = cluster.submit("--gpus", "1g.10gb:1", "-o", str(out),
                         "--wrap", "echo $CUDA_VISIBLE_DEVICES")
    done = cluster.wait_state(job, "COMPLETED", timeout=40)
    slices = _slices(cluster)
    assert WHOLE not in slices and slices.pop(SMALL_SLICE) == "1g.10gb"
    assert list(slices.values()) == ["1g.10gb"]
    (new,) = slices
    assert new.startswith("MIG-") and done["gpu_uuids"] == [new]
    assert out.read_text().strip() == new
    # The agent destroyed the 7g.80gb instance and made one 1g.10gb instance through NVML.
    calls = [" ".join(w for w in line.split() if not w.startswith("uuid="))
             for line in _mig_log(fake)]
    assert [c.split()[0] for c in calls] == ["ci-destroy", "gi-destroy", "gi-create",
                                             "ci-create"]
    assert all(c.endswith("result=SUCCESS") and "gpu=1 " in c for c in calls)
    assert cluster.job(holder)["state"] == "RUNNING"
    # One command, done; the GPU's change time recorded from the agent's registration.
    commands = _query(db_url, "SELECT payload, done_at IS NOT NULL FROM node_commands "
                              "WHERE kind = 'mig'")
    assert commands == [({"gpu_uuid": GPU, "layout": ["1g.10gb"]}, True)]
    (changed,) = _query(db_url, "SELECT mig_changed_at IS NOT NULL FROM gpus WHERE uuid = :u",
                        u=GPU)
    assert changed == (True,)
    # Another job of that profile runs on the slice now there: no second change.
    again = cluster.submit("--gpus", "1g.10gb:1", "--wrap", "true")  # GPU 1's slice
    assert cluster.wait_state(again, "COMPLETED", timeout=20)["gpu_uuids"] == [new]
    assert len(_query(db_url, "SELECT id FROM node_commands WHERE kind = 'mig'")) == 1


def test_a_busy_gpu_is_never_changed(mig_cluster: tuple[Cluster, FakeNvml], db_url: str
                                     ) -> None:
    cluster, fake = mig_cluster
    small = cluster.submit("--gpus", "1g.10gb:1", "--wrap", "sleep 300")
    assert cluster.wait_state(small, "RUNNING")["gpu_uuids"] == [SMALL_SLICE]
    holder = cluster.submit("--gpus", "7g.80gb:1", "--wrap", "sleep 300")
    assert cluster.wait_state(holder, "RUNNING")["gpu_uuids"] == [WHOLE]
    waiting = cluster.submit("--gpus", "1g.10gb:1", "--wrap", "true")
    wait_for(lambda: cluster.job(waiting)["reason"] == "Resources", what="the job waiting",
             seen=lambda: cluster.job(waiting))
    time.sleep(3)  # passes come and go: the controller asks for no change
    assert _query(db_url, "SELECT id FROM node_commands WHERE kind = 'mig'") == []
    # A command for the busy GPU (as a controller that did not know of the job would
    # send): the agent refuses it, acknowledges it, and changes nothing.
    (node_id,) = _query(db_url, "SELECT id FROM nodes WHERE name = 'node01'")[0]
    _query(db_url, "INSERT INTO node_commands (job_id, run, node_id, kind, payload) VALUES "
                   "(NULL, 0, :n, 'mig', CAST(:p AS jsonb))", n=node_id,
           p=json.dumps({"gpu_uuid": GPU, "layout": ["1g.10gb"]}))
    _query(db_url, "SELECT pg_notify('node:node01', '')")
    wait_for(lambda: _query(db_url, "SELECT id FROM node_commands WHERE kind = 'mig' "
                                    "AND done_at IS NULL") == [],
             timeout=20, what="the command acknowledged", seen=cluster.logs)
    assert "refused the MIG layout 1g.10gb for GPU " + GPU in cluster.logs()
    assert _mig_log(fake) == []
    assert _slices(cluster) == {SMALL_SLICE: "1g.10gb", WHOLE: "7g.80gb"}
    assert cluster.job(holder)["state"] == "RUNNING"
    # Once the GPU is idle (and a minute after the refused command), it changes.
    assert cluster.run("gcancel", str(holder)).returncode == 0
    cluster.wait_state(holder, "CANCELLED")
    time.sleep(2)
    assert cluster.job(waiting)["state"] == "PENDING"  # within the interval: no change yet
    assert _query(db_url, "SELECT count(*) FROM node_commands WHERE kind = 'mig'") == [(1,)]
