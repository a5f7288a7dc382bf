"""gsubmit's options, declared once here so that the command's signature stays
readable: each is sbatch's option of the same name (docs/cli.md)."""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer


def _text_option(*names: str, metavar: str, help_text: str) -> Any:
    """An optional string option whose default (None) is not shown in --help."""
    return typer.Option(*names, metavar=metavar, show_default=False, help=help_text)


ScriptArg = Annotated[str | None, typer.Argument(
    metavar="SCRIPT", show_default=False,
    help="Batch script; its first line must be #!. Options after it go to the script.",
)]
ArgsArg = Annotated[list[str] | None, typer.Argument(
    metavar="ARGS", show_default=False, help="Arguments passed to the script.",
)]
GpusOpt = Annotated[str | None, _text_option(
    "--gpus", "-G", metavar="[TYPE:]N",
    help_text="GPUs in all (default 0); TYPE a GPU type (a100, h100-80gb; a100|h100 for "
              "either) or a MIG profile (1g.10gb).",
)]
GresOpt = Annotated[str | None, _text_option(
    "--gres", metavar="gpu[:TYPE]:N|mps:N|shard:N|gpumem:SIZE",
    help_text="GPUs per node, Slurm's generic-resource way; mps:N or shard:N a share of one "
              "GPU (N units: percent with MPS's usual 100); gpumem:SIZE as --gpu-mem. "
              "Comma-separated.",
)]
GpuMemOpt = Annotated[str | None, _text_option(
    "--gpu-mem", metavar="SIZE",
    help_text="GPU memory the job needs (20G, 512M): one GPU, MIG slice or share with that "
              "much; with --gres=mps:N, the share's memory limit.",
)]
NodesOpt = Annotated[str | None, _text_option(
    "--nodes", "-N", metavar="K[-MAX]",
    help_text="Nodes, all started together (default 1); of a range K-MAX, K.",
)]
GpusPerNodeOpt = Annotated[str | None, _text_option(
    "--gpus-per-node", metavar="[TYPE:]N", help_text="GPUs on each node.",
)]
CpusPerGpuOpt = Annotated[int | None, typer.Option(
    "--cpus-per-gpu", min=0, metavar="N", show_default=False,
    help="CPUs for each GPU (default: CPUs are not counted).",
)]
MemOpt = Annotated[str | None, _text_option(
    "--mem", metavar="SIZE", help_text="Memory on each node: 4096 (MiB), 512M, 64G, 1T.",
)]
MemPerGpuOpt = Annotated[str | None, _text_option(
    "--mem-per-gpu", metavar="SIZE", help_text="Memory for each GPU.",
)]
TimeOpt = Annotated[str | None, _text_option(
    "--time", "-t", metavar="TIME",
    help_text="Time limit: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S or UNLIMITED.",
)]
PartitionOpt = Annotated[str | None, _text_option(
    "--partition", "-p", metavar="P[,P...]",
    help_text="Partition (default: the default one); of a list, the first that takes the job.",
)]
NodelistOpt = Annotated[str | None, _text_option(
    "--nodelist", "-w", metavar="NODES",
    help_text="Run on exactly these nodes (node[01-04],gpu7); --nodes defaults to their count.",
)]
WarnSignalOpt = Annotated[str | None, _text_option(
    "--signal", metavar="[R:|B:]SIG[@TIME]",
    help_text="Send SIG TIME seconds (default 60) before the time limit: to the whole job, or "
    "with B: to the batch script alone.",
)]
ExcludeOpt = Annotated[str | None, _text_option(
    "--exclude", "-x", metavar="NODES", help_text="Never run on these nodes.",
)]
AccountOpt = Annotated[str | None, _text_option(
    "--account", "-A", metavar="ACCOUNT", help_text="Account to charge (default: your default).",
)]
QosOpt = Annotated[str | None, _text_option(
    "--qos", "-q", metavar="QOS", help_text="Quality of service (default: 'normal' if it exists).",
)]
NameOpt = Annotated[str | None, _text_option(
    "--job-name", "-J", metavar="NAME",
    help_text="Job name (default: the script's file name, or 'wrap').",
)]
OutputOpt = Annotated[str | None, _text_option(
    "--output", "-o", metavar="F",
    help_text="stdout file pattern (%j = job id), relative to the current directory.",
)]
ErrorOpt = Annotated[str | None, _text_option(
    "--error", "-e", metavar="F", help_text="stderr file pattern (default: with stdout).",
)]
GresFlagsOpt = Annotated[str | None, _text_option(
    "--gres-flags", metavar="enforce-binding|disable-binding",
    help_text="enforce-binding: only CPUs close to the job's GPUs; disable-binding: any CPUs "
              "(default: the node's choice).",
)]
ParsableOpt = Annotated[bool, typer.Option("--parsable", help="Print the job id alone.")]
ExclusiveOpt = Annotated[bool, typer.Option(
    "--exclusive", help="Take whole nodes: every GPU of its type on each, and no other job "
    "beside it.")]
