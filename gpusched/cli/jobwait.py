"""gsubmit -W/--wait: wait for the job just submitted to end, then exit with its exit
code, as sbatch does: a job ended by a signal (or one that never ran and did not
complete) gives 1, an array the highest code of its tasks."""

from __future__ import annotations

import time

from gpusched.client import ApiClient

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

ACTIVE = ("PENDING", "RUNNING")
FIRST_POLL, LONGEST_POLL = 0.25, 5.0  # seconds between looks at the job, growing


def exit_code_of(jobs: list[dict[str, Any]]) -> int:
    """The exit code sbatch -W gives for a job (or an array's tasks) that has ended."""
    codes = []
    for job in jobs:
        code, signal = job.get("exit_code"), job.get("signal")
        if job["state"] == "COMPLETED":
            codes.append(code or 0)
        else:  # never 0 for a job that did not complete
            codes.append(code if code and not signal else 1)
    return max(codes, default=1)


def wait_for_job(job_id: int, sleep: Callable[[float], None] = time.sleep) -> int:
    """Poll the controller until job ``job_id`` (every task of an array) has ended; its
    exit code."""
    pause = FIRST_POLL
    path = f"/v1/jobs?all=1&ids={job_id}&fields=job_id,state,exit_code,signal"
    while True:
        with ApiClient() as client:
            answer = client.request("GET", path)
        # ?fields= answers {"fields": [...], "rows": [[...], ...]} (docs/api.md)
        jobs = [dict(zip(answer["fields"], row)) for row in answer["rows"]]
        if jobs and all(job["state"] not in ACTIVE for job in jobs):
            return exit_code_of(jobs)
        sleep(pause)
        pause = min(LONGEST_POLL, pause * 2)
