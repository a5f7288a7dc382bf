"""Drive the real pynvml from a child process, over JSON lines.

Run with the environment from ``FakeNvml.env()`` (tests/nvml_fixture.py) so
that ``libnvidia-ml.so.1`` resolves to the fake library.

    python nvml_repl.py --dump            print what pynvml sees, as JSON, and exit
    python nvml_repl.py [--mask N] [--no-events]

In REPL mode the script initialises NVML, takes handles of every GPU and
MIG device, creates one event set, registers ``--mask`` (default: Xid and
ECC events, restricted to what each GPU supports) on every GPU and prints
``{"ready": true, ...}``.  Then it reads one JSON request per line from
stdin and prints one JSON reply per request:

    {"op": "call", "fn": "nvmlDeviceGetTemperature", "gpu": 1, "args": [0]}
        -> {"ok": 31} or {"error": "NVMLError_GPUIsLost", "value": 15}
        ("gpu" [+ "mig"] puts that cached device handle first in the
        arguments; an argument {"handle": G} or {"handle": G, "mig": M} is
        replaced by that handle, {"event_set": true} by the event set)
    {"op": "wait", "timeout_ms": 1000}
        -> {"ok": {"device": {...}, "eventType": 8, "eventData": 79,
                   "gpuInstanceId": ..., "computeInstanceId": ...},
            "elapsed_ms": 12.5}
    {"op": "stress", "seconds": 1.5, "threads": 2, "timeout_ms": 100}
        samplers query every GPU in threads while this thread waits for
        events; -> {"ok": {"samples": N, "errors": {...}, "temperatures":
        {...}, "events": [...]}}
    {"op": "dump"} -> {"ok": <same as --dump>}
    {"op": "exit"}

Device handles in replies are described as {"kind": "gpu"|"mig",
"index": G, "mig": M, "uuid": ...} by matching the pointer against the
handles taken at start.
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time
from typing import Any

import pynvml  # type: ignore[import-untyped]

DEFAULT_MASK = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)


def _addr(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


def jsonable(value: Any) -> Any:
    """ctypes values and pynvml structures -> plain JSON values."""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, ctypes.Structure):
        return {name: jsonable(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, ctypes._Pointer):  # a device handle
        return DEVICES.describe(value)
    if isinstance(value, ctypes._SimpleCData):
        return jsonable(value.value)
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, pynvml.nvmlFriendlyObject):
        return {k: jsonable(v) for k, v in value.__dict__.items()}
    return value


def attempt(fn: Any, *args: Any) -> Any:
    """fn(*args) as JSON, or {"error": class name} on an NVML error."""
    try:
        return jsonable(fn(*args))
    except pynvml.NVMLError as e:
        return {"error": type(e).__name__, "value": e.value}


class Devices:
    """Handles taken once at start, so a GPU lost later keeps its handle."""

    def __init__(self) -> None:
        self.gpus: list[Any] = []
        self.migs: dict[int, dict[int, Any]] = {}
        self.by_addr: dict[int, dict[str, Any]] = {}

    def load(self) -> None:
        for i in range(pynvml.nvmlDeviceGetCount()):
            self.migs[i] = {}
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
            except pynvml.NVMLError:        # e.g. a GPU lost before we started
                self.gpus.append(None)
                continue
            self.gpus.append(h)
            self.by_addr[_addr(h) or 0] = {"kind": "gpu", "index": i, "uuid": pynvml.nvmlDeviceGetUUID(h)}
            try:
                count = pynvml.nvmlDeviceGetMaxMigDeviceCount(h)
            except pynvml.NVMLError:
                count = 0
            for j in range(count):
                try:
                    m = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                except pynvml.NVMLError_NotFound:
                    continue
                self.migs[i][j] = m
                self.by_addr[_addr(m) or 0] = {
                    "kind": "mig", "index": i, "mig": j, "uuid": pynvml.nvmlDeviceGetUUID(m)}

    def handle(self, gpu: int, mig: int | None = None) -> Any:
        return self.gpus[gpu] if mig is None else self.migs[gpu][mig]

    def describe(self, handle: Any) -> dict[str, Any] | None:
        addr = _addr(handle)
        if addr is None:
            return None
        return self.by_addr.get(addr, {"kind": "unknown", "address": addr})


DEVICES = Devices()


# ---------------------------------------------------------------------------
# --dump: everything pynvml can see


def dump_mig(gpu_handle: Any, j: int, m: Any) -> dict[str, Any]:
    uuid = pynvml.nvmlDeviceGetUUID(m)
    by_uuid = attempt(lambda: DEVICES.describe(pynvml.nvmlDeviceGetHandleByUUID(uuid)))
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
    return {
        "index": j,
        "uuid": uuid,
        "name": attempt(pynvml.nvmlDeviceGetName, m),
        "is_mig": int(pynvml.nvmlDeviceIsMigDeviceHandle(m).value),
        "parent_uuid": pynvml.nvmlDeviceGetUUID(parent),
        "parent_is_same_handle": _addr(parent) == _addr(gpu_handle),
        "by_uuid": by_uuid,
        "gi": attempt(pynvml.nvmlDeviceGetGpuInstanceId, m),
        "ci": attempt(pynvml.nvmlDeviceGetComputeInstanceId, m),
        "attributes": attempt(pynvml.nvmlDeviceGetAttributes, m),
        "memory": attempt(pynvml.nvmlDeviceGetMemoryInfo, m),
        "cuda_compute_capability": attempt(pynvml.nvmlDeviceGetCudaComputeCapability, m),
        # GPU-wide queries are refused on MIG handles:
        "index_query": attempt(pynvml.nvmlDeviceGetIndex, m),
        "temperature": attempt(pynvml.nvmlDeviceGetTemperature, m, pynvml.NVML_TEMPERATURE_GPU),
        "utilization": attempt(pynvml.nvmlDeviceGetUtilizationRates, m),
        "pci": attempt(pynvml.nvmlDeviceGetPciInfo, m),
    }


def dump_gpu(i: int, h: Any, n: int) -> dict[str, Any]:
    g: dict[str, Any] = {
        "index": attempt(pynvml.nvmlDeviceGetIndex, h),
        "uuid": attempt(pynvml.nvmlDeviceGetUUID, h),
        "name": attempt(pynvml.nvmlDeviceGetName, h),
        "serial": attempt(pynvml.nvmlDeviceGetSerial, h),
        "minor": attempt(pynvml.nvmlDeviceGetMinorNumber, h),
        "is_mig": int(pynvml.nvmlDeviceIsMigDeviceHandle(h).value),
        "pci": attempt(pynvml.nvmlDeviceGetPciInfo, h),
        "memory": attempt(pynvml.nvmlDeviceGetMemoryInfo, h),
        "memory_v2": attempt(pynvml.nvmlDeviceGetMemoryInfo, h, pynvml.nvmlMemory_v2),
        "numa_node": attempt(pynvml.nvmlDeviceGetNumaNodeId, h),
        "cuda_compute_capability": attempt(pynvml.nvmlDeviceGetCudaComputeCapability, h),
        "temperature": attempt(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
        "temperature_v": attempt(pynvml.nvmlDeviceGetTemperatureV, h, pynvml.NVML_TEMPERATURE_GPU),
        "utilization": attempt(pynvml.nvmlDeviceGetUtilizationRates, h),
        "power_mw": attempt(pynvml.nvmlDeviceGetPowerUsage, h),
        "power_limit_mw": attempt(pynvml.nvmlDeviceGetPowerManagementLimit, h),
        "enforced_power_limit_mw": attempt(pynvml.nvmlDeviceGetEnforcedPowerLimit, h),
        "processes": attempt(pynvml.nvmlDeviceGetComputeRunningProcesses, h),
        "mig_mode": attempt(pynvml.nvmlDeviceGetMigMode, h),
        "max_mig_devices": attempt(pynvml.nvmlDeviceGetMaxMigDeviceCount, h),
        "gpu_instance_id": attempt(pynvml.nvmlDeviceGetGpuInstanceId, h),
        "attributes": attempt(pynvml.nvmlDeviceGetAttributes, h),
        "ecc_mode": attempt(pynvml.nvmlDeviceGetEccMode, h),
        "ecc_volatile_uncorrected": attempt(
            pynvml.nvmlDeviceGetTotalEccErrors, h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC),
        "ecc_aggregate_corrected": attempt(
            pynvml.nvmlDeviceGetTotalEccErrors, h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            pynvml.NVML_AGGREGATE_ECC),
        "remapped_rows": attempt(pynvml.nvmlDeviceGetRemappedRows, h),
        "retired_pages_dbe": attempt(
            pynvml.nvmlDeviceGetRetiredPages, h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        "retired_pages_sbe_v2": attempt(
            pynvml.nvmlDeviceGetRetiredPages_v2, h,
            pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
        "retired_pages_pending": attempt(pynvml.nvmlDeviceGetRetiredPagesPendingStatus, h),
        "supported_event_types": attempt(pynvml.nvmlDeviceGetSupportedEventTypes, h),
    }
    links = {}
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        state = attempt(pynvml.nvmlDeviceGetNvLinkState, h, link)
        entry: dict[str, Any] = {"state": state}
        if not isinstance(state, dict):
            remote = attempt(pynvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            entry["remote_bus_id"] = remote["busId"] if "busId" in remote else remote
        links[str(link)] = entry
    g["nvlinks"] = links
    g["nvlink_out_of_range"] = attempt(pynvml.nvmlDeviceGetNvLinkState, h, pynvml.NVML_NVLINK_MAX_LINKS)
    g["topology"] = [
        attempt(pynvml.nvmlDeviceGetTopologyCommonAncestor, h, DEVICES.gpus[k]) for k in range(n)]
    g["nearest_single"] = attempt(
        lambda: [DEVICES.describe(d)["index"] for d in  # type: ignore[index]
                 pynvml.nvmlDeviceGetTopologyNearestGpus(h, pynvml.NVML_TOPOLOGY_SINGLE)])
    g["migs"] = [dump_mig(h, j, m) for j, m in sorted(DEVICES.migs[i].items())]
    g["mig_index_past_last"] = attempt(
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex, h, len(DEVICES.migs[i]))
    uuid = g["uuid"]
    if isinstance(uuid, str):
        g["by_uuid"] = attempt(lambda: DEVICES.describe(pynvml.nvmlDeviceGetHandleByUUID(uuid)))
    if isinstance(g["pci"], dict):
        bus = g["pci"]["busId"]
        g["by_pci_bus_id"] = attempt(lambda: DEVICES.describe(pynvml.nvmlDeviceGetHandleByPciBusId(bus)))
    return g


def dump() -> dict[str, Any]:
    n = len(DEVICES.gpus)
    return {
        "driver_version": attempt(pynvml.nvmlSystemGetDriverVersion),
        "nvml_version": attempt(pynvml.nvmlSystemGetNVMLVersion),
        "cuda_driver_version": attempt(pynvml.nvmlSystemGetCudaDriverVersion),
        "cuda_driver_version_v2": attempt(pynvml.nvmlSystemGetCudaDriverVersion_v2),
        "count": attempt(pynvml.nvmlDeviceGetCount),
        "gpu_set_numa0": attempt(
            lambda: [DEVICES.describe(d)["index"]  # type: ignore[index]
                     for d in pynvml.nvmlSystemGetTopologyGpuSet(0)]),
        "by_uuid_missing": attempt(pynvml.nvmlDeviceGetHandleByUUID, "GPU-00000000-0000-0000-0000-000000000000"),
        "handle_index_past_last": attempt(pynvml.nvmlDeviceGetHandleByIndex, n),
        "gpus": [dump_gpu(i, h, n) if h is not None else
                 attempt(pynvml.nvmlDeviceGetHandleByIndex, i) for i, h in enumerate(DEVICES.gpus)],
    }


# ---------------------------------------------------------------------------
# REPL


def event_json(data: Any) -> dict[str, Any]:
    return {
        "device": DEVICES.describe(data.device),
        "eventType": data.eventType,
        "eventData": data.eventData,
        "gpuInstanceId": data.gpuInstanceId,
        "computeInstanceId": data.computeInstanceId,
    }


def wait(event_set: Any, timeout_ms: int) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        data = pynvml.nvmlEventSetWait(event_set, timeout_ms)
        reply: dict[str, Any] = {"ok": event_json(data)}
    except pynvml.NVMLError as e:
        reply = {"error": type(e).__name__, "value": e.value}
    reply["elapsed_ms"] = (time.monotonic() - t0) * 1000
    return reply


EVENT_SET: Any = None


def resolve_arg(a: Any) -> Any:
    if isinstance(a, dict) and "handle" in a:
        return DEVICES.handle(a["handle"], a.get("mig"))
    if isinstance(a, dict) and a.get("event_set"):
        return EVENT_SET
    return a


def call(req: dict[str, Any]) -> dict[str, Any]:
    fn = getattr(pynvml, req["fn"])
    args = [resolve_arg(a) for a in req.get("args", [])]
    if "gpu" in req:
        args.insert(0, DEVICES.handle(req["gpu"], req.get("mig")))
    try:
        return {"ok": jsonable(fn(*args))}
    except pynvml.NVMLError as e:
        return {"error": type(e).__name__, "value": e.value}


def stress(event_set: Any, req: dict[str, Any]) -> dict[str, Any]:
    """Sample every GPU from threads while this thread waits for events."""
    stop = threading.Event()
    lock = threading.Lock()
    samples = 0
    errors: dict[str, int] = {}
    temps: dict[int, list[int]] = {i: [] for i in range(len(DEVICES.gpus))}

    def sampler() -> None:
        nonlocal samples
        while not stop.is_set():
            for i, h in enumerate(DEVICES.gpus):
                if h is None:
                    continue
                try:
                    t = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
                    pynvml.nvmlDeviceGetUtilizationRates(h)
                    pynvml.nvmlDeviceGetMemoryInfo(h)
                    pynvml.nvmlDeviceGetPowerUsage(h)
                    with lock:
                        samples += 1
                        if not temps[i] or temps[i][-1] != t:
                            temps[i].append(t)
                except pynvml.NVMLError as e:
                    with lock:
                        errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1

    threads = [threading.Thread(target=sampler) for _ in range(int(req.get("threads", 2)))]
    for t in threads:
        t.start()
    events = []
    deadline = time.monotonic() + float(req.get("seconds", 1.0))
    while time.monotonic() < deadline:
        r = wait(event_set, int(req.get("timeout_ms", 50)))
        if "ok" in r or r.get("error") != "NVMLError_Timeout":
            events.append(r)
    stop.set()
    for t in threads:
        t.join()
    return {"ok": {"samples": samples, "errors": errors,
                   "temperatures": {str(k): v for k, v in temps.items()}, "events": events}}


def main(argv: list[str]) -> int:
    mask = DEFAULT_MASK
    events = True
    if "--mask" in argv:
        mask = int(argv[argv.index("--mask") + 1], 0)
    if "--no-events" in argv:
        events = False

    pynvml.nvmlInit()
    DEVICES.load()
    if "--dump" in argv:
        print(json.dumps(dump(), indent=1, sort_keys=True))
        return 0

    global EVENT_SET
    event_set = EVENT_SET = pynvml.nvmlEventSetCreate()
    registered: list[Any] = []
    if events:
        for i, h in enumerate(DEVICES.gpus):
            if h is None:
                registered.append({"error": "no handle", "gpu": i})
                continue
            try:
                supported = pynvml.nvmlDeviceGetSupportedEventTypes(h)
                pynvml.nvmlDeviceRegisterEvents(h, mask & supported, event_set)
                registered.append(mask & supported)
            except pynvml.NVMLError as e:
                registered.append({"error": type(e).__name__})

    def out(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    out({"ready": True, "count": len(DEVICES.gpus), "registered": registered,
         "migs": {str(k): len(v) for k, v in DEVICES.migs.items()}})
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        op = req.get("op")
        try:
            if op == "exit":
                break
            if op == "call":
                out(call(req))
            elif op == "wait":
                out(wait(event_set, int(req["timeout_ms"])))
            elif op == "stress":
                out(stress(event_set, req))
            elif op == "dump":
                out({"ok": dump()})
            else:
                out({"exception": f"unknown op {op!r}"})
        except Exception as e:  # report, keep serving
            out({"exception": repr(e)})
    pynvml.nvmlEventSetFree(event_set)
    pynvml.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
