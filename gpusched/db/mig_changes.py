"""Dynamic MIG on the controller: after a pass, the MIG layout changes to ask the agents
for, and when each GPU's layout last changed.

**Deciding** (:func:`after_pass`, in the pass's transaction). For each partition with
``dynamic_mig`` on (by name), the jobs of that partition that still wait for one MIG
profile after the pass (``mig_layout.waiting_demand``) are the demand; its UP nodes'
MIG GPUs (``mig_layout.mig_gpus``, with the pass's starts counted as running) are what
may change; ``mig_layout.plan_layouts`` decides with the partition's
``mig_min_interval``. A GPU's last change is the later of ``gpus.mig_changed_at`` and
the last ``mig`` command made for it, so a change its agent refused is not asked for
again within the interval either. A GPU with a ``mig`` command not yet done is planned
as if it had its target layout already and may not change: its coming slices meet
demand, and no second command is made for it. Each target becomes one ``mig`` command
(payload ``gpusched.messages.mig.MigLayout``, no job) for the GPU's node, stamped with
the pass's epoch; the node's agent is woken. A ``mig`` command still not done
``OPEN_FOR`` seconds after it was made is closed: its agent was gone meanwhile, and the
demand it was for is decided again.

With no partition with dynamic MIG, or no job waiting for a MIG profile in one, this
reads nothing.

**Recording** (:func:`note_layouts`, in the registration's transaction). When an agent
registers (at start, after a change it made, or when it sees its GPUs change), a GPU
whose present MIG slices are not those it reports now gets ``gpus.mig_changed_at`` set.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from gpusched.core.mig_layout import (
    MigDemand,
    MigGpu,
    may_change,
    mig_gpus,
    plan_layouts,
    waiting_demand,
)
from gpusched.core.model import NodeState, PendingJob, Plan, RunningJob, Snapshot
from gpusched.errors import UsageError
from gpusched.messages.mig import MIG_KIND, MigLayout

log = logging.getLogger(__name__)
OPEN_FOR = 600.0  # seconds a mig command may stay not done before it is closed
# How far back the last command of each GPU is looked for: the longest interval allowed.
LOOK_BACK = 7 * 86_400

# (node name, GPU UUID, target layout) of a change to ask for.
Change = tuple[str, str, tuple[str, ...]]


def demand(snapshot: Snapshot, decided: Plan, dynamic: Mapping[str, int], now: float
           ) -> dict[str, list[MigDemand]]:
    """The MIG slices the jobs of each UP dynamic-MIG partition still wait for after the
    pass (pure); only partitions with some."""
    started = {s.job_id for s in decided.starts}
    reasons = {p.job_id: p.reason for p in decided.pending}
    pending: dict[str, list[PendingJob]] = {}
    up = {p.name for p in snapshot.partitions if p.up and p.name in dynamic}
    for job in snapshot.pending:
        if job.partition in up and job.job_id not in started:
            pending.setdefault(job.partition, []).append(
                _with_reason(job, reasons.get(job.job_id)))
    found = {name: waiting_demand(jobs, now) for name, jobs in pending.items()}
    return {name: wanted for name, wanted in found.items() if wanted}


def decide(snapshot: Snapshot, decided: Plan, dynamic: Mapping[str, int], now: float,
           changed_at: Mapping[str, float], open_targets: Mapping[str, tuple[str, ...]],
           wanted: Mapping[str, Sequence[MigDemand]] | None = None) -> list[Change]:
    """The changes to ask for after a pass (see the module; pure). ``dynamic``: the
    partitions with dynamic MIG and their intervals; ``changed_at``: each GPU's last
    change or command (epoch seconds); ``open_targets``: the target layouts of the GPUs
    with a command not yet done; ``wanted``: :func:`demand`'s answer, if known."""
    if wanted is None:
        wanted = demand(snapshot, decided, dynamic, now)
    if not wanted:
        return []
    running: dict[str, list[RunningJob]] = {}  # by node: each job on each of its nodes
    for job in [*snapshot.running,
                *(RunningJob(s.job_id, s.node, s.gpu_uuids, nodes=s.nodes, shares=s.shares)
                  for s in decided.starts)]:
        for name in {job.node, *job.nodes}:
            running.setdefault(name, []).append(job)
    nodes = {n.name: n for n in snapshot.nodes if n.state == NodeState.UP}
    asked: dict[str, tuple[str, ...]] = dict(open_targets)
    changes: list[Change] = []
    for part in sorted(snapshot.partitions, key=lambda p: p.name):
        if part.name not in wanted:
            continue
        interval = dynamic[part.name]
        node_of: dict[str, str] = {}
        gpus: list[MigGpu] = []
        for name in part.nodes:
            node = nodes.get(name)
            if node is None:
                continue
            for gpu in mig_gpus(node, running.get(name, ()), changed_at):
                node_of[gpu.uuid] = name
                if gpu.uuid in asked:  # its change is on its way: planned as done, fixed
                    gpu = gpu._replace(layout=asked[gpu.uuid], changed_at=now)
                gpus.append(gpu)
        if not any(may_change(gpu, now, interval) for gpu in gpus):
            continue  # nothing could change: most passes while jobs wait stop here
        for uuid, layout in sorted(plan_layouts(gpus, wanted[part.name], now,
                                                interval).items()):
            asked[uuid] = layout
            changes.append((node_of[uuid], uuid, layout))
    return changes


def _with_reason(job: PendingJob, reason: Any) -> PendingJob:
    if reason is None or reason == job.reason:
        return job
    return replace(job, reason=reason)


_CLOSE_OLD = text(
    "UPDATE node_commands SET done_at = :now"
    " WHERE kind = 'mig' AND done_at IS NULL AND created_at < :before RETURNING payload")
