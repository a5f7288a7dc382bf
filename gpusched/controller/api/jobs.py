"""``/v1/jobs``: submit, list, show, explain, cancel, hold, release, signal, requeue and
update jobs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from gpusched.controller.api.common import ApiContext, path_job_id
from gpusched.controller.http import Answer, EncodedJson, Request, Router
from gpusched.core.explain import NotPending, explain
from gpusched.core.plan import plan
from gpusched.db import job_views, jobs, jobupdate, submit, submit_known
from gpusched.db.direct import DirectConnections
from gpusched.db.notify import notify_in
from gpusched.db.schedule import load_snapshot
from gpusched.db.submit_store import KnownFacts
from gpusched.errors import UsageError
from gpusched.messages import fields
from gpusched.stages import stamp

# Connections kept for submissions made in one statement (db/direct.py), besides the
# pool's: more submitting at once than this go the ordinary way, on the pool.
DIRECT_CONNECTIONS = 4


class JobRoutes:
    """Users' requests about their jobs (admins may act on anyone's)."""

    def __init__(self, context: ApiContext) -> None:
        self.context = context
        self.known = KnownFacts()  # what submissions read, for the next ones
        self._direct: DirectConnections | None = None
        self._direct_lock = threading.Lock()

    @property
    def direct(self) -> DirectConnections:
        """Connections for submissions made in one statement, made at the first."""
        if self._direct is None:
            with self._direct_lock:
                if self._direct is None:
                    self._direct = DirectConnections.of(self.context.sessions.kw["bind"],
                                                        DIRECT_CONNECTIONS)
        return self._direct

    def add_to(self, r: Router) -> None:
        """Register the job routes."""
        r.add("POST", "/v1/jobs", self.submit)
        r.add("POST", "/v1/jobs/test", self.test_submit)
        r.add("GET", "/v1/jobs", self.list_jobs)
        r.add("GET", "/v1/jobs/{job_id}", self.get_job)
        r.add("GET", "/v1/jobs/{job_id}/explain", self.explain)
        r.add("POST", "/v1/jobs/{job_id}/cancel", self.cancel)
        r.add("POST", "/v1/jobs/{job_id}/hold", self.hold)
        r.add("POST", "/v1/jobs/{job_id}/signal", self.signal)
        r.add("POST", "/v1/jobs/{job_id}/release", self.release)
        r.add("POST", "/v1/jobs/{job_id}/requeue", self.requeue)
        r.add("POST", "/v1/jobs/{job_id}/update", self.update_job)

    def submit(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Store a new PENDING job and wake the scheduler (unless the job is held); a
        ``submit_key`` the caller sent before answers the job stored then (200,
        ``existing``): in one round trip to the database where what former submissions
        read allows it (db/submit_known.py)."""
        ctx = self.context
        # A new job that needs a pass sends the sched NOTIFY with its INSERT.
        job, created = submit_known.store(ctx.sessions, request.body, ctx.identity(request),
                                          self.known, ctx.max_submit_jobs, notify=True,
                                          direct=self.direct)
        schedule = created and submit.needs_pass(job)
        job_id = job.id
        if not created:
            return 200, {"job_id": job_id, "existing": True}
        stamp("committed", (job_id,))
        if schedule:
            ctx.events.wake_scheduler()
        return 201, {"job_id": job_id}

    def test_submit(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Validate a submission and say when and where the next pass would start it,
        storing nothing (gsubmit --test-only): the job is added, planned, rolled back."""
        ctx = self.context
        body = {k: v for k, v in request.body.items() if k != "submit_key"}  # never stored
        session = ctx.sessions()
        try:
            job = submit.submit_job(session, body, self.context.identity(request),
                                    ctx.max_submit_jobs)
            session.flush()
            job_id, partition, gpus = job.id, job.partition, job.gpus
            snapshot, _ = load_snapshot(session, ctx.policy.preempt_grace)
            decided = plan(snapshot, time.time(), ctx.policy)
        finally:
            session.rollback()
            session.close()
        started = [s for s in decided.starts if s.job_id == job_id]
        if started:
            when: float | None = time.time()
            nodes = sorted({n for s in started for n in (s.nodes or (s.node,))})
            reason = "None"
        else:
            waiting = next((p for p in decided.pending if p.job_id == job_id), None)
            when = waiting.expected_start if waiting else None
            reserved = next((r for r in decided.reservations if r.job_id == job_id), None)
            nodes = list(reserved.nodes) if reserved else []
            reason = waiting.reason.value if waiting else "None"
        return 200, {"job_id": job_id, "partition": partition, "gpus": gpus, "nodes": nodes,
                     "start": datetime.fromtimestamp(when, UTC).isoformat() if when else None,
                     "reason": reason}

    def list_jobs(self, request: Request) -> Answer:
        """The queue, as the JSON text PostgreSQL writes (JOB objects, or a table of
        fields) where it writes what job_views.list_jobs would."""
        with self.context.sessions() as session:
            if request.query.get("fields"):
                built = job_views.job_table_json(session, request.query)
            else:
                built = job_views.job_list_json(session, request.query)
            if built is not None:
                return 200, EncodedJson(built)
            return 200, job_views.list_jobs(session, request.query)

    def get_job(self, request: Request) -> tuple[int, dict[str, Any]]:
        """One job."""
        with self.context.sessions() as session:
            return 200, job_views.get_job(session, path_job_id(request), self.context.identity(request))

    def explain(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Everything that keeps a pending job from starting, ranked, in words."""
        job_id, who, policy = path_job_id(request), self.context.identity(request), self.context.policy
        with self.context.sessions() as session:
            job = job_views.get_job(session, job_id, who)
            snapshot, _ = load_snapshot(session, policy.preempt_grace) if job["state"] == "PENDING" else (None, None)
            try:
                why = explain(snapshot, time.time(), policy, job_id) if snapshot else None
            except NotPending:  # it started or ended since it was read
                job, why = job_views.get_job(session, job_id, who), None
        if why is None:
            return 200, {"job": job, "reason": job["reason"], "blockers": [], "would_start": []}
        return 200, {
            "job": job, "reason": why.reason.value, "priority": why.priority,
            "position": why.position, "queue_length": why.queue_length,
            "blockers": [{"reason": b.reason.value, "detail": b.detail} for b in why.blockers],
            "would_start": [{"node": s.node, "gpu_uuids": list(s.gpu_uuids),
                             "array_task_id": s.array_task_id} for s in why.starts],
        }

    def cancel(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Cancel a pending job at once, or ask the node's agent to stop a running one."""
        job_id = path_job_id(request)
        tasks = request.body.get("tasks")
        if tasks is not None and not isinstance(tasks, str):
            raise UsageError("tasks: expected array task ids such as \"3\" or \"1-5\"")
        who = self.context.identity(request)
        return self._change_job(request, job_id, True, lambda session: (
            jobs.cancel_job(session, job_id, who) if tasks is None
            else jobs.cancel_tasks(session, job_id, who, tasks))[1])

    def _change_job(self, request: Request, job_id: int, schedule: bool,
                    change: Callable[[Session], set[str]]) -> tuple[int, dict[str, Any]]:
        """Apply ``change`` (which returns the nodes whose agents must act) in one
        transaction, wake those agents (and the scheduler), and answer the job."""
        ctx = self.context
        with ctx.sessions() as session, session.begin():
            nodes = change(session)
            notify_in(session, *(["sched"] if schedule else []),
                      *(f"node:{node}" for node in sorted(nodes)))
        for node in nodes:
            ctx.events.wake_node(node)
        if schedule:
            ctx.events.wake_scheduler()
        with ctx.sessions() as session:
            return 200, job_views.get_job(session, job_id, self.context.identity(request))

    def signal(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Send a signal to a running job without ending it (gcancel --signal)."""
        job_id = path_job_id(request)
        signum = request.body.get("signal")
        if not isinstance(signum, int) or isinstance(signum, bool):
            raise UsageError("signal: expected a signal number")
        who = self.context.identity(request)
        return self._change_job(request, job_id, False,
                                lambda session: jobs.signal_job(session, job_id, who, signum)[1])

    def hold(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Hold a pending job: it stays queued but is not started."""
        return self._set_hold(request, True)

    def release(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Release a held job; an admin hold needs an admin."""
        return self._set_hold(request, False)

    def _set_hold(self, request: Request, hold: bool) -> tuple[int, dict[str, Any]]:
        ctx, job_id = self.context, path_job_id(request)
        with ctx.sessions() as session, session.begin():
            jobs.set_hold(session, job_id, self.context.identity(request), hold)
            notify_in(session, "sched")
        ctx.events.wake_scheduler()
        with ctx.sessions() as session:
            return 200, job_views.get_job(session, job_id, self.context.identity(request))

    def update_job(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Change a pending job's partition, QOS, time limit, nodes, GPUs, dependency,
        name or priority, or a running job's time limit (its agents apply it) or name
        (gpusched.db.jobupdate has who may change what)."""
        job_id, who = path_job_id(request), self.context.identity(request)
        return self._change_job(request, job_id, True, lambda session: jobupdate.update_job(
            session, job_id, who, request.body)[1])

    def requeue(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Stop a running job, or take an ended one, and put it back in the queue (its
        owner or an admin); with ``hold``, held (scontrol requeuehold)."""
        job_id, who = path_job_id(request), self.context.identity(request)
        hold = fields.flag(request.body, "hold")
        return self._change_job(request, job_id, True,
                                lambda session: jobs.requeue_job(session, job_id, who, hold)[1])
