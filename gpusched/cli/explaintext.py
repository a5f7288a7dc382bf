"""``gqueue --explain JOB``: the answer of ``GET /v1/jobs/{id}/explain`` in sentences."""

from __future__ import annotations

from gpusched.cli.listing import job_label
from gpusched.core.terminal import terminal_safe

TYPE_CHECKING = False  # as gpusched.cli.listing: typing's own import costs gqueue
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def explain_lines(answer: Mapping[str, Any]) -> list[str]:
    """``gqueue --explain``: the answer of ``GET /v1/jobs/{id}/explain`` in sentences,
    escaped (names, reasons and details come from what users stored)."""
    return [terminal_safe(line) for line in _explain_lines(answer)]


def _explain_lines(answer: Mapping[str, Any]) -> list[str]:
    job = answer.get("job") or {}
    label = job_label(job, width=10**6)
    head = f"Job {label} ({job.get('name')}, user {job.get('user')}, partition {job.get('partition')})"
    state = job.get("state")
    if state != "PENDING":
        where = f" on {job['node']}" if state == "RUNNING" and job.get("node") else ""
        return [f"{head} is {state}{where}: nothing holds it back."]
    lines = [f"{head} is pending, reason {answer.get('reason')}.",
             f"Priority {answer.get('priority', 0):.4g}, {_ordinal(int(answer.get('position', 0)))} "
             f"of {answer.get('queue_length')} pending jobs."]
    starts = answer.get("would_start") or []
    if starts:
        tasks = [s["array_task_id"] for s in starts if s.get("array_task_id") is not None]
        what = f"{len(tasks)} of its tasks" if tasks else "It"
        nodes = ", ".join(sorted({str(s["node"]) for s in starts}))
        lines.append(f"{what} would start at the next pass, on {nodes}.")
    blockers = answer.get("blockers") or []
    if blockers:
        lines.append("What holds it back, most fundamental first:")
        lines.extend(f"  {i}. {b['reason']}: {b['detail']}" for i, b in enumerate(blockers, 1))
    return lines
