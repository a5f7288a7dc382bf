"""Applying a MIG layout to a GPU through the real pynvml against the fake NVML
(gpusched.agent.migconfig), in a child process as the agent would."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.nvml_fixture import FakeNvml

BIN = Path(sys.executable).parent
MIXED = ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]

APPLY = """
import json, sys
from dataclasses import asdict
from gpusched.agent.migconfig import apply_layout, MigConfigError
gpu, layout, busy = json.loads(sys.argv[1])
try:
    done = apply_layout(gpu, layout, busy)
except MigConfigError as exc:
    print(json.dumps({"error": type(exc).__name__, "message": exc.message}))
else:
    print(json.dumps({"uuid": done.gpu_uuid, "model": done.model, "layout": done.layout,
                      "created": done.created, "destroyed": done.destroyed,
                      "slices": [asdict(s) for s in done.slices]}))
"""


def apply(fake: FakeNvml, gpu: int | str, layout: Any, busy: list[str] | None = None) -> dict[str, Any]:
    res = subprocess.run([sys.executable, "-c", APPLY, json.dumps([gpu, layout, busy or []])],
                         env=fake.env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def inventory(fake: FakeNvml, tmp_path: Path) -> list[dict[str, Any]]:
    config = tmp_path / "gpusched.toml"
    config.write_text('[agent]\nnode_name = "n1"\n[agent.gpus]\nsource = "nvml"\n')
    res = subprocess.run([str(BIN / "gpusched"), "agent", "inventory", "--json", "--config",
                          str(config)], capture_output=True, text=True, env=fake.env(), timeout=60)
    assert res.returncode == 0, res.stderr
    gpus: list[dict[str, Any]] = json.loads(res.stdout)["gpus"]
    return gpus


def mig_log(fake: FakeNvml) -> list[str]:
    path = Path(str(fake.fault_path) + ".mig")
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture
def mixed(fake_nvml_factory: Callable[..., FakeNvml]) -> FakeNvml:
    """4 x A100 80GB: GPU 0 is 3g+2g+1g+1g, GPU 1 is 7 x 1g.10gb, GPUs 2-3 MIG off."""
    return fake_nvml_factory("mixed_mig.json")


def test_a_layout_applied_to_an_idle_gpu_gives_new_slices(mixed: FakeNvml, tmp_path: Path) -> None:
    spec = mixed.inventory["gpus"][1]
    before = {m["gi"]: m["uuid"] for m in spec["mig_devices"]}  # GI 7 + start
    done = apply(mixed, spec["uuid"], MIXED)
    assert "error" not in done, done
    assert (done["uuid"], done["model"]) == (spec["uuid"], "a100-80gb")
    assert sorted(done["layout"]) == sorted(MIXED)
    # The 1g slices at memory slices 2 and 3 (GI 9 and 10) stay; 3g at 4 and 2g at 0 are new.
    kept = {s["uuid"] for s in done["slices"] if s["mig_profile"] == "1g.10gb"}
    assert kept == {before[9], before[10]}
    assert sorted(done["destroyed"]) == sorted(before[g] for g in (7, 8, 11, 12, 13))
    assert len(done["created"]) == 2 and not set(done["created"]) & set(before.values())
    new = {s["mig_profile"]: s for s in done["slices"] if s["uuid"] in done["created"]}
    assert (new["3g.40gb"]["memory_mb"], new["3g.40gb"]["gi_id"]) == (40192, 2)
    assert (new["2g.20gb"]["memory_mb"], new["2g.20gb"]["gi_id"]) == (19968, 3)
    assert all(s["parent"] == 1 and s["type"] == "a100-80gb" for s in done["slices"])
    assert [s["index"] for s in done["slices"]] == [200, 201, 202, 203]

    # The agent's inventory, read later by another process, has the same slices.
    found = inventory(mixed, tmp_path)
    assert [g for g in found if g["parent"] == 1] == done["slices"]
    assert len([g for g in found if g["parent"] == 0]) == 4
    # What the driver was asked: the unwanted instances went, the new ones came, largest first.
    ops = [line.split()[0] for line in mig_log(mixed)]
    assert ops == ["ci-destroy", "gi-destroy"] * 5 + ["gi-create", "ci-create"] * 2
    assert "profile=9 start=4" in mig_log(mixed)[10] and "profile=14 start=0" in mig_log(mixed)[12]

    # The same layout again changes nothing.
    again = apply(mixed, 1, list(reversed(MIXED)))
    assert again["slices"] == done["slices"] and again["created"] == again["destroyed"] == []
    assert len(mig_log(mixed)) == 14


def test_a_gpu_emptied_and_refilled(mixed: FakeNvml) -> None:
    empty = apply(mixed, 0, [])
    assert empty["slices"] == [] and len(empty["destroyed"]) == 4
    whole = apply(mixed, 0, ["7g.80gb"])
    assert [(s["mig_profile"], s["memory_mb"], s["gi_id"]) for s in whole["slices"]] == [
        ("7g.80gb", 80896, 0)]


def test_a_busy_gpu_is_refused_and_left_unchanged(mixed: FakeNvml, tmp_path: Path) -> None:
    before = inventory(mixed, tmp_path)
    held = mixed.inventory["gpus"][1]["mig_devices"][3]["uuid"]
    got = apply(mixed, 1, ["7g.80gb"], busy=[held])
    assert got == {"error": "GpuBusy", "message": f"GPU {mixed.inventory['gpus'][1]['uuid']} is in use: "
                                                  f"{held} given to jobs"}
    mixed.inject("proc 1 4242 512 mig 12 0")
    got = apply(mixed, 1, ["7g.80gb"])
    assert got["error"] == "GpuBusy" and "processes 4242 run on it" in got["message"]
    # A job on the whole GPU's UUID counts too, and so does a process on another slice.
    assert apply(mixed, 0, MIXED[:2], busy=[mixed.inventory["gpus"][0]["uuid"]])["error"] == "GpuBusy"
    mixed.inject("proc 0 77 100")
    assert "processes 77 run on it" in apply(mixed, 0, MIXED[:2])["message"]
    assert mig_log(mixed) == []
    assert inventory(mixed, tmp_path) == before


@pytest.mark.parametrize(("gpu", "layout", "message"), [
    (1, ["3g.40gb", "4g.40gb", "1g.10gb"], "needs 8 compute slices; a100-80gb has 7"),
    (1, ["1g.5gb"], "'1g.5gb' is not a MIG profile of a100-80gb"),
    (1, ["1g.10gb"] * 8, "at most 7 instances"),
    (1, "3g.40gb", "a list of profile names"),
    (2, ["7g.80gb"], "is not in MIG mode"),
    (9, ["7g.80gb"], "no GPU 9 here"),
    ("MIG-x", ["7g.80gb"], "is not a GPU UUID"),
])
def test_an_invalid_request_changes_nothing(mixed: FakeNvml, tmp_path: Path, gpu: int | str,
                                            layout: Any, message: str) -> None:
    before = inventory(mixed, tmp_path)
    got = apply(mixed, gpu, layout)
    assert got["error"] == "MigConfigError" and message in got["message"], got
    assert mig_log(mixed) == []
    assert inventory(mixed, tmp_path) == before


def test_an_a100_40gb_takes_its_own_profiles(fake_nvml_factory: Callable[..., FakeNvml],
                                             tmp_path: Path) -> None:
    inv = tmp_path / "a100_40.json"
    inv.write_text(json.dumps({"gpus": [{"uuid": "GPU-0a100040-0000-0000-0000-000000000000",
                                         "name": "NVIDIA A100-SXM4-40GB", "memory_mb": 40960,
                                         "pci_bus_id": "00000000:07:00.0", "mig": True}]}))
    fake = fake_nvml_factory(inv)
    done = apply(fake, 0, ["1g.5gb"] * 3 + ["1g.10gb", "2g.10gb"])
    assert sorted(done["layout"]) == ["1g.10gb", "1g.5gb", "1g.5gb", "1g.5gb", "2g.10gb"]
    assert {s["mig_profile"]: s["memory_mb"] for s in done["slices"]} == {
        "1g.5gb": 4864, "1g.10gb": 9856, "2g.10gb": 9856}
    assert apply(fake, 0, ["1g.10gb"] * 5)["message"].endswith("takes at most 4 x 1g.10gb, not 5")


def test_a_lost_gpu_is_an_error_not_a_crash(mixed: FakeNvml) -> None:
    mixed.inject("lost 1")
    got = apply(mixed, 1, ["7g.80gb"])
    assert got == {"error": "MigConfigError", "message": "GPU 1: GPU is lost"}
    assert mig_log(mixed) == []


def test_the_fake_driver_and_the_planner_agree_on_every_model(
        fake_nvml_factory: Callable[..., FakeNvml], tmp_path: Path) -> None:
    from gpusched.core.mig_layout import MODELS

    names = {"a100-40gb": ("NVIDIA A100-SXM4-40GB", 40960), "a100-80gb": ("NVIDIA A100-SXM4-80GB", 81920),
             "h100-80gb": ("NVIDIA H100 80GB HBM3", 81559)}
    inv = tmp_path / "models.json"
    inv.write_text(json.dumps({"gpus": [
        {"uuid": f"GPU-{i}", "name": name, "memory_mb": mb, "pci_bus_id": f"0:{i + 1}:0.0", "mig": True}
        for i, (name, mb) in enumerate(names.values())]}))
    code = """
