"""What an agent registers: its node's GPUs (from NVML or the static inventory), how they
are connected, and the node's CPUs and memory. ``gpusched agent inventory`` prints it."""

from __future__ import annotations

import logging
import os
from dataclasses import asdict
from typing import Any

from gpusched.agent.nvml import Discovered, NvmlUnavailable, discover
from gpusched.agent.settings import AgentConfig
from gpusched.core.features import gpu_features

log = logging.getLogger(__name__)


def gpu_inventory(config: AgentConfig) -> tuple[str, Discovered]:
    """Where the GPUs came from (``nvml`` or ``static``) and what they are.

    ``source = "auto"`` uses NVML when its library loads and the static inventory
    otherwise; ``"nvml"`` insists on NVML (NvmlUnavailable when it cannot load).
    """
    if config.gpu_source != "static":
        try:
            return "nvml", discover()
        except NvmlUnavailable as exc:
            if config.gpu_source == "nvml":
                raise
            log.debug("using the static inventory: %s", exc.message)
    return "static", Discovered(config.static_gpus, config.static_links)


def node_inventory(config: AgentConfig) -> dict[str, Any]:
    """The registration body: see docs/admin.md, "Node inventory"."""
    source, found = gpu_inventory(config)
    gpus = [asdict(gpu) for gpu in found.gpus]
    return {
        "node": config.node_name,
        "uid": os.geteuid(),
        "source": source,
        "driver": found.driver,
        "gpus": gpus,
        "links": [{"a": a, "b": b, "kind": kind, "nvlinks": n} for a, b, kind, n in found.links],
        "cpus": os.cpu_count() or 0,
        "memory_mb": memory_mb(),
        "block": config.block,
        "features": gpu_features(gpus, any(kind == "NVLINK" for *_, kind, _ in found.links),
                                 compute_capabilities() if source == "nvml" else ()),
    }


def compute_capabilities() -> list[tuple[int, int]]:
    """The CUDA compute capability of each GPU NVML reports (``sm_80`` features)."""
    from gpusched.agent.nvml import call_or, load

    try:
        nvml = load()
    except NvmlUnavailable:
        return []
    try:
        found = []
        for position in range(call_or(nvml, nvml.nvmlDeviceGetCount, default=0)):
            handle = call_or(nvml, nvml.nvmlDeviceGetHandleByIndex, position)
            pair = None if handle is None else call_or(
                nvml, nvml.nvmlDeviceGetCudaComputeCapability, handle)
            if isinstance(pair, tuple | list) and len(pair) == 2:
                found.append((int(pair[0]), int(pair[1])))
        return found
    finally:
        call_or(nvml, nvml.nvmlShutdown)


def memory_mb() -> int:
    """This host's memory in MiB (0 when it cannot be read)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError):
        return 0
