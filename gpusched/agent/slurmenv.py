"""The variables of sbatch's OUTPUT ENVIRONMENT VARIABLES that a job's batch script sees,
built purely from its launch order, the node's GPU inventory and the node's CPU count.

Two kinds. The scheduler's own (``OWNED``): what the job holds, where and when it runs,
its partition, account and QOS. The agent sets each of these (or, when it does not
apply, leaves it out) and a variable of the same name in the submit environment never
wins: it is dropped, so that a job submitted from inside another job does not inherit
that job's values. The client's: what only gsubmit knows (``SLURM_SUBMIT_HOST``,
``SLURM_PRIO_PROCESS``, ``SLURM_EXPORT_ENV``, ``SLURM_NTASKS``...), which it puts in the
environment it sends, as sbatch does; the agent keeps them as sent, and reads
``SLURM_NTASKS``/``SLURM_NTASKS_PER_NODE`` to tell ``SLURM_TASKS_PER_NODE``.
``SLURM_SUBMIT_DIR`` is the client's when it sent an absolute path of at most
``MAX_PATH`` bytes, else the job's working directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpusched.core.arrays import runs, task_bounds
from gpusched.core.hostlist import compress_hostlist
from gpusched.core.steps import tasks_per_node_text as repeated
from gpusched.messages import LaunchOrder

MAX_PATH = 4096  # bytes of a submit directory (Linux's PATH_MAX)
MAX_TASKS = 1 << 24  # a task count read back from the submit environment
# Names under SLURM_ the agent owns (each also under GPUSCHED_, but for those in
# NOT_MIRRORED), besides SLURMD_NODENAME (GPUSCHED_NODENAME).
OWNED = (
    "JOB_ID", "JOBID", "JOB_NAME", "JOB_GPUS", "JOB_NODELIST", "NODELIST", "JOB_NUM_NODES",
    "NNODES", "SUBMIT_DIR", "RESTART_COUNT", "ARRAY_JOB_ID", "ARRAY_TASK_ID",
    "ARRAY_TASK_COUNT", "ARRAY_TASK_MIN", "ARRAY_TASK_MAX", "ARRAY_TASK_STEP",
    "GPUS_ON_NODE", "GPUS", "GPUS_PER_NODE", "CPUS_ON_NODE", "JOB_CPUS_PER_NODE",
    "MEM_PER_NODE", "TASKS_PER_NODE", "JOB_PARTITION", "JOB_ACCOUNT", "JOB_QOS",
    "JOB_DEPENDENCY", "JOB_START_TIME", "JOB_END_TIME", "JOB_USER", "JOB_UID", "JOB_GID",
    "NODEID", "PROCID", "LOCALID", "GTIDS", "SHARDS_ON_NODE", "NPROCS",
    "CLUSTER_NAME")
# GPUSCHED_GPUS and GPUSCHED_JOB_NAME are gsubmit's input variables (sbatch's
# SBATCH_GPUS, SBATCH_JOB_NAME): a job that submits another must not pass its own GPU
# count or name on as the new job's.
NOT_MIRRORED = frozenset({"GPUS", "JOB_NAME"})


def owned_names() -> frozenset[str]:
    """Every variable name the agent sets or leaves out, whatever the user sent."""
    names = {f"{prefix}_{key}" for key in OWNED for prefix in ("SLURM", "GPUSCHED")}
    return frozenset(names | {"SLURMD_NODENAME", "GPUSCHED_NODENAME"})


def slurm_variables(order: LaunchOrder, node_name: str,
                    inventory: Mapping[str, Mapping[str, Any]] | None,
                    node_cpus: int, cluster: str | None = None) -> dict[str, str]:
    """The job's variables under their ``SLURM_*`` names (and ``SLURMD_NODENAME``).

    ``inventory`` is this node's GPUs and MIG slices by UUID (each with its
    ``index``); a UUID of the order it does not hold is another node's, shown neither
    in ``SLURM_JOB_GPUS`` nor in ``SLURM_GPUS_ON_NODE``. None: every UUID is this
    node's, with no index known (``SLURM_JOB_GPUS`` empty). ``node_cpus`` is this
    node's CPU count, what a job holds whose CPUs are not counted; ``cluster`` the
    configuration's ``cluster_name`` (None: SLURM_CLUSTER_NAME is not set).
    """
    nodes = list(order.node_names) or [node_name]
    n = len(nodes)
    found = {"JOB_ID": str(order.job_id), "JOBID": str(order.job_id), "JOB_NAME": order.name,
             "JOB_NODELIST": compress_hostlist(nodes), "NODELIST": compress_hostlist(nodes),
             "JOB_NUM_NODES": str(n), "NNODES": str(n),
             "SUBMIT_DIR": submit_dir(order.environment.get("SLURM_SUBMIT_DIR"),
                                      order.work_dir),
             "RESTART_COUNT": str(order.run), "JOB_USER": order.user,
             "JOB_UID": str(order.uid), "JOB_GID": str(order.gid),
             "NODEID": "0", "PROCID": "0", "LOCALID": "0", "GTIDS": "0"}
    if order.array_job_id is not None and order.array_task_id is not None:
        found.update(array_variables(order.array_job_id, order.array_task_id,
                                     order.array_spec or str(order.array_task_id)))
    here = [u for u in order.gpu_uuids if inventory is None or u in inventory]
    indexes = sorted(int(inventory[u]["index"]) for u in here) if inventory else []
    found["JOB_GPUS"] = ",".join(map(str, indexes))
    found["GPUS_ON_NODE"] = str(len(here))
    cpus = order.cpus or node_cpus
    found["CPUS_ON_NODE"] = str(cpus)
    if order.cpus:
        found["JOB_CPUS_PER_NODE"] = repeated([order.cpus] * n)
    if order.mem_mb:
        found["MEM_PER_NODE"] = str(order.mem_mb)
    ntasks = _count(order.environment.get("SLURM_NTASKS"))
    if ntasks:  # sbatch's older name for it
        found["NPROCS"] = str(ntasks)
    per_node = tasks_per_node(ntasks, _count(order.environment.get("SLURM_NTASKS_PER_NODE")), n)
    if per_node:
        found["TASKS_PER_NODE"] = repeated(per_node)
    found.update(fact_variables(order, n))
    if cluster:
        found["CLUSTER_NAME"] = cluster
    out = {f"SLURM_{key}": value for key, value in found.items()}
    out["SLURMD_NODENAME"] = node_name
    return out


def fact_variables(order: LaunchOrder, nodes: int) -> dict[str, str]:
    """What the order's job facts show: partition, account, QOS, dependency, the GPUs
    asked for (whole GPUs or MIG slices, not a share of one), and start and end."""
    facts = order.job
    if facts is None:  # an order of an older controller
        return {}
    found = {"JOB_PARTITION": facts.partition}
    for key, value in (("JOB_ACCOUNT", facts.account), ("JOB_QOS", facts.qos),
                       ("JOB_DEPENDENCY", facts.dependency)):
        if value:
            found[key] = value
    if facts.gpus and order.share is None:
        found["GPUS"] = str(facts.gpus)
        found["GPUS_PER_NODE"] = str(facts.gpus // max(1, nodes))
    if facts.start_time is not None:
        found["JOB_START_TIME"] = str(facts.start_time)
        if order.time_limit:
            found["JOB_END_TIME"] = str(facts.start_time + order.time_limit)
    return found


def mirrored(variables: Mapping[str, str]) -> dict[str, str]:
    """``variables`` under their ``SLURM_*`` names and again under ``GPUSCHED_*``
    (``SLURMD_NODENAME``: ``GPUSCHED_NODENAME``), but for NOT_MIRRORED."""
    out: dict[str, str] = {}
    for name, value in variables.items():
        out[name] = value
        key = name.removeprefix("SLURMD_").removeprefix("SLURM_")
        if key not in NOT_MIRRORED:
            out[f"GPUSCHED_{key}"] = value
    return out


def submit_dir(sent: str | None, work_dir: str) -> str:
    """The directory gsubmit ran in as it sent it, unchanged, when it is an absolute
    path of at most MAX_PATH bytes; else the job's working directory."""
    if sent and sent.startswith("/") and len(sent.encode("utf-8", "surrogatepass")) <= MAX_PATH:
        return sent
    return work_dir


