"""The HTTP/JSON API: request validation, authorisation, reads and writes via db/."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

import gpusched
from gpusched.adminconfig import parse_admin_config
from gpusched.controller.events import Events, notify_in
from gpusched.controller.http import Answer, EncodedJson, Request, Router
from gpusched.core.bounds import BoundError, parse_id_list, parse_job_id
from gpusched.core.explain import NotPending, explain
from gpusched.core.fairshare import FairShareTree
from gpusched.core.model import Policy
from gpusched.core.plan import job_priorities, plan
from gpusched.db import accounting, agents, health, job_views, jobs, submit
from gpusched.db.admin import apply_config, plan_changes
from gpusched.db.nodes import node_listing, node_named
from gpusched.db.partitions import partition_listing
from gpusched.db.schedule import load_snapshot
from gpusched.errors import NotFound, PermissionDenied, UsageError

MAX_POLL_WAIT = 60.0


def _ids(text: str, field: str = "ids") -> set[int]:
    try:
        return set(parse_id_list(field, text))
    except BoundError as exc:
        raise UsageError(str(exc)) from None


def _words(text: str | None) -> list[str] | None:
    return [w for w in text.split(",") if w] if text else None


def _epoch(query: dict[str, str], key: str) -> datetime | None:
    if not query.get(key):
        return None
    try:
        return datetime.fromtimestamp(float(query[key]), UTC)
    except (ValueError, OverflowError, OSError):
        raise UsageError(f"{key}: expected epoch seconds, got {query[key]!r}") from None


def _job_id(request: Request) -> int:
    """The job id of the path; one that no job can have is not found."""
    job_id = parse_job_id(request.params["job_id"])
    if job_id is None:
        shown = request.params["job_id"][:40]
        raise NotFound(f"invalid job id specified: {shown!r}")
    return job_id


class _CheckedRouter(Router):
    """Refuses a path or query value with a NUL before any handler sees it: no text the
    database stores or compares may hold one."""

    def dispatch(self, request: Request) -> Answer:
        for key, value in (*request.query.items(), ("path", request.path)):
            if "\0" in key or "\0" in value:
                raise UsageError(f"{key[:40]!r}: contains a NUL character")
        return super().dispatch(request)


class Api:
    """Binds the routes to a session factory and the wake-up hub."""

    def __init__(self, sessions: sessionmaker[Session], events: Events,
                 is_leader: Callable[[], bool],
                 pass_stats: Callable[[], dict[str, Any]] = dict,
                 policy: Policy | None = None, idle: tuple[float, float] = (1.0, 3600.0),
                 max_submit_jobs: int | None = None) -> None:
        self.policy = policy or Policy()
        self.max_submit_jobs = max_submit_jobs  # per user, but for admins; None: no limit
        self.idle_percent, self.idle_after = idle  # see ControllerConfig
        self.sessions = sessions
        self.events = events
        self.is_leader = is_leader
        self.pass_stats = pass_stats
        self.own_uid = os.geteuid()

    def router(self) -> Router:
        """All routes of docs/api.md."""
        r = _CheckedRouter()
        r.add("GET", "/v1/ping", self.ping)
        r.add("POST", "/v1/jobs", self.submit)
        r.add("POST", "/v1/jobs/test", self.test_submit)
        r.add("GET", "/v1/jobs", self.list_jobs)
        r.add("GET", "/v1/jobs/{job_id}", self.get_job)
        r.add("GET", "/v1/jobs/{job_id}/explain", self.explain)
        r.add("POST", "/v1/jobs/{job_id}/cancel", self.cancel)
        r.add("POST", "/v1/jobs/{job_id}/hold", self.hold)
        r.add("POST", "/v1/jobs/{job_id}/signal", self.signal)
        r.add("POST", "/agent/v1/jobs/{job_id}/signalled", self.signalled)
        r.add("POST", "/v1/jobs/{job_id}/release", self.release)
        r.add("GET", "/v1/nodes", self.nodes)
        r.add("GET", "/v1/partitions", self.partitions)
        r.add("GET", "/v1/accounting", self.accounting)
        r.add("GET", "/v1/accounting/report", self.accounting_report)
        r.add("POST", "/v1/admin/apply", self.admin_apply)
        r.add("GET", "/v1/priority", self.priority)
        r.add("GET", "/v1/share", self.share)
        r.add("POST", "/agent/v1/register", self.register)
        r.add("GET", "/agent/v1/work", self.work)
        r.add("POST", "/agent/v1/jobs/{job_id}/launched", self.launched)
        r.add("POST", "/agent/v1/jobs/{job_id}/ended", self.ended)
        r.add("POST", "/agent/v1/health", self.health)
        r.add("POST", "/agent/v1/samples", self.samples)
        r.add("POST", "/v1/gpus/resume", self.resume_gpu)
        r.add("POST", "/v1/gpus/drain", self.drain_gpu)
        r.add("POST", "/v1/nodes/{name}/drain", self.drain_node)
        r.add("POST", "/v1/nodes/{name}/resume", self.resume_node)
        r.add("POST", "/v1/jobs/{job_id}/requeue", self.requeue)
        r.add("POST", "/v1/jobs/{job_id}/update", self.update_job)
        return r

    @staticmethod
    def who(request: Request) -> jobs.Identity:
        """The caller as the kernel reported it."""
        return jobs.Identity(request.caller.uid, request.caller.gid)

    def priority(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Pending jobs' priority factors, highest first (``?ids=`` to choose jobs)."""
        wanted = _ids(request.query.get("ids", ""))
        with self.sessions() as session:
            snapshot, _ = load_snapshot(session, self.policy.preempt_grace)
        owners = {j.job_id: (j.user, j.account) for j in snapshot.pending}
        rows = [
            {"job_id": b.job_id, "user": owners[b.job_id][0], "account": owners[b.job_id][1],
             "priority": b.total, "age": b.age, "fairshare": b.fairshare,
             "job_size": b.job_size, "partition": b.partition, "qos": b.qos}
            for b in job_priorities(snapshot, time.time(), self.policy)
            if not wanted or b.job_id in wanted
        ]
        return 200, {"jobs": rows, "weights": asdict(self.policy.weights)}

    def explain(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Everything that keeps a pending job from starting, ranked, in words."""
        job_id = _job_id(request)
        with self.sessions() as session:
            job = job_views.get_job(session, job_id, self.who(request))
            snapshot, _ = load_snapshot(session, self.policy.preempt_grace) if job["state"] == "PENDING" else (None, None)
            try:
                why = explain(snapshot, time.time(), self.policy, job_id) if snapshot else None
            except NotPending:  # it started or ended since it was read
                job, why = job_views.get_job(session, job_id, self.who(request)), None
        if why is None:
            return 200, {"job": job, "reason": job["reason"], "blockers": [], "would_start": []}
        return 200, {
            "job": job, "reason": why.reason.value, "priority": why.priority,
            "position": why.position, "queue_length": why.queue_length,
            "blockers": [{"reason": b.reason.value, "detail": b.detail} for b in why.blockers],
            "would_start": [{"node": s.node, "gpu_uuids": list(s.gpu_uuids),
                             "array_task_id": s.array_task_id} for s in why.starts],
        }

    def share(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The fair-share tree with shares, usage and factors, depth first."""
        with self.sessions() as session:
            snapshot, _ = load_snapshot(session, self.policy.preempt_grace)
        tree = FairShareTree(snapshot.accounts, snapshot.user_shares)
        rows = tree.report(snapshot.usage, self.policy.fairshare)
        return 200, {"method": self.policy.fairshare, "rows": [asdict(r) for r in rows]}

    def _require_trusted(self, request: Request, who: str) -> None:
        """Admins and agents alike are root or the controller's own user."""
        if request.caller.uid not in (0, self.own_uid):
            raise PermissionDenied(f"only {who} (root or the controller's user) may do this")

    def _require_admin(self, request: Request) -> None:
        self._require_trusted(request, "an administrator")

    def admin_apply(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Validate admin files as a whole; apply them in one transaction unless dry_run."""
        self._require_admin(request)
        files = request.body.get("files")
        if not isinstance(files, list) or not all(
                isinstance(f, dict) and isinstance(f.get("source"), str) for f in files):
            raise UsageError("files: expected a list of {source, data} objects")
        config = parse_admin_config([(f["source"], f.get("data")) for f in files])
        dry_run = bool(request.body.get("dry_run"))
        with self.sessions() as session, session.begin():
            if dry_run:
                return 200, {"changes": plan_changes(session, config), "applied": False}
            changes = apply_config(session, config)
            notify_in(session, "sched")
        self.events.wake_scheduler()
        return 200, {"changes": changes, "applied": True}

    def _require_agent(self, request: Request) -> None:
        self._require_trusted(request, "an agent")

    def ping(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Liveness, leadership and (on the leader) the last pass's statistics."""
        return 200, {"ok": True, "version": gpusched.__version__, "leader": self.is_leader(),
                     "scheduler": self.pass_stats()}

    def submit(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Store a new PENDING job and wake the scheduler."""
        with self.sessions() as session, session.begin():
            job = submit.submit_job(session, request.body, self.who(request),
                                    self.max_submit_jobs)
            notify_in(session, "sched")
            job_id = job.id
        self.events.wake_scheduler()
        return 201, {"job_id": job_id}

    def test_submit(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Validate a submission and say when and where the next pass would start it,
        storing nothing (gsubmit --test-only): the job is added, planned, rolled back."""
        session = self.sessions()
        try:
            job = submit.submit_job(session, request.body, self.who(request),
                                    self.max_submit_jobs)
            session.flush()
            job_id, partition, gpus = job.id, job.partition, job.gpus
            snapshot, _ = load_snapshot(session, self.policy.preempt_grace)
            decided = plan(snapshot, time.time(), self.policy)
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
        """The queue; a table of fields PostgreSQL can write is sent as it wrote it."""
        with self.sessions() as session:
            if request.query.get("fields"):
                table = job_views.job_table_json(session, request.query)
                if table is not None:
                    return 200, EncodedJson(table)
            return 200, job_views.list_jobs(session, request.query)

    def get_job(self, request: Request) -> tuple[int, dict[str, Any]]:
        """One job."""
        with self.sessions() as session:
            return 200, job_views.get_job(session, _job_id(request), self.who(request))

    def cancel(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Cancel a pending job at once, or ask the node's agent to stop a running one."""
        job_id = _job_id(request)
        tasks = request.body.get("tasks")
        if tasks is not None and not isinstance(tasks, str):
            raise UsageError("tasks: expected array task ids such as \"3\" or \"1-5\"")
        who = self.who(request)
        return self._change_job(request, job_id, True, lambda session: (
            jobs.cancel_job(session, job_id, who) if tasks is None
            else jobs.cancel_tasks(session, job_id, who, tasks))[1])

    def _change_job(self, request: Request, job_id: int, schedule: bool,
                    change: Callable[[Session], set[str]]) -> tuple[int, dict[str, Any]]:
        """Apply ``change`` (which returns the nodes whose agents must act) in one
        transaction, wake those agents (and the scheduler), and answer the job."""
        with self.sessions() as session, session.begin():
            nodes = change(session)
            notify_in(session, *(["sched"] if schedule else []),
                      *(f"node:{node}" for node in sorted(nodes)))
        for node in nodes:
            self.events.wake_node(node)
        if schedule:
            self.events.wake_scheduler()
        with self.sessions() as session:
            return 200, job_views.get_job(session, job_id, self.who(request))

    def signal(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Send a signal to a running job without ending it (gcancel --signal)."""
        job_id = _job_id(request)
        signum = request.body.get("signal")
        if not isinstance(signum, int) or isinstance(signum, bool):
            raise UsageError("signal: expected a signal number")
        who = self.who(request)
        return self._change_job(request, job_id, False,
                                lambda session: jobs.signal_job(session, job_id, who, signum)[1])

    def signalled(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The agent delivered a job's pending signal."""
        self._require_agent(request)
        with self.sessions() as session, session.begin():
            changed = agents.signal_delivered(session, _job_id(request), request.body)
        return 200, {"ok": True, "changed": changed}

    def hold(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Hold a pending job: it stays queued but is not started."""
        return self._set_hold(request, True)

    def release(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Release a held job; an admin hold needs an admin."""
        return self._set_hold(request, False)

    def _set_hold(self, request: Request, hold: bool) -> tuple[int, dict[str, Any]]:
        job_id = _job_id(request)
        with self.sessions() as session, session.begin():
            jobs.set_hold(session, job_id, self.who(request), hold)
            notify_in(session, "sched")
        self.events.wake_scheduler()
        with self.sessions() as session:
            return 200, job_views.get_job(session, job_id, self.who(request))

    def nodes(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Nodes with their GPUs and which job holds each."""
        with self.sessions() as session:
            return 200, {"nodes": node_listing(session)}

    def accounting(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Finished and running jobs with what they used (docs/api.md)."""
        q = request.query
        with self.sessions() as session:
            return 200, {"jobs": accounting.job_records(
                session, _words(q.get("user")), _words(q.get("account")),
                [s.upper() for s in _words(q.get("state")) or []] or None,
                sorted(_ids(q["ids"])) if q.get("ids") else None,
                _epoch(q, "start"), _epoch(q, "end"))}

    def accounting_report(self, request: Request) -> tuple[int, dict[str, Any]]:
        """GPU-hours per account and user within a window (``start``, ``end``: epoch s)."""
        start, end = _epoch(request.query, "start"), _epoch(request.query, "end")
        if start is None or end is None or end <= start:
            raise UsageError("start, end: expected a window, start before end (epoch seconds)")
        with self.sessions() as session:
            return 200, {"start": start.isoformat(), "end": end.isoformat(),
                         "rows": accounting.usage_report(session, start, end)}

    def partitions(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Partitions with their nodes ("*" expanded to every node) and limits."""
        with self.sessions() as session:
            return 200, {"partitions": partition_listing(session)}

    def register(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An agent announces its node and GPUs."""
        self._require_agent(request)
        with self.sessions() as session, session.begin():
            agents.register_node(session, request.body)
            notify_in(session, "sched")
        self.events.wake_scheduler()
        return 200, {"ok": True}

    def work(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Long poll: launches and cancels for a node; doubles as its heartbeat."""
        self._require_agent(request)
        node_name = request.query.get("node", "")
        try:
            wait = float(request.query.get("wait", "0"))
            wait = min(wait, MAX_POLL_WAIT) if math.isfinite(wait) else 0.0
            signalled = _ids(request.query.get("signalled", ""), "signalled")
        except ValueError:
            raise UsageError("wait: expected seconds; signalled: expected job ids") from None
        seen = self.events.node_generation(node_name)
        with self.sessions() as session, session.begin():
            node, came_back = agents.heartbeat(session, node_name)
            work = agents.pending_work(session, node, signalled)
            if came_back:
                notify_in(session, "sched")
        if came_back:
            self.events.wake_scheduler()
        if work["launches"] or work["cancels"] or work["signals"] or wait <= 0:
            return 200, work
        self.events.wait_node(node_name, seen, wait)
        with self.sessions() as session:
            node = node_named(session, node_name)
            return 200, agents.pending_work(session, node, signalled)

    def launched(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The agent started the job's supervisor."""
        self._require_agent(request)
        with self.sessions() as session, session.begin():
            changed = agents.mark_launched(session, _job_id(request), str(request.body.get("node")))
        return 200, {"ok": True, "changed": changed}

    def health(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An agent reports failing GPUs or MIG slices: out of service at once, and the
        jobs on them are stopped (then requeued or FAILED, see db/health.py)."""
        self._require_agent(request)
        node = str(request.body.get("node"))
        with self.sessions() as session, session.begin():
            stopping = health.report_faults(session, node, request.body)
            notify_in(session, "sched", *(f"node:{n}" for n in sorted(stopping)))
        for name in stopping:
            self.events.wake_node(name)
        self.events.wake_scheduler()
        return 200, {"ok": True, "stopping": sorted(stopping)}

    def samples(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An agent's GPU samples: stored per GPU and rolled up into the jobs on them."""
        self._require_agent(request)
        with self.sessions() as session, session.begin():
            flagged = health.record_samples(session, str(request.body.get("node")), request.body,
                                            self.idle_percent, self.idle_after)
        return 200, {"ok": True, "idle": flagged}

    def resume_gpu(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An administrator returns a GPU (``{node, index}``) to service."""
        self._require_admin(request)
        node, index = self._gpu_target(request)
        with self.sessions() as session, session.begin():
            answer = health.resume_gpu(session, node, index)
            notify_in(session, "sched")
        self.events.wake_scheduler()
        return 200, answer

    def drain_gpu(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An administrator takes a GPU (``{node, index, reason}``) out of service."""
        self._require_admin(request)
        node, index = self._gpu_target(request)
        with self.sessions() as session, session.begin():
            return 200, health.drain_gpu(session, node, index, request.body.get("reason"))

    @staticmethod
    def _gpu_target(request: Request) -> tuple[str, int]:
        node, index = request.body.get("node"), request.body.get("index")
        if not isinstance(node, str) or not isinstance(index, int) or isinstance(index, bool):
            raise UsageError("expected {node: NAME, index: N}")
        return node, index

    def drain_node(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An administrator drains a node: no new jobs, running ones go on."""
        self._require_admin(request)
        with self.sessions() as session, session.begin():
            return 200, health.set_node_state(session, request.params["name"], True,
                                              request.body.get("reason"))

    def resume_node(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An administrator returns a drained node to service."""
        self._require_admin(request)
        with self.sessions() as session, session.begin():
            answer = health.set_node_state(session, request.params["name"], False)
            notify_in(session, "sched")
        self.events.wake_scheduler()
        return 200, answer

    def update_job(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Change a pending job's time limit (its owner may lower it), partition, QOS or
        priority, or a running job's time limit (its agent applies it)."""
        job_id, who = _job_id(request), self.who(request)
        return self._change_job(request, job_id, True, lambda session: submit.update_job(
            session, job_id, who, request.body)[1])

    def requeue(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Stop a running job and put it back in the queue (its owner or an admin)."""
        job_id, who = _job_id(request), self.who(request)
        return self._change_job(request, job_id, False,
                                lambda session: jobs.requeue_job(session, job_id, who)[1])

    def ended(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The agent reports a job's end; its GPUs are released and the scheduler woken."""
        self._require_agent(request)
        with self.sessions() as session, session.begin():
            changed = agents.record_end(session, _job_id(request), request.body)
            if changed:
                notify_in(session, "sched")
        if changed:
            self.events.wake_scheduler()
        return 200, {"ok": True, "changed": changed}
