"""The real gsubmit and gqueue console scripts on generated command lines, as
processes with no controller to reach: a refused input exits 2 with one line on stderr,
a taken one gets as far as the controller (exit 1, "cannot reach"); no traceback ever.

Each example is a batch of command lines run side by side, which keeps the (bounded)
sample of processes quick: 10 batches of 10 for each command by default."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from gpusched.cli.submission import INPUT_VARIABLES
from tests.fuzz.commands import SCRIPT, batch_script, gqueue_argv, gsubmit_argv
from tests.fuzz.fuzzing import fuzz
from tests.fuzz.test_fuzz_commands import check_outcome

BIN = Path(sys.executable).parent
BATCH = 10


def run_all(prog: str, argvs: list[list[str]], where: Path) -> None:
    env = {key: value for key, value in os.environ.items()
           if key not in ("GPUSCHED_CONTROLLERS", "GPUSCHED_CONFIG", *INPUT_VARIABLES.values())}
    env["GPUSCHED_SOCKET"] = str(where / "absent.sock")

    def one(argv: list[str]) -> tuple[list[str], subprocess.CompletedProcess[bytes]]:
        return argv, subprocess.run([str(BIN / prog), *argv], capture_output=True, env=env,
                                    cwd=where, timeout=60)

    with ThreadPoolExecutor(4) as pool:
        for argv, done in pool.map(one, argvs):
            out = done.stdout.decode("utf-8", "replace")
            err = done.stderr.decode("utf-8", "replace")
            check_outcome(prog, argv, done.returncode, out, err)

@fuzz(10)
@given(st.lists(gsubmit_argv, min_size=BATCH, max_size=BATCH), batch_script())
def test_gsubmit_processes(tmp_path: Path, argvs: list[list[str]], script: bytes) -> None:
    (tmp_path / SCRIPT).write_bytes(script)
    run_all("gsubmit", argvs, tmp_path)

@fuzz(10)
@given(st.lists(gqueue_argv, min_size=BATCH, max_size=BATCH))
def test_gqueue_processes(tmp_path: Path, argvs: list[list[str]]) -> None:
    run_all("gqueue", argvs, tmp_path)
