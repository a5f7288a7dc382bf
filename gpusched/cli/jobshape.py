"""The job's shape (GPUs, their types, nodes, CPUs and memory per node, node lists)
from gsubmit's options and directives, as sbatch reads them."""

from __future__ import annotations

from gpusched.errors import UsageError

# The parsers of host lists, GPU requests and memory sizes load re: they are imported
# where an option needs them, so that a job asking for nothing special loads none.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def option_value(values: dict[str, Any], origins: dict[str, str], key: str,
            parse: Callable[[str], Any], flag: str = "") -> Any:
    """``parse`` of option ``key``'s value, or None when it is unset. A refusal (the
    parsers' errors are ValueErrors) is a usage error saying where the value came from
    (a directive line or input variable), then ``flag`` when the parser's message does
    not name it."""
    text = values[key]
    if text is None:
        return None
    try:
        return parse(text)
    except (ValueError, UsageError) as err:
        message = err.message if isinstance(err, UsageError) else str(err)
        where = "".join(f"{part}: " for part in (origins.get(key), flag) if part)
        raise UsageError(f"{where}{message}") from None


def job_shape(values: dict[str, Any], origins: dict[str, str]) -> dict[str, Any]:
    """GPUs in all, their types, nodes, and CPUs and memory per node, from the options."""
    given = [name for name in ("gpus", "gres", "gpus_per_node", "gpus_per_task")
             if values[name] is not None]
    if len(given) > 1:
        raise UsageError("give only one of --gpus, --gres, --gpus-per-node and --gpus-per-task")
    memory = [name for name in ("mem", "mem_per_gpu", "mem_per_cpu") if values[name] is not None]
    if len(memory) > 1:
        raise UsageError("give only one of --mem, --mem-per-gpu and --mem-per-cpu")

    def parse(key: str, parser: Callable[..., Any], *args: Any) -> Any:
        return option_value(values, origins, key, lambda text: parser(text, *args))

    nodelist = tuple(parse("nodelist", _hosts, "--nodelist")) if values["nodelist"] else ()
    exclude = tuple(parse("exclude", _hosts, "--exclude")) if values["exclude"] else ()
    nodes = values["nodes"] or len(nodelist) or 1
    if nodelist and nodes != len(nodelist):
        raise UsageError(f"--nodelist names {len(nodelist)} node(s) but --nodes asks for "
                         f"{nodes}: a job with --nodelist runs on exactly the nodes it names")

    kinds: tuple[str, ...] = ()
    per_node = 0
    if given:
        from gpusched.core.shapes import parse_gpus, parse_gres
    if given == ["gpus"]:
        kinds, total = parse("gpus", parse_gpus)
        if total % nodes:
            raise UsageError(f"--gpus {total} cannot be spread evenly over {nodes} nodes; "
                             f"use --gpus-per-node")
        per_node = total // nodes
    elif given == ["gres"]:
        kinds, per_node = parse("gres", parse_gres)
    elif given == ["gpus_per_node"]:
        kinds, per_node = parse("gpus_per_node", parse_gpus, "--gpus-per-node")
    tasks, per_task = values["ntasks"], values["cpus_per_task"]
    node_tasks = values["ntasks_per_node"]
    # sbatch: each node runs its share of the tasks (or --ntasks-per-node of them).
    tasks_here = node_tasks or -(-(tasks or nodes) // nodes)
    if given == ["gpus_per_task"]:
        kinds, per_task_gpus = parse("gpus_per_task", parse_gpus, "--gpus-per-task")
        per_node = per_task_gpus * tasks_here
    if values["cpus_per_gpu"] is not None and (
            tasks is not None or per_task is not None or node_tasks is not None):
        raise UsageError("give --cpus-per-gpu, or --ntasks/--ntasks-per-node/--cpus-per-task, "
                         "not both")
    if tasks is not None or per_task is not None or node_tasks is not None:
        cpus = tasks_here * (per_task or 1)
    else:
        cpus = (values["cpus_per_gpu"] or 0) * per_node
    if memory:
        from gpusched.core.shapes import parse_memory
    mem = (parse("mem", parse_memory) if values["mem"] is not None
           else parse("mem_per_gpu", parse_memory, "--mem-per-gpu") * per_node
           if values["mem_per_gpu"] is not None
           else parse("mem_per_cpu", parse_memory, "--mem-per-cpu") * max(1, cpus)
           if values["mem_per_cpu"] is not None else 0)
    if tasks is None and node_tasks is not None:
        tasks = node_tasks * nodes
    return {"gpus": per_node * nodes, "gpu_types": kinds, "nodes": nodes, "cpus": cpus,
            "mem_mb": mem, "ntasks": tasks, "cpus_per_task": per_task,
            "ntasks_per_node": node_tasks, "nodelist": nodelist, "exclude": exclude}


def _hosts(text: str, flag: str) -> list[str]:
    """The node names of a host list (sbatch: node[01-04],gpu7)."""
    from gpusched.core.hostlist import HostlistError, expand_hostlist

    try:
        return expand_hostlist(text)
    except HostlistError as err:
        raise HostlistError(f"invalid {flag} {text!r}: {err}") from None
