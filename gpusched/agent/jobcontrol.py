"""Acting on a job that runs under its supervisor: its signals, a new time limit, a
notice in its output. Part of the agent's Launcher (gpusched.agent.launcher)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpusched.agent import procs
from gpusched.agent.jobfiles import write_json_atomic
from gpusched.agent.notices import post_notice
from gpusched.agent.supervisor import LIMIT_FILE, LIMIT_SIGNAL

# How long a signal or a new time limit waits for a just-started supervisor to write
# supervisor.json (it names the job's process group) before it is refused.
SUPERVISOR_INFO_WAIT = 5.0


class RunningJobs:
    """What the Launcher does to jobs running under a supervisor it watches."""

    jobs_dir: Path
    _lock: threading.Lock  # guards _pidfds
    _pidfds: dict[int, int]  # job id -> pidfd of its live supervisor

    def _jobdir(self, job_id: int) -> Path:
        return self.jobs_dir / str(int(job_id))

    def signal(self, job_id: int, signum: int) -> bool:
        """Send ``signum`` to the job's whole process group, leaving it running; False if
        the job is unknown or ended. The supervisor keeps the job's main process unreaped
        until the end, so the group id cannot have been reused."""
        return self._with_running(job_id, lambda jobdir, info: os.killpg(int(info["job_pid"]),
                                                                         signum))

    def set_limit(self, job_id: int, time_limit: int | None) -> bool:
        """Give a running job a new time limit (seconds from its start; None: none): its
        supervisor rereads ``limit.json`` on SIGUSR2. False if the job is not running."""
        def tell(jobdir: Path, info: dict[str, Any]) -> None:
            write_json_atomic(str(jobdir / LIMIT_FILE), {"time_limit": time_limit})
            os.kill(int(info["supervisor_pid"]), LIMIT_SIGNAL)

        return self._with_running(job_id, tell)

    def notice(self, job_id: int, seq: int, text: str) -> bool:
        """Have the job's supervisor append ``text`` to its output file as the job's
        user (gpusched.agent.notices); False if the job is not running."""
        return self._with_running(job_id, lambda jobdir, info: post_notice(
            str(jobdir), seq, text, int(info["supervisor_pid"])))

    def _with_running(self, job_id: int, act: Callable[[Path, dict[str, Any]], None]) -> bool:
        """``act(jobdir, supervisor.json)`` for a job still running here; False if the job
        is unknown or ended, or acting failed."""
        # A job may be running before its supervisor has written supervisor.json (it
        # writes it once the job is forked): wait a little for it, outside the lock.
        deadline = time.monotonic() + SUPERVISOR_INFO_WAIT
        jobdir = self._jobdir(job_id)
        while True:
            with self._lock:
                pidfd = self._pidfds.get(job_id)
                if (pidfd is None or procs.pidfd_exited(pidfd)
                        or (jobdir / "status.json").exists()):
                    return False
                try:
                    info = json.loads((jobdir / "supervisor.json").read_text())
                except FileNotFoundError:
                    info = None
                except (OSError, ValueError):
                    return False
                if info is not None:
                    try:
                        act(jobdir, info)
                    except (OSError, ValueError, KeyError):
                        return False
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
