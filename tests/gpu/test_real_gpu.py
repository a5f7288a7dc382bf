"""The NVML code path on a host with real NVIDIA GPUs: what the agent registers matches
``nvidia-smi``, healthy GPUs give no fault and sane samples, and a job's CUDA sees exactly
the GPUs it was given.

Each test skips where NVML finds no GPU (CI has none). Their fake-NVML twins run
everywhere: tests/agent/test_nvml_inventory.py (the inventory), tests/agent/
test_health_monitor.py (checks, samples, events) and tests/ops/test_up_gpus.py (jobs on
all the GPUs ``gpusched up`` found, and on none, see those in CUDA_VISIBLE_DEVICES).
Read-only: nothing here changes a GPU's settings.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.agent.nvml import gpu_type
from tests.nvml_fixture import host_has_gpus

BIN = Path(sys.executable).parent

# Run inside a job: the UUIDs of the devices CUDA's driver API shows it, one per line
# (CUDA_VISIBLE_DEVICES decides which; nothing at all when it shows none).
CUDA_PROBE = r"""
import ctypes, sys
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    sys.exit(f"no CUDA driver: {exc}")
if cuda.cuInit(0) != 0:
    sys.exit(0)  # CUDA_ERROR_NO_DEVICE and the like: no device visible
count = ctypes.c_int()
assert cuda.cuDeviceGetCount(ctypes.byref(count)) == 0
for ordinal in range(count.value):
    device = ctypes.c_int()
    assert cuda.cuDeviceGet(ctypes.byref(device), ordinal) == 0
    raw = (ctypes.c_ubyte * 16)()
    assert cuda.cuDeviceGetUuid_v2(raw, device) == 0
    h = bytes(raw).hex()
    print(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
"""


def _smi(*fields: str) -> list[list[str]]:
    """``nvidia-smi --query-gpu`` rows, one per GPU, the fields stripped."""
    out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    return [[value.strip() for value in line.split(",")] for line in out.splitlines() if line]


def _real_gpus() -> bool:
    return shutil.which("nvidia-smi") is not None and host_has_gpus()


pytestmark = pytest.mark.skipif(not _real_gpus(), reason="no NVIDIA GPU on this host "
                                "(the fake-NVML twins named in this module's docstring run)")


def _plain_env() -> dict[str, str]:
    """This environment without the fake NVML library's variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKENVML")}
    env.pop("GPUSCHED_SOCKET", None)
    return env


def test_the_inventory_matches_nvidia_smi(tmp_path: Path) -> None:
    config = tmp_path / "gpusched.toml"
    config.write_text('[agent]\nnode_name = "n1"\n[agent.gpus]\nsource = "nvml"\n')
    shown = subprocess.run([str(BIN / "gpusched"), "agent", "inventory", "--json", "--config",
                            str(config)], capture_output=True, text=True, timeout=60,
                           env=_plain_env())
    assert shown.returncode == 0, shown.stderr
    found: dict[str, Any] = json.loads(shown.stdout)
    smi = _smi("index", "uuid", "name", "memory.total", "pci.bus_id", "driver_version",
               "compute_cap")
    whole = [g for g in found["gpus"] if g["parent"] is None]
    assert found["source"] == "nvml" and found["driver"] == smi[0][5]
    assert [(g["index"], g["uuid"], g["memory_mb"], g["pci_bus_id"].upper())
            for g in whole] == [(int(r[0]), r[1], int(r[3]), r[4].upper()) for r in smi]
    assert [g["type"] for g in whole] == [gpu_type(r[2]) for r in smi]
    for row in smi:
        major, minor = row[6].split(".")
        assert f"sm_{major}{minor}" in found["features"], (row, found["features"])
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60,
                            check=True).stdout
    slices = [g["uuid"] for g in found["gpus"] if g["parent"] is not None]
    assert ("mig" in found["features"]) == bool(slices)
    assert sorted(slices) == sorted(word.rstrip(")") for word in listed.split()
                                    if word.startswith("MIG-"))
    assert found["cpus"] == os.cpu_count() and found["memory_mb"] > 0


def test_healthy_gpus_give_no_fault_and_sane_samples() -> None:
    from gpusched.agent.health import HealthMonitor
    from gpusched.agent.nvml import load

    monitor = HealthMonitor(lambda faults: None, frozenset({13, 31, 43, 45, 68}),
                            max_temperature=95.0, interval=1.0)
    nvml = load()
    try:
        gpus = monitor._gpus(nvml)
        assert sorted(gpus) == sorted(row[0] for row in _smi("uuid"))
        assert monitor.check(nvml, gpus) == []
        samples = {s["uuid"]: s for s in monitor.samples(nvml, gpus)}
        totals = {row[0]: int(row[1]) for row in _smi("uuid", "memory.total")}
        assert sorted(samples) == sorted(totals)
        for uuid, sample in samples.items():
            assert 0 <= sample["util"] <= 100
            assert 0 <= sample["mem_used_mb"] <= totals[uuid]
            assert 0 < sample["temperature"] < 95
            assert 0 <= sample["power_mw"] < 2_000_000
        events = monitor._event_set(nvml, gpus)  # registering may be refused (then None)
        if events is not None:
            with pytest.raises(nvml.NVMLError_Timeout):  # a healthy GPU: no Xid in 100 ms
                nvml.nvmlEventSetWait_v2(events, 100)
            nvml.nvmlEventSetFree(events)
    finally:
        nvml.nvmlShutdown()


@pytest.fixture
def state_home() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="gpusched-realgpu-"))
    os.chmod(root, 0o755)  # the PostgreSQL user must reach the data directory
    yield root
    subprocess.run([str(BIN / "gpusched"), "down"], env={**_plain_env(), "XDG_STATE_HOME":
                   str(root)}, capture_output=True, timeout=120)
    shutil.rmtree(root, ignore_errors=True)


def test_a_job_sees_exactly_its_gpus_through_cuda(state_home: Path) -> None:
    env = {**_plain_env(), "XDG_STATE_HOME": str(state_home)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / args[0]), *args[1:]], env=env, capture_output=True,
                              text=True, cwd=state_home, timeout=180)

    uuids = [row[0] for row in _smi("uuid")]
    up = run("gpusched", "up")
    assert up.returncode == 0, up.stderr
    assert "found through NVML" in up.stdout, up.stdout
    probe = state_home / "probe.py"
    probe.write_text(CUDA_PROBE)
    os.chmod(probe, 0o644)
    seen = {}
    for gpus in (len(uuids), 1, 0):
        done = run("gsubmit", "--parsable", "--wait", "--gpus", str(gpus), "--wrap",
                   f"echo visible=$CUDA_VISIBLE_DEVICES; {sys.executable} {probe}")
        assert done.returncode == 0, (done.stdout, done.stderr)
        job = done.stdout.split()[0]
        out = (state_home / f"gpusched-{job}.out").read_text()
        lines = out.split()
        assert lines[0].startswith("visible="), out
        given = [u for u in lines[0].removeprefix("visible=").split(",") if u]
        assert len(given) == gpus and set(given) <= set(uuids), out
        assert lines[1:] == given, out  # CUDA shows those GPUs, in that order, and no other
        seen[gpus] = given
    assert sorted(seen[len(uuids)]) == sorted(uuids)
