"""How a job's run ended, as its directory on the node records it: status.json, written
by its supervisor (or by the agent for a run whose supervisor never started or was
lost), read back as a JobEnd for the controller."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpusched.agent import jobfiles
from gpusched.agent.sparedirs import SPARE

log = logging.getLogger(__name__)

SUPERVISOR_LOST = "job supervisor lost"
NEVER_STARTED = "job supervisor lost before it started the job"
NOT_PREPARED = "the node could not prepare the job"
# Errors of the node's own disk while a job's directory is made: the job never started
# and is not at fault (see node_fault).
_NODE_DISK_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})


def node_fault(exc: BaseException) -> bool:
    """Whether ``exc``, met while preparing a job in the agent's state directory, is the
    node's disk failing (full, out of quota, read-only, I/O errors) rather than the job."""
    return isinstance(exc, OSError) and exc.errno in _NODE_DISK_ERRORS


@dataclass(frozen=True)
class JobEnd:
    """How a job ended, as read from its status.json."""

    job_id: int
    outcome: str
    exit_code: int | None
    signal: int | None
    start_time: float | None
    end_time: float
    error: str | None
    run: int = 0  # the job's restarts when this run was launched
    max_rss_bytes: int | None = None  # what the job's cgroup measured (None: not confined)
    cpu_usec: int | None = None
    epilog_error: str | None = None


def spec_run(spec: Mapping[str, Any]) -> int:
    """The run a supervisor spec is for: its ``run``, or for a spec written before runs
    were kept there, the restart count of its environment."""
    run = spec.get("run")
    if isinstance(run, int) and not isinstance(run, bool) and run >= 0:
        return run
    env = spec.get("env")
    count = env.get("GPUSCHED_RESTART_COUNT") if isinstance(env, dict) else None
    return int(count) if isinstance(count, str) and count.isdigit() else 0


def job_end(job_id: int, status: Mapping[str, Any], run: int) -> JobEnd:
    start = status.get("start_time")
    return JobEnd(
        job_id=job_id, outcome=str(status["outcome"]), exit_code=status.get("exit_code"),
        signal=status.get("signal"), start_time=None if start is None else float(start),
        end_time=float(status["end_time"]), error=status.get("error"), run=run,
        max_rss_bytes=_counter(status.get("max_rss_bytes")),
        cpu_usec=_counter(status.get("cpu_usec")),
        epilog_error=_text_or_none(status.get("epilog_error")),
    )


def _counter(value: object) -> int | None:
    """A cgroup counter of status.json: a 64-bit count, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63:
        return value
    return None


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def write_status(jobdir: Path, outcome: str, start_time: float | None, error: str) -> None:
    jobfiles.write_job_file(str(jobdir / "status.json"), {
        "outcome": outcome, "exit_code": None, "signal": None,
        "start_time": start_time, "end_time": time.time(), "error": error})


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s: unreadable: %s", path, exc)
        return None
    return data if isinstance(data, dict) else None


# A job directory whose run is over is renamed DISCARDED + its name, then removed: the
# rename makes no file (a marker would, and making files is what costs a job most on
# some file systems), and an interrupted removal leaves nothing under the job's id.
DISCARDED = ".discarded-"


def discard(jobdir: Path) -> None:
    """Remove the directory of a run that is over; nothing when it is gone already."""
    trash = jobdir.with_name(DISCARDED + jobdir.name)
    for attempt in range(2):
        try:
            os.rename(jobdir, trash)
            break
        except FileNotFoundError:
            return
        except OSError:
            if attempt:  # not even renamed: removed in place
                shutil.rmtree(jobdir, ignore_errors=True)
                return
            shutil.rmtree(trash, ignore_errors=True)  # an interrupted removal's leftovers
    shutil.rmtree(trash, ignore_errors=True)


def remove_discarded(jobs_dir: Path) -> None:
    """Finish the removals of job directories that were interrupted (see discard), and
    remove the spare directories an earlier agent kept (gpusched.agent.sparedirs)."""
    try:
        entries = list(os.scandir(jobs_dir))
    except FileNotFoundError:
        return
    for entry in entries:
        if entry.name.startswith((DISCARDED, SPARE)):
            shutil.rmtree(entry.path, ignore_errors=True)
