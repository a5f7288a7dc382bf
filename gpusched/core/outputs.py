"""Output file name patterns, as in Slurm's ``sbatch --output``.

``%j`` job id, ``%x`` job name, ``%u`` user name, ``%%`` a literal ``%``. As in
Slurm, a number between ``%`` and the letter zero-pads the job id (``%5j`` ->
``00017``); it is ignored for names. Any other ``%`` sequence is kept as written, so a pattern using a
specifier this version does not know yet is not silently mangled.
"""

from __future__ import annotations

import re

DEFAULT_OUTPUT_PATTERN = "gpusched-%j.out"

_SPECIFIER = re.compile(r"%(%|(\d*)([jxu]))")


def expand_output_pattern(pattern: str, job_id: int, name: str, user: str) -> str:
    """Expand ``%j``, ``%x``, ``%u`` and ``%%`` in an output file pattern."""
    values = {"j": str(job_id), "x": name, "u": user}

    def replace(match: re.Match[str]) -> str:
        if match.group(1) == "%":
            return "%"
        width, letter = match.group(2), match.group(3)
        value = values[letter]
        # Slurm ignores the width for non-numeric values.
        return value.zfill(int(width)) if width and letter == "j" else value

    return _SPECIFIER.sub(replace, pattern)
