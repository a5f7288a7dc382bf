"""What gsubmit does with its parsed command line, kept free of typer: validate it,
merge the script's directives (each parsed by the same parser as the command line),
and submit. The typer command (gpusched.cli.gsubmit) and the quick path of common
command lines (gpusched.cli.console) both end here."""

from __future__ import annotations

import os
import sys

from gpusched.cli import submitvalues
from gpusched.cli.batchscript import WRAP_TEMPLATE, read_batch_script
from gpusched.cli.containerrequest import CONTAINER_OPTIONS, container_request
from gpusched.cli.directives import Directive, read_directive_lines
from gpusched.cli.jobshape import (
    job_shape,
    option_value,
    share_fields,
)
from gpusched.cli.output import print_warning
from gpusched.cli.shell import current_umask, job_dir, job_environment
from gpusched.cli.submitvalues import UNLIMITED as UNLIMITED
from gpusched.cli.submitvalues import without_empty_items as without_empty_items
from gpusched.client import ApiClient
from gpusched.core.shapes import is_mig_profile
from gpusched.errors import UsageError

# No typing at run time (see gpusched.cli.console): annotations only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, Protocol

    from gpusched.core.signals import WarnSignal

PROG = "gsubmit"
# What a directive may set. SCRIPT, its ARGS and --wrap only make sense on the command line.
DIRECTIVE_OPTIONS = ("gpus", "gres", "gpu_mem", "nodes", "gpus_per_node", "cpus_per_gpu", "mem",
                     "reservation",
                     "mem_per_gpu", "time_limit", "partition", "account", "qos", "job_name", "output",
                     "error", "parsable", "hold", "begin", "dependency", "array", "requeue",
                     "chdir", "export", "ntasks", "cpus_per_task", "mail_type", "mail_user", "licenses",
                     "constraint", "comment", "nodelist", "exclude", "warn_signal",
                     "ntasks_per_node", "gpus_per_task", "mem_per_cpu", "hint", "gpu_bind",
                     "gpu_freq", "cpu_freq", "distribution", "threads_per_core", "switches",
                     "tmp", "open_mode", "kill_on_invalid_dep", "oversubscribe", "profile",
                     "acctg_freq", "exclusive", "gres_flags", "nice", "nice_adjustment",
                     "priority", "time_min", "deadline", "wait", "ntasks_per_gpu",
                     "clusters", "overcommit",
                     "mincpus", "no_kill", "get_user_env", *CONTAINER_OPTIONS)
# Options that matter only on other sites, or whose effect this cluster has anyway or
# lacks harmlessly: accepted, ignored, and said so.
IGNORED = {"comment": "--comment: comments are not stored",
           "hint": "--hint: CPU binding is left to the job",
           "gpu_bind": "--gpu-bind: the job sees exactly its GPUs in CUDA_VISIBLE_DEVICES",
           "gpu_freq": "--gpu-freq: GPU clocks are not changed",
           "cpu_freq": "--cpu-freq: CPU frequencies are not changed",
           "distribution": "--distribution: tasks are started by the job itself",
           "threads_per_core": "--threads-per-core: CPUs are counted as the node reports them",
           "switches": "--switches: placement follows NVLink and node blocks instead",
           "tmp": "--tmp: local disk is not counted",
           "kill_on_invalid_dep": "--kill-on-invalid-dep: a job whose dependency can never "
                                  "be met stays pending (reason DependencyNeverSatisfied)",
           "oversubscribe": "--oversubscribe: GPUs are shared only by --gres=mps:N or "
                            "shard:N, in partitions that share them",
           "profile": "--profile: no profiling data is gathered",
           "acctg_freq": "--acctg-freq: GPUs are sampled at the agent's health interval",
           "get_user_env": "--get-user-env: the job gets the environment gsubmit runs in "
                           "(--export), as sbatch gives it to a caller who is not root"}
