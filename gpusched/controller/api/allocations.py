"""Allocations (jobs without a batch script, made by galloc and by gsrun outside a job):
``POST /v1/jobs/{job}/heartbeat`` (their client is alive) and ``POST
/v1/jobs/{job}/complete`` (their client's command ended: the allocation ends with its
exit status)."""

from __future__ import annotations

from typing import Any

from gpusched.controller.api.common import ApiContext, path_job_id
from gpusched.controller.http import Request, Router
from gpusched.db import allocations, job_views
from gpusched.db.notify import notify_in
from gpusched.messages.fields import as_object, refuse_unknown, required_integer

MAX_EXIT_CODE = 255


class AllocationRoutes:
    """Only an allocation's owner (or an admin) keeps it alive or ends it."""

    def __init__(self, context: ApiContext, grace: float) -> None:
        self.context = context
        self.grace = grace

    def add_to(self, r: Router) -> None:
        """Register the allocation routes."""
        r.add("POST", "/v1/jobs/{job_id}/heartbeat", self.heartbeat)
        r.add("POST", "/v1/jobs/{job_id}/complete", self.complete)

    def heartbeat(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The client of a pending or running allocation is alive. The answer says the
        job's state, its nodes and partition once it runs, and how long the client may
        stay silent."""
        ctx, job_id = self.context, path_job_id(request)
        refuse_unknown(as_object(request.body, "the heartbeat"), (), "the heartbeat")
        with ctx.sessions() as session, session.begin():
            job = allocations.heartbeat(session, job_id, ctx.identity(request))
            answer = {"job_id": job_id, "state": job.state, "name": job.name,
                      "partition": job.partition,
                      "node_names": allocations.nodes_of(session, job),
                      "allocation_grace": self.grace}
        return 200, answer

    def complete(self, request: Request) -> tuple[int, dict[str, Any]]:
        """End a running allocation with its client's exit status (0: COMPLETED, else
        FAILED); its GPUs are free and its steps end. Answers the job."""
        ctx, job_id = self.context, path_job_id(request)
        body = as_object(request.body, "the completion")
        refuse_unknown(body, ("exit_code",), "the completion")
        code = required_integer(body, "exit_code", 0, MAX_EXIT_CODE, "an exit status")
        who = ctx.identity(request)
        with ctx.sessions() as session, session.begin():
            nodes = allocations.complete(session, job_id, who, code)
            notify_in(session, "sched")
        for node in nodes:
            ctx.events.wake_node(node)
        ctx.events.wake_scheduler()
        with ctx.sessions() as session:
            return 200, job_views.get_job(session, job_id, who)
