"""The client's side of an allocation (a job without a batch script), shared by galloc
and by gsrun run outside a job: submit it (``interactive``), wait until it runs while
saying so as salloc and srun do, keep it alive with heartbeats every grace/4 seconds
from a thread of its own, and end it with the command's exit status.

Stdlib only, no typer (both commands start fast)."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from gpusched.cli.jobshape import job_shape, option_value, share_fields
from gpusched.cli.shell import current_umask
from gpusched.errors import Conflict, GpuschedError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import FrameType
    from typing import Any

FIRST_POLL = 0.02  # seconds between looks at a pending allocation for QUIET_WAIT s (an
QUIET_WAIT = 0.5  # idle cluster starts it within a pass); then doubled up to MAX_POLL,
MAX_POLL = 1.0  # and "queued and waiting for resources" is said
MIN_HEARTBEAT = 1.0  # seconds between heartbeats, at least
REQUEST_TIMEOUT = 10.0
# The job's variables a command in the allocation gets (each also as GPUSCHED_*, but
# JOB_NAME: GPUSCHED_JOB_NAME is gsubmit's input variable, as sbatch's SBATCH_JOB_NAME).
JOB_VARIABLES = ("JOB_ID", "JOBID", "JOB_NODELIST", "NNODES", "JOB_NUM_NODES", "JOB_NAME",
                 "JOB_PARTITION", "SUBMIT_DIR")
# The allocation's resource options, by the key jobshape reads; unset ones are None.
SHAPE_KEYS = ("gpus", "gres", "gpus_per_node", "gpus_per_task", "mem", "mem_per_gpu",
              "mem_per_cpu", "nodelist", "exclude", "nodes", "ntasks", "cpus_per_task",
              "ntasks_per_node", "cpus_per_gpu")


class Revoked(GpuschedError):
    """The allocation ended (or was cancelled) before its command could run."""


class Interrupted(Exception):
    """A signal that ends the wait (SIGINT, SIGTERM, SIGHUP)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def allocation_body(options: Mapping[str, Any], name: str, work_dir: str,
                    environment: Mapping[str, str]) -> dict[str, Any]:
    """The ``POST /v1/jobs`` body of an allocation from its options: the shape keys
    (SHAPE_KEYS), ``time``, ``partition``, ``account``, ``qos``, ``exclusive``,
    ``begin``; a bad value is a UsageError naming its option."""
    from gpusched.core.timefmt import parse_time_limit

    values = {key: options.get(key) for key in (*SHAPE_KEYS, "exclusive")}
    shape = job_shape(values, {})
    given = dict(options)
    seconds = option_value(given, {}, "time", parse_time_limit, "--time") \
        if options.get("time") is not None else None
    begin = None
    if options.get("begin") is not None:
        from datetime import datetime

        from gpusched.core.timefmt import parse_begin

        begin = option_value(given, {}, "begin", lambda text: parse_begin(
            text, datetime.now().astimezone()).isoformat(), "--begin")
    return {
        "interactive": True, "name": name, "work_dir": work_dir,
        "environment": dict(environment), "gpus": shape["gpus"],
        "gpu_types": list(shape["gpu_types"]), "nodes": shape["nodes"],
        "cpus": shape["cpus"], "mem_mb": shape["mem_mb"],
        "nodelist": list(shape["nodelist"]), "exclude": list(shape["exclude"]),
        "time_limit": seconds if seconds is not None or options.get("time") is None
        else "UNLIMITED",
        "partition": options.get("partition"), "account": options.get("account"),
        "qos": options.get("qos"), "exclusive": bool(options.get("exclusive")),
        "begin_time": begin, "umask": current_umask(),
        "constraint": _constraint(given),
        "reservation": options.get("reservation"),  # checked by the controller
        **share_fields(shape["share_mode"], shape["share"], shape["gpu_mem_mb"]),
        # One key per invocation: a submission sent again after a lost answer is one job.
        "submit_key": os.urandom(16).hex(),
    }


def _constraint(given: dict[str, Any]) -> str | None:
    """-C/--constraint, checked and canonical (None: not given)."""
    if given.get("constraint") is None:
        return None
    from gpusched.core.features import canonical_constraint

    return option_value(given, {}, "constraint", canonical_constraint)  # type: ignore[no-any-return]


def shape_environment(options: Mapping[str, Any]) -> dict[str, str]:
    """What salloc tells its command it asked for: SLURM_NTASKS and friends."""
    out = {}
    for name, key in (("NTASKS", "ntasks"), ("CPUS_PER_TASK", "cpus_per_task"),
                      ("NTASKS_PER_NODE", "ntasks_per_node")):
        if options.get(key) is not None:
            out[f"SLURM_{name}"] = out[f"GPUSCHED_{name}"] = str(options[key])
    return out


