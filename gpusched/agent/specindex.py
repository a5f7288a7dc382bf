"""What the agent asks again and again of its job directories' ``spec.json`` (the run
it holds, the CPUs of its cpuset), kept in memory until the file changes.

Every command, launch and end report asks which run a directory holds, and every launch
asks the CPUs of all running jobs: reading and parsing each spec for that cost the agent
more than the rest of a launch. The directory stays the truth: an answer is reused only
while ``spec.json`` is the very file it was read from (same inode, size and change time),
so a directory removed or written anew, by this agent or another, is read again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpusched.agent.jobends import read_json, spec_run

_Stamp = tuple[int, int, int]  # st_ino, st_size, st_mtime_ns


class _Facts:
    __slots__ = ("cpus", "run", "stamp")

    def __init__(self, stamp: _Stamp, spec: Mapping[str, Any]) -> None:
        self.stamp = stamp
        self.run = spec_run(spec)
        self.cpus = _cpus(spec)


class SpecIndex:
    """The run and cpuset CPUs of each job directory's spec, read once per version."""

    def __init__(self, jobs_dir: Path) -> None:
        self._jobs_dir = os.fspath(jobs_dir)  # a job's directory is jobs_dir/<job id>
        self._known: dict[int, _Facts] = {}

    def remember(self, job_id: int, spec: Mapping[str, Any]) -> None:
        """Note the spec just written for ``job_id``, sparing the next read of it."""
        stamp = self._stamp(job_id)
        if stamp is not None:
            self._known[job_id] = _Facts(stamp, spec)

    def run_of(self, job_id: int) -> int | None:
        """The run the job's directory holds; None when it has no spec."""
        facts = self._facts(job_id)
        return None if facts is None else facts.run

    def cpus_of(self, job_id: int) -> frozenset[int]:
        """The CPUs of the job's cpuset (none when it has none, or no spec)."""
        facts = self._facts(job_id)
        return frozenset() if facts is None else facts.cpus

    def _facts(self, job_id: int) -> _Facts | None:
        stamp = self._stamp(job_id)
        if stamp is None:
            self._known.pop(job_id, None)
            return None
        facts = self._known.get(job_id)
        if facts is not None and facts.stamp == stamp:
            return facts
        spec = read_json(Path(self._path(job_id)))
        if spec is None:
            self._known.pop(job_id, None)
            return None
        facts = self._known[job_id] = _Facts(stamp, spec)
        return facts

    def _path(self, job_id: int) -> str:
        return f"{self._jobs_dir}/{int(job_id)}/spec.json"

    def _stamp(self, job_id: int) -> _Stamp | None:
        try:
            st = os.stat(self._path(job_id))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns


def _cpus(spec: Mapping[str, Any]) -> frozenset[int]:
    cgroup = spec.get("cgroup")
    cpus = cgroup.get("cpus") if isinstance(cgroup, dict) else None
    if not isinstance(cpus, list):
        return frozenset()
    return frozenset(c for c in cpus if isinstance(c, int) and not isinstance(c, bool))
