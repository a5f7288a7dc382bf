"""`gpusched up` uses this host's GPUs when NVML finds some (here the fake NVML library
on the library path), the demo inventory when it finds none, and the demo inventory
whenever `--demo` says so; it says which on the console."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import wait_for
from tests.nvml_fixture import FakeNvml, host_has_gpus

BIN = Path(sys.executable).parent
UUIDS = ("GPU-0a0a0a0a-0000-4000-8000-00000000000a", "GPU-0b0b0b0b-0000-4000-8000-00000000000b")


@pytest.fixture
def state_home() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="gpusched-upgpus-"))
    os.chmod(root, 0o755)  # the PostgreSQL user must reach the data directory
    yield root
    env = {**os.environ, "XDG_STATE_HOME": str(root)}
    env.pop("GPUSCHED_SOCKET", None)
    subprocess.run([str(BIN / "gpusched"), "down"], env=env, capture_output=True, timeout=120)
    shutil.rmtree(root, ignore_errors=True)


def _runner(state_home: Path, env: dict[str, str]) -> Callable[..., subprocess.CompletedProcess[str]]:
    env = {**env, "XDG_STATE_HOME": str(state_home)}
    env.pop("GPUSCHED_SOCKET", None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / args[0]), *args[1:]], env=env, capture_output=True,
                              text=True, cwd=state_home, timeout=180)
    return run


def _visible_devices(run: Callable[..., subprocess.CompletedProcess[str]], home: Path,
                     gpus: int) -> list[str]:
    """Run a job on ``gpus`` GPUs; the CUDA_VISIBLE_DEVICES it saw (set and empty: none;
    unset, which CUDA reads as every device, shows as ``["unset"]``)."""
    submitted = run("gsubmit", "--parsable", "--gpus", str(gpus), "--wrap",
                    "echo visible=${CUDA_VISIBLE_DEVICES-unset}")
    assert submitted.returncode == 0, submitted.stderr
    out = home / f"gpusched-{submitted.stdout.strip()}.out"
    wait_for(lambda: out.exists() and out.read_text().strip(), timeout=60, what="job output")
    line = out.read_text().strip()
    assert line.startswith("visible="), line
    return [uuid for uuid in line.removeprefix("visible=").split(",") if uuid]


def test_up_uses_the_gpus_nvml_finds_and_demo_forces_made_up_ones(
        state_home: Path, tmp_path: Path, fake_nvml_factory: Callable[..., FakeNvml]) -> None:
    inventory = tmp_path / "two.json"
    inventory.write_text(json.dumps({"gpus": [
        {"uuid": uuid, "name": "NVIDIA A100-SXM4-80GB", "memory_mb": 81920,
         "pci_bus_id": f"00000000:{16 + i:02X}:00.0"} for i, uuid in enumerate(UUIDS)]}))
    run = _runner(state_home, fake_nvml_factory(inventory).env())

    up = run("gpusched", "up")
    assert up.returncode == 0, up.stderr
    assert ("GPUs: 2 x a100-80gb found through NVML, driver 580.00.01; the agent uses them"
            in up.stdout), up.stdout
    assert sorted(_visible_devices(run, state_home, 2)) == sorted(UUIDS)
    assert _visible_devices(run, state_home, 0) == []  # asked for none: sees none
    info = json.loads(run("ginfo", "--json").stdout)
    assert info["nodes"][0]["total"] == 2

    assert run("gpusched", "down").returncode == 0
    demo = run("gpusched", "up", "--demo", "--gpus", "3")  # NVML is there: --demo wins
    assert demo.returncode == 0, demo.stderr
    assert ("GPUs: the demo inventory (--demo): 3 demo GPUs per node (made-up UUIDs)"
            in demo.stdout), demo.stdout
    seen = _visible_devices(run, state_home, 3)
    assert len(seen) == 3 and not set(seen) & set(UUIDS)
    assert all(uuid.startswith("GPU-") for uuid in seen)


def test_up_without_nvml_falls_back_to_the_demo_inventory(state_home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKENVML")}
    run = _runner(state_home, env)
    up = run("gpusched", "up", "--gpus", "2")
    assert up.returncode == 0, up.stderr
    if host_has_gpus():  # a host with a real GPU uses it: the NVML line instead
        assert "found through NVML" in up.stdout, up.stdout
        return
    line = next(x for x in up.stdout.splitlines() if x.startswith("GPUs: "))
    assert line.startswith("GPUs: none found (NVML is not available: ")
    assert line.endswith("; using the demo inventory: 2 demo GPUs per node (made-up UUIDs)")
    seen = _visible_devices(run, state_home, 2)
    assert len(seen) == 2 and all(uuid.startswith("GPU-") for uuid in seen)


def test_several_local_nodes_never_share_the_hosts_gpus(
        state_home: Path, fake_nvml_factory: Callable[..., FakeNvml]) -> None:
    run = _runner(state_home, fake_nvml_factory("dgx_a100_8.json").env())
    up = run("gpusched", "up", "--nodes", "2", "--gpus", "1")
    assert up.returncode == 0, up.stderr
    assert ("but 2 local nodes cannot share them; using the demo inventory: 1 demo GPU per "
            "node") in up.stdout, up.stdout


def test_the_demo_runs_on_a_host_with_one_gpu(
        state_home: Path, tmp_path: Path, fake_nvml_factory: Callable[..., FakeNvml]) -> None:
    inventory = tmp_path / "one.json"
    inventory.write_text(json.dumps({"gpus": [
        {"uuid": UUIDS[0], "name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559,
         "pci_bus_id": "00000000:18:00.0"}]}))
    run = _runner(state_home, fake_nvml_factory(inventory).env())
    up = run("gpusched", "up")
    assert up.returncode == 0 and "GPUs: 1 x h100-80gb found through NVML" in up.stdout, up
    shown = run("gpusched", "demo")  # README's ./demo: asks for what the host has
    assert shown.returncode == 0, shown.stderr
    assert f"COMPLETED on {socket.gethostname().split('.')[0]} with GPUs {UUIDS[0]}" \
        in shown.stdout, shown.stdout
    assert f"CUDA_VISIBLE_DEVICES={UUIDS[0]}" in shown.stdout