# Input variables that set an option unless the command line does (directives lose to
# them), as sbatch's SBATCH_* do.
INPUT_VARIABLES = {"partition": "GPUSCHED_PARTITION", "account": "GPUSCHED_ACCOUNT",
                   "qos": "GPUSCHED_QOS", "time_limit": "GPUSCHED_TIMELIMIT",
                   "job_name": "GPUSCHED_JOB_NAME", "export": "GPUSCHED_EXPORT",
                   "chdir": "GPUSCHED_CHDIR", "gpus": "GPUSCHED_GPUS",
                   "dependency": "GPUSCHED_DEPENDENCY", "array": "GPUSCHED_ARRAY"}


def _constraint_value(text: str) -> str:
    """A -C/--constraint value, checked and canonical (loaded only when given)."""
    from gpusched.core.features import canonical_constraint

    return canonical_constraint(text)


if TYPE_CHECKING:
    class ParsedArgs(Protocol):
        """A parsed argument list: the part of a click context that merging reads."""

        params: dict[str, Any]

        def get_parameter_source(self, name: str) -> Any:
            """Where the value of ``name`` came from (click's ParameterSource)."""

    # Parses a directive line's options as the command line's are parsed; a line it
    # refuses is a UsageError saying why.
    OptionParser = Callable[[list[str]], ParsedArgs]


class Submission:
    """A validated submission, before the caller's directory and environment are added."""

    # A plain class rather than a NamedTuple: typing is not loaded on gsubmit's path.
    __slots__ = ("script", "args", "name", "gpus", "time_limit", "partition", "output",
                 "reservation",
                 "error", "parsable", "account", "qos", "hold", "exclusive", "begin_time",
                 "dependency", "array", "requeue", "chdir", "ntasks", "ntasks_per_node",
                 "cpus_per_task", "ignored", "export", "gpu_types", "nodes", "cpus",
                 "nice", "priority", "open_mode", "time_min", "deadline", "wait",
                 "ntasks_per_gpu",
                 "mem_mb", "nodelist", "warn_signal", "exclude", "gres_flags", "share_mode",
                 "share", "gpu_mem_mb", "mail_types", "mail_user", "licenses",
                 "constraint", "container")

    def __init__(
        self, *, script: str, args: tuple[str, ...], name: str, gpus: int,
        time_limit: int | str | None,  # seconds, "UNLIMITED", or None: the partition's
        partition: str | None, output: str | None, error: str | None, parsable: bool,
        account: str | None = None, qos: str | None = None, hold: bool = False,
        exclusive: bool = False,  # --exclusive
        begin_time: str | None = None,  # ISO 8601 with the submitter's zone
        dependency: str | None = None,
        array: str | None = None,  # canonical task ids and cap, as parse_array gives them
        requeue: bool | None = None,  # after a GPU failure; None: the partition's default
        chdir: str | None = None,  # the job's working directory (default: the current one)
        ntasks: int | None = None,  # sbatch's --ntasks, shown to the job as SLURM_NTASKS
        ntasks_per_node: int | None = None, cpus_per_task: int | None = None,
        ignored: tuple[str, ...] = (),  # warnings for options accepted and ignored
        nice: int | None = None,  # --nice: subtracted from its priority
        priority: float | None = None,  # --priority: in place of the computed one
        open_mode: str | None = None,  # --open-mode: append (None: the same) or truncate
        time_min: int | None = None,  # --time-min, seconds
        deadline: str | None = None,  # --deadline, ISO 8601 with the submitter's zone
        wait: bool = False,  # -W: wait for the job to end, with its exit code
        ntasks_per_gpu: int | None = None,  # --ntasks-per-gpu
        export: str | None = None,  # --export: ALL, NONE, or VAR[=value] lists
        gpu_types: tuple[str, ...] = (),
        nodes: int = 1,
        cpus: int = 0,  # on each node; 0: not counted
        mem_mb: int = 0,  # on each node; 0: not counted
        nodelist: tuple[str, ...] = (),  # --nodelist, expanded
        warn_signal: WarnSignal | None = None,  # --signal
        exclude: tuple[str, ...] = (),  # --exclude, expanded
        gres_flags: str | None = None,  # --gres-flags: enforce-binding or disable-binding
        share_mode: str | None = None,  # --gres=mps:N or shard:N: a share of one GPU
        share: int | None = None,  # its N
        gpu_mem_mb: int | None = None,  # --gpu-mem (or --gres=gpumem:SIZE), MiB
        mail_types: tuple[str, ...] | None = None,  # --mail-type, ALL expanded; (): NONE
        mail_user: str | None = None,  # --mail-user (None: the submitting user)
        licenses: str | None = None,  # -L, canonical (gpusched.core.licenses)
        reservation: str | None = None,  # --reservation: an advance reservation's name
        constraint: str | None = None,  # -C, canonical (gpusched.core.features)
        container: dict[str, Any] | None = None,  # --container-image and the rest
    ) -> None:
        self.script, self.args, self.name, self.gpus = script, args, name, gpus
        self.time_limit, self.partition, self.output, self.error = (
            time_limit, partition, output, error)
        self.parsable, self.account, self.qos, self.hold = parsable, account, qos, hold
        self.exclusive, self.begin_time, self.dependency, self.array = (
            exclusive, begin_time, dependency, array)
        self.requeue, self.chdir, self.ntasks = requeue, chdir, ntasks
        self.ntasks_per_node, self.cpus_per_task = ntasks_per_node, cpus_per_task
        self.ignored, self.export, self.gpu_types, self.nodes = ignored, export, gpu_types, nodes
        self.cpus, self.mem_mb, self.nodelist = cpus, mem_mb, nodelist
        self.warn_signal, self.exclude, self.gres_flags = warn_signal, exclude, gres_flags
        self.share_mode, self.share, self.gpu_mem_mb = share_mode, share, gpu_mem_mb
        self.mail_types, self.mail_user = mail_types, mail_user
        self.nice, self.priority, self.open_mode = nice, priority, open_mode
        self.time_min, self.deadline, self.wait = time_min, deadline, wait
        self.ntasks_per_gpu = ntasks_per_gpu
        self.reservation = reservation
        self.licenses, self.constraint = licenses, constraint
        self.container = container

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Submission) and all(
            getattr(self, name) == getattr(other, name) for name in self.__slots__)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"Submission({fields})"


