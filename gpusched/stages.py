"""Debug timing of a job's way from submit to start, and from its end to the next start.

Each stage the controller and the agent pass a job through (its row committed, the pass
woken and done, its launch order sent and received, its supervisor spawned, its end
seen and recorded), and the controller's time on each API request (``answered``), is
one line of the ``gpusched.stages`` logger at debug::

    stage NAME t=EPOCH_SECONDS jobs=ID,ID,... [key=value ...]

Off unless the daemon runs with ``GPUSCHED_LOG_STAGES=1`` in its environment (or with
its whole log at debug); off, a stamp costs one level check. ``bench/lifecycle.py``
and ``bench/api_submit.py`` turn it on and read the lines back.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Collection

__all__ = ["on", "stamp"]

LOG = logging.getLogger("gpusched.stages")
MAX_IDS = 256  # job ids one line names; a longer list is cut and its length given
if os.environ.get("GPUSCHED_LOG_STAGES") == "1":
    LOG.setLevel(logging.DEBUG)


def on() -> bool:
    """Whether stamps are written (callers check before gathering costly arguments)."""
    return LOG.isEnabledFor(logging.DEBUG)


def stamp(stage: str, job_ids: Collection[int] = (), when: float | None = None,
          **extra: float | int | str | None) -> None:
    """Log that ``job_ids`` passed ``stage`` at ``when`` (default: now, epoch seconds)."""
    if not LOG.isEnabledFor(logging.DEBUG):
        return
    ids = list(job_ids)
    named = ",".join(map(str, ids[:MAX_IDS])) + (f",+{len(ids) - MAX_IDS}"
                                                  if len(ids) > MAX_IDS else "")
    fields = "".join(f" {key}={_value(value)}" for key, value in extra.items())
    LOG.debug("stage %s t=%.6f jobs=%s%s", stage, time.time() if when is None else when,
              named or "-", fields)


def _value(value: float | int | str | None) -> str:
    if isinstance(value, float):
        return f"{value:.6f}"
    return "-" if value is None else str(value)[:80].replace(" ", "_")
