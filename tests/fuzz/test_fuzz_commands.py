"""gsubmit's and gqueue's command lines and gsubmit's directives, driven as the console
scripts drive them (the quick parser first, typer when it declines) with no controller
to reach: every input is either taken (and the command gets as far as the controller)
or refused with exit code 2 and one line on stderr; nothing raises."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import assume, event, given
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from gpusched.cli.console import quick_gqueue, quick_gsubmit
from gpusched.cli.directives import read_directive_lines
from gpusched.cli.jobshape import parse_gres_list
from gpusched.cli.optiontables import GSUBMIT
from gpusched.cli.quickparse import Declined, quick_parse
from gpusched.cli.submission import INPUT_VARIABLES
from gpusched.core.shapes import ShapeError
from gpusched.errors import UsageError
from tests.fuzz.commands import (
    SCRIPT,
    batch_script,
    gqueue_argv,
    gsubmit_argv,
    gsubmit_options,
)
from tests.fuzz.fuzzing import TEXT, fuzz, noisy_text, one_line

UNREACHABLE = "cannot reach"


@pytest.fixture
def no_controller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A scratch directory, and a controller socket that does not exist."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUSCHED_SOCKET", str(tmp_path / "absent.sock"))
    for name in ("GPUSCHED_CONTROLLERS", "GPUSCHED_CONFIG", *INPUT_VARIABLES.values()):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path


def check_outcome(prog: str, argv: list[str], code: int, out: str, err: str) -> None:
    """Refused: exit 2, one error line. Taken: the one error line is that the controller
    cannot be reached (exit 1), after any warnings. Never a traceback."""
    if currently_in_test_context():  # a hypothesis test: count the outcomes
        event(f"{prog} exit {code}")
    assert "Traceback" not in err, (argv, err)
    lines = err.splitlines()
    errors = [line for line in lines if line.startswith(f"{prog}: error: ")]
    if code == 2:
        assert lines == errors and len(errors) == 1 and out == "", (argv, err)
    elif code == 0:
        assert "--help" in argv, (argv, out, err)
    else:
        assert code == 1 and len(errors) == 1 and UNREACHABLE in errors[0], (argv, code, err)
        assert all(line.startswith(f"{prog}: ") for line in lines), (argv, err)


@fuzz(150)
@given(gsubmit_argv, batch_script())
def test_gsubmit_command_lines_and_scripts(no_controller: Path,
                                           capsys: pytest.CaptureFixture[str],
                                           argv: list[str], script: bytes) -> None:
    (no_controller / SCRIPT).write_bytes(script)
    code = quick_gsubmit(argv)
    out, err = capsys.readouterr()
    check_outcome("gsubmit", argv, code, out, err)


@fuzz(150)
@given(gqueue_argv)
def test_gqueue_command_lines(no_controller: Path, capsys: pytest.CaptureFixture[str],
                              argv: list[str]) -> None:
    code = quick_gqueue(argv)
    out, err = capsys.readouterr()
    check_outcome("gqueue", argv, code, out, err)


@fuzz(300)
@given(st.lists(gsubmit_options, max_size=3).map(lambda g: [t for a in g for t in a]))
def test_the_quick_parser_takes_or_declines(argv: list[str]) -> None:
    try:
        quick_parse(GSUBMIT, argv)
    except Declined:
        pass


@fuzz(300)
@given(batch_script().map(lambda b: b.decode("utf-8", "replace"))
       | st.text(TEXT, max_size=200))
def test_directive_lines_split_or_are_refused(text: str) -> None:
    try:
        directives = read_directive_lines(text)
    except UsageError as err:
        assert one_line(err).startswith("line ")
        return
    for directive in directives:
        assert directive.args and directive.prefix in ("#SBATCH", "#GSUB")
        assert os.linesep not in "".join(directive.args)


@pytest.mark.parametrize("argv", [["-N", "9" * 5000, "--wrap", "true"],
                                  ["--iterate", "9" * 5000]])
def test_an_integer_too_long_for_int(no_controller: Path, capsys: pytest.CaptureFixture[str],
                                     argv: list[str]) -> None:
    prog, run = ("gqueue", quick_gqueue) if "--iterate" in argv else ("gsubmit", quick_gsubmit)
    code = run(argv)
    out, err = capsys.readouterr()
    check_outcome(prog, argv, code, out, err)


def test_an_undecodable_byte_in_a_gqueue_value(no_controller: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["-u", "\udcff"]
    code = quick_gqueue(argv)
    out, err = capsys.readouterr()
    check_outcome("gqueue", argv, code, out, err)


@fuzz(300)
@given(st.lists(st.sampled_from(["gpu", "gpu:2", "gpu:a100:1", "mps:50", "shard:", "gpumem:20G",
                                 "gpumem:0", "mps:" + "9" * 5000, "shard:1", "fpga:1", ""])
                | noisy_text("gpumsharde:0129,G", 6), min_size=1, max_size=4).map(",".join))
def test_gres_lists(text: str) -> None:
    # gpu:N of more than 4300 digits: gpusched/core/shapes.py's own case, below.
    assume(not any(item.strip().startswith("gpu:") and len(item) > 4300
                   for item in text.split(",")))
    try:
        gres = parse_gres_list(text)
    except ShapeError as err:
        one_line(err)
        return
    assert gres.gpu is not None or gres.mode is not None or gres.memory_mb is not None
    assert gres.mode is None or 1 <= gres.units <= 10_000


def test_a_gpu_count_too_long_for_int() -> None:
    with pytest.raises(ShapeError):
        parse_gres_list("gpu:" + "9" * 5000)


plain_word = st.text(st.characters(exclude_categories=("Cs", "Zl", "Zp", "Cc"),
                                   exclude_characters=" '\"\\"), min_size=1, max_size=8)


@fuzz(300)
@given(st.lists(plain_word.filter(lambda w: not w.startswith("#")), min_size=1, max_size=6),
       st.sampled_from(["#SBATCH", "#GSUB"]))
def test_unquoted_words_come_back_whole(words: list[str], prefix: str) -> None:
    """Words without quotes, spaces or a leading # are the directive's arguments as they
    are (a # inside a word, or after a no-break space, is not a comment)."""
    text = f"#!/bin/sh\n{prefix} {' '.join(words)}\ntrue\n"
    assume(len(text.splitlines()) == 3)  # no other line break inside a word
    (directive,) = read_directive_lines(text)
    assert list(directive.args) == words
