"""A command's wall time from its start to its end, run again and again: what the CLI
benches time the bare interpreter with (``python -c pass``), the floor under every
command."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path


def start_times(argv: list[str], trials: int, gap: float = 0.0,
                cwd: Path | None = None) -> list[float]:
    """Milliseconds each of ``trials`` runs of ``argv`` took, each started ``gap``
    seconds after the one before ended (a failed run ends the bench)."""
    took = []
    for _ in range(trials):
        time.sleep(gap)
        began = time.perf_counter()
        subprocess.run(argv, cwd=cwd, check=True)
        took.append((time.perf_counter() - began) * 1000)
    return took
