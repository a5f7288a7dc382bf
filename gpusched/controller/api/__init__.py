"""The HTTP/JSON API (docs/api.md), one module per resource: request validation,
authorisation, and reads and writes through db/."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

import gpusched
from gpusched.auth.admins import AdminPolicy
from gpusched.controller.api.accounting import AccountingRoutes
from gpusched.controller.api.admin import AdminRoutes
from gpusched.controller.api.agent import AgentRoutes
from gpusched.controller.api.allocations import AllocationRoutes
from gpusched.controller.api.balance import BalanceRoutes
from gpusched.controller.api.common import ApiContext, CheckedRouter, Routes
from gpusched.controller.api.jobcontrol import JobControlRoutes, task_path_resolver
from gpusched.controller.api.jobs import JobRoutes
from gpusched.controller.api.nodes import NodeRoutes
from gpusched.controller.api.reservations import ReservationRoutes
from gpusched.controller.api.steps import StepRoutes
from gpusched.controller.diag import DiagRoutes
from gpusched.controller.events import Events
from gpusched.controller.http import Request, Router
from gpusched.controller.metrics import ControllerMetrics
from gpusched.controller.openapi import OpenApi
from gpusched.controller.retention import ArchiveShelf
from gpusched.core.model import Policy


class Api:
    """Binds the routes to a session factory and the wake-up hub."""

    def __init__(self, sessions: sessionmaker[Session], events: Events,
                 is_leader: Callable[[], bool],
                 pass_stats: Callable[[], dict[str, Any]] = dict,
                 policy: Policy | None = None, idle: tuple[float, float] = (1.0, 3600.0),
                 max_submit_jobs: int | None = None, admin_group: str | None = None,
                 allocation_grace: float = 60.0,
                 metrics: ControllerMetrics | None = None,
                 archives: ArchiveShelf | None = None) -> None:
        self.context = ApiContext(
            sessions=sessions, events=events, is_leader=is_leader, pass_stats=pass_stats,
            policy=policy or Policy(), idle_percent=idle[0], idle_after=idle[1],
            max_submit_jobs=max_submit_jobs, own_uid=os.geteuid(),
            admins=AdminPolicy(admin_group))
        self.resources: tuple[Routes, ...] = (JobRoutes(self.context), NodeRoutes(self.context),
                          JobControlRoutes(self.context),
                          AccountingRoutes(self.context, archives), AdminRoutes(self.context),
                          AgentRoutes(self.context), StepRoutes(self.context),
                          AllocationRoutes(self.context, allocation_grace),
                          BalanceRoutes(self.context), ReservationRoutes(self.context),
                          DiagRoutes(metrics or ControllerMetrics(sessions, None, is_leader)))

    def router(self) -> Router:
        """All routes of docs/api.md."""
        r = CheckedRouter(task_path_resolver(self.context))
        r.add("GET", "/v1/ping", self.ping)
        r.add("GET", "/v1/openapi.json", OpenApi(r).serve)
        for resource in self.resources:
            resource.add_to(r)
        return r

    def ping(self, request: Request) -> tuple[int, dict[str, Any]]:
        """Liveness, leadership and (on the leader) the last pass's statistics."""
        return 200, {"ok": True, "version": gpusched.__version__,
                     "leader": self.context.is_leader(), "scheduler": self.context.pass_stats()}