HoldOpt = Annotated[bool, typer.Option("--hold", "-H", help="Submit held: release it with 'gcontrol release'.")]
RequeueOpt = Annotated[Optional[bool], typer.Option(
    "--requeue/--no-requeue",
    help="Whether the job goes back to the queue if its GPU fails (default: the partition's).")]
DependencyOpt = Annotated[str | None, _text_option(
    "--dependency", "-d", metavar="DEP",
    help_text="after[ok|notok|any]:ID[:ID...] (ID or ARRAY_TASK; after:ID+MIN), aftercorr:ID "
              "or singleton; ',' for all of them, '?' for any.",
)]
BeginOpt = Annotated[str | None, _text_option(
    "--begin", "-b", metavar="TIME",
    help_text="Not before TIME: now+N[units], HH:MM[:SS], YYYY-MM-DD[THH:MM[:SS]], tomorrow, ...",
)]
ArrayOpt = Annotated[str | None, _text_option(
    "--array", "-a", metavar="IDS",
    help_text="A job array: task ids such as 0-99, 1,3,5-9 or 0-30:10; %N runs at most N at once.",
)]
NtasksOpt = Annotated[int | None, typer.Option(
    "--ntasks", "-n", min=1, metavar="N", show_default=False,
    help="Tasks the job runs; with --cpus-per-task they set its CPUs per node.",
)]
NtasksPerNodeOpt = Annotated[int | None, typer.Option(
    "--ntasks-per-node", "--tasks-per-node", min=1, metavar="N", show_default=False,
    help="Tasks on each node (with --cpus-per-task: CPUs per node; with --gpus-per-task: GPUs).",
)]
GpusPerTaskOpt = Annotated[str | None, _text_option(
    "--gpus-per-task", metavar="[TYPE:]N", help_text="GPUs for each task.",
)]
MemPerCpuOpt = Annotated[str | None, _text_option(
    "--mem-per-cpu", metavar="SIZE", help_text="Memory for each CPU.",
)]
CpusPerTaskOpt = Annotated[int | None, typer.Option(
    "--cpus-per-task", "-c", min=1, metavar="N", show_default=False,
    help="CPUs for each task (default 1 when --ntasks is given).",
)]
MailTypeOpt = Annotated[str | None, _text_option(
    "--mail-type", metavar="TYPE[,TYPE...]",
    help_text="Mail on these events: NONE, BEGIN, END, FAIL, REQUEUE, ALL, INVALID_DEPEND, "
              "TIME_LIMIT, TIME_LIMIT_50/80/90; ARRAY_TASKS: per array task.")]
MailUserOpt = Annotated[str | None, _text_option(
    "--mail-user", metavar="USER",
    help_text="Whom to mail: a user name or an address (default: you).")]
LicensesOpt = Annotated[str | None, _text_option(
    "--licenses", "-L", metavar="NAME[:N][,NAME[:N]...]",
    help_text="Licenses the job holds while it runs (N defaults to 1); it waits (reason "
              "Licenses) until they are free.")]
ReservationOpt = Annotated[str | None, _text_option(
    "--reservation", metavar="NAME",
    help_text="Run in this advance reservation (gcontrol show reservation): only on what it "
              "holds, while it lasts; it waits (reason Reservation) until then.")]
ConstraintOpt = Annotated[str | None, _text_option(
    "--constraint", "-C", metavar="LIST",
    help_text="Node features the job's nodes need: a&b, a|b, [a|b] (all nodes alike), [a*2&b*1] "
              "(counts); see ginfo -o %f.")]
CommentOpt = Annotated[str | None, _text_option(
    "--comment", metavar="TEXT", help_text="Accepted and ignored.")]


def _ignored(*names: str, metavar: str = "VALUE") -> Any:
    return _text_option(*names, metavar=metavar,
                        help_text="Accepted and ignored (see docs/cli.md).")