_OPEN = text(
    "SELECT id, payload FROM node_commands WHERE kind = 'mig' AND done_at IS NULL ORDER BY id")
_CLOSE = text("UPDATE node_commands SET done_at = :now WHERE id = :id")
_LAST_ASKED = text(
    "SELECT payload->>'gpu_uuid', extract(epoch FROM max(created_at)) FROM node_commands"
    " WHERE kind = 'mig' AND created_at > :since GROUP BY 1")
_CHANGED = text(
    "SELECT uuid, extract(epoch FROM mig_changed_at) FROM gpus"
    " WHERE mig_changed_at IS NOT NULL AND present AND parent_id IS NULL")
_ISSUE = text(
    "INSERT INTO node_commands (job_id, run, node_id, kind, payload, epoch) "
    "SELECT NULL, 0, t.node_id, :kind, t.payload,"
    " COALESCE(CAST(:epoch AS bigint), (SELECT epoch FROM leader WHERE id = 1)) FROM unnest("
    "CAST(:nodes AS integer[]), CAST(:payloads AS jsonb[])) WITH ORDINALITY"
    " AS t(node_id, payload, n) ORDER BY t.n")


def after_pass(session: Session, snapshot: Snapshot, decided: Plan,
               node_ids: Mapping[str, int], dynamic: Mapping[str, int], epoch: int | None,
               now: float) -> set[str]:
    """Make the ``mig`` commands the pass's outcome calls for (see the module); the names
    of the nodes given one, to wake."""
    wanted = demand(snapshot, decided, dynamic, now) if dynamic else {}
    if not wanted:  # most passes stop here, having read nothing
        return set()
    moment = datetime.fromtimestamp(now, UTC)
    for (payload,) in session.execute(_CLOSE_OLD, {
            "now": moment, "before": moment - timedelta(seconds=OPEN_FOR)}):
        log.warning("dynamic MIG: no answer to the change of %s within %.0f s: closed",
                    payload.get("gpu_uuid") if isinstance(payload, dict) else payload, OPEN_FOR)
    open_targets: dict[str, tuple[str, ...]] = {}
    for command_id, payload in session.execute(_OPEN):
        try:
            stored = MigLayout.parse(payload)
        except UsageError as exc:  # not one this module made: closed, never sent
            log.warning("dynamic MIG: closing command %d: %s", command_id, exc.message)
            session.execute(_CLOSE, {"now": moment, "id": command_id})
            continue
        open_targets[stored.gpu_uuid] = stored.layout
    changed_at: dict[str, float] = {
        uuid: float(at) for uuid, at in session.execute(_CHANGED)}
    for uuid, at in session.execute(_LAST_ASKED, {
            "since": moment - timedelta(seconds=LOOK_BACK)}):
        if uuid is not None:
            changed_at[uuid] = max(changed_at.get(uuid, 0.0), float(at))
    changes = decide(snapshot, decided, dynamic, now, changed_at, open_targets, wanted)
    issue(session, [(node_ids[node], MigLayout(uuid, layout)) for node, uuid, layout in changes],
          epoch)
    for node, uuid, layout in changes:
        log.info("dynamic MIG: asking %s to give GPU %s the layout %s", node, uuid,
                 " + ".join(layout))
    return {node for node, _, _ in changes}


def issue(session: Session, changes: Sequence[tuple[int, MigLayout]],
          epoch: int | None) -> int:
    """One ``mig`` command per (node id, layout), stamped with ``epoch`` (None: the
    epoch in force); how many."""
    if not changes:
        return 0
    session.execute(_ISSUE, {
        "kind": MIG_KIND, "epoch": epoch, "nodes": [node for node, _ in changes],
        "payloads": [json.dumps(layout.to_json()) for _, layout in changes]})
    return len(changes)


_SLICES = text(
    "SELECT p.uuid, array_remove(array_agg(s.uuid ORDER BY s.uuid), NULL) FROM gpus AS p"
    " LEFT JOIN gpus AS s ON s.parent_id = p.id AND s.present"
    " WHERE p.node_id = :node AND p.parent_id IS NULL AND p.present GROUP BY p.uuid")
_STAMP = text("UPDATE gpus SET mig_changed_at = :now WHERE uuid = ANY(:uuids)")


def note_layouts(session: Session, node_id: int, gpus: Iterable[Any],
                 now: datetime | None = None) -> list[str]:
    """Before a registration of node ``node_id`` stores ``gpus`` (its body's list): set
    ``mig_changed_at`` of each GPU known here whose present MIG slices are not the
    slices it reports now; those GPUs' UUIDs. Malformed entries are left to the
    registration's own checks."""
    reported: dict[str, set[str]] = {}
    parents: dict[int, str] = {}
    items = [g for g in gpus if isinstance(g, dict) and isinstance(g.get("uuid"), str)]
    for gpu in items:
        if gpu.get("parent") is None and isinstance(gpu.get("index"), int):
            parents[gpu["index"]] = gpu["uuid"]
            reported.setdefault(gpu["uuid"], set())
    for gpu in items:
        parent = gpu.get("parent")
        if isinstance(parent, int) and parent in parents:
            reported[parents[parent]].add(gpu["uuid"])
    stored = {uuid: set(slices) for uuid, slices in session.execute(_SLICES, {"node": node_id})}
    changed = sorted(uuid for uuid, slices in reported.items()
                     if uuid in stored and stored[uuid] != slices)
    if changed:
        session.execute(_STAMP, {"now": now or datetime.now(UTC), "uuids": changed})
        log.info("MIG layout of %s changed", ", ".join(changed))
    return changed
