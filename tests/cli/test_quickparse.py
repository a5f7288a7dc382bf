"""The quick parser of the user commands' common command lines agrees with typer: its
tables are the typer declarations', and whatever it accepts, typer parses the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.main import get_command

from gpusched.cli import gqueue, gsubmit, optiontables, tablegen
from gpusched.cli.common import use_light_coercion
from gpusched.cli.quickparse import Declined, Table, quick_parse

COMMANDS = [(gqueue, optiontables.GQUEUE), (gsubmit, optiontables.GSUBMIT)]
VALUES = ["1", "0", "-1", " 7 ", "1_000", "x", "", "-", "--", "a=b", "--json", "-u", "gpu:2",
          "%.8i %R", "٣", "+3"]


def test_the_tables_are_the_typer_declarations() -> None:
    written = Path(optiontables.__file__).read_text()
    assert written == tablegen.module_text(), \
        "a user command's options changed: run 'python -m gpusched.cli.tablegen'"


def typer_parse(module: Any, argv: list[str]) -> tuple[dict[str, Any], set[str]] | None:
    command = get_command(module.app)
    use_light_coercion(command)
    try:
        ctx = command.make_context(module.PROG, list(argv))
    except Exception:
        return None
    given = {name for name in ctx.params
             if getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"}
    return dict(ctx.params), given


def tokens(table: Table) -> st.SearchStrategy[list[str]]:
    names = sorted(table.options)
    one = st.one_of(
        st.sampled_from(names),
        st.sampled_from(VALUES),
        st.builds(lambda n, v: f"{n}={v}", st.sampled_from(names), st.sampled_from(VALUES)),
        st.builds(lambda n, v: n + v, st.sampled_from([n for n in names if len(n) == 2]),
                  st.sampled_from(VALUES)),
        st.sampled_from(["train.sh", "--help", "-Hs", "--nonsense", "-Z"]),
        st.text(max_size=4),
    )
    return st.lists(one, max_size=8)


@pytest.mark.parametrize("module, table", COMMANDS, ids=["gqueue", "gsubmit"])
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_what_the_quick_parser_accepts_typer_parses_alike(
        module: Any, table: Table, data: st.DataObject) -> None:
    argv = data.draw(tokens(table))
    try:
        quick = quick_parse(table, argv)
    except Declined:
        return
    expected = typer_parse(module, argv)
    assert expected is not None, f"typer refuses {argv!r}, the quick parser took it"
    params, given_names = expected
    assert quick.params == params, argv
    assert quick.given == given_names, argv


@pytest.mark.parametrize("module, table, argv", [
    (gqueue, optiontables.GQUEUE, []),
    (gqueue, optiontables.GQUEUE, ["--json"]),
    (gqueue, optiontables.GQUEUE, ["-u", "alice", "-tPD", "--format=%.8i %R", "-h"]),
    (gqueue, optiontables.GQUEUE, ["--explain", "12"]),
    (gsubmit, optiontables.GSUBMIT, ["--wrap", "true"]),
    (gsubmit, optiontables.GSUBMIT, ["-G", "a100:2", "--time=1:00", "-N2", "--no-requeue",
                                     "train.sh", "--epochs", "3", "-h"]),
])
def test_common_command_lines_are_taken(module: Any, table: Table, argv: list[str]) -> None:
    quick = quick_parse(table, argv)
    assert (quick.params, quick.given) == typer_parse(module, argv)


@pytest.mark.parametrize("table, argv", [
    (optiontables.GQUEUE, ["--help"]),
    (optiontables.GQUEUE, ["--explain", "0"]),
    (optiontables.GQUEUE, ["--explain", "x"]),
    (optiontables.GQUEUE, ["-u"]),
    (optiontables.GQUEUE, ["--json=1"]),
    (optiontables.GQUEUE, ["extra"]),
    (optiontables.GSUBMIT, ["-Hs", "--wrap", "true"]),
    (optiontables.GSUBMIT, ["--ntasks", "0", "x.sh"]),
    (optiontables.GSUBMIT, ["--", "x.sh"]),
    (optiontables.GSUBMIT, ["-G=2", "x.sh"]),
])
def test_anything_unusual_is_left_to_typer(table: Table, argv: list[str]) -> None:
    with pytest.raises(Declined):
        quick_parse(table, argv)
