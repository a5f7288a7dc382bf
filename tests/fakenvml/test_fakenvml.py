"""The fake libnvidia-ml.so.1, exercised through the real pynvml.

pynvml loads the library once per process, so every check runs pynvml in a
child process (tests/fakenvml/nvml_repl.py) with the environment from
FakeNvml.env().
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.nvml_fixture import (
    CFLAGS,
    FAKENVML_DIR,
    INVENTORY_DIR,
    LIB_NAME,
    REPL_SCRIPT,
    FakeNvml,
    PynvmlRepl,
    build_fake_nvml,
    wait_for,
)

MiB = 1024 * 1024
XID = 0x8                 # nvmlEventTypeXidCriticalError
DBE = 0x2                 # nvmlEventTypeDoubleBitEccError
SBE = 0x1                 # nvmlEventTypeSingleBitEccError
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId of a non-MIG event
INVENTORIES = ["dgx_a100_8.json", "mixed_mig.json", "hetero.json"]

Factory = Callable[..., FakeNvml]


def load_inventory(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((INVENTORY_DIR / name).read_text())
    return data


def run_python(env: dict[str, str], code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout)


def error(name: str) -> Any:
    """Matches an {"error": ...} reply or dump entry."""

    class _Err:
        def __eq__(self, other: object) -> bool:
            return isinstance(other, dict) and other.get("error") == name

        def __repr__(self) -> str:
            return f"<error {name}>"

    return _Err()


@pytest.fixture(scope="module")
def dump(fake_nvml_lib: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Any]]:
    """dump(inventory) -> everything pynvml reports for it (cached)."""
    cache: dict[str, dict[str, Any]] = {}

    def get(name: str) -> dict[str, Any]:
        if name not in cache:
            fake = FakeNvml(fake_nvml_lib, name, tmp_path_factory.mktemp("dump") / "faults")
            res = subprocess.run([sys.executable, str(REPL_SCRIPT), "--dump"], env=fake.env(),
                                 capture_output=True, text=True, timeout=60)
            assert res.returncode == 0, res.stderr
            cache[name] = json.loads(res.stdout)
        return cache[name]

    return get


@pytest.fixture
def repl(fake_nvml_factory: Factory) -> Any:
    """repl(inventory, *args) -> a started PynvmlRepl, closed at teardown."""
    started: list[PynvmlRepl] = []

    def start(inventory: str | Path = "dgx_a100_8.json", *args: str) -> tuple[FakeNvml, PynvmlRepl]:
        fake = fake_nvml_factory(inventory)
        r = fake.repl(*args)
        started.append(r)
        assert r.hello.get("ready"), r.hello
        return fake, r

    yield start
    for r in started:
        r.close()


# ---------------------------------------------------------------------------
# Static inventory, as pynvml sees it


@pytest.mark.parametrize("name", INVENTORIES)
def test_inventory_matches_json(dump: Callable[[str], dict[str, Any]], name: str) -> None:
    inv = load_inventory(name)
    d = dump(name)
    assert d["count"] == len(inv["gpus"])
    assert d["handle_index_past_last"] == error("NVMLError_InvalidArgument")
    assert d["by_uuid_missing"] == error("NVMLError_NotFound")
    for i, (want, got) in enumerate(zip(inv["gpus"], d["gpus"], strict=True)):
        assert got["index"] == i
        assert got["uuid"] == want["uuid"]
        assert got["name"] == want["name"]
        assert got["serial"] == want["serial"]
        assert got["minor"] == i
        assert got["is_mig"] == 0
        assert got["by_uuid"] == {"kind": "gpu", "index": i, "uuid": want["uuid"]}
        assert got["by_pci_bus_id"]["index"] == i
        total = want["memory_mb"] * MiB
        assert got["memory"] == {"total": total, "used": 0, "free": total}
        assert got["memory_v2"]["total"] == total and got["memory_v2"]["reserved"] == 0
        pci = got["pci"]
        assert pci["busId"] == want["pci_bus_id"]
        assert pci["busIdLegacy"] == want["pci_bus_id"][4:]
        assert (pci["domain"], pci["bus"], pci["device"]) == (0, int(want["pci_bus_id"][9:11], 16), 0)
        assert pci["pciDeviceId"] == int(want["pci_device_id"], 16)
        assert pci["pciSubSystemId"] == int(want["pci_subsystem_id"], 16)
        assert got["numa_node"] == want["numa_node"]
        assert got["cuda_compute_capability"] == [int(x) for x in want["compute_capability"].split(".")]
        assert got["temperature"] == got["temperature_v"] == want["temperature"]
        assert got["utilization"] == {"gpu": want["utilization"], "memory": 0}
        assert got["power_mw"] == want["power_mw"]
        assert got["power_limit_mw"] == got["enforced_power_limit_mw"] == want["power_limit_mw"]
        assert got["processes"] == []
        assert got["supported_event_types"] & (XID | DBE | SBE) == XID | DBE | SBE
        assert got["ecc_mode"] == [1, 1]
        assert got["ecc_volatile_uncorrected"] == 0
        assert got["gpu_instance_id"] == error("NVMLError_NotSupported")
        assert got["attributes"] == error("NVMLError_NotSupported")  # MIG handles only
        assert got["nvlink_out_of_range"] == error("NVMLError_InvalidArgument")
        assert got["topology"][i] == 0  # NVML_TOPOLOGY_INTERNAL with itself


def test_system_versions(dump: Callable[[str], dict[str, Any]]) -> None:
    d = dump("dgx_a100_8.json")
    assert d["driver_version"] == "580.00.01"
    assert d["nvml_version"] == "12.580.00.01"
    assert d["cuda_driver_version"] == d["cuda_driver_version_v2"] == 12080


def test_dgx_nvlink_islands(dump: Callable[[str], dict[str, Any]]) -> None:
    d = dump("dgx_a100_8.json")
    bus_to_index = {g["pci"]["busId"]: i for i, g in enumerate(d["gpus"])}
    for i, g in enumerate(d["gpus"]):
        island = set(range(4)) if i < 4 else set(range(4, 8))
        peers: dict[int, int] = {}
        for link in range(36):
            entry = g["nvlinks"][str(link)]
            if link < 12:
                assert entry["state"] == 1, (i, link)
                peer = bus_to_index[entry["remote_bus_id"]]
                peers[peer] = peers.get(peer, 0) + 1
            else:
                assert entry["state"] == error("NVMLError_NotSupported"), (i, link)
        assert peers == {p: 4 for p in island - {i}}, i


def test_dgx_topology_levels(dump: Callable[[str], dict[str, Any]]) -> None:
    d = dump("dgx_a100_8.json")
    matrix = [g["topology"] for g in d["gpus"]]
    for i in range(8):
        for j in range(8):
            assert matrix[i][j] == matrix[j][i]
            if i == j:
                want = 0                     # INTERNAL
            elif i // 2 == j // 2:
                want = 10                    # SINGLE: same PCIe switch
            elif i // 4 == j // 4:
                want = 40                    # NODE: same NUMA node
            else:
                want = 50                    # SYSTEM: across the sockets
            assert matrix[i][j] == want, (i, j)
    assert [g["nearest_single"] for g in d["gpus"]] == [[1], [0], [3], [2], [5], [4], [7], [6]]
    assert d["gpu_set_numa0"] == [0, 1, 2, 3]
    assert [g["numa_node"] for g in d["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("name", ["mixed_mig.json", "hetero.json"])
def test_gpus_without_nvlink_report_not_supported(dump: Callable[[str], dict[str, Any]], name: str) -> None:
    for g in dump(name)["gpus"]:
        assert all(e["state"] == error("NVMLError_NotSupported") for e in g["nvlinks"].values())


def test_dgx_health_defaults(dump: Callable[[str], dict[str, Any]]) -> None:
    for g in dump("dgx_a100_8.json")["gpus"]:
        assert g["remapped_rows"] == [0, 0, 0, 0]
        assert g["retired_pages_dbe"] == error("NVMLError_NotSupported")
        assert g["retired_pages_sbe_v2"] == error("NVMLError_NotSupported")
        assert g["retired_pages_pending"] == error("NVMLError_NotSupported")
        assert g["mig_mode"] == [0, 0]
        assert g["max_mig_devices"] == 0
        assert g["migs"] == []


def test_hetero_node(dump: Callable[[str], dict[str, Any]]) -> None:
    gpus = dump("hetero.json")["gpus"]
    assert [g["name"] for g in gpus] == ["NVIDIA H100 80GB HBM3"] * 2 + ["NVIDIA L4", "Tesla T4"]
    assert [g["memory"]["total"] // MiB for g in gpus] == [81559, 81559, 23034, 15360]
    assert [g["cuda_compute_capability"] for g in gpus] == [[9, 0], [9, 0], [8, 9], [7, 5]]
    # H100: MIG capable but off; L4 and T4 cannot do MIG at all.
    assert gpus[0]["mig_mode"] == gpus[1]["mig_mode"] == [0, 0]
    assert gpus[2]["mig_mode"] == gpus[3]["mig_mode"] == error("NVMLError_NotSupported")
    assert gpus[3]["mig_index_past_last"] == error("NVMLError_NotSupported")
    # Turing has page retirement, no row remapping; Ampere and later the opposite.
    assert gpus[3]["remapped_rows"] == error("NVMLError_NotSupported")
    assert gpus[3]["retired_pages_dbe"] == [] and gpus[3]["retired_pages_pending"] == 0
    assert gpus[0]["retired_pages_dbe"] == error("NVMLError_NotSupported")
    assert gpus[2]["remapped_rows"] == [0, 0, 0, 0]
    assert [g["topology"] for g in gpus] == [
        [0, 40, 50, 50], [40, 0, 50, 50], [50, 50, 0, 30], [50, 50, 30, 0]]


def test_mixed_mig_devices(dump: Callable[[str], dict[str, Any]]) -> None:
    inv = load_inventory("mixed_mig.json")
    d = dump("mixed_mig.json")
    g0, g1, g2, g3 = d["gpus"]
    assert g0["mig_mode"] == g1["mig_mode"] == [1, 1]
    assert g2["mig_mode"] == g3["mig_mode"] == [0, 0]
    assert g0["max_mig_devices"] == g1["max_mig_devices"] == 7
    assert g2["max_mig_devices"] == 0 and g2["migs"] == []
    assert g0["mig_index_past_last"] == error("NVMLError_NotFound")

    assert [m["attributes"]["gpuInstanceSliceCount"] for m in g0["migs"]] == [3, 2, 1, 1]
    assert [m["attributes"]["memorySizeMB"] for m in g0["migs"]] == [40192, 19968, 9728, 9728]
    assert [m["name"] for m in g0["migs"]] == [
        "NVIDIA A100 80GB PCIe MIG 3g.40gb", "NVIDIA A100 80GB PCIe MIG 2g.20gb",
        "NVIDIA A100 80GB PCIe MIG 1g.10gb", "NVIDIA A100 80GB PCIe MIG 1g.10gb"]
    assert len(g1["migs"]) == 7
    assert {m["attributes"]["memorySizeMB"] for m in g1["migs"]} == {9728}
    assert sorted(m["gi"] for m in g1["migs"]) == list(range(7, 14))

    for gi, (gpu, want_gpu) in enumerate(zip(d["gpus"][:2], inv["gpus"][:2], strict=True)):
        for j, (m, want) in enumerate(zip(gpu["migs"], want_gpu["mig_devices"], strict=True)):
            assert m["uuid"] == want["uuid"] and m["uuid"].startswith("MIG-")
            assert m["is_mig"] == 1
            assert m["parent_uuid"] == want_gpu["uuid"]
            assert m["parent_is_same_handle"] is True
            assert m["by_uuid"] == {"kind": "mig", "index": gi, "mig": j, "uuid": want["uuid"]}
            assert (m["gi"], m["ci"]) == (want["gi"], want["ci"])
            assert m["attributes"]["computeInstanceSliceCount"] == want["slices"]
            assert m["attributes"]["multiprocessorCount"] == want["sm_count"]
            assert m["memory"] == {"total": want["memory_mb"] * MiB, "used": 0,
                                   "free": want["memory_mb"] * MiB}
            assert m["cuda_compute_capability"] == [8, 0]
            # GPU-wide queries need the parent handle.
            for key in ("index_query", "temperature", "utilization", "pci"):
                assert m[key] == error("NVMLError_NotSupported"), key


def test_memory_reserved_and_used(fake_nvml_factory: Factory, tmp_path: Path) -> None:
    inv = load_inventory("hetero.json")
    inv["gpus"][0].update(memory_reserved_mb=565, memory_used_mb=1000)
    path = tmp_path / "inv.json"
    path.write_text(json.dumps(inv))
    fake = fake_nvml_factory(path)
    with fake.repl("--no-events") as r:
        v1 = r.call("nvmlDeviceGetMemoryInfo", gpu=0)["ok"]
        v2 = r.call("nvmlDeviceGetMemoryInfo", 0x02000028, gpu=0)["ok"]
        bad = r.call("nvmlDeviceGetMemoryInfo", 0x01000028, gpu=0)
    total = 81559 * MiB
    assert v1 == {"total": total, "used": 1565 * MiB, "free": total - 1565 * MiB}
    assert v2["reserved"] == 565 * MiB and v2["used"] == 1000 * MiB
    assert v2["free"] == total - 1565 * MiB
    assert bad == error("NVMLError_ArgumentVersionMismatch")


# ---------------------------------------------------------------------------
# Events and faults


def inject_while_waiting(fake: FakeNvml, r: PynvmlRepl, line: str, timeout_ms: int = 5000) -> tuple[dict[str, Any], float]:
    """Start a wait, inject ``line`` and return (reply, seconds from inject to reply)."""
    r.send({"op": "wait", "timeout_ms": timeout_ms})
    time.sleep(0.05)  # the child is now inside nvmlEventSetWait
    t0 = time.monotonic()
    fake.inject(line)
    reply = r.reply(timeout=timeout_ms / 1000 + 10)
    return reply, time.monotonic() - t0


def test_xid_is_delivered_within_a_second(repl: Any) -> None:
    fake, r = repl("dgx_a100_8.json")
    reply, latency = inject_while_waiting(fake, r, "xid 3 79")
    assert reply["ok"] == {
        "device": {"kind": "gpu", "index": 3, "uuid": fake.inventory["gpus"][3]["uuid"]},
        "eventType": XID, "eventData": 79,
        "gpuInstanceId": NO_INSTANCE, "computeInstanceId": NO_INSTANCE,
    }
    assert latency < 1.0


def test_application_xid_is_delivered_too(repl: Any) -> None:
    fake, r = repl("dgx_a100_8.json")
    reply, _ = inject_while_waiting(fake, r, "xid 0 13")
    assert reply["ok"]["device"]["index"] == 0
    assert (reply["ok"]["eventType"], reply["ok"]["eventData"]) == (XID, 13)


def test_events_queue_in_order(repl: Any) -> None:
    fake, r = repl("dgx_a100_8.json")
    for line in ("xid 1 31", "xid 2 48", "ecc 6", "# a comment", "", "xid 7 94"):
        if line:
            fake.inject(line)
    got = [r.wait(2000)["ok"] for _ in range(4)]
    assert [(e["device"]["index"], e["eventType"], e["eventData"]) for e in got] == [
        (1, XID, 31), (2, XID, 48), (6, DBE, 0), (7, XID, 94)]
    assert r.wait(100) == error("NVMLError_Timeout")


def test_wait_times_out(repl: Any) -> None:
    _, r = repl("dgx_a100_8.json")
    reply = r.wait(200)
    assert reply == error("NVMLError_Timeout")
    assert 190 <= reply["elapsed_ms"] < 2000


def test_only_registered_event_types_are_delivered(repl: Any) -> None:
    fake, r = repl("dgx_a100_8.json", "--mask", str(XID))
    assert r.hello["registered"] == [XID] * 8
    fake.inject("ecc 2")
    fake.inject("ecc 2 single")
    assert r.wait(300) == error("NVMLError_Timeout")
    fake.inject("xid 2 48")
    assert r.wait(2000)["ok"]["eventData"] == 48


def test_unregistered_gpu_gets_no_events(repl: Any) -> None:
    fake, r = repl("dgx_a100_8.json", "--no-events")
    fake.inject("xid 3 79")
    assert r.wait(300) == error("NVMLError_Timeout")


def test_registering_unsupported_types_fails(repl: Any) -> None:
    fake, r = repl("hetero.json", "--no-events")
    mig_change = 0x100                      # nvmlEventTypeMigConfigChange
    assert r.call("nvmlDeviceGetSupportedEventTypes", gpu=2)["ok"] & mig_change == 0
    assert r.call("nvmlDeviceGetSupportedEventTypes", gpu=0)["ok"] & mig_change == mig_change
    # The L4 cannot do MIG: asking for MIG events fails as a whole ...
    assert r.call("nvmlDeviceRegisterEvents", mig_change | XID, {"event_set": True},
                  gpu=2) == error("NVMLError_NotSupported")
    fake.inject("xid 2 79")
    assert r.wait(200) == error("NVMLError_Timeout")
    # ... while the H100 accepts them.
    assert r.call("nvmlDeviceRegisterEvents", mig_change | XID, {"event_set": True}, gpu=0) == {"ok": None}
    fake.inject("xid 0 79")
    assert r.wait(2000)["ok"]["device"]["index"] == 0
    # MIG handles cannot register: events are registered on the parent.
    _, m = repl("mixed_mig.json", "--no-events")
    assert m.call("nvmlDeviceRegisterEvents", XID, {"event_set": True},
                  gpu=0, mig=0) == error("NVMLError_NotSupported")


def test_ecc_event_and_counters(repl: Any) -> None:
    fake, r = repl("dgx_a100_8.json")

    def count(kind: int, counter: int) -> int:
        res: int = r.call("nvmlDeviceGetTotalEccErrors", kind, counter, gpu=2)["ok"]
        return res

    assert count(1, 0) == 0
    reply, latency = inject_while_waiting(fake, r, "ecc 2")
    assert reply["ok"]["device"]["index"] == 2
    assert reply["ok"]["eventType"] == DBE
    assert latency < 1.0
    assert count(1, 0) == 1 and count(1, 1) == 1     # uncorrected volatile / aggregate
    fake.inject("ecc 2 single")
    assert r.wait(2000)["ok"]["eventType"] == SBE
    assert count(0, 0) == 1


def test_mig_xid_carries_mig_handle_and_instance_ids(repl: Any) -> None:
    fake, r = repl("mixed_mig.json")
    inv = fake.inventory
    reply, latency = inject_while_waiting(fake, r, "xid 0 43 mig 3 0")
    assert reply["ok"] == {
        "device": {"kind": "mig", "index": 0, "mig": 1, "uuid": inv["gpus"][0]["mig_devices"][1]["uuid"]},
        "eventType": XID, "eventData": 43, "gpuInstanceId": 3, "computeInstanceId": 0,
    }
    assert latency < 1.0
    # A GPU-wide Xid on a MIG-enabled GPU points at the GPU, without instance ids.
    fake.inject("xid 1 79")
    ev = r.wait(2000)["ok"]
    assert ev["device"]["kind"] == "gpu" and ev["device"]["index"] == 1
    assert (ev["gpuInstanceId"], ev["computeInstanceId"]) == (NO_INSTANCE, NO_INSTANCE)
    # An unknown GI/CI is reported on stderr and ignored.
    fake.inject("xid 1 43 mig 99 0")
    assert r.wait(300) == error("NVMLError_Timeout")
    assert "no MIG device gi 99 ci 0" in r.stderr


def test_mig_xid_parent_mode(repl: Any, tmp_path: Path) -> None:
    """With "mig_event_device": "parent" the event names the physical GPU,
    and only the instance ids identify the MIG device."""
    inv = load_inventory("mixed_mig.json")
    inv["mig_event_device"] = "parent"
    path = tmp_path / "parent.json"
    path.write_text(json.dumps(inv))
    fake, r = repl(path)
    reply, _ = inject_while_waiting(fake, r, "xid 1 31 mig 10 0")
    ev = reply["ok"]
    assert ev["device"] == {"kind": "gpu", "index": 1, "uuid": inv["gpus"][1]["uuid"]}
    assert (ev["eventData"], ev["gpuInstanceId"], ev["computeInstanceId"]) == (31, 10, 0)


def test_lost_gpu(repl: Any) -> None:
    fake, r = repl("dgx_a100_8.json")
    reply, latency = inject_while_waiting(fake, r, "lost 5")
    # The event set reports the loss once ...
    assert reply == error("NVMLError_GpuIsLost")
    assert latency < 1.0
    # ... every query on the lost GPU fails ...
    for fn, args in [("nvmlDeviceGetTemperature", [0]), ("nvmlDeviceGetUUID", []),
                     ("nvmlDeviceGetMemoryInfo", []), ("nvmlDeviceGetPciInfo", []),
                     ("nvmlDeviceGetRemappedRows", []), ("nvmlDeviceGetNvLinkState", [0])]:
        assert r.call(fn, *args, gpu=5) == error("NVMLError_GpuIsLost"), fn
    assert r.call("nvmlDeviceGetHandleByIndex", 5) == error("NVMLError_GpuIsLost")
    assert r.call("nvmlDeviceGetTopologyCommonAncestor", {"handle": 5}, gpu=4) == error("NVMLError_GpuIsLost")
    # ... the others keep working, and the event set still serves them.
    assert r.call("nvmlDeviceGetTemperature", 0, gpu=4)["ok"] == fake.inventory["gpus"][4]["temperature"]
    assert r.call("nvmlDeviceGetCount")["ok"] == 8
    fake.inject("xid 5 79")                 # a lost GPU reports nothing more
    fake.inject("xid 4 79")
    assert r.wait(2000)["ok"]["device"]["index"] == 4
    assert r.wait(200) == error("NVMLError_Timeout")
    # recover (a fake-only convenience) brings it back
    fake.inject("recover 5")
    assert r.call("nvmlDeviceGetUUID", gpu=5)["ok"] == fake.inventory["gpus"][5]["uuid"]


def test_lost_gpu_takes_its_mig_devices(repl: Any) -> None:
    fake, r = repl("mixed_mig.json")
    fake.inject("lost 0")
    assert r.wait(2000) == error("NVMLError_GpuIsLost")
    assert r.call("nvmlDeviceGetUUID", gpu=0, mig=0) == error("NVMLError_GpuIsLost")
    assert r.call("nvmlDeviceGetMemoryInfo", gpu=0, mig=2) == error("NVMLError_GpuIsLost")
    assert r.call("nvmlDeviceIsMigDeviceHandle", gpu=0, mig=0)["ok"] == 1   # pure bookkeeping
    assert r.call("nvmlDeviceGetUUID", gpu=1, mig=6)["ok"] == fake.inventory["gpus"][1]["mig_devices"][6]["uuid"]
    mig_uuid = fake.inventory["gpus"][0]["mig_devices"][0]["uuid"]
    assert r.call("nvmlDeviceGetHandleByUUID", mig_uuid) == error("NVMLError_GpuIsLost")


def test_telemetry_faults(repl: Any) -> None:
    fake, r = repl("dgx_a100_8.json")
    assert r.call("nvmlDeviceGetTemperature", 0, gpu=1)["ok"] == fake.inventory["gpus"][1]["temperature"]
    fake.inject("temp 1 95")
    fake.inject("util 2 87 40000")
    fake.inject("util 3 50 1024 33")
    fake.inject("power 3 250000")
    fake.inject("remap 4 failure")
    fake.inject("remap 4 uncorrectable 2")
    assert r.call("nvmlDeviceGetTemperature", 0, gpu=1)["ok"] == 95
    assert r.call("nvmlDeviceGetTemperatureV", 0, gpu=1)["ok"] == 95
    assert r.call("nvmlDeviceGetUtilizationRates", gpu=2)["ok"] == {"gpu": 87, "memory": 0}
    assert r.call("nvmlDeviceGetMemoryInfo", gpu=2)["ok"]["used"] == 40000 * MiB
    assert r.call("nvmlDeviceGetUtilizationRates", gpu=3)["ok"] == {"gpu": 50, "memory": 33}
    assert r.call("nvmlDeviceGetPowerUsage", gpu=3)["ok"] == 250000
    assert r.call("nvmlDeviceGetRemappedRows", gpu=4)["ok"] == [0, 2, 0, 1]
    assert r.call("nvmlDeviceGetRemappedRows", gpu=5)["ok"] == [0, 0, 0, 0]


def test_retired_pages_fault(repl: Any) -> None:
    fake, r = repl("hetero.json")
    fake.inject("retire 3 dbe 0x1a2b000")
    fake.inject("retire 3 dbe 0x1a2c000")
    assert r.call("nvmlDeviceGetRetiredPages", 1, gpu=3)["ok"] == [0x1A2B000, 0x1A2C000]
    v2 = r.call("nvmlDeviceGetRetiredPages_v2", 1, gpu=3)["ok"]
    assert [p["address"] for p in v2] == [0x1A2B000, 0x1A2C000] and all(p["timestamp"] > 0 for p in v2)
    assert r.call("nvmlDeviceGetRetiredPagesPendingStatus", gpu=3)["ok"] == 1
    assert r.call("nvmlDeviceGetRetiredPages", 0, gpu=3)["ok"] == []


def test_new_process_sees_state_faults_but_not_old_events(fake_nvml_factory: Factory) -> None:
    fake = fake_nvml_factory("dgx_a100_8.json")
    fake.inject("temp 1 95")
    fake.inject("lost 5")
    fake.inject("xid 3 79")                 # nobody listens yet: gone
    with fake.repl() as r:
        assert r.hello["registered"][5] == {"error": "no handle", "gpu": 5}
        assert r.call("nvmlDeviceGetHandleByIndex", 5) == error("NVMLError_GpuIsLost")
        assert r.call("nvmlDeviceGetTemperature", 0, gpu=1)["ok"] == 95
        assert r.wait(200) == error("NVMLError_Timeout")


def test_partial_fault_line_waits_for_its_newline(repl: Any) -> None:
    fake, r = repl("dgx_a100_8.json")
    with open(fake.fault_path, "a") as f:
        f.write("temp 1 7")
    assert r.call("nvmlDeviceGetTemperature", 0, gpu=1)["ok"] == fake.inventory["gpus"][1]["temperature"]
    with open(fake.fault_path, "a") as f:
        f.write("7\n")
    assert r.call("nvmlDeviceGetTemperature", 0, gpu=1)["ok"] == 77


def test_bad_fault_lines_are_reported_and_skipped(repl: Any) -> None:
    fake, r = repl("dgx_a100_8.json")
    for line in ("bogus 1", "xid 99 79", "temp 1 hot", "xid 1", "util 1 101 0", "temp 1 50"):
        fake.inject(line)
    assert r.call("nvmlDeviceGetTemperature", 0, gpu=1)["ok"] == 50
    assert r.wait(200) == error("NVMLError_Timeout")
    assert wait_for(lambda: "line 2: no GPU 99" in r.stderr)
    assert "line 1: cannot parse \"bogus ...\"" in r.stderr


def test_inject_rejects_multi_line_input(fake_nvml: FakeNvml) -> None:
    with pytest.raises(ValueError):
        fake_nvml.inject("xid 1 79\nxid 2 79")
    with pytest.raises(ValueError):
        fake_nvml.inject("   ")


def test_sampling_while_another_thread_waits(repl: Any) -> None:
    fake, r = repl("dgx_a100_8.json")
    r.send({"op": "stress", "seconds": 1.5, "threads": 3, "timeout_ms": 50})
    time.sleep(0.4)
    fake.inject("temp 6 88")
    fake.inject("xid 6 79")
    time.sleep(0.2)
    fake.inject("xid 7 48")
    out = r.reply(timeout=30)["ok"]
    assert out["errors"] == {}
    assert out["samples"] > 100
    assert 88 in out["temperatures"]["6"]
    assert [(e["ok"]["device"]["index"], e["ok"]["eventData"]) for e in out["events"]] == [(6, 79), (7, 48)]


# ---------------------------------------------------------------------------
# nvmlInit failures, init/shutdown, handle checks


INIT_PROBE = """
import pynvml, sys
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as e:
    print(type(e).__name__, pynvml.nvmlErrorString(e.value), sep="|")
    sys.exit(0)
