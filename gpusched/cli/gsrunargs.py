"""gsrun's command line, parsed as srun's is: options first, then the command and its
arguments, untouched (``gsrun -N2 python train.py -N 5``: the second ``-N`` is the
program's). Short options group (``-lK``, ``-lN2``), long ones take ``--opt=value`` or
``--opt value``, ``--`` ends the options.

Pure: no environment, no I/O. Every fault is one UsageError naming the option.
"""

from __future__ import annotations

from gpusched.cli.optionwalk import walk_options
from gpusched.core import bounds
from gpusched.errors import UsageError

# gpusched.core.steps.MAX_TASKS_PER_STEP (tests/cli/test_gsrun.py holds them equal):
# that module's dataclasses would cost gsrun's every start tens of milliseconds.
MAX_TASKS_PER_STEP = 65_536

USAGE = """\
Usage: gsrun [OPTIONS] COMMAND [ARGS]...

Run COMMAND as a step of the job gsrun runs in (as srun does in a batch script): one
task per node of the job by default, each with its rank variables (SLURM_PROCID,
RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT...) and its GPUs. The tasks'
output comes back here; gsrun exits with the worst task's status.

Outside a job, gsrun first gets an allocation for the step, as srun does: -N, -n,
--ntasks-per-node, -c, --gpus-per-task and -J shape it too, and these options only
there (its end comes with the step's, with the step's status):
  -G, --gpus [TYPE:]N        GPUs in all.      --gpus-per-node [TYPE:]N  GPUs per node.
      --mem SIZE             Memory per node.  -t, --time TIME  Time limit.
  -p, --partition P          -A, --account A   -q, --qos Q      --exclusive
  -w, --nodelist NODES       -x, --exclude NODES
      --reservation NAME     An advance reservation to run in (gcontrol show reservation).

Options:
  -N, --nodes N              Nodes of the job to run on (default: all of them).
  -n, --ntasks N             Tasks in all (default: $SLURM_NTASKS, the job's or
                             allocation's -n, unless -N or --ntasks-per-node is
                             given; else one per node).
      --ntasks-per-node N    Tasks on each node.
      --gpus-per-task N      GPUs of its node for each task (default: every task of a node
                             sees all the job's GPUs there).
  -c, --cpus-per-task N      CPUs for each task.
      --exact                Hold only the CPUs and GPUs asked for, so that other steps can
                             run beside this one.
      --overlap              Share CPUs and GPUs that other running steps hold.
  -l, --label                Prefix each line of output with its task id ("3: ...").
  -u, --unbuffered           Show output as it comes, not a whole line at a time (the
                             lines of different tasks may then mix).
  -o, --output PATTERN       Write each task's stdout to a file (%t task, %n node index,
                             %N node name, %j job, %s step, %u user, %x job name, %%),
                             relative to the working directory; stderr too unless -e.
  -e, --error PATTERN        Write each task's stderr to a file (same patterns).
  -i, --input none|FILE      Task input: none, or a file (default: task 0 reads gsrun's
                             standard input).
  -K, --kill-on-bad-exit     End the step when a task exits non-zero.
  -J, --job-name NAME        The step's name (default: the command's name).
  -D, --chdir DIR            The tasks' working directory (default: the current one).
      --export ALL|NONE|LIST The tasks' environment: ALL (gsrun's, the default), NONE, or
                             NAME[=VALUE],... (ALL,NAME=VALUE adds to gsrun's).
      --jobid ID             Run in this job (default: $SLURM_JOB_ID).
      --pty                  Run one task on a terminal of its own, with gsrun's terminal
                             passed through (raw: keys, Ctrl-C, window size); one task
                             on the job's first node unless -N/-n say otherwise.
  -v, --verbose              Say what gsrun does.
  -h, --help                 Show this message and exit.
"""

