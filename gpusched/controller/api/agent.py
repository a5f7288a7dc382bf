"""``/agent/v1``: what nodes' agents tell the controller and take from it."""

from __future__ import annotations

import math
import time
from datetime import datetime
from typing import Any

from gpusched import stages
from gpusched.controller.api.common import ApiContext, path_job_id
from gpusched.controller.http import Request, Router
from gpusched.core import bounds
from gpusched.db import agents, commands, health, idle_policy, node_drain, node_failure
from gpusched.db.notify import notify_in
from gpusched.errors import UsageError
from gpusched.messages import JobEnd, NodeHealth

MAX_POLL_WAIT = 60.0


class AgentRoutes:
    """Every route here acts for one node (named in its body or query) and refuses
    anyone but that node's agent: root or the controller's user on the local socket, a
    node credential for that very node over TCP (ApiContext.require_node)."""

    def __init__(self, context: ApiContext) -> None:
        self.context = context

    def add_to(self, r: Router) -> None:
        """Register the agents' routes."""
        r.add("POST", "/agent/v1/register", self.register)
        r.add("GET", "/agent/v1/work", self.work)
        r.add("POST", "/agent/v1/commands/done", self.done_all)
        r.add("POST", "/agent/v1/commands/{command_id}/done", self.done)
        r.add("POST", "/agent/v1/jobs/ended", self.ended_all)
        r.add("POST", "/agent/v1/jobs/{job_id}/ended", self.ended)
        r.add("POST", "/agent/v1/health", self.health)
        r.add("POST", "/agent/v1/nodes/{node}/health", self.node_health)
        r.add("POST", "/agent/v1/samples", self.samples)

    def register(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An agent announces its node, its GPUs and the runs it holds; it is told which
        of those runs the controller has ended, to kill before it takes new work."""
        ctx = self.context
        ctx.require_node(request, request.body.get("node"))
        runs = node_failure.parse_runs(request.body.get("runs"))
        with ctx.sessions() as session, session.begin():
            node = agents.register_node(session, request.body)
            kill = node_failure.fence_runs(session, node, runs)
            notify_in(session, "sched")
        ctx.events.wake_scheduler()
        # acks_in_poll: this controller takes a work poll's ``done`` (an agent that is
        # not told so acknowledges by POST /agent/v1/commands/done, as before it).
        return 200, {"ok": True, "kill": [{"job_id": job_id, "run": run} for job_id, run in kill],
                     "acks_in_poll": True}

    def work(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Long poll: claim the node's open commands; doubles as its heartbeat. ``done``
        acknowledges the commands the agent did since its last poll, in the same
        transaction and before anything is claimed (one request less per work answer)."""
        ctx = self.context
        ctx.require_node(request, request.query.get("node"))
        node_name = request.query.get("node", "")
        try:
            wait = float(request.query.get("wait", "0"))
            wait = min(wait, MAX_POLL_WAIT) if math.isfinite(wait) else 0.0
        except ValueError:
            raise UsageError("wait: expected seconds") from None
        done = _done_seqs(request.query.get("done"))
        seen = ctx.events.node_generation(node_name)
        claimed, registered = self._claim(node_name, None, done)
        woke = None
        if not claimed and wait > 0:
            ctx.events.wait_node(node_name, seen, wait)
            woke = time.time()
            claimed, _ = self._claim(node_name, registered)
        if claimed and stages.on():
            stages.stamp("sent", [c["job_id"] for c in claimed if c["kind"] == "launch"],
                         node=node_name, woke=woke)
        return 200, {"commands": claimed}

    def _claim(self, node_name: str, registered: datetime | None, done: list[int] | None = None
               ) -> tuple[list[dict[str, Any]], datetime | None]:
        """Mark ``done`` commands done, claim the node's commands, and say when the node
        registered. A poll that waited while its node registered again claims nothing:
        it is an agent's that has been replaced (killed, restarted), and what it claimed
        would be lost."""
        with self.context.sessions() as session, session.begin():
            claimed, registered_at = commands.poll(session, node_name, registered, done or ())
            return [command.to_json() for command in claimed], registered_at

    def done(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The agent did one command (for a launch: the job's supervisor runs)."""
        ctx = self.context
        ctx.require_node(request, request.body.get("node"))
        raw = request.params.get("command_id", "")
        if not raw.isdigit() or not 1 <= int(raw) <= bounds.MAX_JOB_ID:
            raise UsageError(f"command id: expected a number, got {raw[:40]!r}")
        with ctx.sessions() as session, session.begin():
            node_id = commands.node_id(session, str(request.body.get("node")))
            changed = bool(commands.complete_all(session, node_id, [int(raw)]))
        return 200, {"ok": True, "changed": changed}

    def done_all(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The agent did these commands (``seqs``), acknowledged in one transaction;
        ``changed``: those not done before."""
        ctx = self.context
        ctx.require_node(request, request.body.get("node"))
        seqs = request.body.get("seqs")
        if not isinstance(seqs, list) or not 1 <= len(seqs) <= bounds.MAX_COMMANDS_ACKED or any(
                not isinstance(s, int) or isinstance(s, bool) or not 1 <= s <= bounds.MAX_JOB_ID
                for s in seqs):
            raise UsageError(f"seqs: expected 1 to {bounds.MAX_COMMANDS_ACKED} command numbers")
        with ctx.sessions() as session, session.begin():
            node_id = commands.node_id(session, str(request.body.get("node")))
            changed = commands.complete_all(session, node_id, seqs)
        return 200, {"ok": True, "changed": changed}

    def ended(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The agent reports how a run of a job ended; its GPUs are released and the
        scheduler woken. An end for a run the controller has ended is ``stale``: it
        changes nothing, and the agent forgets it."""
        ctx = self.context
        ctx.require_node(request, request.body.get("node"))
        with ctx.sessions() as session, session.begin():
            changed, stale = agents.record_run_end(session, path_job_id(request), request.body)
            if changed:
                notify_in(session, "sched")
        if changed:
            ctx.events.wake_scheduler()
            stages.stamp("ended", (int(request.params["job_id"]),))
        return 200, {"ok": True, "changed": changed, "stale": stale}

    def ended_all(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Several runs' ends of one node in one transaction, each as ``ended`` records
        it (in job order); every report is checked before any is recorded."""
        ctx = self.context
        node = ctx.require_node(request, request.body.get("node"))
        ends = request.body.get("ends")
        if not isinstance(ends, list) or not 1 <= len(ends) <= bounds.MAX_ENDS_REPORTED:
            raise UsageError(f"ends: expected 1 to {bounds.MAX_ENDS_REPORTED} job ends")
        reports = [_end_of(node, item) for item in ends]
        outcome: dict[int, tuple[bool, bool]] = {}
        with ctx.sessions() as session, session.begin():
            for job_id, report in sorted(reports, key=lambda r: r[0]):
                if job_id not in outcome:
                    outcome[job_id] = agents.record_run_end(session, job_id, report)
            changed = [job_id for job_id, (did, _) in outcome.items() if did]
            if changed:
                notify_in(session, "sched")
        if changed:
            ctx.events.wake_scheduler()
            stages.stamp("ended", changed)
        return 200, {"ok": True, "ended": [
            {"job_id": job_id, "changed": outcome[job_id][0], "stale": outcome[job_id][1]}
            for job_id, _ in reports]}

    def health(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An agent reports failing GPUs or MIG slices: out of service at once, and the
        jobs on them are stopped (then requeued or FAILED, see db/health.py)."""
        ctx = self.context
        ctx.require_node(request, request.body.get("node"))
        node = str(request.body.get("node"))
        with ctx.sessions() as session, session.begin():
            stopping = health.report_faults(session, node, request.body)
            notify_in(session, "sched", *(f"node:{n}" for n in sorted(stopping)))
        for name in stopping:
            ctx.events.wake_node(name)
        ctx.events.wake_scheduler()
        return 200, {"ok": True, "stopping": sorted(stopping)}

    def node_health(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The node's health check ran: a failure drains the node (reason ``health
        check: ...``), a pass lifts a drain an earlier failure made (db/node_drain.py)."""
        ctx = self.context
        name = ctx.require_node(request, request.params.get("node"))
        report = NodeHealth.parse(request.body)
        if report.node != name:
            raise UsageError(f"node: the report is for {report.node[:64]}, the path names "
                             f"{name[:64]}")
        with ctx.sessions() as session, session.begin():
            node = agents.registered_node(session, name)
            before = (node.state, node.reason)
            state = node_drain.record_health(session, node, report)
            if state == "UP" and before[0] != "UP":
                notify_in(session, "sched")
            answer = {"ok": True, "node": name, "state": state, "reason": node.reason,
                      "drained_by": node.drained_by, "changed": (state, node.reason) != before}
        if state == "UP" and before[0] != "UP":
            ctx.events.wake_scheduler()
        return 200, answer

    def samples(self, request: Request) -> tuple[int, dict[str, Any]]:
        """An agent's GPU samples: stored per GPU and rolled up into the jobs on them."""
        ctx = self.context
        ctx.require_node(request, request.body.get("node"))
        node = str(request.body.get("node"))
        with ctx.sessions() as session, session.begin():
            flagged = health.record_samples(session, node, request.body,
                                            ctx.idle_percent, ctx.idle_after)
            told = idle_policy.enforce(session, node, ctx.idle_percent)
            if told:
                notify_in(session, "sched", *(f"node:{n}" for n in sorted(told)))
        for name in told:
            ctx.events.wake_node(name)
        return 200, {"ok": True, "idle": flagged}


def _end_of(node: str, item: object) -> tuple[int, dict[str, Any]]:
    """A job id and its end report, from one entry of ``ends``; its node must be the
    one the request acts for."""
    if not isinstance(item, dict):
        raise UsageError("ends: expected objects, each a job_id and its end report")
    job_id = item.get("job_id")
    if not isinstance(job_id, int) or isinstance(job_id, bool) \
            or not 1 <= job_id <= bounds.MAX_JOB_ID:
        raise UsageError("ends: job_id: expected a job id")
    report = {key: value for key, value in item.items() if key != "job_id"}
    if report.get("node") != node:
        raise UsageError(f"ends: job {job_id}: node: the report is for "
                         f"{str(report.get('node'))[:64]}, the request for {node[:64]}")
    JobEnd.parse(report)  # refused whole before anything is recorded
    return job_id, report


def _done_seqs(text: str | None) -> list[int] | None:
    """A work poll's ``done``: command numbers separated by commas (None: none given).
    Stricter than the lists users give (bounds.parse_id_list, which checks each number):
    no empty item, no space, and at most MAX_ACKS_IN_POLL items, repeats counted."""
    if text is None:
        return None
    parts = text.split(",", bounds.MAX_ACKS_IN_POLL)
    if len(parts) > bounds.MAX_ACKS_IN_POLL or not all(part and not any(
            c.isspace() for c in part) for part in parts):
        raise UsageError(f"done: expected 1 to {bounds.MAX_ACKS_IN_POLL} command numbers "
                         "separated by commas")
    try:
        return bounds.parse_id_list("done", text, bounds.MAX_ACKS_IN_POLL, "command numbers")
    except bounds.BoundError as exc:
        raise UsageError(str(exc)) from None
