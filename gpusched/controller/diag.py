"""``GET /v1/diag`` (``gpusched diag``, like Slurm's sdiag): what this controller's
passes and API did since it started, its agents' heartbeats and its database pool.

Anyone may read it, as any user may run sdiag: it names routes, nodes and counts,
never a job, a user or an account (docs/operations.md has the shape)."""

from __future__ import annotations

from typing import Any

from gpusched.controller.http import Request, Router
from gpusched.controller.metrics import ControllerMetrics


class DiagRoutes:
    """The controller's own figures."""

    def __init__(self, metrics: ControllerMetrics) -> None:
        self.metrics = metrics

    def add_to(self, r: Router) -> None:
        """Register ``GET /v1/diag``."""
        r.add("GET", "/v1/diag", self.diag)

    def diag(self, request: Request) -> tuple[int, dict[str, Any]]:
        """This controller's passes, API requests, agents' heartbeats and database pool."""
        return 200, self.metrics.diag()
