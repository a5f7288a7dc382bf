"""A job's supervisor spec, built from its launch order: what to run, as whom, where,
with which variables, for how long, confined how, between which site programs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpusched.agent import mps
from gpusched.agent.containers import job_container
from gpusched.agent.slurmenv import mirrored, owned_names, slurm_variables
from gpusched.core.outputs import DEFAULT_OUTPUT_PATTERN, expand_output_pattern
from gpusched.messages import LaunchOrder

SCRIPT_PLACEHOLDER = "script"  # argv[0] of a built spec, until launch() writes the file
DEFAULT_UMASK = 0o022  # for a job stored without its submitter's umask
DEFAULT_STATE_DIR = "/var/lib/gpusched/agent"  # as AgentConfig's, for a spec built without
DEFAULT_MPS_CONTROL = "nvidia-cuda-mps-control"


def build_spec(order: LaunchOrder, kill_grace: float, node_name: str,
               min_uid: int = 1, cgroup: dict[str, Any] | None = None,
               site: Mapping[str, Any] | None = None,
               inventory: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Turn a launch order of ``/agent/v1/work`` into a supervisor spec.

    The environment is the submit environment plus the job's variables, each under
    ``GPUSCHED_*`` and Slurm's ``SLURM_*`` name (gpusched.agent.slurmenv; a submitted
    variable of a name the scheduler sets is dropped). ``CUDA_VISIBLE_DEVICES`` and
    ``GPUSCHED_JOB_GPUS`` are the comma-joined GPU UUIDs (UUIDs cannot be misread under
    another device order), empty when the job has no GPUs; ``SLURM_JOB_GPUS`` has their
    indexes in ``inventory``, this node's GPUs by UUID, as Slurm gives them.
    ``argv[0]`` is a placeholder that ``launch()`` replaces with the path of the script
    file. ``run`` is the job's restart count, which names
    this run of it in everything the agent tells the controller. ``min_uid`` travels in the spec for the
    supervisor, which refuses a job below it too; ``umask`` is the submitter's.
    ``cgroup`` is what the supervisor confines the job in (gpusched.agent.confine; None:
    not confined) and ``site`` the agent's settings as a mapping: the node's prolog and
    epilog (``site_programs``), and for a job that shares its GPU, ``state_dir`` and
    ``mps_control`` (gpusched.agent.mps: its variables, and ``mps``, the daemon it needs).
    """
    job_id, name, user, work_dir = order.job_id, order.name, order.user, order.work_dir
    array_job, task = order.array_job_id, order.array_task_id
    gpus = ",".join(order.gpu_uuids)
    # The job's own variables first: the prolog gets only these.
    env = mirrored(slurm_variables(order, node_name, inventory, os.cpu_count() or 1,
                                   (site or {}).get("cluster_name")))
    env["GPUSCHED_JOB_GPUS"] = gpus  # UUIDs; SLURM_JOB_GPUS has Slurm's indexes
    env["CUDA_VISIBLE_DEVICES"] = gpus
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # else CUDA orders by speed, unlike nvidia-smi
    site = site or {}
    state_dir = Path(site.get("state_dir", DEFAULT_STATE_DIR))
    env.update(mps.share_environment(order.share, state_dir))
    job_vars = dict(env)
    owned = owned_names()  # a submitted value never stands in for the scheduler's
    env = {**{k: v for k, v in order.environment.items() if k not in owned}, **env}

    def output_path(pattern: str) -> str:
        return os.path.join(work_dir, expand_output_pattern(
            pattern, job_id, name, user, array_job, task, node_name))

    stdout = output_path(order.output or DEFAULT_OUTPUT_PATTERN)
    stderr = output_path(order.error) if order.error else stdout
    return {
        "job_id": job_id, "run": order.run, "uid": order.uid, "gid": order.gid, "user": user,
        "argv": [SCRIPT_PLACEHOLDER, *order.args],
        "cwd": work_dir, "env": env, "stdout": stdout, "stderr": stderr,
        "open_mode": order.open_mode,  # truncate: the output files are emptied first
        "time_limit": order.time_limit, "kill_grace": float(kill_grace),
        "warn_signal": order.warn_signal, "warn_seconds": order.warn_seconds,
        "warn_batch_only": order.warn_batch_only,
        "umask": DEFAULT_UMASK if order.umask is None else order.umask,
        "min_uid": int(min_uid),
        "cgroup": cgroup,
        "mps": mps.spec_entry(order.share, str(site.get("mps_control", DEFAULT_MPS_CONTROL))),
        **site_programs(site),
        "job_vars": job_vars,
        # The runtime's command that runs the script in the job's container (None: none).
        "container": job_container(order, site, inventory, env),
    }


def site_programs(config: Mapping[str, Any]) -> dict[str, Any]:
    """The prolog and epilog paths (None: none) and timeouts, from the agent's settings
    as a mapping (``prolog``, ``epilog``, ``prolog_timeout``, ``epilog_timeout``)."""
    found: dict[str, Any] = {}
    for key in ("prolog", "epilog"):
        path = config.get(key)
        found[key] = None if path is None else str(path)
        found[f"{key}_timeout"] = float(config.get(f"{key}_timeout", 60.0))
    return found
