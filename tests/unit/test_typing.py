"""The code type-checks: the pure core under --strict, the rest (and the migrations)
as configured."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_passes_on_the_package() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "gpusched", "migrations"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