# option -> (field, kind); kind "flag" or "int:LIMIT" or "str"
_LONG: dict[str, tuple[str, str]] = {
    "--nodes": ("nodes", f"int:{bounds.MAX_NODES}"),
    "--ntasks": ("ntasks", f"int:{MAX_TASKS_PER_STEP}"),
    "--ntasks-per-node": ("ntasks_per_node", f"int:{MAX_TASKS_PER_STEP}"),
    "--gpus-per-task": ("gpus_per_task", f"int:{bounds.MAX_GPUS}"),
    "--cpus-per-task": ("cpus_per_task", f"int:{bounds.MAX_CPUS}"),
    "--exact": ("exact", "flag"),
    "--overlap": ("overlap", "flag"),
    "--label": ("label", "flag"),
    "--unbuffered": ("unbuffered", "flag"),
    "--output": ("output", "str"),
    "--error": ("error", "str"),
    "--input": ("input", "str"),
    "--kill-on-bad-exit": ("kill_on_bad_exit", "flag"),
    "--job-name": ("name", "str"),
    "--chdir": ("chdir", "str"),
    "--export": ("export", "str"),
    "--jobid": ("jobid", f"int:{bounds.MAX_JOB_ID}"),
    "--pty": ("pty", "flag"),
    "--verbose": ("verbose", "flag"),
    "--help": ("help", "flag"),
}
# The allocation's options (gsrun outside a job), kept in GsrunArgs.allocation by key.
_ALLOCATION_LONG: dict[str, tuple[str, str]] = {
    "--gpus": ("allocation:gpus", "str"), "--gpus-per-node": ("allocation:gpus_per_node", "str"),
    "--mem": ("allocation:mem", "str"), "--time": ("allocation:time", "str"),
    "--partition": ("allocation:partition", "str"),
    "--account": ("allocation:account", "str"), "--qos": ("allocation:qos", "str"),
    "--exclusive": ("allocation:exclusive", "flag"),
    "--nodelist": ("allocation:nodelist", "str"), "--exclude": ("allocation:exclude", "str"),
    "--reservation": ("allocation:reservation", "str"),
}
_LONG.update(_ALLOCATION_LONG)
_SHORT = {"-N": "--nodes", "-n": "--ntasks", "-c": "--cpus-per-task", "-l": "--label",
          "-u": "--unbuffered", "-o": "--output", "-e": "--error", "-i": "--input", "-K": "--kill-on-bad-exit",
          "-J": "--job-name", "-D": "--chdir", "-v": "--verbose", "-h": "--help",
          # the allocation's (gsrun outside a job)
          "-G": "--gpus", "-t": "--time", "-p": "--partition", "-A": "--account",
          "-q": "--qos", "-w": "--nodelist", "-x": "--exclude"}
_FLAG_VALUES = {"0": False, "1": True, "no": False, "yes": True}  # --kill-on-bad-exit=1


class GsrunArgs:
    """What gsrun was asked: the step's options and the command."""

    __slots__ = ("nodes", "ntasks", "ntasks_per_node", "gpus_per_task", "cpus_per_task",
                 "exact", "overlap", "label", "unbuffered", "output", "error", "input",
                 "kill_on_bad_exit", "name", "chdir", "export", "jobid", "pty", "verbose",
                 "help", "command", "allocation")

    def __init__(self) -> None:
        self.nodes: int | None = None
        self.ntasks: int | None = None
        self.ntasks_per_node: int | None = None
        self.gpus_per_task: int | None = None
        self.cpus_per_task: int | None = None
        self.exact = False
        self.overlap = False
        self.label = False
        self.unbuffered = False
        self.output: str | None = None
        self.error: str | None = None
        self.input: str | None = None
        self.kill_on_bad_exit = False
        self.name: str | None = None
        self.chdir: str | None = None
        self.export: str | None = None
        self.jobid: int | None = None
        self.pty = False
        self.verbose = 0
        self.help = False
        self.command: list[str] = []
        # The allocation's options given (gsrun outside a job), by jobshape's keys.
        self.allocation: dict[str, str | bool] = {}


