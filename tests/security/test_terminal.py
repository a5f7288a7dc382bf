"""A hostile value already in the database reaches no other user's terminal raw.

Submissions refuse control and bidi characters, so the value is written into the
jobs table directly, as a row from before that check (or from anything else that
writes the database) would hold it. The bystander then lists it with every command that
shows it, to a pipe and to a terminal (a pseudo-terminal from util-linux ``script``,
where the tables are drawn by rich)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess

import psycopg
import pytest

from tests.e2e.cluster import BIN, Cluster, wait_for
from tests.security.conftest import LocalUser, run_as

# An OSC window title (ending in BEL), a screen clear, a one-character C1 CSI, a bidi
# override and rich markup.
HOSTILE = "rep\x1b]0;pwned\x07ort\x1b[2J\x9b31m\u202ehs.txt[bold]big[/bold]"
SHOWN = "rep\\x1b]0;pwned\\x07ort\\x1b[2J\\x9b31m\\u202ehs.txt[bold]big[/bold]"
# What a terminal may receive: rich's own styles (SGR sequences), nothing else.
SGR = re.compile(r"\x1b\[[0-9;]*m")


def assert_clean(text: str, *, styled: bool = False) -> None:
    """No character of ``text`` acts on a terminal (rich's styles allowed if ``styled``)."""
    bare = SGR.sub("", text) if styled else text
    for raw in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert raw not in bare, (raw, text)
    assert all(c.isprintable() or c in "\n\r" for c in bare), text


@pytest.fixture
def hostile_job(cluster: Cluster, db_url: str,
                attackers: tuple[LocalUser, LocalUser]) -> int:
    """A running job of mallory's whose stored name is HOSTILE."""
    mallory, _ = attackers
    submitted = run_as(mallory, [str(BIN / "gsubmit"), "--parsable", "-J", "plain",
                                 "--wrap", "touch started-$SLURM_JOB_ID; sleep 300"],
                       env=cluster.env, cwd=cluster.work)
    assert submitted.returncode == 0, submitted
    job_id = int(submitted.stdout.strip())
    cluster.wait_state(job_id, "RUNNING")
    # Changed only once it runs: the agent refuses a launch order with such a name.
    wait_for((cluster.work / f"started-{job_id}").exists, what="the job to start")
    with psycopg.connect(db_url.replace("postgresql+psycopg", "postgresql"),
                         autocommit=True) as db:
        updated = db.execute("UPDATE jobs SET name = %s WHERE id = %s", (HOSTILE, job_id))
        assert updated.rowcount == 1
    assert cluster.job(job_id)["name"] == HOSTILE
    return job_id


def commands(job_id: int) -> list[tuple[list[str], str, str]]:
    """Each command that shows the name, with what it must show of it through a pipe
    and on a 250-column terminal: all of it, or its start where a table cuts it to fit
    80 columns."""
    cut = SHOWN[:len("rep\\x1")]
    return [(["gqueue"], cut, SHOWN), (["gqueue", "--all"], cut, SHOWN),
            (["gqueue", "-o", "%.8i %.20j %u %R"], SHOWN[:20], SHOWN[:20]),
            (["gqueue", "-o", "%j"], SHOWN, SHOWN),
            (["gqueue", "--start"], "", ""),  # lists pending jobs only
            (["gcontrol", "show", "job", str(job_id)], f" Name={SHOWN}", f" Name={SHOWN}"),
            # Another's jobs: with -a (-j), as sacct shows a user only their own by default.
            (["gacct", "-a"], cut, SHOWN), (["gacct", "-j", str(job_id)], cut, SHOWN)]


def test_a_bystander_sees_the_name_escaped_through_a_pipe(
        cluster: Cluster, attackers: tuple[LocalUser, LocalUser], hostile_job: int) -> None:
    _, alice = attackers
    for argv, shown, _ in commands(hostile_job):
        result = run_as(alice, [str(BIN / argv[0]), *argv[1:]], env=cluster.env,
                        cwd=cluster.work)
        assert result.returncode == 0, (argv, result)
        assert_clean(result.stdout)
        assert_clean(result.stderr)
        assert shown in result.stdout, (argv, result.stdout)


def test_a_bystander_sees_the_name_escaped_on_a_terminal(
        cluster: Cluster, attackers: tuple[LocalUser, LocalUser], hostile_job: int) -> None:
    _, alice = attackers
    env = {**cluster.env, "TERM": "xterm-256color", "COLUMNS": "250"}
    env.pop("NO_COLOR", None)
    drawn = 0
    for argv, _, shown in commands(hostile_job):
        line = shlex.join([str(BIN / argv[0]), *argv[1:]])
        result = run_as(alice, ["script", "--quiet", "--return", "--command", line,
                                "/dev/null"], env=env, cwd=cluster.work)
        assert result.returncode == 0, (argv, result)
        assert_clean(result.stdout, styled=True)
        drawn += bool(SGR.search(result.stdout))  # rich drew a table: the terminal path
        assert shown in SGR.sub("", result.stdout), (argv, result.stdout)
    assert drawn >= 3, "no command drew a rich table: the terminal path was not taken"


def test_json_output_is_exact_and_holds_no_raw_control(
        cluster: Cluster, attackers: tuple[LocalUser, LocalUser], hostile_job: int) -> None:
    _, alice = attackers
    for argv, names in [
        (["gqueue", "--json"], lambda out: [j["name"] for j in out["jobs"]]),
        (["gcontrol", "show", "job", str(hostile_job), "--json"], lambda out: [out["name"]]),
        (["gacct", "-a", "--json"], lambda out: [j["name"] for j in out["jobs"]]),
    ]:
        result = run_as(alice, [str(BIN / argv[0]), *argv[1:]], env=cluster.env,
                        cwd=cluster.work)
        assert result.returncode == 0, (argv, result)
        assert_clean(result.stdout)
        assert "\\u001b]0;pwned" in result.stdout and "\\u202e" in result.stdout
        assert names(json.loads(result.stdout)) == [HOSTILE], argv


def test_errors_echoing_a_value_are_escaped(
        cluster: Cluster, attackers: tuple[LocalUser, LocalUser], hostile_job: int) -> None:
    """The error printer escapes what a message quotes, from the controller or from the
    command line; a refused cancel of another user's job says nothing raw either."""
    _, alice = attackers
    for argv, needle in [
        (["gcontrol", "show", "node", "n\x1b]0;x\x07\u202e"], "n\\x1b]0;x\\x07\\u202e"),
        (["gqueue", "-p", "p\x9b2J"], None),
        (["gcancel", str(hostile_job)], str(hostile_job)),
    ]:
        result = run_as(alice, [str(BIN / argv[0]), *argv[1:]], env=cluster.env,
                        cwd=cluster.work)
        assert_clean(result.stdout)
        assert_clean(result.stderr)
        if needle is not None:
            assert result.returncode != 0, (argv, result)
            assert len(result.stderr.splitlines()) == 1 and needle in result.stderr, result
    assert cluster.job(hostile_job)["state"] == "RUNNING"


def test_the_pseudo_terminal_passes_raw_escapes_through() -> None:
    """The terminal test above can fail: through ``script``, what a command prints raw
    arrives raw."""
    result = subprocess.run(["script", "--quiet", "--return", "--command",
                             "printf 'a\\033]0;t\\007b'", "/dev/null"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result
    assert "\x1b]0;t\x07" in result.stdout
