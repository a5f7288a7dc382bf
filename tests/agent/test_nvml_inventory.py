"""``gpusched agent inventory`` through the real pynvml against the fake NVML library."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

from gpusched.agent.nvml import SLICE_BASE, gpu_type
from tests.nvml_fixture import FakeNvml

BIN = Path(sys.executable).parent


def inventory(fake: FakeNvml | None, tmp_path: Path, source: str = "nvml",
              extra: str = "", driver: bool = True) -> subprocess.CompletedProcess[str]:
    """``driver=False``: the fake library acts as a host without an NVIDIA driver (as
    on CI, but also on a host with real GPUs, whose library it stands in front of)."""
    config = tmp_path / "gpusched.toml"
    config.write_text(f'[agent]\nnode_name = "n1"\n[agent.gpus]\nsource = "{source}"\n{extra}')
    env = fake.env() if fake is not None else None
    if env is not None and not driver:
        env["FAKENVML_CONFIG"] = ""
    return subprocess.run([str(BIN / "gpusched"), "agent", "inventory", "--json",
                           "--config", str(config)], capture_output=True, text=True, env=env,
                          timeout=60)


def answer(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def test_eight_gpus_in_two_nvlink_islands(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    found = answer(inventory(fake_nvml, tmp_path))
    spec = fake_nvml.inventory["gpus"]
    assert (found["source"], found["driver"]) == ("nvml", fake_nvml.inventory["driver"])
    assert [g["uuid"] for g in found["gpus"]] == [g["uuid"] for g in spec]
    assert [g["index"] for g in found["gpus"]] == list(range(8))
    assert {g["type"] for g in found["gpus"]} == {"a100-80gb"}
    assert [g["pci_bus_id"] for g in found["gpus"]] == [g["pci_bus_id"].upper() for g in spec]
    assert all(g["memory_mb"] == 81920 and g["mig_profile"] is None for g in found["gpus"])
    kinds = {(link["a"], link["b"]): (link["kind"], link["nvlinks"]) for link in found["links"]}
    assert len(kinds) == 28  # every pair of 8
    for a in range(8):
        for b in range(a + 1, 8):
            same_island = a // 4 == b // 4
            assert (kinds[(a, b)][0] == "NVLINK") == same_island, (a, b)
            if same_island:
                assert kinds[(a, b)][1] >= 1
    assert kinds[(0, 4)][0] in ("SYSTEM", "NUMA_NODE")


def test_mig_slices_with_profiles_parents_and_indexes(fake_nvml_factory: Callable[..., FakeNvml],
                                                       tmp_path: Path) -> None:
    fake = fake_nvml_factory("mixed_mig.json")
    found = answer(inventory(fake, tmp_path))["gpus"]
    spec = fake.inventory["gpus"]
    whole = [g for g in found if g["parent"] is None]
    assert [g["uuid"] for g in whole] == [g["uuid"] for g in spec]
    for index, gpu in enumerate(spec):
        slices = [g for g in found if g["parent"] == index]
        assert [s["uuid"] for s in slices] == [m["uuid"] for m in gpu.get("mig_devices", [])]
        # The profile is worked out from slices and memory; the inventory says what it is.
        assert [s["mig_profile"] for s in slices] == [m["profile"] for m in gpu.get("mig_devices", [])]
        assert [s["index"] for s in slices] == [(index + 1) * SLICE_BASE + n for n in range(len(slices))]
        assert all(s["uuid"].startswith("MIG-") and s["type"] == gpu_type(gpu["name"]) for s in slices)
    assert len([g for g in found if g["parent"] is not None]) == 11


def test_a_heterogeneous_node_gets_its_types(fake_nvml_factory: Callable[..., FakeNvml],
                                             tmp_path: Path) -> None:
    fake = fake_nvml_factory("hetero.json")
    found = answer(inventory(fake, tmp_path))["gpus"]
    assert [g["type"] for g in found] == [gpu_type(g["name"]) for g in fake.inventory["gpus"]]
    assert {g["type"] for g in found} >= {"h100-80gb", "l4", "t4"}


def test_without_nvml_auto_falls_back_and_nvml_refuses(fake_nvml: FakeNvml,
                                                       tmp_path: Path) -> None:
    auto = answer(inventory(fake_nvml, tmp_path, "auto", "count = 2\n", driver=False))
    assert auto["source"] == "static" and len(auto["gpus"]) == 2
    strict = inventory(fake_nvml, tmp_path, "nvml", "count = 2\n", driver=False)
    assert strict.returncode == 1
    said = [line for line in strict.stderr.splitlines() if not line.startswith("fakenvml: ")]
    assert len(said) == 1 and said[0].startswith("gpusched: error: NVML is not available")
    assert strict.stdout == ""


def test_table_output(fake_nvml: FakeNvml, tmp_path: Path) -> None:
    config = tmp_path / "gpusched.toml"
    config.write_text('[agent]\nnode_name = "n1"\n[agent.gpus]\nsource = "auto"\n')
    result = subprocess.run([str(BIN / "gpusched"), "agent", "inventory", "--config", str(config)],
                            capture_output=True, text=True, env=fake_nvml.env(), timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("node n1: 8 GPUs and MIG slices from nvml (driver ")
    assert lines[1].split()[:4] == ["INDEX", "UUID", "TYPE", "MIG"]
    assert sum(1 for line in lines if line.startswith("link ")) == 28


@pytest.mark.parametrize("inventory_name", ["dgx_a100_8.json", "mixed_mig.json", "hetero.json"])
def test_every_inventory_registers_as_a_valid_node(fake_nvml_factory: Callable[..., FakeNvml],
                                                   tmp_path: Path, inventory_name: str) -> None:
    """What the agent would register passes the static inventory's own validation."""
    from gpusched.config import parse_config

    found = answer(inventory(fake_nvml_factory(inventory_name), tmp_path))
    static = [{k: v for k, v in g.items() if v is not None} for g in found["gpus"]]
    config = parse_config({"agent": {"gpus": {"source": "static", "static": static}}}, "x")
    assert len(config.agent.static_gpus) == len(found["gpus"])