print("ok")
"""


def test_init_without_config_fails_cleanly(fake_nvml: FakeNvml) -> None:
    env = fake_nvml.env()
    del env["FAKENVML_CONFIG"]
    res = run_python(env, INIT_PROBE)
    assert res.returncode == 0, res.stderr
    name, message = res.stdout.strip().split("|")
    assert name == "NVMLError_LibraryNotFound"
    assert "FAKENVML_CONFIG is not set" in message
    assert "FAKENVML_CONFIG is not set" in res.stderr


BAD_INVENTORIES = [
    ('{"gpus": [}', "line 1 column 11"),
    ('{"gpus": [],}', "object key"),
    ('{"gpus": [], "gpus": []}', 'duplicate key "gpus"'),
    ('{"gpus": [{"uuid": "GPU-1", "name": "x", "memory_mb": 1, "pci_bus_id": "0:1:0.0", "colour": 1}]}',
     'gpus[0]: unknown key "colour"'),
    ('{"gpus": [{"uuid": "GPU-1", "name": "x", "memory_mb": 1}]}', 'gpus[0]: missing "pci_bus_id"'),
    ('{"gpus": [{"uuid": "GPU-1", "name": "x", "memory_mb": 1, "pci_bus_id": "zz"}]}', "bad pci_bus_id"),
    ('{"gpus": [{"uuid": "GPU-1", "name": "x", "memory_mb": -5, "pci_bus_id": "0:1:0.0"}]}',
     "out of range"),
    ('{"gpus": [], "topology": [{"gpus": [0, 1], "level": "NVML_TOPOLOGY_SINGLE"}]}', "topology[0]"),
    ('{"gpus": [{"uuid": "GPU-1", "name": "x", "memory_mb": 1, "pci_bus_id": "0:1:0.0",'
     ' "mig_devices": [{"uuid": "MIG-1", "profile": "1g.10gb", "slices": 1, "memory_mb": 1, "gi": 1, "ci": 0}]}]}',
     '"mig" is not true'),
    ('{"gpus": [], "cuda": 12.08e3}', '"cuda" must be an integer'),
    ('{"gpus": [], "driver": "a\\qb"}', "bad escape"),
    ('{"gpus": [], "driver": "\\ud800"}', "unpaired surrogate"),
    ('{"gpus": [], "driver": "x"} 1', "trailing characters"),
    ("\"unterminated", "unterminated string"),
    ("", "unexpected end of input"),
]


@pytest.mark.parametrize(("text", "message"), BAD_INVENTORIES)
def test_init_with_bad_inventory_fails_cleanly(fake_nvml_factory: Factory, tmp_path: Path,
                                               text: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    res = run_python(fake_nvml_factory(path).env(), INIT_PROBE)
    assert res.stdout.split("|")[0] == "NVMLError_Unknown", res.stdout + res.stderr
    assert message in res.stderr


def test_init_with_missing_inventory_file(fake_nvml_factory: Factory, tmp_path: Path) -> None:
    res = run_python(fake_nvml_factory(tmp_path / "nope.json").env(), INIT_PROBE)
    assert res.stdout.split("|")[0] == "NVMLError_Unknown"
    assert "cannot open" in res.stderr


def test_json_reader_handles_escapes_and_numbers(fake_nvml_factory: Factory, tmp_path: Path) -> None:
    inv = load_inventory("hetero.json")
    inv["gpus"][2]["name"] = "NVIDIA L4 \u00c4\U0001f600 \"q\" \\ /"
    text = json.dumps(inv, ensure_ascii=True)          # \uXXXX escapes, surrogate pairs
    path = tmp_path / "esc.json"
    path.write_text("\ufeff" + text, encoding="utf-8")  # with a BOM
    fake = fake_nvml_factory(path)
    with fake.repl("--no-events") as r:
        assert r.call("nvmlDeviceGetName", gpu=2)["ok"] == inv["gpus"][2]["name"]


def test_init_shutdown_nest(fake_nvml: FakeNvml) -> None:
    code = """