import ctypes, json
from gpusched.agent.nvml import gpu_type, instance_profiles, load
N = load()
out = {}
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    model = out.setdefault(gpu_type(N.nvmlDeviceGetName(h)), {})
    for name, info in instance_profiles(N, h).items():
        n = ctypes.c_uint(0)
        N.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, None, ctypes.byref(n))
        arr = (N.c_nvmlGpuInstancePlacement_t * n.value)()
        N.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, arr, ctypes.byref(n))
        model[name] = [info.sliceCount, arr[0].size, [p.start for p in arr], info.instanceCount,
                       info.memorySizeMB]
print(json.dumps(out))
"""
    res = subprocess.run([sys.executable, "-c", code], env=fake_nvml_factory(inv).env(),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    driver = json.loads(res.stdout)
    assert set(driver) == set(MODELS) == set(names)
    for model, profiles in MODELS.items():
        assert driver[model] == {p.name: [p.slices, p.size, list(p.starts), p.instances, p.memory_mb]
                                 for p in profiles.values()}, model


def test_the_planner_target_applied_by_the_agent(mixed: FakeNvml, tmp_path: Path) -> None:
    """The building blocks together: slices read from NVML, a plan for a waiting demand,
    the plan applied, the new slice in the inventory."""
    from gpusched.core.mig_layout import MigDemand, MigGpu, plan_layouts

    found = inventory(mixed, tmp_path)
    held = {g["uuid"] for g in found if g["parent"] == 0 and g["mig_profile"] == "3g.40gb"}
    assert len(held) == 1  # GPU 0's 3g.40gb runs a job
    gpus = [MigGpu(g["uuid"], g["type"],
                   tuple(s["mig_profile"] for s in found if s["parent"] == g["index"]),
                   tuple(s["mig_profile"] for s in found if s["parent"] == g["index"] and s["uuid"] in held))
            for g in found if g["parent"] is None and any(s["parent"] == g["index"] for s in found)]
    plan = plan_layouts(gpus, [MigDemand("4g.40gb", 1, 120.0)], now=1000.0, min_interval=600.0)
    gpu1 = mixed.inventory["gpus"][1]["uuid"]
    assert plan == {gpu1: ("4g.40gb", "1g.10gb", "1g.10gb", "1g.10gb")}
    done = apply(mixed, gpu1, list(plan[gpu1]), busy=sorted(held))
    assert sorted(done["layout"]) == sorted(plan[gpu1])
    after = [g for g in inventory(mixed, tmp_path) if g["parent"] == 1]
    assert [g["mig_profile"] for g in after].count("4g.40gb") == 1
    # The three 1g slices at 4, 5 and 6 kept their UUIDs.
    assert {g["uuid"] for g in after if g["mig_profile"] == "1g.10gb"} == {
        m["uuid"] for m in mixed.inventory["gpus"][1]["mig_devices"] if m["gi"] in (11, 12, 13)}
