"""galloc: get an allocation and run a command on this host with its variables, as
salloc does. ``gsrun`` run from that command starts steps on the allocation; when the
command exits, the allocation ends with its exit status.

Started by people at a prompt: no typer, no rich (tests/cli/test_cli_imports.py).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import NoReturn

from gpusched.cli.allocation import (
    Allocation,
    Interrupted,
    Revoked,
    allocation_body,
    exit_status,
    shape_environment,
)
from gpusched.cli.optionwalk import walk_options
from gpusched.cli.output import print_error
from gpusched.cli.shell import job_dir
from gpusched.core import bounds
from gpusched.errors import GpuschedError, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import FrameType
    from typing import Any

PROG = "galloc"
USAGE = """\
Usage: galloc [OPTIONS] [COMMAND [ARGS]...]

Get an allocation (a job that runs no script), then run COMMAND here (default: your
$SHELL) with the job's variables (SLURM_JOB_ID, SLURM_JOB_NODELIST...), so that gsrun
from it runs steps on the allocation, as salloc does. When COMMAND exits the allocation
ends with its exit status; galloc exits with it.

Options:
  -N, --nodes N              Nodes (default 1).
  -n, --ntasks N             Tasks (shown to COMMAND as SLURM_NTASKS).
      --ntasks-per-node N    Tasks on each node.
  -c, --cpus-per-task N      CPUs for each task.
  -G, --gpus [TYPE:]N        GPUs in all.
      --gpus-per-node [TYPE:]N
                             GPUs on each node.
      --gpus-per-task [TYPE:]N
                             GPUs for each task.
      --mem SIZE             Memory on each node: 4096 (MiB), 512M, 64G, 1T.
  -t, --time TIME            Time limit: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S or UNLIMITED.
  -p, --partition P[,P...]   Partition (default: the default one).
  -A, --account ACCOUNT      Account to charge.
  -q, --qos QOS              Quality of service.
  -J, --job-name NAME        Job name (default: the command's name).
      --exclusive            Whole nodes, shared with no other job.
  -w, --nodelist NODES       Exactly these nodes.
  -x, --exclude NODES        Never these nodes.
  -C, --constraint LIST      Node features the nodes need (a&b, a|b, [a|b], [a*2&b*1]).
      --reservation NAME     Run in this advance reservation (gcontrol show reservation).
      --begin TIME           Not before TIME (now+1hour, 16:00, 2026-12-24T18:30).
  -D, --chdir DIR            The job's working directory (default: the current one).
  -v, --verbose              Say more.
  -h, --help                 Show this message and exit.
"""

# option -> (key, kind): kind "flag", "int:LIMIT" or "str"
_LONG: dict[str, tuple[str, str]] = {
    "--nodes": ("nodes", f"int:{bounds.MAX_NODES}"),
    "--ntasks": ("ntasks", "int:65536"),
    "--ntasks-per-node": ("ntasks_per_node", "int:65536"),
    "--cpus-per-task": ("cpus_per_task", f"int:{bounds.MAX_CPUS}"),
    "--gpus": ("gpus", "str"),
    "--gpus-per-node": ("gpus_per_node", "str"),
    "--gpus-per-task": ("gpus_per_task", "str"),
    "--mem": ("mem", "str"),
    "--time": ("time", "str"),
    "--partition": ("partition", "str"),
    "--account": ("account", "str"),
    "--qos": ("qos", "str"),
    "--job-name": ("job_name", "str"),
    "--exclusive": ("exclusive", "flag"),
    "--nodelist": ("nodelist", "str"),
    "--exclude": ("exclude", "str"),
    "--constraint": ("constraint", "str"),
    "--reservation": ("reservation", "str"),
    "--begin": ("begin", "str"),
    "--chdir": ("chdir", "str"),
    "--verbose": ("verbose", "flag"),
    "--help": ("help", "flag"),
}
_SHORT = {"-N": "--nodes", "-n": "--ntasks", "-c": "--cpus-per-task", "-G": "--gpus",
          "-t": "--time", "-p": "--partition", "-A": "--account", "-q": "--qos",
          "-J": "--job-name", "-w": "--nodelist", "-x": "--exclude", "-C": "--constraint", "-D": "--chdir",
          "-v": "--verbose", "-h": "--help"}


def entry() -> NoReturn:
    """The ``galloc`` console script."""
    code = main(sys.argv[1:])
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 1
    os._exit(code)


def parse_args(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """``argv`` as galloc's options (by key; those not given are absent) and the
    command (options first, then the command, untouched)."""
    options: dict[str, Any] = {}

    def take(name: str, shown: str, value: str | None, rest: list[str],
             attached: bool) -> None:
        _take(options, name, shown, value, rest, attached)

    rest = walk_options(argv, _LONG, _SHORT, take, "galloc", lambda: bool(options.get("help")))
    return options, rest


def _take(options: dict[str, Any], name: str, shown: str, value: str | None,
          rest: list[str], attached: bool) -> None:
    key, kind = _LONG[name]
    if kind == "flag":
        if attached:
            raise UsageError(f"{shown} takes no value")
        options[key] = True
        return
    if value is None:
        if not rest:
            raise UsageError(f"{shown} expects a value")
        value = rest.pop(0)
    if not value or "\0" in value:
        raise UsageError(f"{shown}: expected a value, got {value!r:.80}")
    if kind.startswith("int:"):
        high = int(kind[4:])
        digits = value.strip()
        if not (digits.isascii() and digits.isdigit()) or len(digits) > 20 \
                or not 1 <= int(digits) <= high:
            raise UsageError(f"{shown}: expected a whole number from 1 to {high}, got "
                             f"{value!r:.40}")
        options[key] = int(digits)
    else:
        options[key] = value


def main(argv: list[str], environ: Mapping[str, str] | None = None) -> int:
    """Run ``galloc ARGV``; the exit status."""
    env = dict(os.environ if environ is None else environ)
    try:
        options, command = parse_args(argv)
        if options.get("help"):
            sys.stdout.write(USAGE)
            return 0
        command = command or [env.get("SHELL") or "/bin/sh"]
        name = options.get("job_name") or os.path.basename(command[0])[:bounds.MAX_NAME] \
            or "interactive"
        submit_dir = job_dir(None)
        body = allocation_body(options, name, job_dir(options.get("chdir")),
                               shape_environment(options))
        allocation = Allocation(PROG, bool(options.get("verbose")))
        allocation.obtain(body, announce_pending=True)
    except Interrupted:
        return 1  # cancelled, and said so
    except Revoked as err:
        print_error(PROG, err.message)
        return 1
    except GpuschedError as err:
        print_error(PROG, err.message)
        return err.exit_code
    env.update(shape_environment(options))
    env.update(allocation.variables(submit_dir))
    return run_command(allocation, command, env)


def run_command(allocation: Allocation, command: list[str], env: dict[str, str]) -> int:
    """Run ``command`` in the allocation (heartbeats meanwhile), then end the allocation
    with its status; the status. Ctrl-C and Ctrl-\\ are the command's (it shares the
    terminal); SIGTERM or SIGHUP to galloc hang the command up and end the
    allocation."""
    import subprocess

    allocation.keep_alive()
    old = {sig: signal.signal(sig, handler) for sig, handler in (
        (signal.SIGINT, _ignored), (signal.SIGQUIT, _ignored),
        (signal.SIGTERM, _relinquish), (signal.SIGHUP, _relinquish))}
    child: subprocess.Popen[bytes] | None = None
    try:
        try:
            # Caught signals return to their defaults in the child when it execs.
            child = subprocess.Popen(command, env=env)
        except OSError as err:
            print_error(PROG, f"cannot run {command[0]!r:.200}: {err.strerror or err}")
            status = 127 if isinstance(err, FileNotFoundError) else 126
        else:
            status = exit_status(child.wait())
    except Interrupted as stop:
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGHUP)  # as a terminal's hang-up would
        status = 128 + stop.signum
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    allocation.finish(status)
    return status


def _ignored(signum: int, frame: FrameType | None) -> None:
    """The command in the foreground has it; galloc goes on waiting."""


def _relinquish(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)
