"""``gcontrol update job`` (scontrol update): a pending job's partition, QOS, time
limit, node and GPU counts, dependency, name, nice, priority, node features (-C) and
advance reservation; a running job's time limit and name.

Slurm's rules: a job's owner may change these of a pending job (a partition or QOS
they could submit to), lower its time limit (of a running job too), rename it and give
it a positive nice; only an administrator may raise a time limit, give a negative nice
or fix a priority. Every new value is checked
as a submission's is; a change that fails a check stores nothing.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gpusched.core.dependency import format_dependency
from gpusched.core.timefmt import format_duration
from gpusched.db import steps
from gpusched.db.associations import QosRow, choose_qos, qos_access, qos_row
from gpusched.db.engine import rowcount
from gpusched.db.features import check_constraint_nodes
from gpusched.db.jobs import Identity, _owned_job
from gpusched.db.models import Job
from gpusched.db.reservations import check_reservation
from gpusched.db.submit import (
    _check_fits,
    _check_max_wall,
    _check_partition,
    _check_share,
    _validate_time,
)
from gpusched.db.submit_facts import PartitionFacts, PartitionRow, read_partition
from gpusched.errors import Conflict, PermissionDenied, UsageError
from gpusched.messages import JobUpdate, jobparts

RUNNING_CHANGES = frozenset({"time_limit", "name"})  # what a running job may change
SHAPE = frozenset({"nodes", "gpus_per_node"})


def update_job(session: Session, job_id: int, who: Identity,
               body: dict[str, Any]) -> tuple[Job, set[str]]:
    """Change a job as ``body`` (a JobUpdate) asks; the job and, for a running job's
    new time limit, the nodes whose agents apply it."""
    change = JobUpdate.parse(body)
    given = change.changes
    job = _owned_job(session, job_id, who, "update")
    if job.state not in ("PENDING", "RUNNING"):
        raise Conflict(f"job {job_id} is {job.state}: only pending and running jobs can be "
                       "updated")
    if job.state == "RUNNING" and not given <= RUNNING_CHANGES:
        raise Conflict(f"job {job_id} is RUNNING: only its time limit and name can change")
    if "priority" in given and not who.is_admin:
        raise PermissionDenied("only an administrator may set a job's priority")
    if change.nice is not None and change.nice < 0 and not who.is_admin:
        raise PermissionDenied(f"nice: only an administrator may give a negative nice "
                               f"({change.nice}), which raises a job's priority")
    if "name" in given and change.name is None:
        raise UsageError("name: expected a job name")
    moved = "partition" in given
    facts = read_partition(session, change.partition if moved else job.partition,
                           members=moved or bool(given & (SHAPE | {"constraint"})))
    part = _check_partition(facts.partition, change.partition) if moved else facts.partition
    if part is None:
        raise Conflict(f"job {job_id}'s partition {job.partition} no longer exists")
    if moved and not who.is_admin:
        _check_account(part, job.account)
    limit = _new_limit(job, change, part, who)
    nodes, per_node = _new_shape(job, change, part, facts)
    qos = _new_qos(session, job, change, who)
    _check_max_wall(qos, limit)
    values: dict[str, Any] = {"time_limit": limit}
    if "name" in given:
        values["name"] = change.name
    if job.state == "PENDING":
        values.update(partition=part.name, qos=None if qos is None else qos.name,
                      nodes=nodes, gpus=per_node * nodes)
        if "priority" in given:
            values["admin_priority"] = change.priority
        if "nice" in given:
            values["nice"] = change.nice or None
        if "dependency" in given:
            values["dependency"] = _new_dependency(session, job, change)
        if "constraint" in given:
            values["constraints"] = _new_constraint(session, job, change, part, facts, nodes)
        if "reservation" in given:  # one its user and account may use, as at submit
            check_reservation(session, change.reservation, job.user_name, job.account,
                              (part.name, part.nodes))
            values["reservation"] = change.reservation
    changed = rowcount(session.execute(update(Job).where(
        Job.id == job_id, Job.state == job.state, Job.restarts == job.restarts).values(**values)))
    if not changed:
        raise Conflict(f"job {job_id} changed state while it was being updated")
    session.refresh(job)
    if job.state != "RUNNING" or "time_limit" not in given:
        return job, set()
    return job, _tell_limit(session, job)


def _new_constraint(session: Session, job: Job, change: JobUpdate, part: PartitionRow,
                    facts: PartitionFacts, nodes: int) -> str | None:
    """The -C the job gets (scontrol's Features=; empty: none), refused as a submission's
    is when no ``nodes`` nodes of its partition could satisfy it."""
    if change.constraint is None:
        return None
    jobparts.constraint({"constraint": change.constraint}, nodes, jobparts.whole_or_shared(
        job.exclusive, job.share_mode, job.gpu_mem_mb))
    check_constraint_nodes(session, part.name, facts.members, job.nodelist or (),
                           job.exclude_nodes or (), change.constraint, nodes)
    return change.constraint


def _check_account(part: PartitionRow, account: str | None) -> None:
    """A user's job may move only to a partition that allows its account."""
    allowed = part.allow_accounts
    if account is not None and ((allowed is not None and account not in allowed)
                                or account in part.deny_accounts):
        raise UsageError(f"partition {part.name} does not allow account {account}")
    if account is None and allowed is not None:
        raise UsageError(f"partition {part.name} allows only accounts {', '.join(allowed)}")


def _new_limit(job: Job, change: JobUpdate, part: PartitionRow, who: Identity) -> int | None:
    """The time limit the job gets: its owner may only lower it."""
    if "time_limit" not in change.changes:
        limit = job.time_limit
    else:
        limit = _validate_time(part, change.time_limit)
        if not who.is_admin and job.time_limit is not None and (
                limit is None or limit > job.time_limit):
            raise PermissionDenied(f"only an administrator may raise a time limit (now "
                                   f"{format_duration(job.time_limit)})")
    if part.max_time is not None and (limit is None or limit > part.max_time):
        raise UsageError(f"time limit {format_duration(limit)} exceeds the MaxTime "
                         f"{format_duration(part.max_time)} of partition {part.name}")
    return limit


def _new_shape(job: Job, change: JobUpdate, part: PartitionRow,
               facts: PartitionFacts) -> tuple[int, int]:
    """(nodes, GPUs per node) the job gets, checked against its partition."""
    given = change.changes
    nodes = change.nodes if change.nodes is not None else job.nodes
    per_node = (change.gpus_per_node if change.gpus_per_node is not None
                else job.gpus // max(1, job.nodes))
    if given & SHAPE:
        if job.share_mode is not None:
            raise UsageError(f"job {job.id} asks for a share of one GPU "
                             f"({job.share_mode}): its nodes and GPUs cannot change")
        if job.nodelist and nodes != len(job.nodelist):
            raise UsageError(f"nodes: the job names {len(job.nodelist)} node(s) in its "
                             f"nodelist, so it runs on {len(job.nodelist)}, not {nodes}")
        if job.gpu_types and per_node == 0:
            raise UsageError("gpus_per_node: a job of a GPU type needs at least one GPU")
    gpus = per_node * nodes
    if gpus > 65_536:
        raise UsageError(f"gpus: {gpus} GPUs in all, more than the 65536 allowed")
    if part.max_gpus_per_job is not None and gpus > part.max_gpus_per_job and (
            given & SHAPE or "partition" in given):
        raise UsageError(f"requested {gpus} GPUs, more than the {part.max_gpus_per_job} "
                         f"GPUs per job of partition {part.name}")
    if "partition" in given or given & SHAPE:
        _check_share(part, job.share_mode, job.share_units)
        _check_fits(part, facts.members, per_node, tuple(job.gpu_types), nodes, job.cpus,
                    job.mem_mb, job.nodelist, job.exclude_nodes, job.gpu_mem_mb)
    return nodes, per_node


def _new_qos(session: Session, job: Job, change: JobUpdate, who: Identity) -> QosRow | None:
    """The QOS the job gets: one its association may use (any, for an administrator)."""
    if "qos" in change.changes:
        return choose_qos(change.qos, qos_access(session, job.user_name, job.account,
                                                 who.is_admin),
                          lambda name: qos_row(session, name))
    return qos_row(session, job.qos) if job.qos is not None else None


def _new_dependency(session: Session, job: Job, change: JobUpdate) -> str | None:
    """The dependency as stored (None: none), every job it names existing."""
    if not change.dependency:
        return None
    named = {j for clause in change.dependency for j in clause.job_ids}
    if job.id in named or (job.array_job_id is not None and job.array_job_id in named):
        raise UsageError(f"invalid dependency: job {job.id} cannot depend on itself")
    known = set(session.scalars(select(Job.id).where(Job.id.in_(sorted(named)))))
    missing = sorted(named - known)
    if missing:
        raise UsageError(f"invalid dependency: job {missing[0]} does not exist")
    return format_dependency(change.dependency)


def _tell_limit(session: Session, job: Job) -> set[str]:
    """The running job's agents get its new limit (the time it was suspended added: a
    ``limit`` command to its batch node and its running steps' nodes); none while it is
    suspended (resume tells them)."""
    if job.suspended_at is not None:
        return set()
    return steps.tell_new_limit(session, job)