import pynvml
pynvml.nvmlInit(); pynvml.nvmlInit()
pynvml.nvmlShutdown()
print(pynvml.nvmlDeviceGetCount())
pynvml.nvmlShutdown()
for call in (pynvml.nvmlDeviceGetCount, pynvml.nvmlShutdown):
    try:
        call()
    except pynvml.NVMLError_Uninitialized:
        print("uninitialized")
pynvml.nvmlInit()
print(pynvml.nvmlDeviceGetCount())
"""
    res = run_python(fake_nvml.env(), code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["8", "uninitialized", "uninitialized", "8"]


def test_bogus_handles_are_rejected(fake_nvml: FakeNvml) -> None:
    code = """
import ctypes, pynvml
pynvml.nvmlInit()
fake = ctypes.cast(ctypes.c_void_p(0x1234), pynvml.c_nvmlDevice_t)
for fn in (pynvml.nvmlDeviceGetUUID, pynvml.nvmlDeviceGetIndex, pynvml.nvmlDeviceIsMigDeviceHandle):
    try:
        fn(fake)
    except pynvml.NVMLError as e:
        print(type(e).__name__)
es = ctypes.cast(ctypes.c_void_p(0x5678), pynvml.c_nvmlEventSet_t)
try:
    pynvml.nvmlEventSetWait(es, 10)
