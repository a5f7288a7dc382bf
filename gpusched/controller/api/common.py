"""What every resource's routes share: the controller's parts they act through, who
the caller is and may be, and the parsing of path and query values."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from gpusched.controller.events import Events
from gpusched.controller.http import Answer, Request, Router
from gpusched.core.bounds import BoundError, parse_id_list, parse_job_id
from gpusched.core.model import Policy
from gpusched.db.jobs import Identity
from gpusched.errors import NotFound, PermissionDenied, UsageError


@dataclass(frozen=True)
class ApiContext:
    """The session factory, the wake-up hub and the settings the routes read."""

    sessions: sessionmaker[Session]
    events: Events
    is_leader: Callable[[], bool]
    pass_stats: Callable[[], dict[str, Any]]
    policy: Policy
    idle_percent: float  # see ControllerConfig
    idle_after: float
    max_submit_jobs: int | None  # per user, but for admins; None: no limit
    own_uid: int

    def require_trusted(self, request: Request, who: str) -> None:
        """Admins and agents alike are root or the controller's own user."""
        if request.caller.uid not in (0, self.own_uid):
            raise PermissionDenied(f"only {who} (root or the controller's user) may do this")

    def require_admin(self, request: Request) -> None:
        """Refuse anyone but an administrator."""
        self.require_trusted(request, "an administrator")

    def require_agent(self, request: Request) -> None:
        """Refuse anyone but a node's agent."""
        self.require_trusted(request, "an agent")


class Routes(Protocol):
    """One resource's handlers."""

    def add_to(self, r: Router) -> None:
        """Register the resource's routes on ``r``."""


class CheckedRouter(Router):
    """Refuses a path or query value with a NUL before any handler sees it: no text the
    database stores or compares may hold one."""

    def dispatch(self, request: Request) -> Answer:
        for key, value in (*request.query.items(), ("path", request.path)):
            if "\0" in key or "\0" in value:
                raise UsageError(f"{key[:40]!r}: contains a NUL character")
        return super().dispatch(request)


def caller_identity(request: Request) -> Identity:
    """The caller as the kernel reported it."""
    return Identity(request.caller.uid, request.caller.gid)


def id_set(text: str, field: str = "ids") -> set[int]:
    """A query's list of job ids (``1,5-7``); a bad one is a usage error naming ``field``."""
    try:
        return set(parse_id_list(field, text))
    except BoundError as exc:
        raise UsageError(str(exc)) from None


def word_list(text: str | None) -> list[str] | None:
    """A query's comma-separated words; None when there are none."""
    return [w for w in text.split(",") if w] if text else None


def epoch_param(query: dict[str, str], key: str) -> datetime | None:
    """A query's time in epoch seconds; None when absent."""
    if not query.get(key):
        return None
    try:
        return datetime.fromtimestamp(float(query[key]), UTC)
    except (ValueError, OverflowError, OSError):
        raise UsageError(f"{key}: expected epoch seconds, got {query[key]!r}") from None


def path_job_id(request: Request) -> int:
    """The job id of the path; one that no job can have is not found."""
    job_id = parse_job_id(request.params["job_id"])
    if job_id is None:
        shown = request.params["job_id"][:40]
        raise NotFound(f"invalid job id specified: {shown!r}")
    return job_id
