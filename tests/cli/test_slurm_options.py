"""Every option of squeue, scancel, sinfo and sacct (tests/data/slurm/*.options, from
their man pages) is, on gqueue, gcancel, ginfo and gacct: declared by the command,
accepted as doing what it already does, read as another declared spelling, or refused
with one error line naming it (exit 2, nothing sent to the controller)."""

from __future__ import annotations

import socket
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.cli import gacct, gcancel, gcontrol, ginfo, gqueue, slurmflags
from gpusched.errors import UsageError

DATA = Path(__file__).resolve().parents[1] / "data" / "slurm"
COMMANDS: dict[str, tuple[str, ModuleType]] = {
    "squeue": ("gqueue", gqueue), "scancel": ("gcancel", gcancel), "sinfo": ("ginfo", ginfo),
    "sacct": ("gacct", gacct), "scontrol": ("gcontrol", gcontrol),
}


def slurm_options(slurm: str) -> list[list[str]]:
    """The option lines of one command's data file: each line's spellings."""
    lines = (DATA / f"{slurm}.options").read_text().splitlines()
    return [line.split() for line in lines if line.strip() and not line.startswith("#")]


def declared(module: ModuleType) -> frozenset[str]:
    return slurmflags.declared_options(module.app) | {"--help"}


CASES = [(slurm, spelling) for slurm in COMMANDS for line in slurm_options(slurm)
         for spelling in line]


def test_data_files_list_many_options() -> None:
    counts = {slurm: len(slurm_options(slurm)) for slurm in COMMANDS}
    assert counts["squeue"] >= 35 and counts["scancel"] >= 24
    assert counts["sinfo"] >= 28 and counts["sacct"] >= 49 and counts["scontrol"] >= 15