def submit(parsed: ParsedArgs, parse_options: OptionParser) -> int | None:
    """Submit what a parsed gsubmit command line asks for (or, with --test-only, say when
    it would start); ``parse_options`` parses a directive line's options. With -W, the
    job's exit code once it has ended (gpusched.cli.jobwait)."""
    submission = resolve_submission(parsed, parse_options)
    for warning in (*submission.ignored, mig_warning(submission)):
        if warning:
            print_warning(PROG, f"{warning}; ignored" if warning in submission.ignored else warning)
    environment, dropped = job_environment(submission.export, os.environ)
    for name in dropped:  # the job starts without it rather than not at all
        print_warning(PROG, f"{name.encode('utf-8', 'backslashreplace').decode()}: not "
                      "valid UTF-8; the job's environment leaves it out")
    for name, value in (("NTASKS", submission.ntasks), ("CPUS_PER_TASK", submission.cpus_per_task),
                        ("NTASKS_PER_NODE", submission.ntasks_per_node),
                        ("NTASKS_PER_GPU", submission.ntasks_per_gpu)):
        if value is not None:  # what sbatch tells the job it asked for
            environment[f"SLURM_{name}"] = environment[f"GPUSCHED_{name}"] = str(value)
    environment.update(submit_variables(submission.export))
    body = submission_body(submission, work_dir=job_dir(submission.chdir), environment=environment)
    body["umask"] = current_umask()  # the job creates its files as this shell would
    if parsed.params["test_only"]:
        from datetime import datetime

        with ApiClient() as client:
            answer = client.request("POST", "/v1/jobs/test", body)
        where = f" on nodes {','.join(answer['nodes'])}" if answer["nodes"] else ""
        when = (datetime.fromisoformat(answer["start"]).astimezone().strftime("%Y-%m-%dT%H:%M:%S")
                if answer["start"] else f"an unknown time (reason {answer['reason']})")
        print_warning(PROG, "--test-only: nothing was submitted")
        print(f"gsubmit: Job {answer['job_id']} to start at {when} using {answer['gpus']} GPUs"
              f"{where} in partition {answer['partition']}", file=sys.stderr)
        return None
    # One key per invocation: should the answer be lost (a controller dies, the client
    # fails over), sending it again gives the same job, never a second one.
    body["submit_key"] = os.urandom(16).hex()
    with ApiClient() as client:
        answer = client.request("POST", "/v1/jobs", body)
    job_id = answer.get("job_id")
    print(job_id if submission.parsable else f"Submitted batch job {job_id}")
    if submission.wait:  # -W, as sbatch's: until the job ends, then its exit code
        sys.stdout.flush()
        from gpusched.cli.jobwait import wait_for_job

        return wait_for_job(int(answer["job_id"]))
    return None


