"""The GPU health loop of an agent: NVML events and checks that take a failing GPU, or
the MIG slice an event names, out of service.

What counts as failing:

- an Xid critical error event, unless its Xid is an application error (13, 31, 43,
  45, 68, 109 by default: a job's own fault, not the GPU's);
- a double-bit ECC error event;
- the GPU is lost (``NVML_ERROR_GPU_IS_LOST`` from any call on it);
- its temperature is over the configured limit;
- row remapping failed, or pages are waiting to be retired (where the GPU reports them).

Events are reported as they come; a condition that lasts is reported again every
``REPEAT_S`` seconds, so a GPU an admin returned to service while it still fails goes
out again. The controller decides what happens to the jobs (db/health.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpusched.agent.nvml import as_text, call_or, load, mig_handles

log = logging.getLogger(__name__)

REPEAT_S = 60.0  # a lasting condition is reported again this often
NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId of an event on a whole GPU


@dataclass(frozen=True)
class Fault:
    """A GPU or MIG slice that fails, and why."""

    uuid: str
    reason: str


def classify_xid(xid: int, ignored: frozenset[int]) -> str | None:
    """The fault an Xid event means, or None for an application error to ignore."""
    return None if xid in ignored else f"Xid {xid}"


class HealthMonitor:
    """Waits for NVML events and checks every GPU each ``interval`` seconds; each fault
    found goes to ``report`` (a list of faults at a time)."""

    def __init__(self, report: Callable[[list[Fault]], None], ignored_xids: frozenset[int],
                 max_temperature: float, interval: float,
                 sample: Callable[[list[dict[str, Any]]], None] | None = None) -> None:
        self.report = report
        self.sample = sample
        self.ignored = ignored_xids
        self.max_temperature = max_temperature
        self.interval = interval
        self.stop = threading.Event()
        self._last: dict[tuple[str, str], float] = {}  # (uuid, reason) -> reported at
        self._wait_error = ""

    def run(self) -> None:
        """Until ``stop`` is set (NVML must load: the agent runs this only then)."""
        nvml = load()
        try:
            self._watch(nvml)
        finally:
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError:
                pass

    def _watch(self, nvml: Any) -> None:
        gpus = self._gpus(nvml)
        events = self._event_set(nvml, gpus)
        next_check = 0.0
        while not self.stop.is_set():
            now = time.monotonic()
            if now >= next_check:
                self._send(self.check(nvml, gpus), lasting=True)
                if self.sample is not None:
                    self._send_samples(self.samples(nvml, gpus))
                next_check = now + self.interval
            wait_ms = max(1, int(min(1.0, next_check - time.monotonic()) * 1000))
            if events is None:
                self.stop.wait(wait_ms / 1000)
                continue
            try:
                event = nvml.nvmlEventSetWait_v2(events, wait_ms)
            except nvml.NVMLError_Timeout:
                continue
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) == nvml.NVML_ERROR_GPU_IS_LOST:
                    # A lost GPU breaks the whole set: wait on the others (the checks
                    # report the lost one).
                    lost = {u for u, (h, _) in gpus.items() if self._lost(nvml, h)}
                    try:
                        nvml.nvmlEventSetFree(events)
                    except nvml.NVMLError:
                        pass
                    events = self._event_set(nvml, {u: g for u, g in gpus.items()
                                                    if u not in lost})
                    continue
                if str(exc) != self._wait_error:  # say it once
                    log.warning("waiting for GPU events failed: %s", exc)
                    self._wait_error = str(exc)
                self.stop.wait(wait_ms / 1000)
                continue
            fault = self.event_fault(nvml, event, gpus)
            if fault is not None:
                self._send([fault], lasting=False)

    @staticmethod
    def _gpus(nvml: Any) -> dict[str, tuple[Any, dict[tuple[int, int], str]]]:
        """Whole GPUs by UUID: the handle and its MIG slices by (GPU instance, compute
        instance)."""
        found: dict[str, tuple[Any, dict[tuple[int, int], str]]] = {}
        for position in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(position)
            slices = {(nvml.nvmlDeviceGetGpuInstanceId(device),
                       nvml.nvmlDeviceGetComputeInstanceId(device)):
                      as_text(nvml.nvmlDeviceGetUUID(device))
                      for device in mig_handles(nvml, handle)}
            found[as_text(nvml.nvmlDeviceGetUUID(handle))] = (handle, slices)
        return found

    @staticmethod
    def _lost(nvml: Any, handle: Any) -> bool:
        try:
            nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
        except nvml.NVMLError as exc:
            return bool(getattr(exc, "value", None) == nvml.NVML_ERROR_GPU_IS_LOST)
        return False

    @staticmethod
    def _event_set(nvml: Any, gpus: dict[str, tuple[Any, dict[tuple[int, int], str]]]) -> Any:
        wanted = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
        events = nvml.nvmlEventSetCreate()
        registered = 0
        for uuid, (handle, _) in gpus.items():
            try:
                supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
                nvml.nvmlDeviceRegisterEvents(handle, wanted & supported, events)
                registered += 1
            except nvml.NVMLError as exc:
                log.warning("GPU %s gives no error events: %s", uuid, exc)
        if not registered:
            nvml.nvmlEventSetFree(events)
            return None
        return events

    def event_fault(self, nvml: Any, event: Any,
                    gpus: dict[str, tuple[Any, dict[tuple[int, int], str]]]) -> Fault | None:
        """The fault an event means: on the MIG slice it names, else on its GPU."""
        if event.eventType == nvml.nvmlEventTypeXidCriticalError:
            reason = classify_xid(int(event.eventData), self.ignored)
            if reason is None:
                return None
        elif event.eventType == nvml.nvmlEventTypeDoubleBitEccError:
            reason = "double-bit ECC error"
        else:
            return None
        try:
            uuid = as_text(nvml.nvmlDeviceGetUUID(event.device))
        except nvml.NVMLError:
            return None
        if uuid.startswith("MIG-"):
            return Fault(uuid, reason)
        handle, slices = gpus.get(uuid, (None, {}))
        where = (int(event.gpuInstanceId), int(event.computeInstanceId))
        if where[0] != NO_INSTANCE and where not in slices and handle is not None:
            # Its slices changed since they were read (dynamic MIG): read them again.
            try:
                slices = {(nvml.nvmlDeviceGetGpuInstanceId(device),
                           nvml.nvmlDeviceGetComputeInstanceId(device)):
                          as_text(nvml.nvmlDeviceGetUUID(device))
                          for device in mig_handles(nvml, handle)}
            except nvml.NVMLError:
                pass
            else:
                gpus[uuid] = (handle, slices)
        if where[0] != NO_INSTANCE and where in slices:
            return Fault(slices[where], reason)
        if where[0] != NO_INSTANCE:
            # The GPU instance alone (any compute instance within it).
            for (gi, _), slice_uuid in slices.items():
                if gi == where[0]:
                    return Fault(slice_uuid, reason)
        return Fault(uuid, reason)

    def check(self, nvml: Any, gpus: dict[str, tuple[Any, dict[tuple[int, int], str]]]
              ) -> list[Fault]:
        """The lasting conditions of every GPU now."""
        faults = []
        for uuid, (handle, _) in gpus.items():
            reason = self._condition(nvml, handle)
            if reason is not None:
                faults.append(Fault(uuid, reason))
        return faults

    def _condition(self, nvml: Any, handle: Any) -> str | None:
        try:
            temperature = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            if temperature > self.max_temperature:
                return f"temperature {temperature} C over the {self.max_temperature:g} C limit"
            try:
                remapped = nvml.nvmlDeviceGetRemappedRows(handle)
                if remapped[3]:
                    return "row remapping failed"
            except nvml.NVMLError_NotSupported:
                pass
            try:
                if nvml.nvmlDeviceGetRetiredPagesPendingStatus(handle):
                    return "retired pages pending"
            except nvml.NVMLError_NotSupported:
                pass
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == nvml.NVML_ERROR_GPU_IS_LOST:
                return "GPU lost (NVML_ERROR_GPU_IS_LOST)"
            log.debug("GPU check failed: %s", exc)
        return None

    @staticmethod
    def samples(nvml: Any, gpus: dict[str, tuple[Any, dict[tuple[int, int], str]]]
                ) -> list[dict[str, Any]]:
        """Utilisation (%), memory used (MiB), temperature (C) and power (mW) of every
        GPU that answers."""
        found = []
        for uuid, (handle, _) in gpus.items():
            try:
                found.append({
                    "uuid": uuid,
                    "util": int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                    "mem_used_mb": int(nvml.nvmlDeviceGetMemoryInfo(handle).used // (1024 * 1024)),
                    "temperature": int(nvml.nvmlDeviceGetTemperature(handle,
                                                                     nvml.NVML_TEMPERATURE_GPU)),
                    "power_mw": int(call_or(nvml, nvml.nvmlDeviceGetPowerUsage, handle,
                                            default=0))})
            except nvml.NVMLError:
                continue  # a lost GPU: the checks deal with it
        return found

    def _send_samples(self, samples: list[dict[str, Any]]) -> None:
        if not samples or self.sample is None:
            return
        try:
            self.sample(samples)
        except Exception as exc:  # noqa: BLE001 - the next sample goes anyway
            log.debug("cannot send GPU samples: %s", exc)

    def _send(self, faults: list[Fault], lasting: bool) -> None:
        """Report ``faults``: every event, and a lasting condition once per ``REPEAT_S``."""
        now = time.monotonic()
        fresh = [f for f in faults if not lasting
                 or now - self._last.get((f.uuid, f.reason), -REPEAT_S) >= REPEAT_S]
        if not fresh:
            return
        try:
            self.report(fresh)
        except Exception as exc:  # noqa: BLE001 - report again on the next round
            log.warning("cannot report GPU faults yet: %s", exc)
            return
        for fault in fresh:
            self._last[(fault.uuid, fault.reason)] = now
            log.warning("GPU %s out of service: %s", fault.uuid, fault.reason)
