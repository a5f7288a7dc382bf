"""What jobs used and what it does to priority: ``/v1/accounting`` (gacct), the
fair-share tree (``/v1/share``) and pending jobs' priority factors (``/v1/priority``)."""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from gpusched.controller.api.common import ApiContext, epoch_param, id_set, word_list
from gpusched.controller.http import Request, Router
from gpusched.controller.retention import (
    ArchiveQuery,
    ArchiveShelf,
    with_archived,
    with_archived_usage,
)
from gpusched.core.bounds import MAX_LIST
from gpusched.core.fairshare import FairShareTree
from gpusched.core.jobcontrol import JobRef, JobRefError, parse_job_refs, ref_matches
from gpusched.core.plan import job_priorities
from gpusched.db import accounting, budgets, retention
from gpusched.db.schedule import load_snapshot
from gpusched.errors import UsageError


def job_refs(text: str) -> list[JobRef]:
    """``?ids=``: job ids and array task ids (``12_3``); a bad one is a usage error."""
    try:
        return parse_job_refs([text], MAX_LIST)
    except JobRefError as exc:
        raise UsageError(f"ids: {exc}") from None


class AccountingRoutes:
    """Anyone may read the records, the shares and the priorities."""

    def __init__(self, context: ApiContext, archives: ArchiveShelf | None = None) -> None:
        self.context = context
        self.archives = archives  # purged jobs' archives (controller/retention.py)

    def add_to(self, r: Router) -> None:
        """Register the accounting, share and priority routes."""
        r.add("GET", "/v1/accounting", self.accounting)
        r.add("GET", "/v1/accounting/report", self.accounting_report)
        r.add("GET", "/v1/priority", self.priority)
        r.add("GET", "/v1/share", self.share)

    def accounting(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Finished and running jobs with what they used, and the purged ones of the
        archives that may hold any asked for: the caller's own, for all but an
        administrator (docs/api.md)."""
        q = request.query
        refs = job_refs(q["ids"]) if q.get("ids") else None
        asked = ArchiveQuery(word_list(q.get("user")), word_list(q.get("account")),
                             [s.upper() for s in word_list(q.get("state")) or []] or None,
                             sorted({r.job_id for r in refs}) if refs else None,
                             epoch_param(q, "start"), epoch_param(q, "end"))
        with self.context.sessions() as session:
            records = accounting.job_records(session, asked.users, asked.accounts, asked.states,
                                             asked.ids, asked.start, asked.end)
        if self.archives is None:
            answer: dict[str, Any] = {"jobs": records}
        else:
            viewer = None if self.context.is_admin(request.caller) else request.caller.uid
            answer = with_archived(self.archives, records, replace(asked, uid=viewer))
        if refs and any(r.task is not None for r in refs):  # 12_3: that task alone
            answer["jobs"] = [r for r in answer["jobs"] if ref_matches(
                refs, r["job_id"], r.get("array_job_id"), r.get("array_task_id"))]
        return 200, answer

    def accounting_report(self, request: Request) -> tuple[int, dict[str, Any]]:
        """GPU-hours per account and user within a window (``start``, ``end``: epoch s),
        and each GPU-hour budget's use in its periods that overlap the window."""
        start, end = epoch_param(request.query, "start"), epoch_param(request.query, "end")
        if start is None or end is None or end <= start:
            raise UsageError("start, end: expected a window, start before end (epoch seconds)")
        with self.context.sessions() as session:
            return 200, {"start": start.isoformat(), "end": end.isoformat(),
                         "rows": self.usage_with_archives(request, session, start, end),
                         "budgets": budgets.report(session, start, end, datetime.now(UTC))}

    def usage_with_archives(self, request: Request, session: Session, start: datetime,
                            end: datetime) -> list[dict[str, Any]]:
        """The report's rows, the archived jobs' GPU time added (only the caller's own
        jobs', but for an administrator); an archive it cannot read is logged."""
        rows = accounting.usage_report(session, start, end)
        if self.archives is None:
            return rows
        viewer = None if self.context.is_admin(request.caller) else request.caller.uid
        return with_archived_usage(self.archives, rows, ArchiveQuery(start=start, end=end,
                                                                     uid=viewer),
                                   lambda ids: retention.present(session, ids))[0]

    def priority(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Pending jobs' priority factors, highest first (``?ids=`` to choose jobs)."""
        policy = self.context.policy
        wanted = id_set(request.query.get("ids", ""))
        with self.context.sessions() as session:
            snapshot, _ = load_snapshot(session, policy.preempt_grace)
        owners = {j.job_id: (j.user, j.account) for j in snapshot.pending}
        rows = [
            {"job_id": b.job_id, "user": owners[b.job_id][0], "account": owners[b.job_id][1],
             "priority": b.total, "age": b.age, "fairshare": b.fairshare,
             "job_size": b.job_size, "partition": b.partition, "qos": b.qos}
            for b in job_priorities(snapshot, time.time(), policy)
            if not wanted or b.job_id in wanted
        ]
        return 200, {"jobs": rows, "weights": asdict(policy.weights)}

    def share(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The fair-share tree with shares, usage and factors, depth first."""
        policy = self.context.policy
        with self.context.sessions() as session:
            snapshot, _ = load_snapshot(session, policy.preempt_grace)
        tree = FairShareTree(snapshot.accounts, snapshot.user_shares)
        rows = tree.report(snapshot.usage, policy.fairshare)
        return 200, {"method": policy.fairshare, "rows": [asdict(r) for r in rows]}
