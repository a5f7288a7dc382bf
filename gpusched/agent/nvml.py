"""GPU discovery through NVML (pynvml): GPUs, MIG slices and how GPUs are connected.

``discover()`` returns the same ``StaticGpu`` records a static inventory holds, so the
agent registers either alike:

- a whole GPU: its NVML index, UUID, product name, normalised type (``a100-80gb``),
  memory and PCI bus id;
- a GPU in MIG mode: the GPU itself (never handed out whole) and one record per MIG
  device, with its ``MIG-`` UUID, profile (``3g.40gb``) and memory, and the parent's
  index. A MIG device has no node-wide NVML index, so its index here is
  ``(parent index + 1) * 100 + n`` for the n-th MIG device of that GPU (GPU 0's slices
  are 100, 101, ...; GPU 3's are 400, ...);
- links between whole GPUs: NVLink (with the number of links) where NVML reports active
  links between the pair, else the closest common PCIe ancestor (same switch, same host
  bridge, same NUMA node, or across sockets).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from typing import Any

from gpusched.agent.settings import StaticGpu
from gpusched.errors import GpuschedError

log = logging.getLogger(__name__)
SLICE_BASE = 100  # MIG device indexes: (parent index + 1) * SLICE_BASE + n

# NVML topology levels (nvmlGpuTopologyLevel_t) and the link kind each one means.
_LEVELS = {0: "PCIE_SWITCH", 10: "PCIE_SWITCH", 20: "PCIE_SWITCH", 30: "PCIE_HOST_BRIDGE",
           40: "NUMA_NODE", 50: "SYSTEM"}
_VENDOR_WORDS = {"nvidia", "tesla", "geforce", "quadro"}
_FORM_WORDS = {"sxm", "sxm2", "sxm4", "sxm5", "pcie", "hbm2", "hbm2e", "hbm3", "hbm3e", "nvl",
               "mig", "dgx"}
_MEMORY = re.compile(r"(\d+)\s*gb", re.IGNORECASE)


class NvmlUnavailable(GpuschedError):
    """NVML could not be loaded or initialised (no driver, no GPU)."""


@dataclass(frozen=True)
class Discovered:
    """What NVML reported: GPUs and slices, links, and the driver version."""

    gpus: tuple[StaticGpu, ...]
    links: tuple[tuple[int, int, str, int], ...]  # (index, index, kind, nvlinks)
    driver: str = ""


def gpu_type(name: str) -> str:
    """The normalised type of a product name: ``NVIDIA A100-SXM4-80GB`` -> ``a100-80gb``,
    ``NVIDIA H100 80GB HBM3`` -> ``h100-80gb``, ``NVIDIA L4`` -> ``l4``, ``Tesla T4`` ->
    ``t4``, ``NVIDIA GeForce RTX 4090`` -> ``rtx4090``; ``gpu`` when nothing is left."""
    memory = _MEMORY.search(name)
    words = [w for w in re.split(r"[\s\-_/]+", name.lower()) if w]
    words = [w for w in words if w not in _VENDOR_WORDS and w not in _FORM_WORDS
             and not _MEMORY.fullmatch(w)]
    if not words:
        return "gpu"
    model = words[0]
    if model in ("rtx", "gtx", "titan") and len(words) > 1:
        model += words[1]
    model = re.sub(r"[^a-z0-9.]", "", model) or "gpu"
    return f"{model}-{memory.group(1)}gb" if memory else model


def mig_profile(slices: int, memory_mb: int, parent_memory_mb: int, parent_name: str) -> str:
    """The profile name of a MIG device, as ``nvidia-smi`` prints it (``1g.10gb``).

    The memory part counts eighths of the parent GPU's nominal memory (the size in its
    product name, else its memory rounded to GiB): a slice of 9,728 MiB on an 80 GB
    A100 is one eighth, 10 GB.
    """
    named = _MEMORY.search(parent_name)
    nominal = int(named.group(1)) if named else max(1, round(parent_memory_mb / 1024))
    eighth = parent_memory_mb / 8 if parent_memory_mb else 1.0
    eighths = max(1, round(memory_mb / eighth))
    return f"{slices}g.{max(1, round(eighths * nominal / 8))}gb"


def as_text(value: Any) -> str:
    """A string pynvml returned (bytes in older versions)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus_id(pci: Any) -> str:
    """The PCI bus id in the 8-digit-domain form (``00000000:07:00.0``)."""
    text = as_text(getattr(pci, "busId", b"") or getattr(pci, "busIdLegacy", b""))
    return text.upper() if text else ""


def load() -> Any:
    """pynvml, initialised; NvmlUnavailable when the library or a driver is missing."""
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise NvmlUnavailable(f"pynvml is not installed: {exc}") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML is not available: {exc}") from None
    return pynvml


