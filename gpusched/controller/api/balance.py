"""GPU-hour budgets: ``/v1/balance`` (``gpusched balance``): each budget's usage in its
period, what running jobs may still use, and what is left."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpusched.configfile import NAME
from gpusched.controller.api.common import ApiContext
from gpusched.controller.http import Request, Router
from gpusched.db import budgets
from gpusched.db.schedule import load_snapshot
from gpusched.errors import PermissionDenied, UsageError


class BalanceRoutes:
    """A user sees the budgets that cover their own jobs (those of their accounts); an
    administrator every budget, or those of one account."""

    def __init__(self, context: ApiContext) -> None:
        self.context = context

    def add_to(self, r: Router) -> None:
        """Register the balance route."""
        r.add("GET", "/v1/balance", self.balance)

    def balance(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The budgets the caller may see (``?account=NAME``: those covering that
        account's jobs), with used, running and left GPU-hours."""
        account = request.query.get("account") or None
        if account is not None and not NAME.match(account):
            raise UsageError("account: expected an account name (letters, digits, '_', '.', "
                             f"'-'), got {account[:40]!r}")
        who = self.context.identity(request)
        with self.context.sessions() as session:
            snapshot, _ = load_snapshot(session, self.context.policy.preempt_grace)
        user = None if who.is_admin else who.user
        if user is not None and account is not None and not any(
                a.user == user and a.account == account for a in snapshot.user_shares):
            raise PermissionDenied(f"user {user} is not in account {account}: only an "
                                   "administrator may see its budgets")
        if account is not None and user is None and account not in {
                a.name for a in snapshot.accounts}:
            raise UsageError(f"account: no account named {account!r}")
        rows = budgets.balance(snapshot, user, account)
        as_of = max((b.as_of for b in snapshot.budgets), default=None)
        return 200, {"user": user, "account": account, "budgets": rows,
                     "as_of": None if as_of is None
                     else datetime.fromtimestamp(as_of, UTC).isoformat()}