HintOpt = Annotated[str | None, _ignored("--hint")]
GpuBindOpt = Annotated[str | None, _ignored("--gpu-bind")]
GpuFreqOpt = Annotated[str | None, _ignored("--gpu-freq")]
CpuFreqOpt = Annotated[str | None, _ignored("--cpu-freq")]
DistributionOpt = Annotated[str | None, _ignored("--distribution", "-m")]
ThreadsPerCoreOpt = Annotated[str | None, _ignored("--threads-per-core", metavar="N")]
SwitchesOpt = Annotated[str | None, _ignored("--switches", metavar="N[@TIME]")]
TmpOpt = Annotated[str | None, _ignored("--tmp", metavar="SIZE")]
OpenModeOpt = Annotated[str | None, _text_option(
    "--open-mode", metavar="append|truncate",
    help_text="Append to the output files (the default) or truncate them at the start.")]
KillOnInvalidDepOpt = Annotated[str | None, _ignored("--kill-on-invalid-dep", metavar="yes|no")]
OversubscribeOpt = Annotated[Optional[bool], typer.Option(
    "--oversubscribe", "-s",
    help="Accepted and ignored: GPUs are shared only by --gres=mps:N or shard:N.")]
ProfileOpt = Annotated[str | None, _ignored("--profile")]
AcctgFreqOpt = Annotated[str | None, _ignored("--acctg-freq")]
TestOnlyOpt = Annotated[bool, typer.Option(
    "--test-only", help="Say when and where the job would start; submit nothing.")]
ChdirOpt = Annotated[str | None, _text_option(
    "--chdir", "-D", "--workdir", metavar="DIR",
    help_text="Run the job in DIR (default: the current directory).",
)]
ExportOpt = Annotated[str | None, _text_option(
    "--export", metavar="VARS",
    help_text="The job's environment: ALL (default), NONE, or VAR[=value],... (only those; "
    "'ALL,VAR=value' adds to all).",
)]
NiceOpt = Annotated[bool, typer.Option(
    "--nice", help="Lower the job's priority by 100; --nice=ADJ by ADJ (a negative ADJ raises "
    "it: administrators only).")]
# --nice=ADJ, as sbatch_spellings passes it on (sbatch takes the value only after =).
NiceAdjustmentOpt = Annotated[str | None, typer.Option(
    "--nice-adjustment", hidden=True, show_default=False)]
PriorityOpt = Annotated[str | None, _text_option(
    "--priority", metavar="N",
    help_text="The job's priority, a number of 0 or more in place of the computed one "
              "(administrators only).")]
TimeMinOpt = Annotated[str | None, _text_option(
    "--time-min", metavar="TIME",
    help_text="The least time limit the job may run with: backfill may start it sooner with "
              "its --time cut down to no less than this.")]
DeadlineOpt = Annotated[str | None, _text_option(
    "--deadline", metavar="TIME",
    help_text="Never start unless it can end by TIME (--begin's forms); past it, the job ends "
              "DEADLINE.")]
WaitOpt = Annotated[bool, typer.Option(
    "--wait", "-W", help="Wait for the job to end, and exit with its exit code.")]
NtasksPerGpuOpt = Annotated[int | None, typer.Option(
    "--ntasks-per-gpu", min=1, metavar="N", show_default=False,
    help="Tasks for each GPU: --ntasks is N x GPUs (or, with --ntasks alone, GPUs are "
    "ntasks / N).")]
ClustersOpt = Annotated[str | None, _text_option(
    "--clusters", "-M", metavar="NAME",
    help_text="The cluster to submit to: only this one, by its name (the configuration's "
              "cluster_name, default gpusched).")]
OvercommitOpt = Annotated[bool, typer.Option(
    "--overcommit", "-O", help="One CPU per node, however many tasks (with --ntasks).")]
MinCpusOpt = Annotated[int | None, typer.Option(
    "--mincpus", min=1, metavar="N", show_default=False,
    help="At least N CPUs on each node.")]
NoKillOpt = Annotated[bool, typer.Option(
    "--no-kill", "-k", help="One node: accepted (a job ends with its node anyway); several "
    "nodes: refused.")]
GetUserEnvOpt = Annotated[Optional[bool], typer.Option(
    "--get-user-env", help="Accepted and ignored: the job gets gsubmit's environment "
    "(--export).")]
WrapOpt = Annotated[str | None, _text_option(
    "--wrap", metavar="CMD", help_text="Submit CMD wrapped in a /bin/sh script.",
)]
