"""What a submission's scheduling flags (sbatch's --nice, --priority, --open-mode,
--time-min and --deadline; gpusched.messages.schedflags) need beyond their bounds: who
may set them, and how they sit with the job's time limit once its partition gave it one.
Returns the job's columns for them."""

from __future__ import annotations

import time
from typing import Any

from gpusched.errors import PermissionDenied, UsageError
from gpusched.messages import JobRequest

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpusched.db.jobs import Identity


def check_flags(request: JobRequest, who: Identity, time_limit: int | None) -> dict[str, Any]:
    """The columns of ``request``'s flags for a job whose time limit is ``time_limit``
    (seconds; None: none), or the refusal: a negative nice or a priority from anyone but
    an administrator (as sbatch's), a time_min above the limit or beside what it cannot
    cut (a share of a GPU, GPU memory, --exclusive), a deadline without a time limit or
    already past."""
    flags = request.flags
    if flags.nice < 0 and not who.is_admin:
        raise PermissionDenied(f"nice: only an administrator may give a negative nice "
                               f"({flags.nice}), which raises a job's priority")
    if flags.priority is not None and not who.is_admin:
        raise PermissionDenied("priority: only an administrator may set a job's priority")
    if flags.time_min is not None:
        if time_limit is not None and flags.time_min > time_limit:
            raise UsageError(f"time_min: {flags.time_min} seconds is more than the job's "
                             f"time limit ({time_limit} seconds)")
        what = ("a share of a GPU" if request.share_mode is not None
                else "GPU memory (--gpu-mem)" if request.gpu_mem_mb is not None
                else "--exclusive" if request.exclusive else None)
        if what is not None:
            raise UsageError(f"time_min: not taken with {what}: such a job starts with its "
                             "whole time limit")
    if flags.deadline is not None:
        if time_limit is None and flags.time_min is None:
            raise UsageError("deadline: the job has no time limit, so it could never be "
                             "known to end by its deadline; give --time")
        if flags.deadline.timestamp() <= time.time():
            raise UsageError(f"deadline: {flags.deadline.isoformat()} has passed already")
    return {"nice": flags.nice or None, "open_mode": flags.open_mode,
            "time_min": flags.time_min, "deadline": flags.deadline,
            "admin_priority": flags.priority}
