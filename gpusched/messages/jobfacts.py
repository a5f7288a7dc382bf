"""What a launch order tells the agent about its job beyond what the supervisor needs:
the facts the job's Slurm variables show (``SLURM_JOB_PARTITION``, ``SLURM_JOB_ACCOUNT``,
``SLURM_JOB_QOS``, ``SLURM_JOB_DEPENDENCY``, ``SLURM_GPUS``, ``SLURM_JOB_START_TIME``).

``job`` in a launch order (absent from an order of an older controller: the job then
goes without these variables). Bounded field by field as the rest of the order is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpusched.core import bounds
from gpusched.core.dependency import MAX_DEPENDENCY_TEXT
from gpusched.errors import UsageError
from gpusched.messages.fields import (
    as_object,
    integer,
    optional_integer,
    refuse_unknown,
    required_text,
    text,
)

FACT_FIELDS = frozenset({"partition", "account", "qos", "dependency", "gpus", "start_time"})
# Characters of a stored dependency: what submission takes (its canonical form, as
# stored, is never longer).
MAX_DEPENDENCY = MAX_DEPENDENCY_TEXT
MAX_EPOCH = 253_402_300_799  # 9999-12-31T23:59:59Z


@dataclass(frozen=True, slots=True)
class JobFacts:
    """The job's partition, account and QOS (None: none), its dependency as stored
    (``afterok:12:13``; None: none), the GPUs it asked for over all its nodes, and when
    this run started (unix seconds; None: not known)."""

    partition: str
    account: str | None = None
    qos: str | None = None
    dependency: str | None = None
    gpus: int = 0
    start_time: int | None = None

    @classmethod
    def parse(cls, raw: object) -> JobFacts:
        """Check every field's type and bounds; the first fault is a UsageError naming
        it under ``job``."""
        try:
            body = as_object(raw, "the job")
            refuse_unknown(body, FACT_FIELDS, "the job")
            return cls(
                partition=required_text(body, "partition", bounds.MAX_WORD, "a partition"),
                account=text(body, "account", bounds.MAX_WORD, "an account"),
                qos=text(body, "qos", bounds.MAX_WORD, "a QOS"),
                dependency=text(body, "dependency", MAX_DEPENDENCY, "a dependency"),
                gpus=integer(body, "gpus", 0, 0, bounds.MAX_GPUS, "GPUs"),
                start_time=optional_integer(body, "start_time", 0, MAX_EPOCH, "unix seconds"))
        except UsageError as exc:
            raise UsageError(f"job: {exc.message}") from None

    def to_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "account": self.account, "qos": self.qos,
                "dependency": self.dependency, "gpus": self.gpus,
                "start_time": self.start_time}
