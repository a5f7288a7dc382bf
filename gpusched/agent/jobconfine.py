"""The supervisor's side of confinement: the job's cgroup made from its spec, and the
node's prolog and epilog run around the job.

Stdlib only (with gpusched.agent.cgroups and gpusched.agent.siteprog, themselves
stdlib only): the supervisor imports this, lazily, only for a job that needs it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from typing import Any

from gpusched.agent.cgroups import (
    CgroupTree,
    CgroupUnavailable,
    CgroupUnsupported,
    JobCgroup,
    Usage,
)
from gpusched.agent.siteprog import run_site_program

SITE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ConfineError(Exception):
    """The job's cgroup could not be made as its spec asks; the job must not run."""


def make_job_cgroup(spec: Mapping[str, Any]) -> JobCgroup:
    """Create the job's cgroup with its memory limit, cpuset and device allow-list."""
    try:
        tree = CgroupTree.from_json(spec["tree"])
        job = JobCgroup.create(tree, str(spec["name"]))
    except (KeyError, TypeError, ValueError, CgroupUnavailable) as exc:
        raise ConfineError(str(exc)) from None
    try:
        memory = spec.get("memory_bytes")
        if memory is not None:
            job.set_memory(int(memory), swap=bool(spec.get("swap")))
        cpus = spec.get("cpus")
        if cpus:
            mems = spec.get("mems")
            job.set_cpus(set(cpus), set(mems) if mems else None)
        rules = [(str(k), int(major), None if minor is None else int(minor))
                 for k, major, minor in spec.get("devices") or []]
        job.allow_devices(rules)
    except (OSError, ValueError, TypeError, CgroupUnsupported) as exc:
        remove_job_cgroup(job)
        reason = str(exc)
        if isinstance(exc, OSError) and exc.strerror:
            reason = exc.strerror + (f": {exc.filename}" if exc.filename else "")
        raise ConfineError(reason) from None
    return job


def signal_others(job: JobCgroup, pgid: int, sig: int) -> None:
    """Send ``sig`` to the job's processes outside its process group (those that left
    it with setsid); the group itself is signalled by the caller."""
    for pid in job.pids():
        try:
            if os.getpgid(pid) != pgid:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def end_job_cgroup(job: JobCgroup) -> Usage:
    """Kill whatever is left in the job's cgroup, read what it used, and remove it."""
    job.kill()  # returns once it is empty, and an empty cgroup gains no process
    usage = job.usage()
    _remove(job)
    return usage


def remove_job_cgroup(job: JobCgroup) -> None:
    """Kill whatever is in the job's cgroup and remove it; a failure is only noted."""
    try:
        job.kill(timeout=5.0)
    except OSError as exc:
        print(f"gpusched: cannot remove cgroup {job.name}: {exc}", flush=True)
        return
    _remove(job)


def _remove(job: JobCgroup) -> None:
    try:
        job.remove()
    except OSError as exc:
        print(f"gpusched: cannot remove cgroup {job.name}: {exc}", flush=True)


def site_environment(spec: Mapping[str, Any], context: str) -> dict[str, str]:
    """The prolog's or epilog's environment: the job's own variables, as gpusched set
    them, never the submitter's (a root program must not run with a user's LD_PRELOAD
    or PATH)."""
    env = {"PATH": SITE_PATH, "LC_ALL": "C.UTF-8"}
    own = spec.get("job_vars")
    if isinstance(own, dict):
        env.update({str(k): str(v) for k, v in own.items()})
    env["SLURM_SCRIPT_CONTEXT"] = env["GPUSCHED_SCRIPT_CONTEXT"] = context
    return env


def run_prolog(spec: Mapping[str, Any]) -> str | None:
    """Run the node's prolog, if any; why it failed, or None."""
    return _run(spec, "prolog")


def run_epilog(spec: Mapping[str, Any]) -> str | None:
    """Run the node's epilog, if any; why it failed, or None."""
    return _run(spec, "epilog")


def _run(spec: Mapping[str, Any], what: str) -> str | None:
    path = spec.get(what)
    if not path:
        return None
    # The supervisor blocks the signals it waits for, and a program must not inherit a
    # blocked mask; meanwhile they are noted and raised again once blocked, so that a
    # cancel during the program still reaches the supervisor's wait.
    caught: list[int] = []

    def note(signum: int, frame: object) -> None:
        caught.append(signum)

    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    handlers = {sig: signal.signal(sig, note) for sig in blocked
                if sig not in (signal.SIGKILL, signal.SIGSTOP)}
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    try:
        return run_site_program(str(path), site_environment(spec, f"{what}_slurmd"),
                                float(spec.get(f"{what}_timeout") or 60.0), what)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(caught):
            os.kill(os.getpid(), sig)
