"""The real console scripts on bad input: exit 2, one line on stderr, nothing on stdout.

No controller runs here: GPUSCHED_SOCKET names a socket that does not exist, so a
command that got as far as contacting the controller exits 1 with the "cannot reach"
line, and every input error must be caught before that.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpusched.cli.batchscript import NOT_A_BATCH_SCRIPT

BIN = Path(sys.executable).parent
GOOD_SCRIPT = "#!/bin/sh\n#GSUB --gpus=1\necho hi\n"


def run(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run a console script in ``tmp_path`` with no controller reachable."""
    env = {**os.environ, "GPUSCHED_SOCKET": str(tmp_path / "absent.sock")}
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, env=env,
        cwd=tmp_path, timeout=60,
    )


def one_error_line(result: subprocess.CompletedProcess[str], prog: str) -> str:
    """The single stderr line of a failed command, checked for shape."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    assert result.stdout == ""
    return lines[0]


def write(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    return name


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--gpus", "-1", "--wrap", "true"], "--gpus"),
        (["--gpus=-1", "--wrap", "true"], "invalid --gpus '-1': '-1' is not a whole number"),
        (["-G", "a100:two", "--wrap", "true"], "'two' is not a whole number of GPUs"),
        (["--gpus", "1.5", "--wrap", "true"], "'1.5' is not a whole number of GPUs"),
        (["--gpus", "a100:", "--wrap", "true"], "'' is not a whole number of GPUs"),
        (["--gpus", "A 100:2", "--wrap", "true"], "'a 100' is not a GPU type or MIG profile"),
        (["--gres", "fpga:1", "--wrap", "true"], "invalid --gres 'fpga:1': 'fpga:1' is not a "
         "resource here (expected gpu[:TYPE][:N], mps:N, shard:N and gpumem:SIZE"),
        (["--gres=mps:50,shard:2", "--wrap", "true"], "give mps:N or shard:N, not both"),
        (["--gres=mps:0", "--wrap", "true"], "mps:N takes N from 1 to 10000 units of one GPU, "
         "not '0'"),
        (["--gres=shard", "--wrap", "true"], "shard:N takes N from 1 to 10000"),
        (["--gres=mps:50", "-G", "2", "--wrap", "true"],
         "--gres=mps:50 asks for a share of one GPU, not 2 GPUs"),
        (["--gres=mps:50", "-N", "2", "--wrap", "true"], "on one node, not 2 nodes"),
        (["--gres=shard:1", "--exclusive", "--wrap", "true"],
         "cannot take whole nodes (--exclusive)"),
        (["--gpu-mem", "lots", "--wrap", "true"], "invalid --gpu-mem 'lots'"),
        (["--gpu-mem", "0", "--wrap", "true"], "invalid --gpu-mem '0': expected 1M to 16T"),
        (["--gpu-mem", "20G", "--gres=gpumem:20G", "--wrap", "true"],
         "give --gpu-mem or --gres=gpumem:SIZE, not both"),
        (["--gres=gpumem:x", "--wrap", "true"], "gpumem: 'x' is not a size such as 20G"),
        (["-G", "2", "--gres", "gpu:2", "--wrap", "true"], "give only one of --gpus, --gres"),
        (["-N", "2", "-G", "3", "--wrap", "true"], "cannot be spread evenly over 2 nodes"),
        (["-N", "0", "--wrap", "true"], "minimum of 1"),
        (["--mem", "lots", "--wrap", "true"], "invalid --mem 'lots'"),
        (["--mem", "1G", "--mem-per-gpu", "1G", "--wrap", "true"], "only one of --mem, --mem-per-gpu and --mem-per-cpu"),
        (["--time", "abc", "--wrap", "true"], "invalid time 'abc'"),
        (["-t", "0", "--wrap", "true"], "must be positive"),
        (["missing.sh"], "unable to open batch script 'missing.sh': No such file or directory"),
        (["."], "Is a directory"),
        (["--wrap", "true", "extra.sh"], "not both"),
        ([], "nothing to submit"),
        (["--parsable"], "nothing to submit"),
        (["--bogus", "--wrap", "true"], "No such option: --bogus"),
        (["--gpus"], "--gpus"),
    ],
)
def test_gsubmit_bad_input_exits_2(tmp_path: Path, argv: list[str], needle: str) -> None:
    result = run(tmp_path, "gsubmit", *argv)
    assert result.returncode == 2, result
    assert needle in one_error_line(result, "gsubmit")


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("echo hi\n", NOT_A_BATCH_SCRIPT),
        ("", NOT_A_BATCH_SCRIPT),
        ("#!/bin/sh\r\necho hi\r\n", "DOS line breaks"),
        ("#!/bin/sh\necho \0\n", "NUL character"),
        ("#!/bin/sh\n#SBATCH --time=abc\ntrue\n", "line 2: #SBATCH: --time: invalid time 'abc'"),
        ("#!/bin/sh\n\n#GSUB --gpus=-3\ntrue\n", "line 3: #GSUB: invalid --gpus '-3'"),
        ("#!/bin/sh\n#SBATCH --frobnicate=4G\ntrue\n",
         "line 2: #SBATCH --frobnicate=4G: No such option: --frobnicate"),
        ('#!/bin/sh\n#SBATCH -J "unclosed\ntrue\n', "line 2: #SBATCH directive: No closing quotation"),
        ("#!/bin/sh\n#SBATCH other.sh\ntrue\n", "takes options only"),
        ("#!/bin/sh\n#GSUB --wrap true\ntrue\n", "--wrap is not a directive"),
    ],
)
def test_gsubmit_bad_script_exits_2(tmp_path: Path, text: str, needle: str) -> None:
    result = run(tmp_path, "gsubmit", write(tmp_path, "job.sh", text))
    assert result.returncode == 2, result
    assert needle in one_error_line(result, "gsubmit")


def test_gsubmit_not_utf8_exits_2(tmp_path: Path) -> None:
    (tmp_path / "job.sh").write_bytes(b"#!/bin/sh\necho \xff\n")
    result = run(tmp_path, "gsubmit", "job.sh")
    assert result.returncode == 2
    assert "not UTF-8" in one_error_line(result, "gsubmit")


def test_gsubmit_unreadable_script_exits_2(tmp_path: Path) -> None:
    # A directory cannot be read as a script by anyone, root included.
    (tmp_path / "job.sh").mkdir()
    result = run(tmp_path, "gsubmit", "job.sh")
    assert result.returncode == 2
    assert "job.sh" in one_error_line(result, "gsubmit")


def test_command_line_wins_over_a_bad_directive_value(tmp_path: Path) -> None:
    # The directive's --time alone is an error (see above); given on the command line,
    # the flag wins, so validation passes and only the missing controller stops it.
    script = write(tmp_path, "job.sh", "#!/bin/sh\n#SBATCH --time=abc\ntrue\n")
    result = run(tmp_path, "gsubmit", "--time", "10", script)
    assert result.returncode == 1
    assert "cannot reach" in one_error_line(result, "gsubmit")


@pytest.mark.parametrize(
    "argv",
    [
        ["--wrap", "true"],
        ["--gpus=2", "-t", "1-0", "-p", "gpu", "-J", "x", "-o", "o-%j", "-e", "e-%j", "--wrap", "true"],
        ["job.sh", "--gpus", "-5", "not-an-option-of-ours"],  # after SCRIPT: the script's args
    ],
)
def test_valid_submit_without_controller_exits_1(tmp_path: Path, argv: list[str]) -> None:
    write(tmp_path, "job.sh", GOOD_SCRIPT)
    result = run(tmp_path, "gsubmit", *argv)
    assert result.returncode == 1, result
    line = one_error_line(result, "gsubmit")
    assert line == (
        f"gsubmit: error: cannot reach the gpusched controller at {tmp_path / 'absent.sock'}: "
        "No such file or directory; is it running? (start a local cluster with 'gpusched up')")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["abc"], "invalid job id 'abc'"),
        (["12", "x1"], "invalid job id 'x1'"),  # checked before the first cancel is sent
        (["0"], "invalid job id '0'"),
        (["-5"], "No such option: -5"),
        (["1.x"], "invalid step id '1.x': expected JOB.STEP such as 12.3"),
        (["1.5.2"], "invalid step id '1.5.2'"),
        (["0.5"], "invalid job id '0'"),
        ([], "nothing to cancel: give job ids, or filters"),
        (["12_x"], "invalid job id '12_x': expected ID, ID_TASK or ID_[TASKS]"),
        (["12_[1-3%2]"], "a % limit has no meaning here"),
        (["x_3"], "invalid job id 'x'"),
        (["-t", "CD", "--me"], "invalid --state 'CD'"),
        (["--me", "-u", "someone-else"], "--me and --user name different users"),
        (["--signal", "BOGUS", "3"], "invalid --signal 'BOGUS'"),
        (["-s", "99", "3"], "invalid --signal '99'"),
        (["-s", "USR1", "3_1"], "--signal takes job ids"),
    ],
)
def test_gcancel_bad_ids_exit_2(tmp_path: Path, argv: list[str], needle: str) -> None:
    result = run(tmp_path, "gcancel", *argv)
    assert result.returncode == 2, result
    assert needle in one_error_line(result, "gcancel")


def test_gcancel_without_controller_says_so_once(tmp_path: Path) -> None:
    result = run(tmp_path, "gcancel", "1", "2", "3")
    assert result.returncode == 1
    assert "cannot reach the gpusched controller" in one_error_line(result, "gcancel")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--states", "XX"], "unknown job state 'XX'"),
        (["-t", ","], "at least one job state"),
        (["--bogus"], "No such option: --bogus"),
        (["--user"], "--user"),
    ],
)
def test_gqueue_bad_input_exits_2(tmp_path: Path, argv: list[str], needle: str) -> None:
    result = run(tmp_path, "gqueue", *argv)
    assert result.returncode == 2, result
    assert needle in one_error_line(result, "gqueue")


@pytest.mark.parametrize("argv", [[], ["--json"], ["-t", "pd,R", "-u", "alice", "--all", "-h"]])
def test_gqueue_without_controller_exits_1(tmp_path: Path, argv: list[str]) -> None:
    result = run(tmp_path, "gqueue", *argv)
    assert result.returncode == 1
    assert "cannot reach the gpusched controller" in one_error_line(result, "gqueue")


@pytest.mark.parametrize("prog", ["gsubmit", "gqueue", "gcancel"])
def test_help_exits_0_in_plain_text(tmp_path: Path, prog: str) -> None:
    result = run(tmp_path, prog, "--help")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith(f"Usage: {prog} ")
    assert "╭" not in result.stdout  # no rich panels
