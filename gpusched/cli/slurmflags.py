"""The Slurm options of squeue, scancel, sinfo and sacct that gqueue, gcancel, ginfo and
gacct do not declare: refused with a message naming the option and why, accepted as
doing what they already do, or handled before the command-line framework parses
(``--usage``, ``-V/--version``). docs/cli.md keeps the table; tests/data/slurm/*.options
list every option of the man pages, and tests/cli/test_slurm_options.py holds each
command to them.

Also the input variables (``GQUEUE_FORMAT``, ``SQUEUE_FORMAT``, ...) that set an option
the command line leaves out.
"""

from __future__ import annotations

import os

from gpusched.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from typing import Any

_FEDERATION = "there is no federation: this cluster runs every job itself"
_YAML = "YAML output is not offered: use --json"
_BATCH = ("--signal goes to the job's whole process group here; the batch shell alone "
          "cannot be signalled")

# Option spelling -> why it is refused.
REFUSED: dict[str, dict[str, str]] = {
    "gqueue": {
        "--federation": _FEDERATION, "--sibling": _FEDERATION, "--yaml": _YAML,
    },
    "gcancel": {
        "--sibling": _FEDERATION,
        "-c": "there are no crontab jobs (scrontab) here",
        "--cron": "there are no crontab jobs (scrontab) here",
        "--wckey": "jobs carry no workload characterisation key (WCKey) here",
        "-b": _BATCH, "--batch": _BATCH,
    },
    "ginfo": {
        "--federation": _FEDERATION, "--yaml": _YAML,
    },
    "gacct": {
        "-c": "there is no job completion log here: gacct reads the database",
        "--completion": "there is no job completion log here: gacct reads the database",
        "-f": "there is no job completion file here: gacct reads the database",
        "--file": "there is no job completion file here: gacct reads the database",
        "-F": "the scheduler does not record which of its passes started a job",
        "--flags": "the scheduler does not record which of its passes started a job",
        "-W": "jobs carry no workload characterisation key (WCKey) here",
        "--wckeys": "jobs carry no workload characterisation key (WCKey) here",
        "--whole-hetjob": "there are no heterogeneous jobs here",
        "-x": "associations are a user and an account here: use -u and -A",
        "--associations": "associations are a user and an account here: use -u and -A",
        "--yaml": _YAML,
    },
    "gcontrol": {
        "--sibling": _FEDERATION, "--yaml": _YAML,
        "-M": "gcontrol acts on this cluster only", "--clusters": "gcontrol acts on this "
        "cluster only",
        "-u": "requests are made as the user who runs gcontrol",
        "--uid": "requests are made as the user who runs gcontrol",
        "-o": "gcontrol show prints KEY=VALUE lines; --json gives each record whole",
        "--oneliner": "gcontrol show prints KEY=VALUE lines; --json gives each record whole",
        "-Q": "gcontrol prints one line for each change and each failure",
        "--quiet": "gcontrol prints one line for each change and each failure",
        "-v": "gcontrol says each change in one line already",
        "--verbose": "gcontrol says each change in one line already",
    },
}
# scontrol's job and node commands gcontrol does not have, each with why.
REFUSED_COMMANDS: dict[str, dict[str, str]] = {
    "gcontrol": {
        "holdu": "a hold placed by root is an administrator's; a job's owner holds it with "
                 "gcontrol hold",
        "uhold": "a hold placed by root is an administrator's; a job's owner holds it with "
                 "gcontrol hold",
        "listpids": "a job's processes are the agent's to know (its cgroup on the node)",
        "pidinfo": "a job's processes are the agent's to know (its cgroup on the node)",
        "notify": "jobs get no messages from the controller here (mail: --mail-type)",
        "wait_job": "gsubmit -W waits for a job it submits; gqueue -j JOB -i shows one",
        "reboot": "nodes are not rebooted by gpusched", "cancel_reboot": "nodes are not "
        "rebooted by gpusched", "power": "nodes are not powered by gpusched",
    },
}

# Option spellings accepted as they are: what Slurm means by them is already what the
# command does here (no hidden partitions, one cluster, memory in MiB), dropped before
# parsing.
ALREADY: dict[str, frozenset[str]] = {
    "gqueue": frozenset({"--hide", "--local", "--noconvert", "-P", "--priority", "-a"}),
    "gcancel": frozenset({"--ctld", "-H", "--hurry", "-f", "--full"}),
    "ginfo": frozenset({"--hide", "--local", "--noconvert", "-a", "--all"}),
    "gacct": frozenset({"--local", "-L", "--allclusters", "--use-local-uid", "--array"}),
    "gcontrol": frozenset({"-a", "--all", "-d", "--details", "-F", "--future", "--hide",
                           "--local"}),
}

