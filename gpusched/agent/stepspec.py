"""The spec of a node's part of a job step, as its step supervisor takes it: each
task's environment (srun's, CUDA's and torch.distributed's variables), where its
output, error and input go, and the step's cgroup on the node."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from typing import Any

from gpusched.agent.confine import MIB, Confinement, agent_cpus, device_rules, numa_cpus
from gpusched.agent.cpubind import choose_cpus
from gpusched.core.hostlist import compress_hostlist
from gpusched.core.outputs import StepPlace, expand_output_pattern
from gpusched.core.steps import tasks_per_node_text
from gpusched.messages.steps import StepLaunch

DEFAULT_UMASK = 0o022  # a step stored without its submitter's umask



def task_environment(launch: StepLaunch, task_id: int, local_id: int,
                     gpu_uuids: Collection[str]) -> dict[str, str]:
    """One task's environment: gsrun's, then the step's variables (each ``SLURM_X``
    also as ``GPUSCHED_X``), CUDA's and torch.distributed's."""
    nodes = list(launch.node_names)
    per_node = tasks_per_node_text(launch.tasks_per_node)
    step_gpus = ",".join(dict.fromkeys(u for t in launch.tasks for u in t.gpu_uuids))
    slurm = {
        "JOB_ID": launch.job_id, "JOBID": launch.job_id, "STEP_ID": launch.step_id,
        "STEPID": launch.step_id, "PROCID": task_id, "LOCALID": local_id,
        "NODEID": launch.node_index, "NTASKS": launch.ntasks, "NPROCS": launch.ntasks,
        "NNODES": len(nodes), "STEP_NUM_TASKS": launch.ntasks,
        "STEP_NUM_NODES": len(nodes), "STEP_NODELIST": compress_hostlist(nodes),
        "STEP_TASKS_PER_NODE": per_node, "TASKS_PER_NODE": per_node,
        "STEP_GPUS": step_gpus,
    }
    env = dict(launch.environment)
    for key, value in slurm.items():
        env[f"SLURM_{key}"] = env[f"GPUSCHED_{key}"] = str(value)
    env["SLURMD_NODENAME"] = env["GPUSCHED_NODENAME"] = launch.node
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_uuids)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    # A rendezvous address gsrun's environment names is kept, as the controller keeps it.
    env.setdefault("MASTER_ADDR", launch.master_addr)
    env.setdefault("MASTER_PORT", str(launch.master_port))
    env.update(WORLD_SIZE=str(launch.ntasks), RANK=str(task_id), LOCAL_RANK=str(local_id),
               LOCAL_WORLD_SIZE=str(len(launch.tasks)), GROUP_RANK=str(launch.node_index))
    return env


def _task_files(launch: StepLaunch, task_id: int) -> dict[str, Any]:
    """Where a task's stdout, stderr and stdin go (None: streamed through gsrun)."""
    place = StepPlace(launch.step_id, task_id, launch.node_index)

    def path(pattern: str) -> str:
        return os.path.join(launch.work_dir, expand_output_pattern(
            pattern, launch.job_id, launch.job_name, launch.user, node=launch.node,
            step=place))

    stdout = None if launch.output is None else path(launch.output)
    stderr = path(launch.error) if launch.error is not None else stdout
    if launch.pty:  # the terminal is its stdin, stdout and stderr
        return {"stdout": None, "stderr": None, "stdin": None, "stdin_frames": True,
                "pty": True}
    if launch.input is None:
        return {"stdout": stdout, "stderr": stderr, "stdin": None,
                "stdin_frames": task_id == 0}
    stdin = None if launch.input == "none" else path(launch.input)
    return {"stdout": stdout, "stderr": stderr, "stdin": stdin, "stdin_frames": False}


def step_spec(launch: StepLaunch, kill_grace: float, min_uid: int,
              cgroup: dict[str, Any] | None = None,
              refusal: str | None = None) -> dict[str, Any]:
    """The step supervisor's spec for this node's part of a step."""
    tasks = [{"task_id": t.task_id, "local_id": t.local_id,
              "env": task_environment(launch, t.task_id, t.local_id, t.gpu_uuids),
              **_task_files(launch, t.task_id)} for t in launch.tasks]
    return {
        "job_id": launch.job_id, "run": launch.run, "step_id": launch.step_id,
        "node": launch.node, "node_index": launch.node_index, "uid": launch.uid,
        "gid": launch.gid, "user": launch.user, "min_uid": int(min_uid),
        "argv": list(launch.argv), "cwd": launch.work_dir,
        "umask": DEFAULT_UMASK if launch.umask is None else launch.umask,
        "kill_grace": float(kill_grace), "deadline": launch.deadline,
        "io": launch.io.to_json(), "tasks": tasks, "cgroup": cgroup, "refusal": refusal,
    }


def step_cgroup_spec(confinement: Confinement, launch: StepLaunch,
                     gpus: Mapping[str, Mapping[str, Any]],
                     job_cpus: Collection[int] | None,
                     held_cpus: Collection[int]) -> dict[str, Any] | None:
    """The cgroup the step supervisor makes (None: steps here are not confined): the
    job's GPUs on this node, its memory here, and the CPUs of its batch run where that
    runs on this node (``job_cpus``), else CPUs chosen as for a job. LaunchRefused when
    the devices cannot be allowed."""
    tree = confinement.tree
    if tree is None:
        return None
    controllers = tree.controllers()
    memory = launch.mem_mb * MIB if launch.mem_mb > 0 and "memory" in controllers else None
    cpus = mems = None
    if "cpuset" in controllers:
        if job_cpus:
            cpus = sorted(job_cpus)
        else:
            numa = numa_cpus()
            gpu_numa = {gpus[u]["numa_node"] for u in launch.gpu_uuids
                        if u in gpus and gpus[u].get("numa_node") is not None}
            choice = choose_cpus(launch.cpus, agent_cpus(tree), held_cpus, gpu_numa, numa)
            if choice.cpus is not None:
                cpus = sorted(choice.cpus)
                mems = None if choice.mems is None else sorted(choice.mems)
    return {
        "tree": tree.to_json(),
        "name": f"job_{launch.job_id}_step_{launch.step_id}_{launch.run}",
        "memory_bytes": memory, "swap": confinement.allow_swap, "cpus": cpus,
        "mems": mems, "devices": [list(r) for r in device_rules(launch.gpu_uuids, gpus)],
        "notes": [],
    }
