"""-C/--constraint on the command lines: gsubmit (command line and directive) and galloc
send it canonical; a malformed one is one usage error naming the option."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.cli.allocation import allocation_body
from gpusched.cli.galloc import parse_args
from gpusched.errors import UsageError
from tests.cli.test_cli_format import parse_submit


def test_galloc_sends_the_constraint_canonical() -> None:
    options, command = parse_args(["-C", "a100 & (ib|roce)", "-N", "2", "bash"])
    assert command == ["bash"]
    assert allocation_body(options, "x", "/tmp", {})["constraint"] == "a100&(ib|roce)"
    assert allocation_body(parse_args(["true"])[0], "x", "/tmp", {})["constraint"] is None
    with pytest.raises(UsageError, match="^--constraint: join features with '&'"):
        allocation_body(parse_args(["--constraint=a,b", "true"])[0], "x", "/tmp", {})


def test_gsubmit_takes_the_constraint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_submit(["-C", "[r1 | r2]", "--wrap", "true"]).constraint == "[r1|r2]"
    (tmp_path / "job.sh").write_text("#!/bin/sh\n#SBATCH --constraint=sm_90\ntrue\n")
    assert parse_submit(["job.sh"]).constraint == "sm_90"
    assert parse_submit(["-C", "sm_80", "job.sh"]).constraint == "sm_80"  # the command line wins
    (tmp_path / "bad.sh").write_text("#!/bin/sh\n#SBATCH -C a&&b\ntrue\n")
    with pytest.raises(UsageError, match=r"^line 2: #SBATCH: --constraint: expected a feature"):
        parse_submit(["bad.sh"])
