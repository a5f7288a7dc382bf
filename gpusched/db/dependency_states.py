"""What a pass knows of the jobs its pending jobs' dependencies name (read for
gpusched.core.dependency): each job's state (an array's tasks' together), each task's
for the arrays whose tasks are named one by one, and when each began."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.orm import Session

from gpusched.core.arrays import iter_tasks
from gpusched.core.dependency import Key, dependency_clauses
from gpusched.core.model import JobState, PendingJob

# The states of the jobs a dependency names, and of the tasks of those that are arrays,
# with when each began (or ended without beginning: cancelled while pending).
_DEPENDENCY_STATES = text(
    "SELECT id, array_job_id, array_task_id, array_tasks, state, "
    "extract(epoch FROM coalesce(start_time, end_time)) FROM jobs "
    "WHERE id = ANY(CAST(:named AS bigint[])) OR array_job_id = ANY(CAST(:named AS bigint[]))")


def dependency_states(session: Session, pending: tuple[PendingJob, ...]
                       ) -> tuple[dict[Key, JobState], dict[Key, float]]:
    """The state of each job a dependency names (for an array, of all its tasks
    together) and of each of its tasks, and when each began (an array: its last task)."""
    clauses = [c for job in pending if job.dependency for c in dependency_clauses(job.dependency)]
    named = {j for c in clauses for j in c.job_ids}
    if not named:
        return {}, {}
    # Arrays whose tasks are named one by one (12_3, aftercorr): only theirs are listed.
    by_task = {j for c in clauses if c.tasks or c.kind == "aftercorr" for j in c.job_ids}
    states: dict[int, list[JobState]] = {}
    tasks: dict[Key, JobState] = {}
    began: dict[Key, float] = {}
    for job_id, array_job, task, pending_tasks, state, start in session.connection().execute(
            _DEPENDENCY_STATES, {"named": list(named)}):
        key = array_job if array_job in named else job_id
        states.setdefault(key, []).append(JobState(state))
        if start is not None:
            began[key] = max(float(start), began.get(key, 0.0))
        if array_job in named and task is not None:
            tasks[(array_job, task)] = JobState(state)
            if start is not None:
                began[(array_job, task)] = float(start)
        if array_job in by_task and pending_tasks is not None:  # not split off yet
            tasks.update(((array_job, t), JobState(state)) for t in iter_tasks(pending_tasks))
    for key, found_states in states.items():  # an array begins once all its tasks have
        if JobState.PENDING in found_states:
            began.pop(key, None)
    found: dict[Key, JobState] = {job_id: array_state(s) for job_id, s in states.items()}
    return {**tasks, **found}, began


def array_state(states: list[JobState]) -> JobState:
    """One state for a group of tasks: running until all end, then the worst ending."""
    if any(s is JobState.RUNNING for s in states):
        return JobState.RUNNING
    if any(not s.terminal for s in states):
        return JobState.PENDING
    return next((s for s in states if s is not JobState.COMPLETED), JobState.COMPLETED)
