"""What a pass decided about time limits and deadlines (core/timecut.py), applied with
its plan: the limit a job started with when --time-min cut it, and the end (state
DEADLINE) of each pending job that can no longer end by its --deadline."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import text
from sqlalchemy.orm import Session

from gpusched.core.model import Plan, Reason, Start

_CUT_LIMITS = text(
    "UPDATE jobs SET time_limit = t.cut FROM unnest(CAST(:ids AS bigint[]), "
    "CAST(:limits AS integer[])) AS t(id, cut) "
    "WHERE jobs.id = t.id AND jobs.state = 'RUNNING'")
_PAST_DEADLINE = text(
    "UPDATE jobs SET state = 'DEADLINE', reason = :reason, end_time = :now, "
    "expected_start = NULL WHERE id = ANY(CAST(:ids AS bigint[])) AND state = 'PENDING'")


def apply_time_cuts(session: Session, started: dict[int, Start], plan: Plan,
                    now: datetime) -> None:
    """Store the cut limits of the jobs ``started`` (by job id: an array's tasks by
    their own) and end the jobs the plan found past their deadline."""
    cut = [(job_id, start.time_limit) for job_id, start in started.items()
           if start.time_limit is not None]
    if cut:
        session.connection().execute(_CUT_LIMITS, {"ids": [c[0] for c in cut],
                                                   "limits": [c[1] for c in cut]})
    past = [p.job_id for p in plan.pending if p.reason is Reason.DEADLINE]
    if past:
        session.connection().execute(_PAST_DEADLINE, {"ids": past, "now": now,
                                                      "reason": Reason.DEADLINE.value})
