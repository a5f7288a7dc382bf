"""sbatch's options that gsubmit does not declare: refused with a message naming the
option and why, or accepted as what gsubmit does anyway (dropped before parsing).
docs/cli.md keeps the table; tests/data/slurm/sbatch.options lists every option of
sbatch's man page, and tests/cli/test_sbatch_options.py holds gsubmit to each. Read only
on typer's path (a command line the quick parser declined), never on the common one."""

from __future__ import annotations

from gpusched.errors import UsageError

_NODES = "nodes are not chosen by their sockets, cores or threads here"
_BURST = "there are no burst buffers here"
_OCI = ("Slurm's OCI bundles are not run here: give an image with --container-image "
        "(pyxis's options)")
_USER = "a job runs as the user who submits it"
_CORES = "no cores or threads are set aside for the system here"
_REBOOT = "the scheduler does not boot or reboot nodes"

# Option spelling -> why it is refused (unless gsubmit declares it).
REFUSED: dict[str, str] = {
    "--batch": "the batch script runs on the job's first node; nodes carry no batch "
               "features",
    "--bb": _BURST, "--bbf": _BURST,
    "--cluster-constraint": "jobs are not sent to other clusters (-M names this one only)",
    "--container": _OCI, "--container-id": _OCI,
    "--contiguous": "nodes are placed by NVLink and node blocks, not by contiguous names",
    "-S": _CORES, "--core-spec": _CORES, "--thread-spec": _CORES,
    "--cores-per-socket": _NODES, "--sockets-per-node": _NODES, "-B": _NODES,
    "--extra-node-info": _NODES,
    "--delay-boot": _REBOOT, "--reboot": _REBOOT,
    "--export-file": "give the job's variables with --export",
    "--extra": "nodes carry no extra attributes to match (see -C/--constraint)",
    "--gid": _USER, "--uid": _USER,
    "--gpus-per-socket": "GPUs are counted per node, task or job, not per socket",
    "-i": "a batch job reads nothing: its standard input is /dev/null",
    "--input": "a batch job reads nothing: its standard input is /dev/null",
    "--jobid": "job ids are given by the controller",
    "--mcs-label": "there are no MCS labels here",
    "--mem-bind": "memory binding is left to the job (its cpuset is near its GPUs)",
    "--network": "no network resources are scheduled here",
    "-F": "give the nodes with -w/--nodelist", "--nodefile": "give the nodes with "
                                                            "-w/--nodelist",
    "--ntasks-per-core": "tasks are counted per node, GPU or job, not per core",
    "--ntasks-per-socket": "tasks are counted per node, GPU or job, not per socket",
    "--power": "there is no power management here",
    "--prefer": "there are no soft preferences: -C/--constraint is a requirement",
    "--propagate": "the job's resource limits are the node's, not the submitting shell's",
    "-Q": "gsubmit's warnings say what it changed or ignored; they are not silenced",
    "--quiet": "gsubmit's warnings say what it changed or ignored; they are not silenced",
    "--spread-job": "jobs are placed best fit, on as few nodes as they ask for",
    "--tres-per-task": "give --gpus-per-task and --cpus-per-task",
    "-v": "gsubmit has no verbose output (--test-only says where a job would start)",
    "--verbose": "gsubmit has no verbose output (--test-only says where a job would start)",
    "--wait-all-nodes": "the batch script starts once every node of the job has it",
    "--wckey": "jobs carry no workload characterisation key (WCKey) here",
}
# Accepted as they are, dropped before parsing: what sbatch means by them is what
# gsubmit does anyway (#PBS lines are never read; a node range runs on its minimum).
ALREADY = frozenset({"--ignore-pbs", "--use-min-nodes"})
ALIASES = {"--usage": "--help", "-h": "--help"}
VERSION = ("-V", "--version")


def sbatch_only(token: str, declared: frozenset[str]) -> str | None:
    """``token`` (an option before the script) as gsubmit reads it: itself, another
    spelling, or None (dropped); a usage error naming a refused option. ``declared``:
    the spellings gsubmit declares, which are never refused here."""
    name = token.partition("=")[0] if token.startswith("--") else token[:2]
    if name in declared:
        return token
    if name in REFUSED:
        raise UsageError(f"{name}: not supported: {REFUSED[name]}")
    if name in VERSION:
        raise UsageError(f"{name}: run 'gsubmit {name}' alone for the version")
    if name in ALREADY:
        return None
    return ALIASES.get(name, token)
