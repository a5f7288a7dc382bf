"""Property tests over gsubmit's parsers: valid values round-trip through them; invalid
ones, on the command line or in a directive, end gsubmit with exit code 2 and one line
naming the bad value, before anything reaches the controller."""

from __future__ import annotations

import re
import shlex
import signal
import socket
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpusched.cli import gsubmit
from gpusched.cli.directives import read_directive_lines
from gpusched.cli.jobshape import gpu_request
from gpusched.cli.submission import without_empty_items
from gpusched.core.arrays import parse_array
from gpusched.core.dependency import Dependency, parse_dependency
from gpusched.core.hostlist import expand_hostlist
from gpusched.core.shapes import parse_gres, parse_memory
from gpusched.core.signals import WarnSignal, parse_warn_signal
from gpusched.core.timefmt import format_duration, parse_begin, parse_time_limit

# -- valid values round-trip ----------------------------------------------------------

clause = st.one_of(
    st.just(Dependency("singleton")),
    st.builds(Dependency, st.sampled_from(["afterok", "afternotok", "afterany"]),
              st.lists(st.integers(1, 10**9), min_size=1, max_size=4, unique=True).map(tuple)))


@given(st.lists(clause, min_size=1, max_size=4))
def test_dependencies_round_trip(clauses: list[Dependency]) -> None:
    text = ",".join(c.kind + "".join(f":{i}" for i in c.job_ids) for c in clauses)
    assert parse_dependency(text) == tuple(clauses)


@given(st.sampled_from(["HUP", "INT", "USR1", "USR2", "TERM", "CONT", "URG"]),
       st.integers(0, 65535), st.booleans(), st.sampled_from(["", "SIG"]))
def test_warn_signals_round_trip(name: str, seconds: int, batch_only: bool, prefix: str) -> None:
    text = f"{'B:' if batch_only else 'R:'}{prefix}{name}@{seconds}"
    warn = parse_warn_signal(text)
    assert warn.seconds == seconds and warn.batch_only is batch_only
    assert parse_warn_signal(warn.text()) == warn
    assert parse_warn_signal(name) == WarnSignal(warn.number)  # @60 and the whole job


@given(st.integers(1, signal.NSIG - 1), st.integers(0, 65535), st.booleans())
def test_every_signal_number_round_trips(number: int, seconds: int, batch_only: bool) -> None:
    warn = WarnSignal(number, seconds, batch_only)
    assert parse_warn_signal(warn.text()) == warn


@given(st.integers(0, 400), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_every_time_form_means_its_seconds(days: int, hours: int, minutes: int, secs: int) -> None:
    total = days * 86400 + hours * 3600 + minutes * 60 + secs
    assume(total > 0)
    assert parse_time_limit(f"{days}-{hours}:{minutes}:{secs}") == total
    assert parse_time_limit(f"{days * 24 + hours}:{minutes:02d}:{secs:02d}") == total
    assert parse_time_limit(format_duration(total)) == total


word = st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="\\'\"#"),
               min_size=1, max_size=10)


@given(st.lists(st.lists(word | st.text(" #x'ab", min_size=1, max_size=6), min_size=1,
                         max_size=4), min_size=1, max_size=5),
       st.sampled_from(["#SBATCH", "#GSUB"]), st.booleans())
def test_directives_split_as_a_shell_would(lines: list[list[str]], prefix: str,
                                           comment: bool) -> None:
    """Quoted words (spaces, # and quotes inside) come back whole; a `` #`` after them is
    a comment; the first command ends the block."""
    text = "#!/bin/sh\n" + "".join(
        f"{prefix} {shlex.join(args)}{'  # note' if comment else ''}\n" for args in lines)
    text += f"echo hi\n{prefix} --late\n"
    found = read_directive_lines(text)
    assert [d.args for d in found] == [tuple(args) for args in lines]
    assert [d.line for d in found] == list(range(2, 2 + len(lines)))


# -- invalid values: exit 2, the value named, nothing sent ----------------------------

NOW = datetime.now().astimezone()


def refuses(parse: Callable[[str], object]) -> Callable[[str], bool]:
    def check(text: str) -> bool:
        try:
            parse(text)
        except ValueError:
            return True
        return False
    return check


def commas_after(parse: Callable[[str], object]) -> Callable[[str], object]:
    """``parse`` of a list that may end in commas, as sbatch's lists may ("a," is "a")."""
    return lambda t: parse(t.rstrip().rstrip(",") or t)


# Each flag with the parser whose refusal gsubmit must report.
PARSERS: dict[str, Callable[[str], object]] = {
    "--time": parse_time_limit,
    "--gpus": gpu_request,  # parse_gpus, and a type alone is one GPU of it
    "--gres": commas_after(parse_gres),
    "--mem": parse_memory,
    "--array": lambda t: parse_array(without_empty_items(t)),  # "1," is "1", as in sbatch
    "--begin": lambda t: parse_begin(t, NOW),
    "--signal": parse_warn_signal,
    "--nodelist": commas_after(expand_hostlist),
    "--dependency": commas_after(parse_dependency),
}
junk = st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=14)



def assert_nothing_sent(server: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        server.accept()


def named(text: str, flag: str, stderr: str) -> bool:
    """Whether the one error line names the bad value (a dependency: or its bad clause)."""
    if repr(text) in stderr or repr(text.strip()) in stderr:
        return True  # quoted, as the messages quote values (blank ones too)
    tokens = [text.strip()]
    if flag == "--dependency":
        tokens += [c.strip() for c in re.split(r"[,?]", text)]  # all of, or any of (?)
    return any(t and (t in stderr or repr(t) in stderr) for t in tokens)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(st.sampled_from(sorted(PARSERS)), junk)
def test_bad_values_on_the_command_line(listener: socket.socket, capsys: pytest.CaptureFixture[str],
                                        flag: str, text: str) -> None:
    assume(refuses(PARSERS[flag])(text))
    code = gsubmit.main([f"{flag}={text}", "--wrap", "true"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("gsubmit: error: ")
    assert named(text, flag, err), err
    assert_nothing_sent(listener)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
@given(st.sampled_from(sorted(PARSERS)), junk.filter(lambda t: "'" not in t and "#" not in t),
       st.integers(0, 3))
def test_bad_values_in_directives(listener: socket.socket, capsys: pytest.CaptureFixture[str],
                                  flag: str, text: str, blank: int) -> None:
    assume(refuses(PARSERS[flag])(text) and text.strip() == text)
    script = Path("job.sh")
    script.write_text("#!/bin/sh\n" + "#\n" * blank + f"#SBATCH {flag}='{text}'\ntrue\n")
    code = gsubmit.main([str(script)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"line {blank + 2}: #SBATCH" in err and named(text, flag, err), err
    assert_nothing_sent(listener)


@given(st.lists(st.integers(1, 10**9), min_size=1, max_size=6))
def test_a_job_named_twice_in_a_dependency_counts_once(ids: list[int]) -> None:
    (parsed,) = parse_dependency("afterany" + "".join(f":{i}" for i in ids + ids))
    assert parsed.job_ids == tuple(dict.fromkeys(ids))
