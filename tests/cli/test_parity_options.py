"""sbatch's forms and flags that real batch scripts use (docs/cli.md, "sbatch forms"):
each accepted on the command line and in a directive, by both of gsubmit's parsers (the
quick one and typer), with its value reaching the submission; each refusal one line
naming the option, exit 2, nothing sent to the controller. The hypothesis test at the
end holds every option of gsubmit's option table to that: its value reaches the job, a
warning says why it changes nothing, or it is refused naming it."""

from __future__ import annotations

import shlex
import socket
from collections.abc import Sequence
from pathlib import Path

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.main import get_command

from gpusched.cli import gsubmit
from gpusched.cli.common import use_light_coercion
from gpusched.cli.console import quick_gsubmit
from gpusched.cli.directives import sbatch_spellings
from gpusched.cli.optiontables import GSUBMIT
from gpusched.cli.quickparse import Declined, QuickArgs, quick_parse
from gpusched.cli.submission import Submission, resolve_submission
from gpusched.config import parse_config
from gpusched.errors import ConfigError, UsageError


def typer_submission(args: Sequence[str]) -> Submission:
    """The submission typer's path makes of ``args`` (as gsubmit.main reads them)."""
    command = get_command(gsubmit.app)
    use_light_coercion(command)
    try:
        with command.make_context("gsubmit", sbatch_spellings(list(args))) as ctx:
            return gsubmit.resolve_submission(ctx)  # type: ignore[arg-type]
    except typer.TyperException as err:  # as gsubmit.main reports it
        raise UsageError(err.format_message()) from None


def quick_submission(args: Sequence[str]) -> Submission:
    """The submission of the quick path (raises Declined where typer must parse)."""

    def options(line: list[str]) -> QuickArgs:
        return quick_parse(GSUBMIT, line)

    return resolve_submission(quick_parse(GSUBMIT, list(args)), options)


def submission(args: Sequence[str]) -> Submission:
    """What gsubmit makes of ``args``, the same by both parsers where the quick one
    takes them."""
    slow = typer_submission(args)
    try:
        fast = quick_submission(args)
    except Declined:
        return slow
    assert fast == slow
    return slow


def script(*directives: str) -> str:
    Path("job.sh").write_text("#!/bin/sh\n" + "".join(f"#SBATCH {d}\n" for d in directives)
                              + "true\n")
    return "job.sh"


def refused(args: Sequence[str], server: socket.socket, capsys: pytest.CaptureFixture[str],
            *named: str) -> str:
    """Run gsubmit (the console's quick path, then typer as it falls back): exit 2, one
    error line naming each of ``named``, nothing sent. Returns the line."""
    for run in (quick_gsubmit, gsubmit.main):
        code = run(list(args))
        err = capsys.readouterr().err
        assert code == 2, err
        assert len(err.strip().splitlines()) == 1 and err.startswith("gsubmit: error: "), err
        assert all(name in err for name in named), err
        with pytest.raises(BlockingIOError):
            server.accept()
    return err


# -- the parsing forms ----------------------------------------------------------------