# Spellings read as another: --usage is --help; sacct's -h is its --help.
ALIASES: dict[str, dict[str, str]] = {
    "gqueue": {"--usage": "--help", "--array-unique": "--array"},
    "gcancel": {"--usage": "--help", "--jobname": "--name"},
    "ginfo": {"--usage": "--help"},
    "gacct": {"--usage": "--help", "-h": "--help", "--uid": "--user"},
    "gcontrol": {"--usage": "--help", "-h": "--help"},
}
VERSION = ("-V", "--version")


def handled(prog: str) -> frozenset[str]:
    """Every spelling this module answers for ``prog`` (refused, accepted or read as
    another)."""
    return frozenset({*REFUSED.get(prog, {}), *ALREADY.get(prog, ()), *ALIASES.get(prog, {}),
                      *VERSION})


def check_argv(prog: str, argv: Sequence[str], declared: Iterable[str] = ()
               ) -> list[str] | None:
    """``argv`` with the accepted spellings dropped and aliases read; a usage error
    naming a refused one (unless the command ``declared`` it). None: ``-V/--version``
    was asked for and is printed."""
    refused = {k: v for k, v in REFUSED.get(prog, {}).items() if k not in set(declared)}
    already = ALREADY.get(prog, frozenset())
    aliases = ALIASES.get(prog, {})
    out: list[str] = []
    for at, word in enumerate(argv):
        if word == "--":
            return out + list(argv[at:])
        name, eq, value = word.partition("=") if word.startswith("--") else (word, "", "")
        if name in refused:
            raise UsageError(f"{name}: not supported: {refused[name]}")
        if name in VERSION:
            from gpusched import __version__

            print(f"gpusched {__version__}")
            return None
        if name in already:
            continue
        out.append(aliases[name] + eq + value if name in aliases else word)
    return out


def check_command(prog: str, argv: Sequence[str]) -> None:
    """A usage error naming the command (the first word that is not an option) when it
    is one of Slurm's that ``prog`` refuses."""
    refused = REFUSED_COMMANDS.get(prog, {})
    for word in argv:
        if word == "--":
            return
        if not word.startswith("-"):
            if word.lower() in refused:
                raise UsageError(f"{word}: not supported: {refused[word.lower()]}")
            return


def from_environment(given: Mapping[str, object], names: Mapping[str, str],
                     environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The options the input variables set: for each parameter of ``names`` (parameter
    -> variable suffix, such as ``"fmt": "FORMAT"``) the command line left at None,
    ``GQUEUE_FORMAT`` (the command's own) else ``SQUEUE_FORMAT`` (Slurm's), by the
    prefixes ``names`` carries as ``"GQUEUE SQUEUE"`` under the key ``""``."""
    env = os.environ if environ is None else environ
    ours, slurms = names[""].split()
    found: dict[str, str] = {}
    for param, suffix in names.items():
        if not param or given.get(param) is not None:
            continue
        value = env.get(f"{ours}_{suffix}")
        if value is None:
            value = env.get(f"{slurms}_{suffix}")
        if value is not None and value.strip():
            found[param] = value
    return found


def user_names(text: str) -> str:
    """A user list with each uid (``1000``) as its user's name, as squeue, scancel and
    sacct take either; a uid no user has stays as written (it then matches no job)."""
    import pwd

    names = []
    for word in (w.strip() for w in text.split(",")):
        if word.isascii() and word.isdigit() and len(word) <= 10:
            try:
                word = pwd.getpwuid(int(word)).pw_name
            except (KeyError, OverflowError):
                pass
        names.append(word)
    return ",".join(names)


STANDARD_TIME = "%Y-%m-%dT%H:%M:%S"


def time_format() -> str:
    """How listings write a time: ``GPUSCHED_TIME_FORMAT``, else Slurm's
    ``SLURM_TIME_FORMAT``: ``standard`` (the default, ``2026-11-28T14:05:00``) or a
    strftime format (``%d/%m %H:%M``); ``relative`` is taken as standard."""
    value = os.environ.get("GPUSCHED_TIME_FORMAT") or os.environ.get("SLURM_TIME_FORMAT")
    if not value or "%" not in value or len(value) > 128:
        return STANDARD_TIME
    return value


def check_clusters(text: str | None) -> None:
    """``-M/--clusters``: every name must be this cluster's (``all`` too); a usage error
    naming any other."""
    if text is None:
        return
    from gpusched.cli.submission import local_cluster_name

    local = local_cluster_name()
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names or [""]:
        if name != local and name.lower() != "all":
            raise UsageError(f"-M/--clusters: no cluster {name[:64]!r} here: this cluster "
                             f"is {local!r}")


def declared_options(app: Any) -> frozenset[str]:
    """Every option spelling a typer app's command (and its subcommands) declares."""
    from typer.main import get_command

    found: set[str] = set()
    commands = [get_command(app)]
    while commands:
        command = commands.pop()
        found.update(name for param in command.params
                     for name in [*param.opts, *param.secondary_opts]
                     if param.param_type_name == "option")
        commands.extend(getattr(command, "commands", {}).values())
    return frozenset(found)
