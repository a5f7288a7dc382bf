"""gsubmit: submit a batch script to gpusched, the way sbatch does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import typer

from gpusched.cli.common import new_app, run_cli
from gpusched.cli.containeropts import (
    ContainerEntrypointLogOpt,
    ContainerEntrypointOpt,
    ContainerEnvOpt,
    ContainerImageOpt,
    ContainerMountHomeOpt,
    ContainerMountsOpt,
    ContainerNameOpt,
    ContainerRemapRootOpt,
    ContainerSaveOpt,
    ContainerWorkdirOpt,
    ContainerWritableOpt,
)
from gpusched.cli.directives import sbatch_spellings
from gpusched.cli.submission import (
    DIRECTIVE_OPTIONS,
    IGNORED,
    INPUT_VARIABLES,
    UNLIMITED,
    Submission,
    merge_directives,
    mig_warning,
    submission_body,
    submit,
)
from gpusched.cli.submission import resolve_submission as resolve_parsed

if TYPE_CHECKING:
    from gpusched.cli.submission import OptionParser, ParsedArgs
from gpusched.cli.submitoptions import (
    AccountOpt,
    AcctgFreqOpt,
    ArgsArg,
    ArrayOpt,
    BeginOpt,
    ChdirOpt,
    ClustersOpt,
    CommentOpt,
    ConstraintOpt,
    CpuFreqOpt,
    CpusPerGpuOpt,
    CpusPerTaskOpt,
    DeadlineOpt,
    DependencyOpt,
    DistributionOpt,
    ErrorOpt,
    ExcludeOpt,
    ExclusiveOpt,
    ExportOpt,
    GetUserEnvOpt,
    GpuBindOpt,
    GpuFreqOpt,
    GpuMemOpt,
    GpusOpt,
    GpusPerNodeOpt,
    GpusPerTaskOpt,
    GresFlagsOpt,
    GresOpt,
    HintOpt,
    HoldOpt,
    KillOnInvalidDepOpt,
    LicensesOpt,
    MailTypeOpt,
    MailUserOpt,
    MemOpt,
    MemPerCpuOpt,
    MemPerGpuOpt,
    MinCpusOpt,
    NameOpt,
    NiceAdjustmentOpt,
    NiceOpt,
    NodelistOpt,
    NodesOpt,
    NoKillOpt,
    NtasksOpt,
    NtasksPerGpuOpt,
    NtasksPerNodeOpt,
    OpenModeOpt,
    OutputOpt,
    OvercommitOpt,
    OversubscribeOpt,
    ParsableOpt,
    PartitionOpt,
    PriorityOpt,
    ProfileOpt,
    QosOpt,
    RequeueOpt,
    ReservationOpt,
    ScriptArg,
    SwitchesOpt,
    TestOnlyOpt,
    ThreadsPerCoreOpt,
    TimeMinOpt,
    TimeOpt,
    TmpOpt,
    WaitOpt,
    WarnSignalOpt,
    WrapOpt,
)
from gpusched.errors import UsageError

__all__ = ["DIRECTIVE_OPTIONS", "IGNORED", "INPUT_VARIABLES", "UNLIMITED", "Submission",
           "merge_directives", "mig_warning", "submission_body"]

PROG = "gsubmit"

app = new_app("Submit a batch script (or a --wrap'ed command) to gpusched, like sbatch.")


@app.command(context_settings={"allow_interspersed_args": False})
def gsubmit(
    ctx: typer.Context,
    script: ScriptArg = None,
    args: ArgsArg = None,
    gpus: GpusOpt = None,
    gres: GresOpt = None,
    gpu_mem: GpuMemOpt = None,
    nodes: NodesOpt = None,
    gpus_per_node: GpusPerNodeOpt = None,
    cpus_per_gpu: CpusPerGpuOpt = None,
    ntasks: NtasksOpt = None,
    ntasks_per_node: NtasksPerNodeOpt = None,
    cpus_per_task: CpusPerTaskOpt = None,
    gpus_per_task: GpusPerTaskOpt = None,
    mem_per_cpu: MemPerCpuOpt = None,
    mem: MemOpt = None,
    mem_per_gpu: MemPerGpuOpt = None,
    time_limit: TimeOpt = None,
    partition: PartitionOpt = None,
    nodelist: NodelistOpt = None,
    exclude: ExcludeOpt = None,
    warn_signal: WarnSignalOpt = None,
    account: AccountOpt = None,
    qos: QosOpt = None,
    job_name: NameOpt = None,
    output: OutputOpt = None,
    error: ErrorOpt = None,
    parsable: ParsableOpt = False,
    hold: HoldOpt = False,
    exclusive: ExclusiveOpt = False,
    gres_flags: GresFlagsOpt = None,
    requeue: RequeueOpt = None,
    chdir: ChdirOpt = None,
    export: ExportOpt = None,
    test_only: TestOnlyOpt = False,
    mail_type: MailTypeOpt = None,
    mail_user: MailUserOpt = None,
    licenses: LicensesOpt = None,
    reservation: ReservationOpt = None,
    constraint: ConstraintOpt = None,
    comment: CommentOpt = None,
    hint: HintOpt = None,
    gpu_bind: GpuBindOpt = None,
    gpu_freq: GpuFreqOpt = None,
    cpu_freq: CpuFreqOpt = None,
    distribution: DistributionOpt = None,
    threads_per_core: ThreadsPerCoreOpt = None,
    switches: SwitchesOpt = None,
    tmp: TmpOpt = None,
    open_mode: OpenModeOpt = None,
    kill_on_invalid_dep: KillOnInvalidDepOpt = None,
    oversubscribe: OversubscribeOpt = None,
    profile: ProfileOpt = None,
    acctg_freq: AcctgFreqOpt = None,
    begin: BeginOpt = None,
    dependency: DependencyOpt = None,
    array: ArrayOpt = None,
    nice: NiceOpt = False,
    nice_adjustment: NiceAdjustmentOpt = None,
    priority: PriorityOpt = None,
    time_min: TimeMinOpt = None,
    deadline: DeadlineOpt = None,
    wait: WaitOpt = False,
    ntasks_per_gpu: NtasksPerGpuOpt = None,
    clusters: ClustersOpt = None,
    overcommit: OvercommitOpt = False,
    mincpus: MinCpusOpt = None,
    no_kill: NoKillOpt = False,
    get_user_env: GetUserEnvOpt = None,
    container_image: ContainerImageOpt = None,
    container_mounts: ContainerMountsOpt = None,
    container_workdir: ContainerWorkdirOpt = None,
    container_name: ContainerNameOpt = None,
    container_save: ContainerSaveOpt = None,
    container_mount_home: ContainerMountHomeOpt = None,
    container_remap_root: ContainerRemapRootOpt = None,
    container_entrypoint: ContainerEntrypointOpt = None,
    container_entrypoint_log: ContainerEntrypointLogOpt = False,
    container_writable: ContainerWritableOpt = None,
    container_env: ContainerEnvOpt = None,
    wrap: WrapOpt = None,
) -> int | None:
    """Submit a batch script to gpusched; #GSUB and #SBATCH directives are honoured.

    Examples: gsubmit train.sh; gsubmit -G a100:4 -t 2:00:00 -p gpu train.sh --epochs 3;
    gsubmit --array=0-9%2 sweep.sh; gsubmit -d afterok:17 --wrap 'python eval.py'
    """
    return submit(ctx, typer_options(ctx))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gsubmit`` console script."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-V"], ["--version"]):  # sbatch's -V
        from gpusched import __version__

        print(f"gpusched {__version__}")
        return 0
    try:
        args = sbatch_spellings(args)
    except UsageError as err:
        from gpusched.cli.output import print_error

        print_error(PROG, err.message)
        return 2
    return run_cli(app, PROG, args)


def resolve_submission(ctx: typer.Context) -> Submission:
    """Validate the parsed command line, read the script and merge its directives."""
    return resolve_parsed(ctx, typer_options(ctx))


def typer_options(ctx: typer.Context) -> OptionParser:
    """Parses a directive line's options with the command's own typer parser."""

    def parse(args: list[str]) -> ParsedArgs:
        try:
            with ctx.command.make_context(ctx.info_name, sbatch_spellings(args)) as parsed:
                pass
        except typer.TyperException as err:
            raise UsageError(err.format_message()) from None
        return parsed

    return parse
