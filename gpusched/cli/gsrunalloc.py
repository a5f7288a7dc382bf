"""gsrun outside a job: get an allocation shaped by gsrun's options (as srun does), run
the step on it, then end it with the step's status. While it waits for resources it
says so (``gsrun: job N queued and waiting for resources``); Ctrl-C then cancels it."""

from __future__ import annotations

import os

from gpusched.cli.allocation import Allocation, Interrupted, Revoked, allocation_body
from gpusched.cli.gsrunargs import GsrunArgs
from gpusched.cli.output import print_error
from gpusched.cli.shell import job_dir
from gpusched.core import bounds

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

PROG = "gsrun"
# gsrun's own options that the allocation's shape reads too.
STEP_SHAPE = ("nodes", "ntasks", "ntasks_per_node", "cpus_per_task")


def allocation_options(args: GsrunArgs) -> dict[str, object]:
    """The allocation's options from gsrun's: its own, and the step's shape."""
    options: dict[str, object] = dict(args.allocation)
    for key in STEP_SHAPE:
        options[key] = getattr(args, key)
    if args.gpus_per_task is not None:
        options["gpus_per_task"] = str(args.gpus_per_task)
    return options


def refuse_allocation_options(args: GsrunArgs) -> str | None:
    """Inside a job the allocation exists: the error line for options that only shape
    a new one, or None."""
    if not args.allocation:
        return None
    named = ", ".join("--" + key.replace("_", "-") for key in sorted(args.allocation))
    return (f"{named}: only for the allocation gsrun gets outside a job; this step runs "
            "in its job's")


def run_in_new_allocation(args: GsrunArgs, env: Mapping[str, str],
                          run_step: Callable[[GsrunArgs, int, Mapping[str, str]], int]) -> int:
    """Get an allocation for ``args``, run the step on it with ``run_step``, end the
    allocation with the step's status; that status."""
    name = args.name or os.path.basename(args.command[0])[:bounds.MAX_NAME] or "gsrun"
    submit_dir = job_dir(None)
    body = allocation_body(allocation_options(args), name, job_dir(args.chdir), {})
    allocation = Allocation(PROG, bool(args.verbose))
    try:
        allocation.obtain(body, announce_pending=False)
    except Interrupted:
        return 1
    except Revoked as err:
        print_error(PROG, err.message)
        return 1
    allocation.keep_alive()
    status = 1
    try:
        status = run_step(args, int(str(allocation.job_id)),
                          {**env, **allocation.variables(submit_dir)})
    finally:
        allocation.finish(status)
    return status
