"""Job supervisors found again after an agent restart, and the ends of those that died
without writing their job's status (Slurm's way with a step whose slurmstepd is gone)."""

from __future__ import annotations

import logging
from pathlib import Path

from gpusched.agent import procs
from gpusched.agent import supervisor as supervisor_files
from gpusched.agent.confine import remove_lost_job_cgroup
from gpusched.agent.jobends import (
    NEVER_STARTED,
    SUPERVISOR_LOST,
    read_json,
    write_status,
)

log = logging.getLogger(__name__)


class SupervisorNotFound(Exception):
    """A job's supervisor holds its lock, but no process could be matched to it."""


def find_supervisor(jobdir: Path) -> int | None:
    """A pidfd of the job's live supervisor, or None once it is surely dead."""
    for _ in range(3):
        if not procs.lock_is_held(jobdir / "supervisor.lock"):
            return None
        info = read_json(jobdir / "supervisor.json")
        if info is not None:
            pidfd = procs.open_pidfd(int(info["supervisor_pid"]), int(info["supervisor_starttime"]))
        else:
            # Started but not yet written supervisor.json: find it by its lock fd.
            pidfd = procs.open_lock_holder(jobdir / "supervisor.lock")
        if pidfd is not None:
            return pidfd
        # It may have exited between the two looks; look at the lock again.
    raise SupervisorNotFound(jobdir)


def record_lost(jobdir: Path) -> None:
    """Record the end of a job whose supervisor died without writing its status."""
    info = read_json(jobdir / "supervisor.json") or {}
    spec = read_json(jobdir / "spec.json") or {}
    remove_lost_job_cgroup(jobdir.name, spec)
    if info:
        procs.reap_if_child(int(info["supervisor_pid"]), int(info["supervisor_starttime"]))
        # Nothing else will ever stop the job now; Slurm kills a step whose
        # slurmstepd is gone the same way.
        starttime = info.get("job_starttime")
        if "uid" in spec:
            procs.kill_process_group(int(info["job_pid"]),
                                     None if starttime is None else int(starttime),
                                     int(spec["uid"]), int(info["supervisor_starttime"]))
    if read_json(jobdir / "status.json") is not None:
        return  # it did write it after all, just before dying
    if not info and not supervisor_files.job_forked(str(jobdir)):  # never forked
        log.warning("job %s: %s", jobdir.name, NEVER_STARTED)
        write_status(jobdir, "not_started", None, NEVER_STARTED)
        return
    log.warning("job %s: %s", jobdir.name, SUPERVISOR_LOST)
    start = info.get("start_time")
    write_status(jobdir, "failed", None if start is None else float(start), SUPERVISOR_LOST)
