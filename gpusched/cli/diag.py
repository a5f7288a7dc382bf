"""``gpusched diag``: the controller's own figures, like Slurm's sdiag (``GET /v1/diag``;
docs/operations.md)."""

from __future__ import annotations

from typing import Any

import typer

from gpusched.core.terminal import terminal_safe
from gpusched.core.timefmt import format_duration


def diag(as_json: bool = False) -> None:
    """Ask the controller for its figures and print them (JSON with ``as_json``)."""
    from gpusched.client import ApiClient

    with ApiClient() as client:
        answer = client.request("GET", "/v1/diag")
    if as_json:
        import json

        typer.echo(json.dumps(answer, indent=2))
        return
    print_diag(answer)


def print_diag(answer: dict[str, Any]) -> None:
    """The answer of ``GET /v1/diag`` as sdiag lays it out."""
    from gpusched.cli.output import print_table

    ctl, sched, pool = answer["controller"], answer["scheduler"], answer["database"]["pool"]
    echo = _echo
    echo(f"gpusched diag at {ctl['now']}")
    echo(f"Controller {ctl['version']}, {'leader' if ctl['leader'] else 'standby'}, up "
         f"{format_duration(ctl['uptime_s'])} (since {ctl['started_at']})")
    echo("")
    echo("Scheduling passes (this controller's):")
    echo(f"  Passes:              {sched['passes']}")
    echo(f"  Last pass:           {sched['last_ms']:.1f} ms at {sched['last_pass_at'] or '-'}")
    echo(f"  Max / mean:          {sched['max_ms']:.1f} ms / {sched['mean_ms']:.1f} ms")
    depth = sched["depth"]
    echo(f"  Depth last/max/mean: {depth['last']} / {depth['max']} / {depth['mean']:.1f} jobs")
    echo(f"  Stopped early:       {sched['stopped_early']} (time budget reached)")
    starts = sched["starts"]
    echo(f"  Starts:              {starts['immediate']} immediate, "
         f"{starts['backfilled']} backfilled")
    echo("")
    echo("API requests (since the controller started):")
    print_table(["METHOD", "ROUTE", "COUNT", "ERRORS", "MEAN_MS", "MAX_MS"],
                [[r["method"], r["route"], str(r["count"]), str(r["errors"]),
                  f"{r['mean_ms']:.2f}", f"{r['max_ms']:.2f}"] for r in answer["api"]],
                right_aligned=frozenset({2, 3, 4, 5}), shrinkable=frozenset({1}))
    echo("")
    agents = answer["agents"]
    if agents is None:
        echo("Agents: the database could not be read")
    else:
        echo("Agents (seconds since each was last heard):")
        print_table(["NODE", "STATE", "HEARTBEAT_AGE_S"],
                    [[a["node"], a["state"], "-" if a["heartbeat_age_s"] is None
                      else f"{a['heartbeat_age_s']:.1f}"] for a in agents],
                    right_aligned=frozenset({2}), shrinkable=frozenset({0}))
    echo("")
    echo(f"Database pool: {pool['checked_out']} in use, {pool['idle']} idle, "
         f"{pool['overflow']} beyond its size of {pool['size']}")


def _echo(line: str) -> None:
    typer.echo(terminal_safe(line))