def _nothing_connected(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
    except BlockingIOError:
        return True
    return False


@pytest.mark.parametrize(("slurm", "spelling"), CASES)
def test_each_option_is_implemented_or_refused_naming_it(
        slurm: str, spelling: str, listener: socket.socket,
        capsys: pytest.CaptureFixture[str]) -> None:
    prog, module = COMMANDS[slurm]
    ours = declared(module)
    if spelling in ours:
        return  # declared: its help and its tests say what it does
    if spelling in slurmflags.ALREADY.get(prog, ()):
        assert slurmflags.check_argv(prog, [spelling], ours) == []
        return
    alias = slurmflags.ALIASES.get(prog, {}).get(spelling)
    if alias is not None:
        assert alias in ours, (prog, spelling, alias)
        assert slurmflags.check_argv(prog, [spelling, "x"], ours) == [alias, "x"]
        return
    if spelling in slurmflags.VERSION:
        assert module.main([spelling]) == 0
        assert capsys.readouterr().out.startswith("gpusched ")
        return
    assert spelling in slurmflags.REFUSED.get(prog, {}), f"{prog}: {spelling} is neither " \
        "implemented nor refused"
    assert module.main([spelling, "x"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"{prog}: error: {spelling}: not supported: ")
    assert _nothing_connected(listener)


def test_refused_and_declared_do_not_overlap() -> None:
    """gqueue, gcancel and gcontrol check before building their typer command, so a spelling
    they declare must not be refused; ginfo and gacct pass what they declare, and a
    declared spelling wins over its refusal (an option added later)."""
    for prog, module in (entry for entry in COMMANDS.values()):
        ours = declared(module)
        if prog in ("gqueue", "gcancel", "gcontrol"):
            assert not set(slurmflags.REFUSED.get(prog, {})) & ours, prog
        else:
            for spelling in set(slurmflags.REFUSED.get(prog, {})) & ours:
                assert slurmflags.check_argv(prog, [spelling], ours) == [spelling]
        assert not set(slurmflags.ALREADY.get(prog, ())) & ours, prog
        assert not set(slurmflags.ALIASES.get(prog, {})) & ours, prog  # an alias shadows none


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_refused_option_anywhere_is_refused_naming_it(
        data: st.DataObject, listener: socket.socket,
        capsys: pytest.CaptureFixture[str]) -> None:
    prog = data.draw(st.sampled_from(sorted(slurmflags.REFUSED)), label="prog")
    module = dict(COMMANDS.values())[prog]
    refused = data.draw(st.sampled_from(sorted(slurmflags.REFUSED[prog])), label="refused")
    word = refused + ("=1" if refused.startswith("--") and data.draw(st.booleans()) else "")
    harmless = [word for word in ("-v", "--verbose", "-h", "--noheader", "-n", "x", "--json")
                if word not in slurmflags.REFUSED[prog]]
    others = data.draw(st.lists(st.sampled_from(harmless), max_size=4))
    at = data.draw(st.integers(0, len(others)))
    argv = [*others[:at], word, *others[at:]]
    capsys.readouterr()
    assert module.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"{prog}: error: {refused}: not supported: {slurmflags.REFUSED[prog][refused]}"]
    assert _nothing_connected(listener)


def test_everything_after_double_dash_is_left_alone() -> None:
    assert slurmflags.check_argv("gqueue", ["-h", "--", "--yaml"]) == ["-h", "--", "--yaml"]
    with pytest.raises(UsageError, match="--yaml: not supported"):
        slurmflags.check_argv("gqueue", ["--yaml=1"])


def test_input_variables_ours_then_slurms_and_the_command_line_wins() -> None:
    names = {"": "GQUEUE SQUEUE", "fmt": "FORMAT", "sort": "SORT"}
    env = {"SQUEUE_FORMAT": "%i", "GQUEUE_FORMAT": "%j", "SQUEUE_SORT": "-t"}
    assert slurmflags.from_environment({"fmt": None, "sort": None}, names, env) == {
        "fmt": "%j", "sort": "-t"}
    assert slurmflags.from_environment({"fmt": "%A", "sort": None}, names, env) == {"sort": "-t"}
    assert slurmflags.from_environment({"fmt": None}, names, {"SQUEUE_FORMAT": " "}) == {}


SCONTROL_COMMANDS = [line.strip() for line in (DATA / "scontrol.commands").read_text()
                     .splitlines() if line.strip() and not line.startswith("#")]


@pytest.mark.parametrize("command", SCONTROL_COMMANDS)
def test_each_scontrol_job_and_node_command_is_gcontrols_or_refused(
        command: str, listener: socket.socket, capsys: pytest.CaptureFixture[str]) -> None:
    from typer.main import get_command

    group = get_command(gcontrol.app)
    if command in getattr(group, "commands", {}):
        return
    assert command in slurmflags.REFUSED_COMMANDS["gcontrol"], f"{command} is neither " \
        "gcontrol's nor refused"
    assert gcontrol.main([command, "17"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"gcontrol: error: {command}: not supported: ")
    assert _nothing_connected(listener)


def test_node_updates_as_scontrol_writes_them() -> None:
    from gpusched.cli.nodecontrol import node_changes, node_update_argv

    assert node_update_argv(["update", "NodeName=n[1-2]", "State=DRAIN"]) == [
        "update", "node", "n[1-2]", "State=DRAIN"]
    assert node_changes("n[1-2]", ["state=drain", "Reason=bad fan"]) == [
        ("/v1/nodes/n1/drain", {"reason": "bad fan"}), ("/v1/nodes/n2/drain", {"reason": "bad fan"})]
    assert node_changes("n1", ["State=UNDRAIN"]) == [("/v1/nodes/n1/resume", None)]
    for changes, says in ((["State=DRAIN"], "needs Reason"), (["State=DOWN"], "DOWN: not supp"),
                        (["State=odd"], "invalid State=ODD"), (["Weight=3"], "Weight: not supp"),
                        (["Reason=x"], "give State=")):
        with pytest.raises(UsageError, match=says):
            node_changes("n1", changes)
