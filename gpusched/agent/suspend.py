"""Suspend and resume a job on this node (gcontrol suspend/resume): stop every process
of it, or let them go on, keeping its GPUs.

Where a run is confined, its cgroup is frozen (v1 freezer, v2 ``cgroup.freeze``):
nothing of it escapes, not even what left its process group. Elsewhere every process
group of it gets SIGSTOP (the batch script's group; each step task's group), and
SIGCONT on resume. While suspended the job's clocks stop: its batch supervisor has no
time limit and its steps no deadline until resume gives them the limit with the time
suspended added (the controller works it out).

A cancel of a suspended job thaws it first (``release``), so that its processes see
the SIGTERM; a stopped group gets SIGCONT from its supervisor with the SIGTERM.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpusched.agent.cgroups import CgroupTree, JobCgroup
from gpusched.messages import LimitJob
from gpusched.messages.jobcontrol import SuspendJob

if TYPE_CHECKING:
    from gpusched.agent.launcher import Launcher
    from gpusched.agent.stepagent import NodeSteps

log = logging.getLogger(__name__)


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _cgroup(spec: dict[str, Any]) -> JobCgroup | None:
    """The run's cgroup as its spec names it, if it still exists and can be frozen."""
    named = spec.get("cgroup")
    if not isinstance(named, dict):
        return None
    try:
        cgroup = JobCgroup.existing(CgroupTree.from_json(named["tree"]), str(named["name"]))
    except (KeyError, TypeError, ValueError):
        return None
    return cgroup if cgroup.can_freeze() else None


def _starttime(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (None: gone), to tell a process from a reuse of its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _stop_groups(pids: list[int], starts: list[Any], sig: int) -> int:
    """Send ``sig`` to the process group of each pid still the process it was; how many."""
    sent = 0
    for pid, start in zip(pids, starts):
        if not isinstance(pid, int) or start is None or _starttime(pid) != start:
            continue
        try:
            os.killpg(pid, sig)
            sent += 1
        except (ProcessLookupError, PermissionError):
            pass
    return sent


def freeze_part(spec: dict[str, Any], info: dict[str, Any], frozen: bool) -> bool:
    """Freeze or thaw one part of a job (its spec.json; ``info``: the pids of its
    process groups and their start times): its cgroup, else SIGSTOP or SIGCONT to its
    groups; whether anything was acted on."""
    cgroup = _cgroup(spec)
    if cgroup is not None:
        try:
            cgroup.set_frozen(frozen)
            return True
        except OSError as exc:
            log.warning("cannot %s cgroup %s (%s): signalling its processes instead",
                        "freeze" if frozen else "thaw", cgroup.name, exc)
    sig = signal.SIGSTOP if frozen else signal.SIGCONT
    return _stop_groups(info["pids"], info["starts"], sig) > 0


class Suspender:
    """Stops and continues the runs and steps of jobs on one node."""

    def __init__(self, launcher: Launcher, steps: NodeSteps) -> None:
        self.launcher = launcher
        self.steps = steps

    def apply(self, job_id: int, run: int, order: SuspendJob) -> int:
        """Suspend or resume every part of run ``run`` of the job here; how many parts
        (the batch run, each step) were acted on."""
        if order.suspend:
            self._set_clocks(job_id, run, None, None)
            acted = sum(freeze_part(spec, info, True) for spec, info in self._parts(job_id, run))
        else:
            acted = sum(freeze_part(spec, info, False) for spec, info in self._parts(job_id, run))
            self._set_clocks(job_id, run, order.time_limit, order.deadline)
        log.info("job %d: %s (%d part(s) here)", job_id,
                 "suspended" if order.suspend else "resumed", acted)
        return acted

    def release(self, job_id: int) -> None:
        """Thaw whatever of the job is frozen here (before it is cancelled or killed)."""
        for spec, _ in self._parts(job_id, None):
            cgroup = _cgroup(spec)
            if cgroup is not None:
                try:
                    cgroup.set_frozen(False)
                except OSError as exc:
                    log.warning("job %d: cannot thaw cgroup %s: %s", job_id, cgroup.name, exc)

    def _set_clocks(self, job_id: int, run: int, limit: int | None,
                    deadline: float | None) -> None:
        """The batch run's time limit and the steps' deadline (None and None: stopped)."""
        if self.launcher.run_of(job_id) == run:
            self.launcher.set_limit(job_id, limit)
        # A limit with no deadline leaves the steps as they are: give them None as such.
        self.steps.new_limit(job_id, run, LimitJob(None) if deadline is None
                             else LimitJob(limit, deadline))

    def _parts(self, job_id: int, run: int | None) -> Iterator[tuple[dict[str, Any],
                                                                      dict[str, Any]]]:
        """(spec.json, supervisor.json) of the batch run and of each step of the job
        here (of run ``run``; None: any) whose supervisor has started it."""
        jobdir = self.launcher.jobs_dir / str(int(job_id))
        spec = _read(jobdir / "spec.json")
        if spec and (run is None or self.launcher.run_of(job_id) == run) \
                and not (jobdir / "status.json").exists():
            info = _read(jobdir / "supervisor.json")
            if info:
                yield spec, {"pids": [info.get("job_pid")],
                             "starts": [info.get("job_starttime")]}
        runner = self.steps.runner
        for step_id in runner._step_ids(job_id):
            stepdir = runner.stepdir(job_id, step_id)
            step = _read(stepdir / "spec.json")
            if not step or (run is not None and step.get("run") != run) \
                    or (stepdir / "status.json").exists():
                continue
            info = _read(stepdir / "supervisor.json")
            if info:
                yield step, {"pids": list(info.get("task_pids") or []),
                             "starts": list(info.get("task_starttimes") or [])}
