"""Job control routes (gcontrol suspend, resume, top) and array task ids in job paths:
``/v1/jobs/12_3/...`` acts on task 3 of array 12."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from gpusched.controller.api.common import ApiContext, path_job_id
from gpusched.controller.http import Request, Router
from gpusched.core.jobcontrol import JobRefError, parse_job_ref
from gpusched.db import job_views, jobcontrol
from gpusched.db.notify import notify_in
from gpusched.errors import NotFound

_JOBS = "/v1/jobs/"


class JobControlRoutes:
    """Administrators suspend and resume running jobs; owners move their pending jobs
    to the top of their own queue."""

    def __init__(self, context: ApiContext) -> None:
        self.context = context

    def add_to(self, r: Router) -> None:
        """Register the job control routes."""
        r.add("POST", "/v1/jobs/{job_id}/suspend", self.suspend)
        r.add("POST", "/v1/jobs/{job_id}/resume", self.resume)
        r.add("POST", "/v1/jobs/{job_id}/top", self.top)

    def suspend(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Stop every process of a running job, keeping its GPUs (administrators)."""
        return self._suspend(request, True)

    def resume(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Continue a suspended job; its time limit runs again (administrators)."""
        return self._suspend(request, False)

    def _suspend(self, request: Request, suspend: bool) -> tuple[int, dict[str, Any]]:
        job_id, who = path_job_id(request), self.context.identity(request)
        return self._change(request, job_id, lambda session: jobcontrol.suspend_jobs(
            session, job_id, who, suspend)[1])

    def top(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Move a pending job ahead of its owner's other pending jobs (its owner or an
        administrator)."""
        job_id, who = path_job_id(request), self.context.identity(request)
        return self._change(request, job_id, lambda session: (
            jobcontrol.top_jobs(session, [job_id], who), set())[1])

    def _change(self, request: Request, job_id: int,
                change: Callable[[Session], set[str]]) -> tuple[int, dict[str, Any]]:
        """Apply ``change`` (returning the nodes whose agents act) in one transaction,
        wake those agents and the scheduler, and answer the job."""
        ctx = self.context
        with ctx.sessions() as session, session.begin():
            nodes = change(session)
            notify_in(session, "sched", *(f"node:{node}" for node in sorted(nodes)))
        for node in sorted(nodes):
            ctx.events.wake_node(node)
        ctx.events.wake_scheduler()
        with ctx.sessions() as session:
            return 200, job_views.get_job(session, job_id, ctx.identity(request))


def task_path_resolver(context: ApiContext) -> Callable[[Request], None]:
    """What turns ``/v1/jobs/12_3/...`` into the path of the row of task 3 of array 12
    before routing (a POST by someone who may act on the array splits a task still
    pending in the array's record off into a row of its own, as Slurm does)."""
    def resolve(request: Request) -> None:
        if not request.path.startswith(_JOBS):
            return
        segment, slash, rest = request.path[len(_JOBS):].partition("/")
        if "_" not in segment:
            return
        try:
            ref = parse_job_ref(segment)
        except JobRefError:
            raise NotFound(f"invalid job id specified: {segment[:40]!r}") from None
        who = context.identity(request) if request.method == "POST" else None
        with context.sessions() as session, session.begin():
            row = jobcontrol.resolve_ref(session, ref, who)
        request.path = f"{_JOBS}{row}{slash}{rest}"
    return resolve
