"""An agent's metrics (``[metrics] agent_listen``, docs/operations.md): each GPU's
utilisation, memory, temperature, power, ECC and Xid counts from the agent's own NVML
samples, labelled with the node, the GPU's index, UUID and model and the job(s)
holding it; and the jobs the node runs.

The figures are those of the health loop (gpusched.agent.health): every
``[agent.health] interval`` it samples each GPU for the controller, and this monitor
reads the ECC counters beside them and counts every Xid event the loop receives
(application Xids too, which the loop does not act on). A scrape reads no NVML: it
shows the last sample. Names are DCGM-exporter's where the meaning is the same, so
that dashboards made for it work; the others follow Prometheus' conventions.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

import gpusched
from gpusched.agent.health import HealthMonitor
from gpusched.agent.launcher import Launcher
from gpusched.agent.nvml import as_text, call_or

GpuSlices = dict[str, tuple[Any, dict[tuple[int, int], str]]]  # as HealthMonitor keeps them
GPU_LABELS = ["node", "gpu", "UUID", "modelName", "hpc_job"]
# (DCGM field, what NVML's nvmlDeviceGetTotalEccErrors is asked: error type, counter)
ECC_FIELDS = (("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", 0, 0), ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1, 0),
              ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", 0, 1), ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", 1, 1))
_ECC_WORDS = {0: "single-bit (corrected)", 1: "double-bit (uncorrected)"}


@dataclass
class GpuSample:
    """One whole GPU as last sampled."""

    uuid: str
    index: int
    model: str
    util: int
    mem_used_mb: int
    mem_total_mb: int
    temperature: int
    power_mw: int
    ecc: dict[str, int]  # DCGM field -> count; a field the GPU does not report is absent
    slices: frozenset[str] = frozenset()  # its MIG slices' UUIDs
    at: float = 0.0  # epoch seconds


@dataclass
class _Xids:
    counts: dict[int, int] = field(default_factory=dict)  # Xid -> events
    last: int = 0


class AgentMetrics:
    """The samples and Xid counts of one node's GPUs, and its registry."""

    def __init__(self, node: str, launcher: Launcher) -> None:
        self.node = node
        self.launcher = launcher
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_AgentCollector(self))
        self._lock = threading.Lock()
        self.gpus: dict[str, GpuSample] = {}
        self.xids: dict[str, _Xids] = {}
        self._holders: dict[int, tuple[int, tuple[str, ...]]] = {}  # job -> (mtime, GPUs)
        self._holders_lock = threading.Lock()

    def health_monitor(self, *args: Any, **kwargs: Any) -> HealthMonitor:
        """A health monitor (HealthMonitor's arguments) that also feeds these metrics."""
        return _SamplingMonitor(self, *args, **kwargs)

    def scrape(self) -> bytes:
        """The text exposition (what ``GET /metrics`` answers)."""
        return prometheus_client.generate_latest(self.registry)

    def record(self, samples: list[GpuSample]) -> None:
        """The GPUs as just sampled."""
        with self._lock:
            for sample in samples:
                self.gpus[sample.uuid] = sample

    def record_xid(self, uuid: str, xid: int) -> None:
        """An Xid event on the whole GPU ``uuid``."""
        with self._lock:
            seen = self.xids.setdefault(uuid, _Xids())
            seen.counts[xid] = seen.counts.get(xid, 0) + 1
            seen.last = xid

    def holders(self, running: list[int]) -> dict[str, list[int]]:
        """Each GPU or MIG slice UUID -> the jobs of ``running`` that hold it (from each
        run's spec.json, read again only when it changes)."""
        with self._holders_lock:  # two scrapes at once
            return self._holders_of(running)

    def _holders_of(self, running: list[int]) -> dict[str, list[int]]:
        held: dict[str, list[int]] = {}
        for job_id in running:
            spec = self.launcher.jobs_dir / str(job_id) / "spec.json"
            try:
                mtime = spec.stat().st_mtime_ns
            except OSError:
                continue
            known = self._holders.get(job_id)
            if known is None or known[0] != mtime:
                known = self._holders[job_id] = (mtime, _spec_gpus(spec))
            for uuid in known[1]:
                held.setdefault(uuid, []).append(job_id)
        for gone in self._holders.keys() - set(running):
            del self._holders[gone]
        return held


def _spec_gpus(path: Path) -> tuple[str, ...]:
    """The GPU (or slice) UUIDs a run's spec gives its job; none if it cannot be read."""
    try:
        spec = json.loads(path.read_text())
        text = spec["env"]["GPUSCHED_JOB_GPUS"]
    except (OSError, ValueError, KeyError, TypeError):
        return ()
    return tuple(u for u in str(text).split(",") if u)