def discover() -> Discovered:
    """Every GPU and MIG device NVML reports, and the links between whole GPUs."""
    nvml = load()
    try:
        return _discover(nvml)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _discover(nvml: Any) -> Discovered:
    gpus: list[StaticGpu] = []
    handles: dict[int, Any] = {}
    buses: dict[str, int] = {}
    for position in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(position)
            index = call_or(nvml, nvml.nvmlDeviceGetIndex, handle, default=position)
            name = as_text(nvml.nvmlDeviceGetName(handle))
            memory_mb = int(nvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024))
            bus = _bus_id(nvml.nvmlDeviceGetPciInfo(handle))
            kind = gpu_type(name)
            found = [StaticGpu(index=index, uuid=as_text(nvml.nvmlDeviceGetUUID(handle)), name=name,
                               memory_mb=memory_mb, pci_bus_id=bus, type=kind,
                               minor=_bounded(call_or(nvml, nvml.nvmlDeviceGetMinorNumber,
                                                      handle), 254),
                               numa_node=_bounded(call_or(nvml, nvml.nvmlDeviceGetNumaNodeId,
                                                          handle), 1023)),
                     *_mig_devices(nvml, handle, index, name, memory_mb, kind)]
        except nvml.NVMLError as exc:
            # Fallen off the bus, or otherwise unreadable: not offered until it is back.
            log.warning("GPU at NVML position %d left out of the inventory: %s", position, exc)
            continue
        gpus.extend(found)
        handles[index] = handle
        if bus:
            buses[bus] = index
    return Discovered(tuple(gpus), _links(nvml, handles, buses),
                      as_text(call_or(nvml, nvml.nvmlSystemGetDriverVersion, default="")))


def call_or(nvml: Any, function: Any, *args: Any, default: Any = None) -> Any:
    """``function(*args)``, or ``default`` where this GPU or driver does not support it."""
    try:
        return function(*args)
    except nvml.NVMLError:
        return default


