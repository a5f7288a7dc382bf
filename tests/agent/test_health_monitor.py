"""The agent's health loop through the real pynvml and the fake NVML library, in a
process of its own (pynvml loads the library once per process)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.nvml_fixture import FakeNvml, inventory_path

# Runs the monitor, applies each batch of faults in turn, and prints what it reported.
SCRIPT = """
import json, sys, threading, time
from gpusched.agent.health import HealthMonitor
batches, ignored = json.loads(sys.argv[2]), frozenset(json.loads(sys.argv[3]))
got = []
monitor = HealthMonitor(lambda faults: got.extend(faults), ignored, 90, 0.2)
thread = threading.Thread(target=monitor.run, daemon=True)
thread.start()
time.sleep(0.5)
for batch in batches:
    with open(sys.argv[1], "a") as faults:
        faults.write("".join(line + "\\n" for line in batch))
    time.sleep(0.8)
monitor.stop.set()
thread.join(5)
print(json.dumps([[f.uuid, f.reason] for f in got]))
"""


def monitor(fake: FakeNvml, batches: list[list[str]], ignored: tuple[int, ...] = (13, 31, 43, 45, 68, 109)
            ) -> list[tuple[str, str]]:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(fake.fault_path), json.dumps(batches),
         json.dumps(list(ignored))], env=fake.env(), capture_output=True, text=True, timeout=60,
        cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr
    return [tuple(f) for f in json.loads(result.stdout)]  # type: ignore[misc]


def test_events_and_conditions_name_the_right_gpu(fake_nvml: FakeNvml) -> None:
    uuids = [g["uuid"] for g in fake_nvml.inventory["gpus"]]
    got = monitor(fake_nvml, [["xid 1 13", "xid 3 79"], ["ecc 6"], ["lost 2"], ["xid 4 48"],
                              ["temp 7 91"]])
    assert got[:3] == [(uuids[3], "Xid 79"), (uuids[6], "double-bit ECC error"),
                       (uuids[2], "GPU lost (NVML_ERROR_GPU_IS_LOST)")]
    # Events still arrive from the other GPUs once one is lost.
    assert (uuids[4], "Xid 48") in got[3:]
    assert (uuids[7], "temperature 91 C over the 90 C limit") in got[3:]
    assert all(u != uuids[1] for u, _ in got)  # Xid 13 is the application's own
    # A lasting condition is reported once a minute, not at every check.
    assert got.count((uuids[2], "GPU lost (NVML_ERROR_GPU_IS_LOST)")) == 1


def test_row_remapping_failure(fake_nvml: FakeNvml) -> None:
    uuids = [g["uuid"] for g in fake_nvml.inventory["gpus"]]
    assert monitor(fake_nvml, [["remap 6 failure"]]) == [(uuids[6], "row remapping failed")]


def test_the_ignore_list_is_configurable(fake_nvml: FakeNvml) -> None:
    uuids = [g["uuid"] for g in fake_nvml.inventory["gpus"]]
    assert monitor(fake_nvml, [["xid 0 13", "xid 1 79"]], ignored=(79,)) == [(uuids[0], "Xid 13")]


@pytest.mark.parametrize("event_device", ["mig", "parent"])
def test_a_mig_event_names_its_slice(fake_nvml_factory: Callable[..., FakeNvml], tmp_path: Path,
                                     event_device: str) -> None:
    """Real NVML names the parent GPU and the instance ids; either way the slice is found."""
    inventory = json.loads(inventory_path("mixed_mig.json").read_text())
    inventory["mig_event_device"] = event_device
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    fake = fake_nvml_factory(tmp_path / "inventory.json")
    slices = fake.inventory["gpus"][0]["mig_devices"]
    target = slices[1]
    got = monitor(fake, [[f"xid 0 94 mig {target['gi']} {target['ci']}"], ["xid 3 79"]])
    assert got == [(target["uuid"], "Xid 94"), (fake.inventory["gpus"][3]["uuid"], "Xid 79")]


# Starts the monitor, re-partitions GPU 0 in the same process (as the agent does for
# dynamic MIG), then injects an Xid on the new slice's instances; prints what was
# reported and the new slice's UUID.
REPARTITION = """
import json, sys, threading, time
from gpusched.agent.health import HealthMonitor
from gpusched.agent.migconfig import apply_layout
from gpusched.agent.nvml import load
got = []
monitor = HealthMonitor(lambda faults: got.extend(faults), frozenset(), 90, 0.2)
thread = threading.Thread(target=monitor.run, daemon=True)
thread.start()
time.sleep(0.5)
applied = apply_layout(0, ["1g.10gb"])
(new,) = applied.created
nvml = load()
parent = nvml.nvmlDeviceGetHandleByIndex(0)
for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
    try:
        device = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, i)
    except nvml.NVMLError:
        continue
    uuid = nvml.nvmlDeviceGetUUID(device)
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    if uuid == new:
        where = (nvml.nvmlDeviceGetGpuInstanceId(device), nvml.nvmlDeviceGetComputeInstanceId(device))
with open(sys.argv[1], "a") as faults:
    faults.write(f"xid 0 94 mig {where[0]} {where[1]}\\n")
time.sleep(0.8)
monitor.stop.set()
thread.join(5)
print(json.dumps({"got": [[f.uuid, f.reason] for f in got], "new": new}))
"""


def test_an_xid_on_a_slice_made_since_the_monitor_started_names_that_slice(
        fake_nvml_factory: Callable[..., FakeNvml], tmp_path: Path) -> None:
    gpu = {"uuid": "GPU-5a0b7c1d-0000-4000-8000-00000000a200", "name": "NVIDIA A100 80GB PCIe",
           "memory_mb": 81920, "pci_bus_id": "00000000:17:00.0", "mig": True,
           "mig_devices": [{"uuid": "MIG-5a0b7c1d-0000-4000-8000-00000000a207",
                            "profile": "7g.80gb", "slices": 7, "memory_mb": 80896, "gi": 0,
                            "ci": 0}]}
    (tmp_path / "inventory.json").write_text(json.dumps({"mig_event_device": "parent",
                                                         "gpus": [gpu]}))
    fake = fake_nvml_factory(tmp_path / "inventory.json")
    result = subprocess.run(
        [sys.executable, "-c", REPARTITION, str(fake.fault_path)], env=fake.env(),
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["got"] == [[seen["new"], "Xid 94"]]
