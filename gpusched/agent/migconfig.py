"""Re-partitioning one idle MIG GPU through NVML (dynamic MIG).

:func:`apply_layout` gives a GPU in MIG mode a target layout, a list of profile names
(``["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]``):

1. the layout is checked against the GPU's model (``gpusched.core.mig_layout``), and
   the GPU must be in MIG mode; nothing is touched otherwise;
2. the GPU must be idle: no compute process on it or on any of its MIG devices, and none
   of its UUIDs (the GPU's or a slice's) among ``busy`` (the slices the caller has given
   to jobs). Otherwise :class:`GpuBusy`, and nothing is touched;
3. a placement of the target is chosen that keeps as many of the current instances where
   they are as possible; the GPU instances that are not kept are destroyed (their compute
   instances first), and the missing ones are created, largest first, at their chosen
   placements, each with one compute instance over all its slices (one MIG device);
4. the result is the GPU's slices read back as the agent's inventory reports them
   (``gpusched.agent.nvml.gpu_slices``): kept slices keep their UUIDs, new ones get new
   UUIDs from the driver.

A GPU instance that does not hold exactly one compute instance over all its slices
(``1c.3g.40gb`` and the like, made by hand) is never kept. A failure half-way (the
driver refuses a call) raises :class:`MigConfigError` saying what was done; the GPU is
then left with what it has, which the next inventory reports.

:func:`apply_command` does a ``mig`` node command of the controller (dynamic MIG) with
:func:`apply_layout`, the GPUs of the jobs running here (:func:`held_gpus`) counting as
busy; a refusal is logged and changes nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpusched.agent.nvml import (
    GpuInstance,
    NvmlUnavailable,
    as_text,
    gpu_instances,
    gpu_processes,
    gpu_slices,
    gpu_type,
    instance_profiles,
    load,
)
from gpusched.agent.settings import AgentConfig, StaticGpu
from gpusched.core.mig_layout import LayoutError, best_placement, check_layout
from gpusched.errors import GpuschedError
from gpusched.messages.mig import MigCommand

if TYPE_CHECKING:
    from gpusched.agent.launcher import Launcher

log = logging.getLogger(__name__)


class MigConfigError(GpuschedError):
    """The layout cannot be applied to this GPU (bad layout, no MIG, a driver refusal)."""

    code = "mig_config"


class GpuBusy(MigConfigError):
    """The GPU has a process or a slice given to a job: it is left as it is."""

    code = "gpu_busy"


@dataclass(frozen=True)
class Applied:
    """What a GPU has after :func:`apply_layout`."""

    gpu_uuid: str
    model: str  # a100-80gb
    slices: tuple[StaticGpu, ...]  # its MIG slices, as the inventory reports them
    created: tuple[str, ...]  # UUIDs of the MIG devices made
    destroyed: tuple[str, ...]  # UUIDs of the MIG devices removed

    @property
    def layout(self) -> tuple[str, ...]:
        return tuple(s.mig_profile or "" for s in self.slices)


def apply_layout(gpu: int | str, layout: Sequence[str], busy: Iterable[str] = ()) -> Applied:
    """Give the GPU (NVML index or ``GPU-`` UUID) the MIG ``layout``; see the module."""
    if isinstance(gpu, bool) or not isinstance(gpu, (int, str)):
        raise MigConfigError(f"a GPU is an NVML index or a GPU- UUID, not {gpu!r}")
    if isinstance(layout, str) or not all(isinstance(p, str) for p in layout):
        raise MigConfigError(f"a MIG layout is a list of profile names, not {layout!r}")
    wanted = tuple(layout)
    taken = frozenset(busy)
    nvml = load()
    try:
        return _apply(nvml, _handle(nvml, gpu), wanted, taken)
    except nvml.NVMLError as exc:  # a read that failed (a lost GPU, say)
        raise MigConfigError(f"GPU {gpu!r}: NVML failed: {exc}") from None
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _handle(nvml: Any, gpu: int | str) -> Any:
    try:
        if isinstance(gpu, int):
            return nvml.nvmlDeviceGetHandleByIndex(gpu)
        if not gpu.startswith("GPU-"):
            raise MigConfigError(f"{gpu!r} is not a GPU UUID (GPU-...)")
        return nvml.nvmlDeviceGetHandleByUUID(gpu)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) in (nvml.NVML_ERROR_NOT_FOUND, nvml.NVML_ERROR_INVALID_ARGUMENT):
            raise MigConfigError(f"no GPU {gpu!r} here: {exc}") from None
        raise MigConfigError(f"GPU {gpu!r}: {exc}") from None


def _apply(nvml: Any, handle: Any, layout: tuple[str, ...], busy: frozenset[str]) -> Applied:
    uuid = as_text(nvml.nvmlDeviceGetUUID(handle))
    model = gpu_type(as_text(nvml.nvmlDeviceGetName(handle)))
    try:
        check_layout(model, layout)
    except LayoutError as exc:
        raise MigConfigError(f"GPU {uuid}: {exc}") from None
    mode = _call(nvml, f"GPU {uuid}: reading its MIG mode", nvml.nvmlDeviceGetMigMode, handle)
    if mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
        raise MigConfigError(f"GPU {uuid} is not in MIG mode (an administrator enables it: "
                             "nvidia-smi -i N -mig 1, then a GPU reset)")
    profiles = instance_profiles(nvml, handle)
    missing = sorted(set(layout) - set(profiles))
    if missing:
        raise MigConfigError(f"GPU {uuid} does not offer {', '.join(missing)} "
                             f"(its driver offers {', '.join(profiles) or 'none'})")

    slices = gpu_slices(nvml, handle)
    held = sorted(({uuid} | {s.uuid for s in slices}) & busy)
    if held:
        raise GpuBusy(f"GPU {uuid} is in use: {', '.join(held)} given to jobs")
    pids = _call(nvml, f"GPU {uuid}: listing its processes", gpu_processes, nvml, handle)
    if pids:
        raise GpuBusy(f"GPU {uuid} is in use: processes {', '.join(map(str, pids))} run on it")

    instances = _call(nvml, f"GPU {uuid}: reading its instances", gpu_instances, nvml, handle)
    current = [(gi.profile, gi.start) for gi in instances if gi.whole]
    chosen = best_placement(model, layout, current)
    if chosen is None:  # pragma: no cover - check_layout found one
        raise MigConfigError(f"GPU {uuid}: {' + '.join(layout)} cannot be placed")
    keep: list[GpuInstance] = []
    create: list[tuple[str, int]] = []
    spare = [gi for gi in instances if gi.whole]
    for profile, start in chosen:
        match = next((gi for gi in spare if (gi.profile, gi.start) == (profile, start)), None)
        if match is None:
            create.append((profile, start))
        else:
            spare.remove(match)
            keep.append(match)
    drop = [gi for gi in instances if not any(gi is k for k in keep)]
    if not drop and not create:
        return Applied(uuid, model, tuple(slices), (), ())

    destroyed: list[str] = []
    created: list[str] = []

    def done() -> str:
        return (f"(destroyed {', '.join(destroyed) or 'nothing'}; "
                f"created {', '.join(created) or 'nothing'})")

    for gi in drop:
        for ci in gi.compute:
            _call(nvml, f"GPU {uuid}: destroying MIG device {ci.uuid} {done()}",
                  nvml.nvmlComputeInstanceDestroy, ci.handle)
            destroyed.append(ci.uuid)
        _call(nvml, f"GPU {uuid}: destroying GPU instance {gi.id} ({gi.profile}) {done()}",
              nvml.nvmlGpuInstanceDestroy, gi.handle)
    for profile, start in create:  # chosen is largest first
        info = profiles[profile]
        what = f"GPU {uuid}: creating {profile} at memory slice {start}"
        placement = nvml.c_nvmlGpuInstancePlacement_t(start, _size(model, profile))
        gi_handle = _call(nvml, f"{what} {done()}", nvml.nvmlDeviceCreateGpuInstanceWithPlacement,
                          handle, info.id, _ref(placement))
        ci_handle = _call(nvml, f"{what}: its compute instance {done()}",
                          nvml.nvmlGpuInstanceCreateComputeInstance, gi_handle,
                          _whole_compute_profile(nvml, gi_handle, int(info.sliceCount)))
        device = nvml.nvmlComputeInstanceGetInfo(ci_handle).device
        created.append(as_text(nvml.nvmlDeviceGetUUID(device)))
    log.info("GPU %s re-partitioned to %s: destroyed %s, created %s", uuid, " + ".join(layout),
             destroyed or "nothing", created or "nothing")
    return Applied(uuid, model, tuple(gpu_slices(nvml, handle)), tuple(created), tuple(destroyed))


def held_gpus(launcher: Launcher) -> set[str]:
    """The GPU and MIG-slice UUIDs given to the jobs whose supervisors run here (their
    ``CUDA_VISIBLE_DEVICES``)."""
    held: set[str] = set()
    for job_id in launcher.running():
        try:
            spec = json.loads((launcher.jobs_dir / str(job_id) / "spec.json").read_text())
        except (OSError, ValueError):
            continue
        env = spec.get("env") if isinstance(spec, dict) else None
        visible = env.get("CUDA_VISIBLE_DEVICES") if isinstance(env, dict) else None
        if isinstance(visible, str):
            held.update(uuid for uuid in visible.split(",") if uuid)
    return held


def apply_command(command: MigCommand, config: AgentConfig, busy: Iterable[str]) -> bool:
    """Do a ``mig`` node command on this node: the layout it names for its GPU, unless a
    job here holds the GPU or a slice of it (``busy``) or a process runs on it. A refusal
    (busy, a layout the GPU cannot take, no MIG mode, no such GPU) is logged and changes
    nothing. Whether the GPU's slices may have changed (the node's inventory is then
    registered again: after a failure half-way too)."""
    target = command.layout
    what = f"MIG layout {' + '.join(target.layout)} for GPU {target.gpu_uuid}"
    if command.node != config.node_name:
        log.warning("refused the %s: the command is for node %s, not %s", what, command.node,
                    config.node_name)
        return False
    if config.gpu_source == "static":
        log.warning("refused the %s: this node's GPUs are configured statically", what)
        return False
    try:
        applied = apply_layout(target.gpu_uuid, target.layout, busy)
    except GpuBusy as exc:
        log.warning("refused the %s: %s", what, exc.message)
        return False
    except MigConfigError as exc:  # maybe half done: the inventory says what is left
        log.warning("could not apply the %s: %s", what, exc.message)
        return True
    except NvmlUnavailable as exc:
        log.warning("refused the %s: %s", what, exc.message)
        return False
    log.info("applied the %s: slices %s", what, ", ".join(
        f"{s.uuid} ({s.mig_profile})" for s in applied.slices) or "none")
    return bool(applied.created or applied.destroyed)


def _size(model: str, profile: str) -> int:
    from gpusched.core.mig_layout import MODELS

    return MODELS[model][profile].size


def _ref(value: Any) -> Any:
    import ctypes

    return ctypes.byref(value)


def _whole_compute_profile(nvml: Any, gi: Any, slices: int) -> int:
    """The compute-instance profile id that covers all of a GPU instance's slices."""
    for profile in range(getattr(nvml, "NVML_COMPUTE_INSTANCE_PROFILE_COUNT", 0)):
        try:
            info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, profile, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        except nvml.NVMLError:
            continue
        if int(info.sliceCount) == slices:
            return int(info.id)
    raise MigConfigError(f"no compute-instance profile of {slices} slices")


def _call(nvml: Any, what: str, function: Any, *args: Any) -> Any:
    try:
        return function(*args)
    except nvml.NVMLError as exc:
        raise MigConfigError(f"{what}: {exc}") from None
