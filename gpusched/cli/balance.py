"""``gpusched balance``: GPU-hour budgets, what they used in their period, what running
jobs may still use, and what is left (like sshare's GrpTRESMins/GrpTRESRaw columns)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import typer

from gpusched.cli.output import print_table
from gpusched.core.terminal import terminal_safe

COLUMNS = ("ACCOUNT", "USER", "PERIOD", "SINCE", "BUDGET", "USED", "RUNNING", "LEFT")


def _hours(value: float) -> str:
    return f"{value:.2f}"


def balance(account: str | None, as_json: bool) -> None:
    """Ask the controller for the budgets the caller may see and print them."""
    from gpusched.client import ApiClient

    query = f"?{urlencode({'account': account})}" if account is not None else ""
    with ApiClient() as client:
        answer = client.request("GET", f"/v1/balance{query}")
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
        return
    rows: list[dict[str, Any]] = answer["budgets"]
    if not rows:
        whom = (f"account {account}" if account is not None
                else "your jobs" if answer.get("user") else "any account")
        typer.echo(terminal_safe(f"No GPU-hour budget covers {whom}."))
        return
    print_table(COLUMNS, [
        [r["account"], r["user"] or "-", r["period"], (r["period_start"] or "-")[:10],
         _hours(r["budget_gpu_hours"]), _hours(r["used_gpu_hours"]),
         _hours(r["running_gpu_hours"]), _hours(r["left_gpu_hours"])] for r in rows],
        right_aligned=frozenset({4, 5, 6, 7}), shrinkable=frozenset({0, 1}))
