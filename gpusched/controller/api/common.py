"""What every resource's routes share: the controller's parts they act through, who
the caller is and may be, and the parsing of path and query values."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from gpusched.auth.admins import AdminPolicy
from gpusched.controller.events import Events
from gpusched.controller.http import Answer, Caller, Request, Router
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
    admins: AdminPolicy = field(default_factory=lambda: AdminPolicy(None))

    def is_admin(self, caller: Caller) -> bool:
        """Root, the controller's own user, or a member of ``[controller] admin_group``
        (by the uid the kernel or the credential proved)."""
        return caller.uid == self.own_uid or self.admins.is_admin(caller.uid, caller.gid)

    def identity(self, request: Request) -> Identity:
        """The caller as the kernel or the credential proved it, and whether an admin."""
        caller = request.caller
        return Identity(caller.uid, caller.gid, name=self.admins.user_name(caller.uid),
                        admin=self.is_admin(caller))

    def require_admin(self, request: Request) -> None:
        """Refuse anyone but an administrator."""
        if not self.is_admin(request.caller):
            group = self.admins.admin_group
            raise PermissionDenied("only an administrator (root, the controller's user"
                                   + (f" or a member of group {group}" if group else "")
                                   + ") may do this")

    def require_agent(self, request: Request) -> None:
        """Refuse anyone but a node's agent (root or the controller's own user), on the
        local socket; over TCP only a node credential names an agent: see require_node."""
        caller = request.caller
        if caller.remote or caller.uid not in (0, self.own_uid):
            raise PermissionDenied("only an agent (root or the controller's user) may do this")

    def require_node(self, request: Request, node: object) -> str:
        """Refuse anyone but the agent of ``node`` (the node a request acts for); returns
        the node name. On the local socket an agent is root or the controller's user; over
        TCP it is root with a credential made for that very node."""
        if not isinstance(node, str) or not node:
            raise UsageError("node: expected the node name")
        caller = request.caller
        if not caller.remote:
            self.require_agent(request)
        elif caller.node is None:
            raise PermissionDenied(f"only the agent of node {node[:64]} may do this: the "
                                   f"credential is a user's (uid {caller.uid}), not a node's")
        elif caller.node != node:
            raise PermissionDenied(f"credential is for node {caller.node}, not {node[:64]}")
        elif caller.uid != 0:
            raise PermissionDenied(f"a node credential must be root's, not uid {caller.uid}'s")
        return node


class Routes(Protocol):
    """One resource's handlers."""

    def add_to(self, r: Router) -> None:
        """Register the resource's routes on ``r``."""


class CheckedRouter(Router):
    """Refuses a path or query value with a NUL before any handler sees it: no text the
    database stores or compares may hold one. ``rewrite`` (array task ids in job paths:
    gpusched.controller.api.jobcontrol) may change the path before routing."""

    def __init__(self, rewrite: Callable[[Request], None] | None = None) -> None:
        super().__init__()
        self.rewrite = rewrite

    def dispatch(self, request: Request) -> Answer:
        for key, value in (*request.query.items(), ("path", request.path)):
            if "\0" in key or "\0" in value:
                raise UsageError(f"{key[:40]!r}: contains a NUL character")
        if self.rewrite is not None:
            self.rewrite(request)
        return super().dispatch(request)


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