def test_a_trailing_comma_ends_an_array_list(listener: socket.socket,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert submission(["--array=1,", "--wrap", "x"]).array == "1"
    assert submission(["-a", "1,3,%2", "--wrap", "x"]).array == "1,3%2"
    assert submission([script("--array=4-5,")]).array == "4-5"
    refused(["--array=,", "--wrap", "x"], listener, capsys, "--array", "','")


def test_other_lists_may_end_in_a_comma(listener: socket.socket,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    sub = submission(["--gres=gpu:a100:2,", "--mail-type=END,FAIL,", "-w", "n[1-2],",
                      "-x", "n3,", "-d", "afterok:5:6,", "--wrap", "x"])
    assert (sub.gpus, sub.gpu_types, sub.mail_types) == (4, ("a100",), ("END", "FAIL"))  # 2 nodes
    assert (sub.nodelist, sub.exclude, sub.dependency) == (("n1", "n2"), ("n3",), "afterok:5:6")
    sub = submission([script("--gres=gpumem:8g,", "--dependency=singleton,")])
    assert (sub.gpu_mem_mb, sub.dependency) == (8192, "singleton")
    for flag in ("--gres", "--nodelist", "--dependency"):
        refused([f"{flag}=,", "--wrap", "x"], listener, capsys, flag, "','")
    refused(["--mail-type=,", "--wrap", "x"], listener, capsys, "--mail-type")
    refused(["--gres=gpu:a100:x,", "--wrap", "x"], listener, capsys, "--gres", "'gpu:a100:x'")


def test_a_gpu_type_alone_is_one_gpu_of_it(listener: socket.socket) -> None:
    sub = submission(["--gpus-per-node=v100", "--wrap", "x"])
    assert (sub.gpus, sub.gpu_types) == (1, ("v100",))
    sub = submission(["-G", "a100|H100", "--wrap", "x"])
    assert (sub.gpus, sub.gpu_types) == (1, ("a100", "h100"))
    sub = submission(["-N", "2", "--gpus-per-task=1g.10gb", "--wrap", "x"])
    assert (sub.gpus, sub.gpu_types) == (2, ("1g.10gb",))
    sub = submission([script("--gpus-per-node=l4")])
    assert (sub.gpus, sub.gpu_types) == (1, ("l4",))
    assert submission(["--gpus-per-node=v100:3", "--wrap", "x"]).gpus == 3


def test_the_last_of_a_repeated_option_wins(listener: socket.socket) -> None:
    assert submission(["--gpus", "1", "--gpus", "3", "--wrap", "x"]).gpus == 3
    assert submission(["-G", "a100:2", "--gpus=4", "--wrap", "x"]).gpu_types == ()
    assert submission([script("--gpus=1", "--gpus=2")]).gpus == 2
    assert submission([script("--gpus=1 --gpus=2 -t 5 -t 7")]).time_limit == 7 * 60
    # The command line wins over any directive, as in sbatch.
    assert submission(["-G", "1", script("--gpus=2", "--gpus=3")]).gpus == 1


def test_gpu_memory_beside_one_gpu(listener: socket.socket) -> None:
    for args in (["--gres=gpumem:20g", "-G", "1", "--wrap", "x"],
                 [script("--gres=gpumem:20g", "-G 1")], ["-G", "1", script("--gres=gpumem:20g")]):
        sub = submission(args)
        assert (sub.gpus, sub.gpu_mem_mb) == (1, 20 * 1024)


# -- the flags ------------------------------------------------------------------------


def test_nice_is_an_adjustment(listener: socket.socket,
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert submission(["--nice", "--wrap", "x"]).nice == 100  # sbatch's default
    assert submission(["--nice=10", "--wrap", "x"]).nice == 10
    assert submission(["--nice=-5", "--wrap", "x"]).nice == -5  # the controller judges it
    assert submission([script("-J a", "--nice=7")]).nice == 7
    assert submission(["--wrap", "x"]).nice is None
    err = refused([script("-J a", "--nice=ten")], listener, capsys, "--nice", "'ten'")
    assert "line 3: #SBATCH" in err
    refused(["--nice=99999999999", "--wrap", "x"], listener, capsys, "--nice")
    # After the script, it is the script's argument.
    assert typer_submission([script(), "--nice=3"]).args == ("--nice=3",)


def test_clusters_take_this_cluster_only(listener: socket.socket,
                                         capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    base = submission(["--wrap", "x"])
    for args in (["-M", "gpusched", "--wrap", "x"], ["--clusters=gpusched,", "--wrap", "x"]):
        assert submission(args) == base  # submitting here is what it asks for
    assert submission([script("-M gpusched")]).ignored == ()
    refused(["-M", "other", "--wrap", "x"], listener, capsys, "-M/--clusters", "'other'",
            "'gpusched'")
    refused(["-M", "gpusched,other", "--wrap", "x"], listener, capsys, "'other'")
    refused([script("--clusters=x")], listener, capsys, "line 2: #SBATCH", "'x'")
    config = Path("gpusched.toml")
    config.write_text('cluster_name = "alpha"\n')
    monkeypatch.setenv("GPUSCHED_CONFIG", str(config))
    assert submission(["-M", "alpha", "--wrap", "x"]).ignored == ()
    with pytest.raises(UsageError, match="this cluster is 'alpha'"):
        typer_submission(["-M", "gpusched", "--wrap", "x"])


def test_the_daemons_read_the_same_cluster_name() -> None:
    assert parse_config({}, "t").cluster_name == "gpusched"
    assert parse_config({"cluster_name": "alpha"}, "t").cluster_name == "alpha"
    with pytest.raises(ConfigError, match="cluster_name: expected a cluster name"):
        parse_config({"cluster_name": 5}, "t")


def test_overcommit_takes_one_cpu_per_node(listener: socket.socket) -> None:
    assert submission(["-n", "8", "--wrap", "x"]).cpus == 8
    assert submission(["--overcommit", "-n", "8", "--wrap", "x"]).cpus == 1
    assert submission(["-O", "-n", "8", "-c", "2", "--wrap", "x"]).cpus == 2
    assert submission([script("--overcommit", "--ntasks-per-node=4")]).cpus == 1
    sub = submission(["--overcommit", "--wrap", "x"])  # no CPUs counted: said so
    assert sub.cpus == 0 and "--overcommit" in sub.ignored[0]


def test_mincpus_is_a_floor_on_each_node(listener: socket.socket,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert submission(["--mincpus", "4", "--wrap", "x"]).cpus == 4
    assert submission(["--mincpus=4", "-n", "8", "--wrap", "x"]).cpus == 8
    assert submission([script("--mincpus=6", "-n 2")]).cpus == 6
    assert submission(["--mincpus=6", "-O", "-n", "9", "--wrap", "x"]).cpus == 6
    refused(["--mincpus=0", "--wrap", "x"], listener, capsys, "--mincpus")


def test_no_kill_on_one_node_is_said_to_change_nothing(
        listener: socket.socket, capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["-k", "--wrap", "x"], ["--no-kill", "--wrap", "x"],
                 ["--no-kill=on", "--wrap", "x"], [script("-k")]):
        (warning,) = submission(args).ignored
        assert "--no-kill" in warning and "one node" in warning
    assert submission(["--no-kill=off", "--wrap", "x"]).ignored == ()
    refused(["-k", "-N", "2", "--wrap", "x"], listener, capsys, "-k/--no-kill", "2 nodes")
    refused([script("-N 2", "--no-kill")], listener, capsys, "line 3: #SBATCH", "--no-kill")


def test_get_user_env_is_said_to_change_nothing(
        listener: socket.socket, capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["--get-user-env", "--wrap", "x"], ["--get-user-env=10L", "--wrap", "x"],
                 [script("--get-user-env=S")]):
        (warning,) = submission(args).ignored
        assert "--get-user-env" in warning and "--export" in warning
    refused(["--get-user-env=soon", "--wrap", "x"], listener, capsys, "--get-user-env")


def test_exclusive_user_is_refused(listener: socket.socket,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert submission(["--exclusive", "--wrap", "x"]).exclusive is True
    for mode in ("user", "mcs", "topo"):
        refused([f"--exclusive={mode}", "--wrap", "x"], listener, capsys,
                f"--exclusive={mode}", "not supported")
    refused([script("--exclusive=user")], listener, capsys, "line 2: #SBATCH",
            "--exclusive=user")
    refused(["--exclusive=all", "--wrap", "x"], listener, capsys, "--exclusive")


def test_a_node_range_runs_on_its_minimum(listener: socket.socket,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    sub = submission(["-N", "2-4", "-G", "4", "--wrap", "x"])
    assert (sub.nodes, sub.gpus) == (2, 4)
    assert sub.ignored == ("--nodes 2-4: the job runs on 2 node(s), the range's minimum",)
    sub = submission([script("--nodes=3-3", "--gpus-per-node=1")])
    assert (sub.nodes, sub.gpus) == (3, 3)
    assert submission(["-N", "2", "--wrap", "x"]).ignored == ()
    for bad in ("4-2", "0", "0-2", "x", "2-", "-2"):
        refused([f"--nodes={bad}", "--wrap", "x"], listener, capsys, "--nodes", repr(bad))


# -- every option of the table --------------------------------------------------------

# Values a real script gives each option; any text at all is tried too.
SAMPLES = {
    "gpus": ["2", "a100:1", "v100"], "gres": ["gpu:2", "mps:50", "gpumem:10g"],
    "gpu_mem": ["10G"], "nodes": ["2", "1-3"], "gpus_per_node": ["2", "l4"],
    "gpus_per_task": ["1"], "mem": ["4G"], "mem_per_gpu": ["2G"], "mem_per_cpu": ["1G"],
    "time_limit": ["10", "1-00:00:00"], "nodelist": ["node[01-02]"], "exclude": ["node3"],
    "warn_signal": ["B:USR1@90"], "gres_flags": ["enforce-binding"], "export": ["NONE"],
    "begin": ["now+1h"], "dependency": ["afterok:12", "singleton"], "array": ["0-9%2", "1,"],
    "mail_type": ["END"], "mail_user": ["ada"], "clusters": ["gpusched", "elsewhere"],
}
# Values that ask for what a job gets without the option.
NEUTRAL = {"cpus_per_gpu": {"0"}, "gpus": {"0"}, "gpus_per_node": {"0"}, "gpus_per_task": {"0"}, "nodes": {"1", "1-1"}, "mem": {"0"},
           "mem_per_gpu": {"0"}, "mem_per_cpu": {"0"}, "export": {"ALL"}, "mincpus": {"1"}}
# Not the job's: where it goes (stdout), or whether it is only tried (--test-only).
ACTIONS = {"test_only"}
OPTION_NAMES: dict[str, list[str]] = {}
for _name, (_param, _kind, _extra) in GSUBMIT.options.items():
    OPTION_NAMES.setdefault(_param, []).append(_name)
OPTION_NAMES["nice_adjustment"].append("--nice")  # --nice=ADJ, as sbatch_spellings reads it


@st.composite
def option_and_value(draw: st.DrawFn) -> tuple[str, str, list[str]]:
    name = draw(st.sampled_from(sorted(GSUBMIT.options)))
    param, kind, _extra = GSUBMIT.options[name]
    if kind == "flag":
        return param, name, [name]
    value = draw(st.sampled_from(SAMPLES.get(param, ["2"]))
                 | st.integers(-3, 300).map(str)
                 | st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1,
                           max_size=10))
    return param, name, [f"{name}={value}"] if name.startswith("--") else [name, value]


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option_and_value(), st.booleans())
def test_every_option_reaches_the_job_or_says_why_not(
        listener: socket.socket, case: tuple[str, str, list[str]], in_directive: bool) -> None:
    param, name, args = case
    if param in ("wrap", "script") or param in ACTIONS:
        return
    base = ["-G", "1"] if param in ("cpus_per_gpu", "mem_per_gpu") else []  # per GPU: one
    try:
        if in_directive:
            line = " ".join(shlex.quote(a) for a in args)
            sub = typer_submission([*base, script(line)])
        else:
            sub = typer_submission([*base, *args, "--wrap", "x"])
    except UsageError as err:
        assert any(n in err.message for n in OPTION_NAMES[param]), (args, err.message)
        return
    default = typer_submission([*base, script()] if in_directive else [*base, "--wrap", "x"])
    if in_directive:  # the script's text holds the directive: the rest must differ
        default.script = sub.script
    if param == "clusters":  # this cluster's own name: submitting here is what it asks
        assert sub == default
        return
    if sub == default and args[-1].rpartition("=")[2] in NEUTRAL.get(param, ()):
        return  # what a job gets without it
    warned = [w for w in sub.ignored if any(n in w for n in OPTION_NAMES[param])]
    assert sub != default or warned, (args, sub)