def parse_args(argv: list[str]) -> GsrunArgs:
    """``argv`` (without the program name) as gsrun's options and command."""
    args = GsrunArgs()

    def take(name: str, shown: str, value: str | None, rest: list[str],
             attached: bool) -> None:
        _take(args, name, shown, value, rest, attached)

    rest = walk_options(argv, _LONG, _SHORT, take, "gsrun", lambda: bool(args.help))
    if args.help:
        return args
    if not rest:
        raise UsageError("expected a command to run (see 'gsrun --help')")
    args.command = rest
    if args.pty:
        _check_pty(args)
    return args


def _check_pty(args: GsrunArgs) -> None:
    """--pty: one task, and its terminal is its input and output."""
    if args.output or args.error or args.input:
        raise UsageError("--pty: the terminal is the task's input and output; -o, -e and "
                         "-i do not apply")
    per_node = args.ntasks_per_node or 1
    tasks = args.ntasks or (args.nodes or 1) * per_node
    if tasks > 1:
        raise UsageError(f"--pty runs one task (got {tasks})")


def _take(args: GsrunArgs, name: str, shown: str, value: str | None, rest: list[str],
          attached: bool) -> None:
    field, kind = _LONG[name]
    if field.startswith("allocation:"):
        _take_allocation(args, field.removeprefix("allocation:"), kind, shown, value, rest,
                         attached)
        return
    if kind == "flag":
        if attached:
            if name != "--kill-on-bad-exit" or value not in _FLAG_VALUES:
                raise UsageError(f"{shown} takes no value")
            setattr(args, field, _FLAG_VALUES[value])
        elif field == "verbose":
            args.verbose += 1
        else:
            setattr(args, field, True)
        return
    if value is None:
        if not rest:
            raise UsageError(f"{shown} expects a value")
        value = rest.pop(0)
    if kind.startswith("int:"):
        setattr(args, field, _count(shown, value, int(kind[4:])))
    else:
        if not value or "\0" in value:
            raise UsageError(f"{shown}: expected a value, got {value!r:.80}")
        setattr(args, field, value)


def _take_allocation(args: GsrunArgs, key: str, kind: str, shown: str, value: str | None,
                     rest: list[str], attached: bool) -> None:
    """An option of the allocation gsrun makes outside a job, kept as given."""
    if kind == "flag":
        if attached:
            raise UsageError(f"{shown} takes no value")
        args.allocation[key] = True
        return
    if value is None:
        if not rest:
            raise UsageError(f"{shown} expects a value")
        value = rest.pop(0)
    if not value or "\0" in value:
        raise UsageError(f"{shown}: expected a value, got {value!r:.80}")
    args.allocation[key] = value


def _count(option: str, text: str, high: int) -> int:
    """A whole number from 1 to ``high``."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 20 \
            or not 1 <= int(digits) <= high:
        raise UsageError(f"{option}: expected a whole number from 1 to {high}, got "
                         f"{text!r:.40}")
    return int(digits)


def export_environment(spec: str | None, environ: dict[str, str]) -> dict[str, str]:
    """The tasks' environment as ``--export`` chooses it from gsrun's ``environ``:
    ALL (or nothing given), NONE, or NAME[=VALUE],... (with ALL: added to all)."""
    if spec is None:
        return dict(environ)
    items = [item for item in spec.split(",") if item]
    if not items:
        raise UsageError("--export: expected ALL, NONE or NAME[=VALUE],...")
    keep_all = items[0].upper() == "ALL"
    if items[0].upper() in ("ALL", "NONE"):
        items = items[1:]
        if not keep_all and items:
            raise UsageError("--export: NONE takes no variables (name them without NONE)")
    out = dict(environ) if keep_all else {}
    for item in items:
        name, equals, value = item.partition("=")
        if not name or name.upper() in ("ALL", "NONE"):
            raise UsageError(f"--export: {item!r:.60}: ALL or NONE comes first, alone")
        if equals:
            out[name] = value
        elif name in environ:
            out[name] = environ[name]
    return out
