"""The fake NVML's MIG re-partitioning (GPU and compute instances), through the real pynvml.

Each check runs pynvml in a child process with FakeNvml.env(); the child prints one JSON
document with what it saw.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.nvml_fixture import FakeNvml

Factory = Callable[..., FakeNvml]

PRELUDE = """
import json, sys
import pynvml as N
N.nvmlInit()
out = {}
def err(f, *a):
    try:
        return f(*a)
    except N.NVMLError as e:
        return type(e).__name__
def gpu(i):
    return N.nvmlDeviceGetHandleByIndex(i)
def migs(h):
    found = []
    for k in range(N.nvmlDeviceGetMaxMigDeviceCount(h)):
        m = err(N.nvmlDeviceGetMigDeviceHandleByIndex, h, k)
        if isinstance(m, str):
            continue
        a = N.nvmlDeviceGetAttributes(m)
        found.append({"uuid": N.nvmlDeviceGetUUID(m), "gi": N.nvmlDeviceGetGpuInstanceId(m),
                      "ci": N.nvmlDeviceGetComputeInstanceId(m), "name": N.nvmlDeviceGetName(m),
                      "memory_mb": N.nvmlDeviceGetMemoryInfo(m).total // 2**20,
                      "slices": a.gpuInstanceSliceCount, "ci_slices": a.computeInstanceSliceCount,
                      "sm": a.multiprocessorCount})
    return found
def gis(h):
    found = []
    for e in range(N.NVML_GPU_INSTANCE_PROFILE_COUNT):
        info = err(N.nvmlDeviceGetGpuInstanceProfileInfo, h, e)
        if isinstance(info, str):
            continue
        arr = (N.c_nvmlGpuInstance_t * info.instanceCount)()
        n = N.c_uint(0)
        N.nvmlDeviceGetGpuInstances(h, info.id, arr, N.byref(n))
        for i in range(n.value):
            gi = N.nvmlGpuInstanceGetInfo(arr[i])
            found.append((gi.id, gi.profileId, gi.placement.start, gi.placement.size))
    return sorted(found)