class Allocation:
    """One allocation of this client's, from its submission to its end."""

    def __init__(self, prog: str, verbose: bool = False,
                 say: Callable[[str], None] | None = None) -> None:
        self.prog = prog
        self.verbose = verbose
        self.say = say or _say
        self.job_id: int | None = None
        self.granted: dict[str, Any] = {}
        self.grace = 60.0
        self.revoked: str | None = None  # why, once the controller ended it
        self.announce = True  # salloc's lines (srun says them only with -v)
        self._stop = threading.Event()
        self._beats: threading.Thread | None = None

    def request(self, client: Any, method: str, path: str,
                body: dict[str, Any] | None = None) -> Any:
        """One request (for tests to watch); the answer."""
        return client.request(method, path, body, timeout=REQUEST_TIMEOUT)

    def obtain(self, body: dict[str, Any], announce_pending: bool) -> dict[str, Any]:
        """Submit the allocation and wait until it runs; its heartbeat answer then
        (state, name, partition, node_names). SIGINT, SIGTERM or SIGHUP meanwhile
        cancels it (Interrupted); its end before it ran is Revoked."""
        from gpusched.client import ApiClient

        self.announce = announce_pending
        with ApiClient() as client, _Interruptible():
            answer = self.request(client, "POST", "/v1/jobs", body)
            self.job_id = job_id = int(answer["job_id"])
            try:
                return self._wait(client, job_id, announce_pending)
            except Interrupted:
                self._cancel(job_id)  # on a connection of its own: that one was cut
                raise

    def _wait(self, client: Any, job_id: int, announce_pending: bool) -> dict[str, Any]:
        started, pause, said = time.monotonic(), FIRST_POLL, False
        while True:
            try:
                beat = self.request(client, "POST", f"/v1/jobs/{job_id}/heartbeat")
            except Conflict as err:
                raise Revoked(f"job allocation {job_id} has been revoked: {err.message}") \
                    from None
            self.grace = float(beat.get("allocation_grace") or self.grace)
            if beat.get("state") == "RUNNING":
                break
            if not said and time.monotonic() - started >= QUIET_WAIT:
                if announce_pending:
                    self.say(f"{self.prog}: Pending job allocation {job_id}")
                self.say(f"{self.prog}: job {job_id} queued and waiting for resources")
                said = True
            time.sleep(pause)
            if said:
                pause = min(pause * 2, MAX_POLL)
        if said:
            self.say(f"{self.prog}: job {job_id} has been allocated resources")
        if announce_pending or self.verbose:
            self.say(f"{self.prog}: Granted job allocation {job_id}")
        self.granted = dict(beat)
        return self.granted

    def _cancel(self, job_id: int) -> None:
        from gpusched.client import ApiClient

        try:
            with ApiClient() as client:
                self.request(client, "POST", f"/v1/jobs/{job_id}/cancel")
        except GpuschedError as err:
            self.say(f"{self.prog}: error: could not cancel job {job_id}: {err.message}")
            return
        self.say(f"{self.prog}: Job allocation {job_id} has been revoked.")

    def variables(self, submit_dir: str) -> dict[str, str]:
        """The job's variables for a command run in the allocation (SLURM_* and their
        GPUSCHED_* twins)."""
        from gpusched.core.hostlist import compress_hostlist

        nodes = [str(n) for n in self.granted.get("node_names") or ()]
        values = (str(self.job_id), str(self.job_id), compress_hostlist(nodes),
                  str(len(nodes)), str(len(nodes)), str(self.granted.get("name") or ""),
                  str(self.granted.get("partition") or ""), submit_dir)
        out = {}
        for name, value in zip(JOB_VARIABLES, values, strict=True):
            out[f"SLURM_{name}"] = value
            if name != "JOB_NAME":  # GPUSCHED_JOB_NAME is gsubmit's input (-J)
                out[f"GPUSCHED_{name}"] = value
        return out

    def keep_alive(self, on_revoked: Callable[[str], None] | None = None) -> None:
        """Send heartbeats every grace/4 seconds from a thread of its own until
        ``finish``; when the controller has ended the allocation, say so (once) and
        call ``on_revoked`` with why."""
        interval = max(MIN_HEARTBEAT, self.grace / 4)

        def beat() -> None:
            from gpusched.client import ApiClient

            with ApiClient() as client:
                while not self._stop.wait(interval):
                    try:
                        self.request(client, "POST", f"/v1/jobs/{self.job_id}/heartbeat")
                    except Conflict as err:
                        self.revoked = err.message
                        self.say(f"{self.prog}: Job allocation {self.job_id} has been "
                                 f"revoked: {err.message}")
                        if on_revoked is not None:
                            on_revoked(err.message)
                        return
                    except GpuschedError:
                        continue  # the controller is away: try again next time

        self._beats = threading.Thread(target=beat, name="heartbeat", daemon=True)
        self._beats.start()

    def finish(self, exit_code: int) -> None:
        """Stop the heartbeats and end the allocation with ``exit_code`` (0..255)."""
        from gpusched.client import ApiClient

        self._stop.set()
        if self.job_id is None or self.revoked is not None:
            return
        if self.announce or self.verbose:
            self.say(f"{self.prog}: Relinquishing job allocation {self.job_id}")
        with ApiClient() as client:
            try:
                self.request(client, "POST", f"/v1/jobs/{self.job_id}/complete",
                             {"exit_code": max(0, min(255, exit_code))})
            except Conflict:
                pass  # it ended already (cancelled, timed out): nothing to relinquish
            except GpuschedError as err:
                self.say(f"{self.prog}: error: could not end job allocation {self.job_id}: "
                         f"{err.message}")


class _Interruptible:
    """While inside: SIGINT, SIGTERM and SIGHUP raise Interrupted."""

    def __enter__(self) -> None:
        self._old = {sig: signal.signal(sig, _interrupt)
                     for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def exit_status(returncode: int) -> int:
    """A child's status as a shell gives it: its exit code, or 128+N when signal N
    killed it."""
    return returncode if returncode >= 0 else 128 - returncode