def submit_variables(export: str | None) -> dict[str, str]:
    """What only the submitting side knows, which sbatch puts in the job's environment
    whatever --export says: the directory and host gsubmit runs in, its nice value, and
    --export itself (docs/user-guide.md, "What the job sees")."""
    found = {"SUBMIT_DIR": job_dir(None), "SUBMIT_HOST": os.uname().nodename,
             "PRIO_PROCESS": str(os.getpriority(os.PRIO_PROCESS, 0))}
    if export is not None:
        found["EXPORT_ENV"] = export
    return {f"{prefix}_{key}": value for key, value in found.items()
            for prefix in ("SLURM", "GPUSCHED")}


def mig_warning(submission: Submission) -> str | None:
    """The warning for a job asking for several MIG slices, or None."""
    per_node = submission.gpus // max(1, submission.nodes)
    if per_node > 1 and submission.gpu_types and all(is_mig_profile(k) for k in submission.gpu_types):
        return (f"the job asks for {per_node} MIG slices per node, but one CUDA process uses "
                "only one MIG device: start one process per slice (each with its own "
                "CUDA_VISIBLE_DEVICES entry)")
    return None


def _reservation_value(text: str) -> str:
    """A --reservation name, checked (loaded only when given)."""
    from gpusched.core.reservations import ReservationError, check_name

    try:
        return check_name(text.strip())
    except ReservationError as exc:
        raise UsageError(f"--reservation: {exc}") from None


def flag_fields(submission: Submission) -> dict[str, Any]:
    """The ``POST /v1/jobs`` fields of --nice, --priority, --open-mode, --time-min and
    --deadline, those given only (gpusched.messages.schedflags)."""
    found = {"nice": submission.nice, "priority": submission.priority,
             "open_mode": submission.open_mode, "time_min": submission.time_min,
             "deadline": submission.deadline}
    return {key: value for key, value in found.items() if value is not None}