def cis(gi_handle):
    found = []
    for p in range(N.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
        arr = (N.c_nvmlComputeInstance_t * 8)()
        n = N.c_uint(0)
        if isinstance(err(N.nvmlGpuInstanceGetComputeInstances, gi_handle, p, arr, N.byref(n)), str):
            continue
        found.extend(arr[i] for i in range(n.value))
    return found
def clear(h):
    for gi_id, *_ in gis(h):
        g = N.nvmlDeviceGetGpuInstanceById(h, gi_id)
        for c in cis(g):
            N.nvmlComputeInstanceDestroy(c)
        N.nvmlGpuInstanceDestroy(g)
def create(h, profile_enum, start=None):
    info = N.nvmlDeviceGetGpuInstanceProfileInfo(h, profile_enum)
    if start is None:
        g = err(N.nvmlDeviceCreateGpuInstance, h, info.id)
    else:
        size = {0: 1, 9: 2, 1: 2, 2: 4, 3: 4, 4: 8}[profile_enum]
        p = N.c_nvmlGpuInstancePlacement_t(start, size)
        g = err(N.nvmlDeviceCreateGpuInstanceWithPlacement, h, info.id, N.byref(p))
    if isinstance(g, str):
        return g
    c = N.nvmlGpuInstanceCreateComputeInstance(g, {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}[info.sliceCount])
    return N.nvmlComputeInstanceGetInfo(c)
"""


def run(fake: FakeNvml, body: str, **extra_env: str) -> dict[str, Any]:
    env = fake.env()
    env.update(extra_env)
    res = subprocess.run([sys.executable, "-c", PRELUDE + body + "\nprint(json.dumps(out))"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    data: dict[str, Any] = json.loads(res.stdout)
    data["_stderr"] = res.stderr
    return data


def log_lines(fake: FakeNvml) -> list[dict[str, str]]:
    path = Path(str(fake.fault_path) + ".mig")
    if not path.exists():
        return []
    lines = []
    for line in path.read_text().splitlines():
        op, *fields = line.split()
        lines.append({"op": op, **dict(w.split("=", 1) for w in fields)})
    return lines


def test_profiles_and_placements_of_an_a100_80gb(fake_nvml_factory: Factory) -> None:
    got = run(fake_nvml_factory("mixed_mig.json"), """
h = gpu(0)
for e in (N.NVML_GPU_INSTANCE_PROFILE_1_SLICE, N.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
          N.NVML_GPU_INSTANCE_PROFILE_2_SLICE, N.NVML_GPU_INSTANCE_PROFILE_3_SLICE,
          N.NVML_GPU_INSTANCE_PROFILE_4_SLICE, N.NVML_GPU_INSTANCE_PROFILE_7_SLICE):
    v2 = N.nvmlDeviceGetGpuInstanceProfileInfo(h, e)
    v1 = N.nvmlDeviceGetGpuInstanceProfileInfo(h, e, 1)
    assert (v1.id, v1.memorySizeMB, v1.sliceCount) == (v2.id, v2.memorySizeMB, v2.sliceCount)
    n = N.c_uint(0)
    N.nvmlDeviceGetGpuInstancePossiblePlacements(h, v2.id, None, N.byref(n))
    arr = (N.c_nvmlGpuInstancePlacement_t * n.value)()
    N.nvmlDeviceGetGpuInstancePossiblePlacements(h, v2.id, arr, N.byref(n))
    out[v2.name if isinstance(v2.name, str) else v2.name.decode()] = [v2.id, v2.sliceCount, v2.instanceCount, v2.memorySizeMB,
                             [(p.start, p.size) for p in arr],
                             N.nvmlDeviceGetGpuInstanceRemainingCapacity(h, v2.id)]
out["gfx"] = err(N.nvmlDeviceGetGpuInstanceProfileInfo, h, N.NVML_GPU_INSTANCE_PROFILE_1_SLICE_GFX)
out["off"] = N.nvmlDeviceGetGpuInstanceProfileInfo(gpu(2), 0).memorySizeMB
out["off_create"] = err(N.nvmlDeviceCreateGpuInstance, gpu(2), 19)
out["bad_id"] = err(N.nvmlDeviceGetGpuInstanceRemainingCapacity, h, 3)
out["gis"] = gis(h)
""")
    # GPU 0 holds 3g.40gb at 4 (GI 2), 2g.20gb at 0 (GI 3), 1g.10gb at 2 and 3 (GI 9, 10):
    # every memory slice is taken.
    assert got["MIG 1g.10gb"] == [19, 1, 7, 9728, [[s, 1] for s in range(7)], 0]
    assert got["MIG 1g.20gb"] == [15, 1, 4, 19968, [[0, 2], [2, 2], [4, 2], [6, 2]], 0]
    assert got["MIG 2g.20gb"] == [14, 2, 3, 19968, [[0, 2], [2, 2], [4, 2]], 0]
    assert got["MIG 3g.40gb"] == [9, 3, 2, 40192, [[0, 4], [4, 4]], 0]
    assert got["MIG 4g.40gb"] == [5, 4, 1, 40192, [[0, 4]], 0]
    assert got["MIG 7g.80gb"] == [0, 7, 1, 80896, [[0, 8]], 0]
    assert got["gfx"] == got["off_create"] == "NVMLError_NotSupported"
    assert got["off"] == 9728  # MIG off: the profiles are known, nothing can be made
    assert got["bad_id"] == "NVMLError_InvalidArgument"
    assert got["gis"] == [[2, 9, 4, 4], [3, 14, 0, 2], [9, 19, 2, 1], [10, 19, 3, 1]]


def test_static_compute_instances_are_the_inventory_mig_devices(fake_nvml_factory: Factory) -> None:
    fake = fake_nvml_factory("mixed_mig.json")
    got = run(fake, """
h = gpu(0)
out["cis"] = []
for gi_id, *_ in gis(h):
    for c in cis(N.nvmlDeviceGetGpuInstanceById(h, gi_id)):
        info = N.nvmlComputeInstanceGetInfo(c)
        out["cis"].append([gi_id, info.id, info.profileId, info.placement.start, info.placement.size,
                           N.nvmlDeviceGetUUID(info.device)])
""")
    spec = {m["uuid"]: m for m in fake.inventory["gpus"][0]["mig_devices"]}
    assert len(got["cis"]) == 4
    for gi_id, ci_id, profile, start, size, uuid in got["cis"]:
        assert (spec[uuid]["gi"], spec[uuid]["ci"]) == (gi_id, ci_id)
        assert (start, size) == (0, spec[uuid]["slices"])
        assert profile == {1: 0, 2: 1, 3: 2}[spec[uuid]["slices"]]


def test_repartition_makes_new_mig_devices_that_outlive_shutdown(fake_nvml_factory: Factory) -> None:
    fake = fake_nvml_factory("mixed_mig.json")
    old = {m["uuid"] for m in fake.inventory["gpus"][1]["mig_devices"]}
    got = run(fake, """
h = gpu(1)
clear(h)
out["empty"] = migs(h)
out["cap"] = [N.nvmlDeviceGetGpuInstanceRemainingCapacity(h, i) for i in (19, 15, 14, 9, 5, 0)]
out["3g"] = create(h, N.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 4).id
out["2g"] = create(h, N.NVML_GPU_INSTANCE_PROFILE_2_SLICE).id
out["1g"] = create(h, N.NVML_GPU_INSTANCE_PROFILE_1_SLICE).id
out["1g_b"] = create(h, N.NVML_GPU_INSTANCE_PROFILE_1_SLICE).id
out["full"] = create(h, N.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
out["bad_start"] = create(h, N.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 2)
out["gis"] = gis(h)
out["migs"] = migs(h)
N.nvmlShutdown()
N.nvmlInit()
out["after"] = migs(gpu(1))
""")
    assert got["empty"] == []
    assert got["cap"] == [7, 4, 3, 2, 1, 1]
    assert got["full"] == "NVMLError_InsufficientResources"
    assert got["bad_start"] == "NVMLError_InvalidArgument"
    assert got["gis"] == [[2, 9, 4, 4], [3, 14, 0, 2], [9, 19, 2, 1], [10, 19, 3, 1]]
    made = got["migs"]
    assert [(m["gi"], m["ci"], m["slices"], m["memory_mb"]) for m in made] == [
        (2, 0, 3, 40192), (3, 0, 2, 19968), (9, 0, 1, 9728), (10, 0, 1, 9728)]
    assert made[0]["name"] == "NVIDIA A100 80GB PCIe MIG 3g.40gb"
    uuids = [m["uuid"] for m in made]
    assert all(u.startswith("MIG-") and len(u) == 40 for u in uuids)
    assert len(set(uuids)) == 4 and not set(uuids) & old
    assert got["after"] == made  # the layout outlives nvmlShutdown
    # A process that starts later sees it too, and GPU 0 is untouched.
    later = run(fake, "out['migs'] = migs(gpu(1)); out['gpu0'] = len(migs(gpu(0)))")
    assert later["migs"] == made and later["gpu0"] == 4
    ops = [(line["op"], line["result"]) for line in log_lines(fake)]
    assert ops[:14] == [("ci-destroy", "SUCCESS"), ("gi-destroy", "SUCCESS")] * 7
    assert ops[14:] == [("gi-create", "SUCCESS"), ("ci-create", "SUCCESS")] * 4 + [
        ("gi-create", "INSUFFICIENT_RESOURCES"), ("gi-create", "INVALID_ARGUMENT")]
    creates = [line for line in log_lines(fake) if line["op"] == "ci-create"]
    assert [c["uuid"] for c in creates] == uuids


def test_without_a_log_the_layout_ends_with_the_last_shutdown(fake_nvml_factory: Factory) -> None:
    fake = fake_nvml_factory("mixed_mig.json")
    got = run(fake, """
h = gpu(1)
clear(h)
out["during"] = len(migs(h))
N.nvmlShutdown()
N.nvmlInit()
out["after"] = len(migs(gpu(1)))
""", FAKENVML_MIG_LOG="")
    assert (got["during"], got["after"]) == (0, 7)
    assert log_lines(fake) == []


def test_processes_keep_their_instances(fake_nvml_factory: Factory) -> None:
    fake = fake_nvml_factory("mixed_mig.json")
    fake.inject("proc 0 4242 1000 mig 2 0")
    fake.inject("proc 0 4343 500 mig 9 0")
    fake.inject("proc 3 99 2000")
    body = """
h = gpu(0)
out["on_gpu"] = sorted((p.pid, p.usedGpuMemory // 2**20, p.gpuInstanceId, p.computeInstanceId)
                       for p in N.nvmlDeviceGetComputeRunningProcesses(h))
out["on_whole"] = [p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(gpu(3))]
m = N.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
out["on_mig"] = [p.pid for p in N.nvmlDeviceGetComputeRunningProcesses(m)]
g = N.nvmlDeviceGetGpuInstanceById(h, 2)
c = cis(g)[0]
out["ci"] = err(N.nvmlComputeInstanceDestroy, c)
out["gi"] = err(N.nvmlGpuInstanceDestroy, g)
out["count"] = len(migs(h))
"""
    got = run(fake, body)
    assert got["on_gpu"] == [[4242, 1000, 2, 0], [4343, 500, 9, 0]]
    assert got["on_whole"] == [99] and got["on_mig"] == [4242]
    assert got["ci"] == "NVMLError_InUse"
    assert got["gi"] == "NVMLError_InUse"  # it still has its compute instance
    assert got["count"] == 4
    assert [(x["op"], x["result"]) for x in log_lines(fake)] == [("ci-destroy", "IN_USE"),
                                                                 ("gi-destroy", "IN_USE")]
    fake.inject("endproc 0 4242")
    got = run(fake, body)
    assert got["on_mig"] == [] and got["ci"] == got["gi"] == 0 and got["count"] == 3


def test_stale_and_bogus_instance_handles_are_rejected(fake_nvml_factory: Factory) -> None:
    got = run(fake_nvml_factory("mixed_mig.json"), """
h = gpu(1)
g = N.nvmlDeviceGetGpuInstanceById(h, 7)
c = cis(g)[0]
m = N.nvmlComputeInstanceGetInfo(c).device
N.nvmlComputeInstanceDestroy(c)
N.nvmlGpuInstanceDestroy(g)
out["gi_again"] = err(N.nvmlGpuInstanceDestroy, g)
out["gi_info"] = err(N.nvmlGpuInstanceGetInfo, g)
out["ci_again"] = err(N.nvmlComputeInstanceDestroy, c)
out["mig_uuid"] = err(N.nvmlDeviceGetUUID, m)
out["by_id"] = err(N.nvmlDeviceGetGpuInstanceById, h, 7)
out["bogus"] = err(N.nvmlGpuInstanceDestroy, N.c_nvmlGpuInstance_t())
out["ci_profile"] = err(N.nvmlGpuInstanceCreateComputeInstance, N.nvmlDeviceGetGpuInstanceById(h, 8), 2)
""")
    assert got["gi_again"] == got["gi_info"] == got["ci_again"] == "NVMLError_InvalidArgument"
    assert got["mig_uuid"] == got["bogus"] == "NVMLError_InvalidArgument"
    assert got["by_id"] == "NVMLError_NotFound"
    assert got["ci_profile"] == "NVMLError_NotSupported"  # a 3-slice CI in a 1-slice GI


def test_gpus_that_cannot_be_repartitioned(fake_nvml_factory: Factory, tmp_path: Path) -> None:
    inv = tmp_path / "odd.json"
    inv.write_text(json.dumps({"gpus": [
        {"uuid": "GPU-1", "name": "NVIDIA A100-SXM4-40GB", "memory_mb": 40960, "pci_bus_id": "0:1:0.0",
         "mig": True, "mig_devices": [{"uuid": "MIG-1", "profile": "1g.5gb", "slices": 1,
                                       "memory_mb": 4864, "gi": 1, "ci": 0}]},
        {"uuid": "GPU-2", "name": "NVIDIA A100-SXM4-40GB", "memory_mb": 40960, "pci_bus_id": "0:2:0.0",
         "mig": False},
        {"uuid": "GPU-3", "name": "NVIDIA A100-SXM4-40GB", "memory_mb": 40960, "pci_bus_id": "0:3:0.0",
         "mig": True, "mig_model": "none"},
        {"uuid": "GPU-4", "name": "Made Up", "memory_mb": 40960, "pci_bus_id": "0:4:0.0",
         "mig": True, "mig_model": "a100-40gb"},
    ]}))
    got = run(fake_nvml_factory(inv), """
for i in range(4):
    made = err(N.nvmlDeviceCreateGpuInstance, gpu(i), 19)
    out[str(i)] = [made if isinstance(made, str) else "ok",
                   err(lambda: N.nvmlDeviceGetGpuInstanceProfileInfo(gpu(i), 0).memorySizeMB)]
out["made"] = [len(migs(gpu(3))), len(migs(gpu(0)))]
""")
    # GPU 0: GI 1 is a half of the GPU, which a 1g.5gb instance cannot be.
    assert got["0"] == ["NVMLError_NotSupported", 4864]
    assert "GPU 0 cannot be re-partitioned: MIG device 0: GPU instance 1 cannot hold" in got["_stderr"]
    assert got["1"] == ["NVMLError_NotSupported", 4864]  # MIG off: profiles known, nothing made
    assert got["2"] == ["NVMLError_NotSupported", "NVMLError_NotSupported"]  # no model
    assert got["3"] == ["ok", 4864]  # the model named explicitly
    assert got["made"] == [0, 1]  # a GPU instance alone is no MIG device


def test_a_bad_mig_model_is_refused(fake_nvml_factory: Factory, tmp_path: Path) -> None:
    inv = tmp_path / "bad.json"
    inv.write_text(json.dumps({"gpus": [{"uuid": "GPU-1", "name": "x", "memory_mb": 1,
                                         "pci_bus_id": "0:1:0.0", "mig": True, "mig_model": "b200"}]}))
    res = subprocess.run([sys.executable, "-c", "import pynvml\ntry:\n pynvml.nvmlInit()\n"
                          "except pynvml.NVMLError as e:\n print(type(e).__name__)"],
                         env=fake_nvml_factory(inv).env(), capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "NVMLError_Unknown"
    assert '"mig_model" must be a100-40gb, a100-80gb, h100-80gb or none' in res.stderr


def test_changes_raise_mig_config_events(fake_nvml_factory: Factory) -> None:
    got = run(fake_nvml_factory("mixed_mig.json"), """
h = gpu(1)
events = N.nvmlEventSetCreate()
N.nvmlDeviceRegisterEvents(h, N.nvmlEventMigConfigChange, events)
g = N.nvmlDeviceGetGpuInstanceById(h, 13)
N.nvmlComputeInstanceDestroy(cis(g)[0])
N.nvmlGpuInstanceDestroy(g)
create(h, N.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
seen = []
while True:
    e = err(N.nvmlEventSetWait_v2, events, 100)
    if isinstance(e, str):
        break
    seen.append([e.eventType, e.gpuInstanceId])
out["seen"] = seen
out["other"] = err(N.nvmlEventSetWait_v2, events, 10)
""")
    assert got["seen"] == [[N_MIG_CONFIG, NONE]] * 4
    assert got["other"] == "NVMLError_Timeout"


N_MIG_CONFIG = 0x100  # nvmlEventTypeMigConfigChange
NONE = 0xFFFFFFFF
