"""Output file name patterns, as in Slurm's ``sbatch --output``.

``%j`` job id, ``%x`` job name, ``%u`` user name, ``%N`` the (first) node's name,
``%A`` an array's job id, ``%a`` its task id, ``%%`` a literal ``%``; for a job step's
files also ``%s`` the step id, ``%t`` the task id and ``%n`` the node's index within the
step (in a batch job's pattern these three are kept as written). For a job that is not part of an array, ``%A`` is its
job id and ``%a`` is 4294967294, Slurm's "no value", so scripts written for Slurm name
their files the same way. As in Slurm, a number between ``%`` and the letter zero-pads
ids (``%5j`` -> ``00017``); it is ignored for names. Any other ``%`` sequence is kept as written, so a pattern using a
specifier this version does not know yet is not silently mangled. A pattern with a
backslash in it is taken as written, every backslash dropped and nothing expanded, as
Slurm takes it (``my\\ dir/%j.out`` names ``my dir/%j.out``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

DEFAULT_OUTPUT_PATTERN = "gpusched-%j.out"

NO_TASK = 4294967294
_SPECIFIER = re.compile(r"%(%|(\d*)([jxuNAastn]))")
_NUMERIC = frozenset("jAastn")


class StepPlace(NamedTuple):
    """Which task of which step a file name is for: the step's id, the task's id and
    the index of its node within the step."""

    step_id: int
    task_id: int
    node_index: int


MAX_PAD_WIDTH = 10  # digits a %<width>j may pad to; Slurm's own patterns use one or two


def output_pattern_error(pattern: str) -> str | None:
    """Why an output pattern cannot be taken at submit, or None: a zero-pad width over
    MAX_PAD_WIDTH (it would make the node's agent build a huge file name)."""
    for match in _SPECIFIER.finditer(pattern):
        width = match.group(2)
        if width and (len(width) > 2 or int(width) > MAX_PAD_WIDTH):
            return (f"the width of %{width}{match.group(3)} is more than {MAX_PAD_WIDTH} "
                    "digits")
    return None


def expand_output_pattern(pattern: str, job_id: int, name: str, user: str,
                          array_job_id: int | None = None,
                          array_task_id: int | None = None, node: str = "",
                          step: StepPlace | None = None) -> str:
    """Expand ``%j``, ``%x``, ``%u``, ``%N``, ``%A``, ``%a`` and ``%%`` in an output file
    pattern, and for one task of a job step (``step``) ``%s``, ``%t`` and ``%n``; a
    pattern with a backslash is taken as written, its backslashes dropped."""
    if "\\" in pattern:
        return pattern.replace("\\", "")
    values = {"j": str(job_id), "x": name, "u": user, "N": node,
              "A": str(job_id if array_job_id is None else array_job_id),
              "a": str(NO_TASK if array_task_id is None else array_task_id)}
    if step is not None:
        values.update(s=str(step.step_id), t=str(step.task_id), n=str(step.node_index))

    def replace(match: re.Match[str]) -> str:
        if match.group(1) == "%":
            return "%"
        width, letter = match.group(2), match.group(3)
        if letter not in values:  # a step's specifier in a batch job's pattern
            return match.group(0)
        value = values[letter]
        # Slurm ignores the width for non-numeric values. A width submit would have
        # refused (the database may hold anything) pads no further than MAX_PAD_WIDTH:
        # this runs in the node's root agent.
        if not width or letter not in _NUMERIC:
            return value
        return value.zfill(MAX_PAD_WIDTH if len(width) > 2 else min(int(width), MAX_PAD_WIDTH))

    return _SPECIFIER.sub(replace, pattern)
