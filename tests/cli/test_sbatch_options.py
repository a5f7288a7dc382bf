"""Every option of sbatch's man page (tests/data/slurm/sbatch.options) is, on gsubmit:
declared (its value reaching the job, or a warning saying why it changes nothing: the
property test of tests/cli/test_parity_options.py), accepted as what gsubmit does
anyway, read as another spelling, or refused with one error line naming it and saying
why (exit 2, nothing sent to the controller); on the command line and in a directive."""

from __future__ import annotations

import shlex
import socket
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.cli import gsubmit, sbatchflags
from gpusched.cli.console import quick_gsubmit
from gpusched.cli.optiontables import GSUBMIT
from gpusched.errors import UsageError
from tests.cli.test_parity_options import script, submission, typer_submission

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm" / "sbatch.options"
LINES = [line.split() for line in DATA.read_text().splitlines()
         if line.strip() and not line.startswith("#")]
SPELLINGS = [spelling for line in LINES for spelling in line]
DECLARED = frozenset(GSUBMIT.options) | {"--help"}
REFUSED = sorted(s for s in SPELLINGS if s in sbatchflags.REFUSED and s not in DECLARED)



def _run(args: list[str], listener: socket.socket, capsys: pytest.CaptureFixture[str]
         ) -> tuple[int, str, str]:
    """gsubmit ``args`` by the console's quick path (typer where it declines), then by
    typer's: the same exit code and output from both; nothing sent."""
    answers = []
    for run in (quick_gsubmit, gsubmit.main):
        code = run(list(args))
        out, err = capsys.readouterr()
        answers.append((code, out, err))
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert answers[0] == answers[1]
    return answers[0]


def test_the_data_file_lists_sbatchs_options() -> None:
    assert len(LINES) >= 100 and len(set(SPELLINGS)) == len(SPELLINGS)
    assert {"--nice", "--time-min", "--deadline", "-W", "--ntasks-per-gpu", "--priority",
            "--open-mode", "--container", "--uid"} <= set(SPELLINGS)


def test_every_option_is_known_to_gsubmit() -> None:
    """Declared, or answered by gpusched.cli.sbatchflags; no table names an option that
    is not sbatch's, and none is both declared and refused."""
    handled = (set(sbatchflags.REFUSED) | sbatchflags.ALREADY | set(sbatchflags.ALIASES)
               | set(sbatchflags.VERSION))
    unknown = [s for s in SPELLINGS if s not in DECLARED and s not in handled]
    assert unknown == []
    assert handled <= set(SPELLINGS)


@pytest.mark.parametrize("spelling", REFUSED)
def test_refused_options_say_why(spelling: str, listener: socket.socket,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    written = f"{spelling}=1" if spelling.startswith("--") else spelling
    code, out, err = _run([written, "--wrap", "x"], listener, capsys)
    assert code == 2 and out == "", err
    assert err.count("\n") == 1 and err.startswith(f"gsubmit: error: {spelling}: not supported: ")
    why = err.split("not supported: ", 1)[1]
    assert len(why.strip()) > 20  # a reason, not just a word
    code, _, err = _run([script(written)], listener, capsys)
    assert code == 2 and "line 2: #SBATCH" in err and f"{spelling}: not supported" in err


def test_options_gsubmit_follows_anyway(listener: socket.socket) -> None:
    base = submission(["--wrap", "x"])
    for spelling in sorted(sbatchflags.ALREADY):
        assert submission([spelling, "--wrap", "x"]) == base
        with_directive = typer_submission([script(spelling)])
        assert (with_directive.ignored, with_directive.gpus) == ((), 0)


def test_usage_help_and_version(listener: socket.socket,
                                capsys: pytest.CaptureFixture[str]) -> None:
    for spelling in ("--usage", "-h", "--help"):
        code, out, _ = _run([spelling], listener, capsys)
        assert code == 0 and "Usage: gsubmit" in out
    for spelling in ("-V", "--version"):
        code, out, _ = _run([spelling], listener, capsys)
        assert code == 0 and out.startswith("gpusched ")
    code, _, err = _run(["-J", "a", "-V", "--wrap", "x"], listener, capsys)
    assert code == 2 and "-V" in err


VALUES = st.sampled_from(["1", "2", "gpu", "a100:1", "10:00", "now+1h", "afterok:5", "END",
                          "append", "0-3", "node1", "x=y"]) | st.text(
    st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=8)


@settings(max_examples=250, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from([line for line in LINES
                        if not {"--help", "--usage", "-V"} & set(line)]),
       st.data(), st.booleans())
def test_any_option_is_taken_or_refused_naming_it(
        listener: socket.socket, line: list[str], data: st.DataObject, in_directive: bool) -> None:
    spelling = data.draw(st.sampled_from(line))
    spec = GSUBMIT.options.get(spelling)
    value = None if spec is not None and spec[1] == "flag" else data.draw(VALUES)
    args = [spelling] if value is None else (
        [f"{spelling}={value}"] if spelling.startswith("--") else [spelling, value])
    try:
        if in_directive:
            typer_submission([script(" ".join(shlex.quote(a) for a in args))])
        else:
            typer_submission([*args, "--wrap", "x"])
    except UsageError as err:
        assert any(name in err.message for name in line), (args, err.message)
