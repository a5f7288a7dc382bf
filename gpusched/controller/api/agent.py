"""``/agent/v1``: what nodes' agents tell the controller and take from it."""

from __future__ import annotations

import math
from typing import Any

from gpusched.controller.api.common import ApiContext, id_set, path_job_id
from gpusched.controller.http import Request, Router
from gpusched.db import agents, health
from gpusched.db.nodes import node_named
from gpusched.db.notify import notify_in
from gpusched.errors import UsageError

MAX_POLL_WAIT = 60.0


class AgentRoutes:
    """Every route here refuses callers other than root and the controller's user."""

    def __init__(self, context: ApiContext) -> None:
        self.context = context

    def add_to(self, r: Router) -> None:
        """Register the agents' routes."""
        r.add("POST", "/agent/v1/register", self.register)
        r.add("GET", "/agent/v1/work", self.work)
        r.add("POST", "/agent/v1/jobs/{job_id}/launched", self.launched)
        r.add("POST", "/agent/v1/jobs/{job_id}/ended", self.ended)
        r.add("POST", "/agent/v1/jobs/{job_id}/signalled", self.signalled)
        r.add("POST", "/agent/v1/health", self.health)
        r.add("POST", "/agent/v1/samples", self.samples)

    def register(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An agent announces its node and GPUs."""
        ctx = self.context
        ctx.require_agent(request)
        with ctx.sessions() as session, session.begin():
            agents.register_node(session, request.body)
            notify_in(session, "sched")
        ctx.events.wake_scheduler()
        return 200, {"ok": True}

    def work(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Long poll: launches and cancels for a node; doubles as its heartbeat."""
        ctx = self.context
        ctx.require_agent(request)
        node_name = request.query.get("node", "")
        try:
            wait = float(request.query.get("wait", "0"))
            wait = min(wait, MAX_POLL_WAIT) if math.isfinite(wait) else 0.0
            signalled = id_set(request.query.get("signalled", ""), "signalled")
        except ValueError:
            raise UsageError("wait: expected seconds; signalled: expected job ids") from None
        seen = ctx.events.node_generation(node_name)
        with ctx.sessions() as session, session.begin():
            node, came_back = agents.heartbeat(session, node_name)
            work = agents.pending_work(session, node, signalled)
            if came_back:
                notify_in(session, "sched")
        if came_back:
            ctx.events.wake_scheduler()
        if work["launches"] or work["cancels"] or work["signals"] or wait <= 0:
            return 200, work
        ctx.events.wait_node(node_name, seen, wait)
        with ctx.sessions() as session:
            return 200, agents.pending_work(session, node_named(session, node_name), signalled)

    def launched(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The agent started the job's supervisor."""
        ctx = self.context
        ctx.require_agent(request)
        with ctx.sessions() as session, session.begin():
            changed = agents.mark_launched(session, path_job_id(request),
                                           str(request.body.get("node")))
        return 200, {"ok": True, "changed": changed}

    def ended(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The agent reports a job's end; its GPUs are released and the scheduler woken."""
        ctx = self.context
        ctx.require_agent(request)
        with ctx.sessions() as session, session.begin():
            changed = agents.record_end(session, path_job_id(request), request.body)
            if changed:
                notify_in(session, "sched")
        if changed:
            ctx.events.wake_scheduler()
        return 200, {"ok": True, "changed": changed}

    def signalled(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The agent delivered a job's pending signal."""
        ctx = self.context
        ctx.require_agent(request)
        with ctx.sessions() as session, session.begin():
            changed = agents.signal_delivered(session, path_job_id(request), request.body)
        return 200, {"ok": True, "changed": changed}

    def health(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An agent reports failing GPUs or MIG slices: out of service at once, and the
        jobs on them are stopped (then requeued or FAILED, see db/health.py)."""
        ctx = self.context
        ctx.require_agent(request)
        node = str(request.body.get("node"))
        with ctx.sessions() as session, session.begin():
            stopping = health.report_faults(session, node, request.body)
            notify_in(session, "sched", *(f"node:{n}" for n in sorted(stopping)))
        for name in stopping:
            ctx.events.wake_node(name)
        ctx.events.wake_scheduler()
        return 200, {"ok": True, "stopping": sorted(stopping)}

    def samples(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An agent's GPU samples: stored per GPU and rolled up into the jobs on them."""
        ctx = self.context
        ctx.require_agent(request)
        with ctx.sessions() as session, session.begin():
            flagged = health.record_samples(session, str(request.body.get("node")), request.body,
                                            ctx.idle_percent, ctx.idle_after)
        return 200, {"ok": True, "idle": flagged}
