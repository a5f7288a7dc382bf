"""Administrators' routes: apply the admin files, drain and resume nodes and GPUs."""

from __future__ import annotations

from typing import Any

from gpusched.adminconfig import parse_admin_config
from gpusched.controller.api.common import ApiContext
from gpusched.controller.http import Request, Router
from gpusched.db import health
from gpusched.db.admin import apply_config, plan_changes
from gpusched.db.notify import notify_in
from gpusched.errors import UsageError


class AdminRoutes:
    """Every route here refuses callers other than root and the controller's user."""

    def __init__(self, context: ApiContext) -> None:
        self.context = context

    def add_to(self, r: Router) -> None:
        """Register the administrators' routes."""
        r.add("POST", "/v1/admin/apply", self.admin_apply)
        r.add("POST", "/v1/gpus/resume", self.resume_gpu)
        r.add("POST", "/v1/gpus/drain", self.drain_gpu)
        r.add("POST", "/v1/nodes/{name}/drain", self.drain_node)
        r.add("POST", "/v1/nodes/{name}/resume", self.resume_node)

    def admin_apply(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Validate admin files as a whole; apply them in one transaction unless dry_run."""
        ctx = self.context
        ctx.require_admin(request)
        files = request.body.get("files")
        if not isinstance(files, list) or not all(
                isinstance(f, dict) and isinstance(f.get("source"), str) for f in files):
            raise UsageError("files: expected a list of {source, data} objects")
        config = parse_admin_config([(f["source"], f.get("data")) for f in files])
        dry_run = bool(request.body.get("dry_run"))
        with ctx.sessions() as session, session.begin():
            if dry_run:
                return 200, {"changes": plan_changes(session, config), "applied": False}
            changes = apply_config(session, config)
            notify_in(session, "sched")
        # Here at once: this controller's next pass must not wait for the NOTIFY.
        ctx.events.admin_changed()
        ctx.events.wake_scheduler()
        return 200, {"changes": changes, "applied": True}

    def resume_gpu(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An administrator returns a GPU (``{node, index}``) to service."""
        ctx = self.context
        ctx.require_admin(request)
        node, index = _gpu_target(request)
        with ctx.sessions() as session, session.begin():
            answer = health.resume_gpu(session, node, index)
            notify_in(session, "sched")
        ctx.events.wake_scheduler()
        return 200, answer

    def drain_gpu(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An administrator takes a GPU (``{node, index, reason}``) out of service."""
        ctx = self.context
        ctx.require_admin(request)
        node, index = _gpu_target(request)
        with ctx.sessions() as session, session.begin():
            return 200, health.drain_gpu(session, node, index, request.body.get("reason"))

    def drain_node(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An administrator drains a node: no new jobs, running ones go on."""
        ctx = self.context
        ctx.require_admin(request)
        with ctx.sessions() as session, session.begin():
            return 200, health.set_node_state(session, request.params["name"], True,
                                              request.body.get("reason"))

    def resume_node(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An administrator returns a drained node to service."""
        ctx = self.context
        ctx.require_admin(request)
        with ctx.sessions() as session, session.begin():
            answer = health.set_node_state(session, request.params["name"], False)
            notify_in(session, "sched")
        ctx.events.wake_scheduler()
        return 200, answer


def _gpu_target(request: Request) -> tuple[str, int]:
    """The ``{node, index}`` of a GPU request's body."""
    node, index = request.body.get("node"), request.body.get("index")
    if not isinstance(node, str) or not isinstance(index, int) or isinstance(index, bool):
        raise UsageError("expected {node: NAME, index: N}")
    return node, index