def tasks_per_node(ntasks: int | None, ntasks_per_node: int | None,
                   nodes: int) -> list[int]:
    """Tasks on each node as Slurm's block distribution lays them: ``--ntasks-per-node``
    on every node, else ``--ntasks`` spread with the first nodes taking one more; []
    when neither is known (or there are fewer tasks than nodes)."""
    if ntasks_per_node:
        return [ntasks_per_node] * nodes
    if not ntasks or ntasks < nodes:
        return []
    base, extra = divmod(ntasks, nodes)
    return [base + 1] * extra + [base] * (nodes - extra)


def array_variables(array_job: int, task: int, spec: str) -> dict[str, str]:
    """``ARRAY_*`` variables of one task, as Slurm sets them (STEP only for one range)."""
    count, lowest, highest = task_bounds(spec)
    found = {"ARRAY_JOB_ID": str(array_job), "ARRAY_TASK_ID": str(task),
             "ARRAY_TASK_COUNT": str(count), "ARRAY_TASK_MIN": str(lowest),
             "ARRAY_TASK_MAX": str(highest)}
    if "," not in spec:
        found["ARRAY_TASK_STEP"] = str(runs(spec)[0].step)
    return found


def _count(text: str | None) -> int | None:
    """A positive task count as gsubmit wrote it, or None."""
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 9:
        return None
    value = int(text)
    return value if 1 <= value <= MAX_TASKS else None