class _SamplingMonitor(HealthMonitor):
    """The health loop, keeping what it samples and the Xid events it receives."""

    def __init__(self, metrics: AgentMetrics, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.metrics = metrics

    def samples(self, nvml: Any, gpus: GpuSlices) -> list[dict[str, Any]]:  # type: ignore[override]
        """What the controller is sent, and the same GPUs' ECC counters for the metrics."""
        found = HealthMonitor.samples(nvml, gpus)
        now = time.time()
        records = []
        for sample in found:
            handle, slices = gpus[sample["uuid"]]
            memory = call_or(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
            ecc = {}
            for name, kind, counter in ECC_FIELDS:
                count = call_or(nvml, nvml.nvmlDeviceGetTotalEccErrors, handle, kind, counter)
                if count is not None:
                    ecc[name] = int(count)
            records.append(GpuSample(
                uuid=sample["uuid"], index=int(call_or(nvml, nvml.nvmlDeviceGetIndex, handle,
                                                       default=-1)),
                model=as_text(call_or(nvml, nvml.nvmlDeviceGetName, handle, default="")),
                util=sample["util"], mem_used_mb=sample["mem_used_mb"],
                mem_total_mb=int(memory.total // (1024 * 1024)) if memory is not None else 0,
                temperature=sample["temperature"], power_mw=sample["power_mw"], ecc=ecc,
                slices=frozenset(slices.values()), at=now))
        self.metrics.record(records)
        return found

    def event_fault(self, nvml: Any, event: Any, gpus: GpuSlices) -> Any:
        """Count an Xid on its whole GPU (an event on a MIG slice, on the slice's GPU),
        then judge it as the health loop does."""
        if event.eventType == nvml.nvmlEventTypeXidCriticalError:
            uuid = as_text(call_or(nvml, nvml.nvmlDeviceGetUUID, event.device, default=""))
            for whole, (_, slices) in gpus.items():
                if uuid in slices.values():
                    uuid = whole
            if uuid in gpus:
                self.metrics.record_xid(uuid, int(event.eventData))
        return super().event_fault(nvml, event, gpus)


class _AgentCollector(Collector):
    def __init__(self, metrics: AgentMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        running_jobs = m.launcher.running()
        holders = m.holders(running_jobs)
        with m._lock:
            gpus = sorted(m.gpus.values(), key=lambda g: g.index)
            xids = {uuid: (dict(x.counts), x.last) for uuid, x in m.xids.items()}
        info = GaugeMetricFamily("gpusched_agent_info", "The agent's node and version.",
                                 labels=["node", "version"])
        info.add_metric([m.node, gpusched.__version__], 1.0)
        yield info
        running = GaugeMetricFamily("gpusched_agent_jobs_running",
                                    "Job runs whose supervisor is alive on this node.",
                                    labels=["node"])
        running.add_metric([m.node], float(len(running_jobs)))
        yield running
        families = {
            "DCGM_FI_DEV_GPU_UTIL": "GPU utilisation (%).",
            "DCGM_FI_DEV_FB_USED": "GPU memory used (MiB).",
            "DCGM_FI_DEV_FB_FREE": "GPU memory free (MiB).",
            "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (C).",
            "DCGM_FI_DEV_POWER_USAGE": "GPU power draw (W).",
            "DCGM_FI_DEV_XID_ERRORS": "The last Xid error seen on the GPU (0: none yet).",
            **{name: f"{_ECC_WORDS[kind]} ECC errors, "
                     f"{'since the driver loaded' if counter == 0 else 'over the GPU life'}."
               for name, kind, counter in ECC_FIELDS},
            "gpusched_gpu_last_sample_timestamp_seconds": "When the GPU was last sampled.",
        }
        out = {name: GaugeMetricFamily(name, doc, labels=GPU_LABELS)
               for name, doc in families.items()}
        xid_total = CounterMetricFamily(
            "gpusched_gpu_xid_errors", "Xid error events on the GPU, by Xid (application "
            "Xids too).", labels=[*GPU_LABELS, "xid"])
        for g in gpus:
            jobs = sorted({j for u in (g.uuid, *g.slices) for j in holders.get(u, ())})
            labels = [m.node, str(g.index), g.uuid, g.model, ",".join(map(str, jobs))]
            counts, last = xids.get(g.uuid, ({}, 0))
            values = {"DCGM_FI_DEV_GPU_UTIL": g.util, "DCGM_FI_DEV_FB_USED": g.mem_used_mb,
                      "DCGM_FI_DEV_FB_FREE": max(0, g.mem_total_mb - g.mem_used_mb),
                      "DCGM_FI_DEV_GPU_TEMP": g.temperature,
                      "DCGM_FI_DEV_POWER_USAGE": g.power_mw / 1000,
                      "DCGM_FI_DEV_XID_ERRORS": last, **g.ecc,
                      "gpusched_gpu_last_sample_timestamp_seconds": g.at}
            for name, value in values.items():
                out[name].add_metric(labels, float(value))
            for xid, count in sorted(counts.items()):
                xid_total.add_metric([*labels, str(xid)], float(count))
        yield from out.values()
        yield xid_total