def _bounded(value: Any, upper: int) -> int | None:
    """An id NVML returned, or None when it is missing or out of range (-1: unknown)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= upper:
        return value
    return None


def mig_handles(nvml: Any, handle: Any) -> list[Any]:
    """The handles of a GPU's MIG devices, in NVML's order; none when MIG is off."""
    mode = call_or(nvml, nvml.nvmlDeviceGetMigMode, handle)
    if not mode or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
        return []
    slots = call_or(nvml, nvml.nvmlDeviceGetMaxMigDeviceCount, handle, default=0) or 0
    found = (call_or(nvml, nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
             for slot in range(slots))
    return [device for device in found if device is not None]


def _mig_devices(nvml: Any, handle: Any, index: int, name: str, memory_mb: int,
                 kind: str) -> list[StaticGpu]:
    found: list[StaticGpu] = []
    for device in mig_handles(nvml, handle):
        attributes = nvml.nvmlDeviceGetAttributes(device)
        slice_mb = int(attributes.memorySizeMB)
        found.append(StaticGpu(
            index=(index + 1) * SLICE_BASE + len(found),
            uuid=as_text(nvml.nvmlDeviceGetUUID(device)), name=name, memory_mb=slice_mb,
            type=kind, parent=index,
            gi_id=_bounded(call_or(nvml, nvml.nvmlDeviceGetGpuInstanceId, device), 255),
            ci_id=_bounded(call_or(nvml, nvml.nvmlDeviceGetComputeInstanceId, device), 255),
            mig_profile=mig_profile(int(attributes.gpuInstanceSliceCount), slice_mb,
                                    memory_mb, name)))
    return found


def _links(nvml: Any, handles: dict[int, Any], buses: dict[str, int]
           ) -> tuple[tuple[int, int, str, int], ...]:
    nvlinks: dict[tuple[int, int], int] = {}
    for index, handle in handles.items():
        for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            state = call_or(nvml, nvml.nvmlDeviceGetNvLinkState, handle, link)
            if state is None:
                if link == 0:
                    break  # no NVLink on this GPU
                continue
            if state != getattr(nvml, "NVML_FEATURE_ENABLED", 1):
                continue
            remote = call_or(nvml, nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            peer = buses.get(_bus_id(remote)) if remote is not None else None
            if peer is not None and peer != index:
                pair = (min(index, peer), max(index, peer))
                nvlinks[pair] = nvlinks.get(pair, 0) + 1
    links: list[tuple[int, int, str, int]] = []
    order = sorted(handles)
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            count = nvlinks.get((a, b), 0)
            if count:
                # Each side counts the link: halve, rounding up for an odd report.
                links.append((a, b, "NVLINK", math.ceil(count / 2)))
                continue
            level = call_or(nvml, nvml.nvmlDeviceGetTopologyCommonAncestor, handles[a], handles[b])
            if level is not None and int(level) in _LEVELS:
                links.append((a, b, _LEVELS[int(level)], 0))
    return tuple(links)


# ---------------------------------------------------------------------------
# One GPU's MIG state, for re-partitioning (gpusched.agent.migconfig).


@dataclass(frozen=True)
class ComputeInstance:
    """A compute instance: one MIG device."""

    handle: Any
    id: int
    slices: int  # compute slices
    uuid: str  # its MIG device's UUID


@dataclass(frozen=True)
class GpuInstance:
    """A GPU instance: a profile placed on the GPU, and its compute instances."""

    handle: Any
    id: int
    profile: str  # 3g.40gb
    slices: int  # compute slices
    start: int  # placement: first memory slice ...
    size: int  # ... and how many
    compute: tuple[ComputeInstance, ...]

    @property
    def whole(self) -> bool:
        """One compute instance over all its slices: one MIG device of its profile."""
        return len(self.compute) == 1 and self.compute[0].slices == self.slices


def gpu_slices(nvml: Any, handle: Any) -> list[StaticGpu]:
    """The MIG slices of one GPU, as :func:`discover` reports them."""
    index = call_or(nvml, nvml.nvmlDeviceGetIndex, handle, default=0)
    name = as_text(nvml.nvmlDeviceGetName(handle))
    memory_mb = int(nvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024))
    return _mig_devices(nvml, handle, index, name, memory_mb, gpu_type(name))


def gpu_processes(nvml: Any, handle: Any) -> list[int]:
    """The ids of the compute processes on a GPU and on each of its MIG devices."""
    pids: set[int] = set()
    for device in [handle, *mig_handles(nvml, handle)]:
        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(device):
            pids.add(int(proc.pid))
    return sorted(pids)


def instance_profiles(nvml: Any, handle: Any) -> dict[str, Any]:
    """The GPU-instance profiles a GPU offers, by name (``1g.10gb``): NVML's profile
    information (``id``, ``sliceCount``, ``instanceCount``, ``memorySizeMB``)."""
    name = as_text(nvml.nvmlDeviceGetName(handle))
    memory_mb = int(nvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024))
    found: dict[str, Any] = {}
    for profile in range(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0)):
        info = call_or(nvml, nvml.nvmlDeviceGetGpuInstanceProfileInfo, handle, profile)
        if info is None or not info.sliceCount:
            continue
        named = as_text(getattr(info, "name", b"")).removeprefix("MIG ").strip()
        found.setdefault(named or mig_profile(int(info.sliceCount), int(info.memorySizeMB),
                                              memory_mb, name), info)
    return found


def gpu_instances(nvml: Any, handle: Any) -> list[GpuInstance]:
    """A MIG GPU's GPU instances with their compute instances, by placement."""
    import ctypes

    found: list[GpuInstance] = []
    for profile, info in instance_profiles(nvml, handle).items():
        array = (nvml.c_nvmlGpuInstance_t * max(1, int(info.instanceCount)))()
        count = ctypes.c_uint(0)
        nvml.nvmlDeviceGetGpuInstances(handle, info.id, array, ctypes.byref(count))
        for gi in array[:count.value]:
            gi_info = nvml.nvmlGpuInstanceGetInfo(gi)
            found.append(GpuInstance(gi, int(gi_info.id), profile, int(info.sliceCount),
                                     int(gi_info.placement.start), int(gi_info.placement.size),
                                     tuple(_compute_instances(nvml, gi))))
    return sorted(found, key=lambda gi: (gi.start, gi.id))


def _compute_instances(nvml: Any, gi: Any) -> list[ComputeInstance]:
    import ctypes

    found: list[ComputeInstance] = []
    seen: set[int] = set()
    for profile in range(getattr(nvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 0)):
        info = call_or(nvml, nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo, gi, profile,
                       nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        if info is None or int(info.id) in seen:
            continue
        seen.add(int(info.id))
        array = (nvml.c_nvmlComputeInstance_t * max(1, int(info.instanceCount)))()
        count = ctypes.c_uint(0)
        if call_or(nvml, nvml.nvmlGpuInstanceGetComputeInstances, gi, info.id, array,
                   ctypes.byref(count)) is None:
            continue
        for ci in array[:count.value]:
            ci_info = nvml.nvmlComputeInstanceGetInfo(ci)
            found.append(ComputeInstance(ci, int(ci_info.id), int(info.sliceCount),
                                         as_text(nvml.nvmlDeviceGetUUID(ci_info.device))))
    return found