def resolve_submission(parsed: ParsedArgs, parse_options: OptionParser) -> Submission:
    """Validate the parsed command line, read the script and merge its directives."""
    script_path: str | None = parsed.params["script"]
    wrap: str | None = parsed.params["wrap"]
    if script_path is not None and wrap is not None:
        raise UsageError("give either a batch SCRIPT or --wrap CMD, not both")
    if wrap is not None:
        text = WRAP_TEMPLATE.format(command=wrap)
        directives: list[Directive] = []  # a wrapped command is not a script of ours
    elif script_path is not None:
        text = read_batch_script(script_path)
        directives = read_directive_lines(text)
    else:
        raise UsageError("nothing to submit: give a batch SCRIPT or --wrap CMD")
    values, origins = merge_directives(parsed, directives, parse_options)

    def option(key: str, parse: Callable[[str], Any], flag: str = "") -> Any:
        return option_value(values, origins, key, parse, flag)

    default_name = os.path.basename(script_path) if script_path is not None else "wrap"
    shape = job_shape(values, origins)
    return Submission(
        script=text,
        args=tuple(parsed.params["args"] or ()),
        name=values["job_name"] or default_name,
        **shape,
        time_limit=option("time_limit", submitvalues.time_value, "--time"),
        partition=values["partition"],
        account=values["account"],
        qos=values["qos"],
        hold=bool(values["hold"]),
        exclusive=bool(values["exclusive"]),
        gres_flags=option("gres_flags", submitvalues.gres_flags_value),
        requeue=values["requeue"],
        chdir=values["chdir"],
        ignored=tuple(f"{origins[name]}: {why}" if name in origins else why
                      for name, why in IGNORED.items() if values[name] is not None)
        + _mail_warning(values) + _flag_checks(values, origins, shape["nodes"],
                                                               shape["cpus"]),
        mail_types=option("mail_type", submitvalues.mail_type_value, "--mail-type"),
        mail_user=option("mail_user", submitvalues.mail_user_value, "--mail-user"),
        licenses=option("licenses", submitvalues.licenses_value, "--licenses"),
        reservation=option("reservation", _reservation_value),
        container=container_request(values, origins),
        constraint=option("constraint", _constraint_value),
        export=option("export", submitvalues.checked_export),
        begin_time=option("begin", submitvalues.begin_value),
        dependency=option("dependency", submitvalues.checked_dependency, "--dependency"),
        array=option("array", submitvalues.array_value, "--array"),
        warn_signal=option("warn_signal", submitvalues.warn_signal_value),
        nice=option("nice_adjustment", submitvalues.nice_value)
        if values["nice_adjustment"] is not None else 100 if values["nice"] else None,
        priority=option("priority", submitvalues.priority_value),
        open_mode=option("open_mode", submitvalues.open_mode_value),
        time_min=option("time_min", submitvalues.time_min_value, "--time-min"),
        deadline=option("deadline", submitvalues.deadline_value),
        wait=bool(values["wait"]),
        output=values["output"],
        error=values["error"],
        parsable=bool(values["parsable"]),
    )


