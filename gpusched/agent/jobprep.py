"""A job directory's files, made by the agent before the job's supervisor is asked for:
the reserve for how it ends, the script, ``spec.json``; and its GPU's MPS daemon."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from gpusched.agent import jobfiles
from gpusched.agent.jobends import node_fault, write_status
from gpusched.agent.mps import MpsDaemons, MpsError


def prepare_job(jobdir: Path, job_id: int, spec: dict[str, Any], script_text: str,
                mps: MpsDaemons) -> dict[str, Any] | None:
    """Fill the new ``jobdir``; the spec written, or None when the job failed (its
    status says why: launch_failed). Raises the error when the node's own disk failed:
    nothing of the job stays then."""
    try:
        jobfiles.make_reserve(str(jobdir))  # first: room for how it ends
        spec = dict(spec, job_id=int(job_id))
        script = jobdir / "script"
        jobfiles.write_script(str(script), script_text, int(spec["uid"]), int(spec["gid"]))
        spec["argv"] = [str(script), *spec["argv"][1:]]
        # Not durable (its fsyncs cost a start milliseconds): it serves the run's
        # supervisor and this agent's restarts; a crash of the machine ends the run
        # too, and a spec lost in one reads as none, the run as one whose supervisor
        # was lost (the node's registration fences it in any case).
        jobfiles.write_json_atomic(str(jobdir / "spec.json"), spec, mode=0o600,
                                   durable=False)
        mps.ensure(spec.get("mps"))  # its GPU's MPS daemon, before the job
    except Exception as exc:  # noqa: BLE001 - a bad job fails itself, never the agent
        try:
            if node_fault(exc):  # this node's disk, not the job: nothing of it stays
                raise
            write_status(jobdir, "launch_failed", None, str(exc) if isinstance(
                exc, MpsError) else f"cannot prepare the job: {exc!r}")
        except OSError:
            # The node's disk failing (or not even the status fits): nothing of the
            # job stays here, and the caller reports the run as never started
            # (agent.commands), a later launch of it finding no directory in the way.
            shutil.rmtree(jobdir, ignore_errors=True)
            raise exc from None
        return None
    return spec
