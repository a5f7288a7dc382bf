"""gcontrol: change queued jobs and return GPUs to service, like scontrol."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer

from gpusched.cli.common import new_app, run_cli
from gpusched.cli.gcancel import parse_job_ids, post_for_each

PROG = "gcontrol"

app = new_app("Change queued gpusched jobs, like scontrol.")
JobIds = Annotated[list[str], typer.Argument(metavar="JOB...", show_default=False,
                                             help="Ids of pending jobs.")]


@app.command()
def hold(job_ids: JobIds) -> int:
    """Keep pending jobs from starting (an administrator's hold needs an administrator to release)."""
    return post_for_each(PROG, [(i, None) for i in parse_job_ids(job_ids)], "hold")


@app.command()
def release(job_ids: JobIds) -> int:
    """Let held jobs start again."""
    return post_for_each(PROG, [(i, None) for i in parse_job_ids(job_ids)], "release")


resume_app = new_app("Return a drained or failed GPU to service.")
app.add_typer(resume_app, name="resume")


@resume_app.command("gpu")
def resume_gpu(target: Annotated[str, typer.Argument(
        metavar="NODE:INDEX", help="The GPU (or MIG slice), by node and index as gpusched "
        "agent inventory shows it.")]) -> None:
    """Return a GPU taken out of service by the health checks (administrators only).

    Example: gcontrol resume gpu node01:3
    """
    from gpusched.cli.client import ApiClient
    from gpusched.errors import UsageError

    node, sep, index = target.rpartition(":")
    if not sep or not node or not index.isdigit():
        raise UsageError(f"invalid GPU {target!r}: expected NODE:INDEX, such as node01:3")
    with ApiClient() as client:
        answer = client.request("POST", "/v1/gpus/resume", {"node": node, "index": int(index)})
    typer.echo(f"GPU {node}:{index} ({answer['uuid']}) is back in service")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gcontrol`` console script."""
    return run_cli(app, PROG, argv)