def merge_directives(
    ctx: ParsedArgs, directives: Sequence[Directive], parse_options: OptionParser,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Option values after directives: the command line wins, then the last directive.

    Each directive line is parsed by the same command as the command line, so it
    accepts exactly the same spellings and is validated the same way. Returns the
    values and, for each one a directive set, where it came from.
    """
    values = {name: ctx.params[name] for name in DIRECTIVE_OPTIONS}
    origins: dict[str, str] = {}
    from_environment = set()
    for name, variable in INPUT_VARIABLES.items():
        text = os.environ.get(variable)
        if text and not _given(ctx, name):
            values[name] = text
            origins[name] = variable
            from_environment.add(name)
    for directive in directives:
        parsed = _parse_directive(parse_options, directive)
        for name in DIRECTIVE_OPTIONS:
            if _given(parsed, name) and not _given(ctx, name) and name not in from_environment:
                values[name] = parsed.params[name]
                origins[name] = f"line {directive.line}: {directive.prefix}"
    return values, origins


def submission_body(
    submission: Submission, *, work_dir: str, environment: dict[str, str],
) -> dict[str, Any]:
    """The ``POST /v1/jobs`` request body of docs/api.md (a share and GPU memory only
    when asked for: a body without them is as before)."""
    return {
        "script": submission.script,
        "args": list(submission.args),
        "name": submission.name,
        "gpus": submission.gpus,
        "gpu_types": list(submission.gpu_types),
        "nodes": submission.nodes,
        "cpus": submission.cpus,
        "mem_mb": submission.mem_mb,
        "nodelist": list(submission.nodelist),
        "warn_signal": None if submission.warn_signal is None else {
            "signal": submission.warn_signal.number, "seconds": submission.warn_signal.seconds,
            "batch_only": submission.warn_signal.batch_only},
        "exclude": list(submission.exclude),
        "time_limit": submission.time_limit,
        "partition": submission.partition,
        "account": submission.account,
        "qos": submission.qos,
        "hold": submission.hold,
        "exclusive": submission.exclusive,
        "gres_flags": submission.gres_flags,
        "requeue": submission.requeue,
        "begin_time": submission.begin_time,
        "dependency": submission.dependency,
        "array": submission.array,
        "work_dir": work_dir,
        "environment": environment,
        "output": submission.output,
        "error": submission.error,
        **share_fields(submission.share_mode, submission.share, submission.gpu_mem_mb),
        # Mail only when asked for: a body without it is as before.
        **({} if submission.mail_types is None else {"mail_type": list(submission.mail_types)}),
        **({} if submission.mail_user is None else {"mail_user": submission.mail_user}),
        **({} if submission.licenses is None else {"licenses": submission.licenses}),
        **flag_fields(submission),
        **({} if submission.reservation is None else {"reservation": submission.reservation}),
        **({} if submission.container is None else {"container": submission.container}),
        **({} if submission.constraint is None else {"constraint": submission.constraint}),
    }


def _parse_directive(parse_options: OptionParser, directive: Directive) -> ParsedArgs:
    """Parse one directive line with the command's own parser."""
    where = f"line {directive.line}: {directive.prefix} {' '.join(directive.args)}"
    if "--help" in directive.args:
        raise UsageError(f"{where}: --help is not a directive")
    try:
        parsed = parse_options(list(directive.args))
    except UsageError as err:
        raise UsageError(f"{where}: {err.message}") from None
    if _given(parsed, "wrap"):
        raise UsageError(f"{where}: --wrap is not a directive")
    if _given(parsed, "script") or _given(parsed, "args"):
        raise UsageError(f"{where}: a directive takes options only, not arguments")
    return parsed


def _given(ctx: ParsedArgs, name: str) -> bool:
    """Whether ``name`` was written in the parsed arguments (not a default)."""
    source = ctx.get_parameter_source(name)
    # Compared by name: the enum lives in click, which newer typer vendors privately.
    return source is not None and source.name == "COMMANDLINE"


def _flag_checks(values: dict[str, Any], origins: dict[str, str], nodes: int,
                 cpus: int) -> tuple[str, ...]:
    """sbatch's -M/--clusters, -k/--no-kill, --overcommit and -N MIN-MAX: refused
    where this cluster cannot honour them, else the warnings saying what they do here."""

    def where(name: str) -> str:
        return f"{origins[name]}: " if name in origins else ""

    if values["clusters"] is not None:
        local = local_cluster_name()
        names = [name.strip() for name in values["clusters"].split(",") if name.strip()]
        for name in names or [""]:  # a trailing comma is sbatch's too
            if name != local:
                raise UsageError(f"{where('clusters')}-M/--clusters: no cluster {name[:64]!r} "
                                 f"here: this cluster is {local!r}, and jobs are not sent "
                                 "to other clusters")
    warnings: tuple[str, ...] = ()
    if values["overcommit"] and not cpus:
        warnings = (f"{where('overcommit')}--overcommit: this job's CPUs are not counted (no "
                    "--ntasks, --cpus-per-task or --cpus-per-gpu)",)
    if values["nodes"] is not None and "-" in values["nodes"]:
        warnings += (f"{where('nodes')}--nodes {values['nodes'].strip()}: the job runs on "
                    f"{nodes} node(s), the range's minimum",)
    if values["no_kill"]:
        if nodes > 1:
            raise UsageError(f"{where('no_kill')}-k/--no-kill: not supported for a job on "
                             f"{nodes} nodes: a node that fails ends (or requeues) the whole "
                             "job here")
        warnings += (f"{where('no_kill')}--no-kill: a job on one node ends with its node "
                     "anyway",)
    return warnings


def local_cluster_name() -> str:
    """This cluster's name: ``cluster_name`` of the configuration file clients read,
    else ``gpusched`` (the default of gpusched.config.Config)."""
    from gpusched.client.settings import settings_file

    path = settings_file()
    if path is None:
        return "gpusched"
    from gpusched.configfile import read_toml

    name = read_toml(path).get("cluster_name", "gpusched")
    return name if isinstance(name, str) else "gpusched"


def _mail_warning(values: dict[str, Any]) -> tuple[str, ...]:
    """The warning for a --mail-user without a --mail-type (sbatch sends nothing then)."""
    if values["mail_user"] is not None and values["mail_type"] is None:
        return ("--mail-user: no --mail-type is given, so no mail is sent",)
    return ()
