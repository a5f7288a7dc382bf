"""Job steps: ``/v1/jobs/{job}/steps`` (gsrun makes, lists and cancels them) and
``/agent/v1/jobs/{job}/steps/{step}/ended`` (a node's agent reports its part's end)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpusched.controller.api.common import ApiContext, path_job_id
from gpusched.controller.http import Request, Router
from gpusched.core.steps import MAX_STEP_ID
from gpusched.db import steps
from gpusched.errors import NotFound, UsageError
from gpusched.messages.agent import MAX_SIGNAL
from gpusched.messages.fields import as_object, flag, optional_integer, refuse_unknown
from gpusched.messages.steps import StepRequest

CANCEL_FIELDS = ("bad_exit", "signal")


def path_step_id(request: Request) -> int:
    """The step id of the path; one that no step can have is not found."""
    raw = request.params["step_id"]
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 10 or int(raw) > MAX_STEP_ID:
        raise NotFound(f"invalid step id specified: {raw[:40]!r}")
    return int(raw)


class StepRoutes:
    """A job's owner (or root) makes its steps, its owner or an admin cancels them;
    anyone may list them, as anyone may read accounting; only the node's own agent
    reports a step's end there."""

    def __init__(self, context: ApiContext) -> None:
        self.context = context

    def add_to(self, r: Router) -> None:
        """Register the step routes."""
        r.add("POST", "/v1/jobs/{job_id}/steps", self.create)
        r.add("GET", "/v1/jobs/{job_id}/steps", self.list_steps)
        r.add("GET", "/v1/jobs/{job_id}/steps/{step_id}", self.get_step)
        r.add("POST", "/v1/jobs/{job_id}/steps/{step_id}/cancel", self.cancel)
        r.add("POST", "/agent/v1/jobs/{job_id}/steps/{step_id}/ended", self.ended)

    def create(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Start a step of a running job on its nodes (201 StepCreated); 409
        ``step_busy`` while the job's running steps hold what it needs.

        A step runs its command as the job's user, so only that user, root and the
        controller's user may make one: a member of ``admin_group`` administers the
        queue and the nodes but may not run commands as the users whose jobs run."""
        ctx = self.context
        job_id = path_job_id(request)
        step_request = StepRequest.parse(request.body)
        who = ctx.identity(request)
        who = replace(who, admin=who.uid in (0, ctx.own_uid))
        with ctx.sessions() as session, session.begin():
            created, nodes = steps.create_step(session, job_id, step_request, who)
        for node in nodes:
            ctx.events.wake_node(node)
        return 201, created.to_json()

    def list_steps(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The job's steps, oldest first."""
        with self.context.sessions() as session:
            return 200, {"steps": steps.list_steps(session, path_job_id(request))}

    def get_step(self, request: Request) -> tuple[int, dict[str, Any]]:
        """One step."""
        job_id, step_id = path_job_id(request), path_step_id(request)
        with self.context.sessions() as session:
            return 200, steps.get_step(session, job_id, step_id)

    def cancel(self, request: Request) -> tuple[int, dict[str, Any]]:
        """End a running step (``bad_exit``: gsrun -K saw a task fail) or, with
        ``signal``, only send its tasks that signal."""
        ctx = self.context
        job_id, step_id = path_job_id(request), path_step_id(request)
        body = as_object(request.body, "the step cancel")
        refuse_unknown(body, CANCEL_FIELDS, "the step cancel")
        bad_exit = flag(body, "bad_exit")
        signum = optional_integer(body, "signal", 1, MAX_SIGNAL, "a signal number")
        if bad_exit and signum is not None:
            raise UsageError("bad_exit ends the step; signal only signals it: not both")
        with ctx.sessions() as session, session.begin():
            nodes = steps.cancel_step(session, job_id, step_id, ctx.identity(request),
                                      bad_exit, signum)
        for node in nodes:
            ctx.events.wake_node(node)
        with ctx.sessions() as session:
            return 200, steps.get_step(session, job_id, step_id)

    def ended(self, request: Request) -> tuple[int, dict[str, Any]]:
        """A node's agent reports how its part of a step ended; ``stale`` when no such
        part runs there (or it was reported already): the agent forgets it."""
        ctx = self.context
        ctx.require_node(request, request.body.get("node"))
        job_id, step_id = path_job_id(request), path_step_id(request)
        with ctx.sessions() as session, session.begin():
            changed, stale = steps.record_step_end(session, job_id, step_id, request.body)
        return 200, {"ok": True, "changed": changed, "stale": stale}