except pynvml.NVMLError as e:
    print(type(e).__name__)
"""
    res = run_python(fake_nvml.env(), code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["NVMLError_InvalidArgument"] * 4


def test_unimplemented_functions_are_absent(fake_nvml: FakeNvml) -> None:
    code = """
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
try:
    pynvml.nvmlDeviceGetFanSpeed(h)
except pynvml.NVMLError_FunctionNotFound:
    print("not found")
"""
    res = run_python(fake_nvml.env(), code)
    assert res.stdout.strip() == "not found", res.stderr


# ---------------------------------------------------------------------------
# Building


def test_library_compiles_without_warnings(tmp_path: Path) -> None:
    gcc = shutil.which("gcc")
    assert gcc is not None, "gcc is part of the test machine"
    res = subprocess.run([gcc, *CFLAGS, "-Werror", "-o", str(tmp_path / LIB_NAME),
                          str(FAKENVML_DIR / "fakenvml.c"), "-lpthread"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""


def test_build_is_cached_and_race_free(fake_nvml_lib: Path, tmp_path: Path) -> None:
    assert (fake_nvml_lib / LIB_NAME).is_file()
    assert build_fake_nvml(fake_nvml_lib.parent) == fake_nvml_lib
    cache = tmp_path / "cache"
    results: list[Path] = []
    errors: list[BaseException] = []

    def build() -> None:
        try:
            results.append(build_fake_nvml(cache))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(set(results)) == 1 and (results[0] / LIB_NAME).is_file()
    assert [p.name for p in cache.iterdir()] == [results[0].name]   # no temp dirs left
    assert results[0].name == fake_nvml_lib.name


def test_env_prepends_library_dir(fake_nvml: FakeNvml) -> None:
    env = fake_nvml.env({"LD_LIBRARY_PATH": "/opt/x", "HOME": "/h"})
    assert env["LD_LIBRARY_PATH"] == f"{fake_nvml.lib_dir}{os.pathsep}/opt/x"
    assert env["HOME"] == "/h"
    assert env["FAKENVML_CONFIG"] == str(INVENTORY_DIR / "dgx_a100_8.json")
    assert env["FAKENVML_FAULTS"] == str(fake_nvml.fault_path)
    assert fake_nvml.variables({})["LD_LIBRARY_PATH"] == str(fake_nvml.lib_dir)
