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


def trailing_comma_allowed(parse: Callable[..., Any]) -> Callable[..., Any]:
    """``parse`` of a comma list that may end in a comma (``gpu:1,``), as sbatch's lists
    may; a refusal quotes the value as it was given."""

    def lenient(text: str, *args: Any) -> Any:
        trimmed = text.rstrip()
        if not trimmed.endswith(",") or not trimmed.rstrip(","):
            return parse(text, *args)
        try:
            return parse(trimmed.rstrip(","), *args)
        except (ValueError, UsageError):
            parse(text, *args)  # its own refusal, naming the whole value
            raise

    return lenient


# --gres items besides gpu[:TYPE][:N], as Slurm and sites write them.
SHARE_MODES = ("mps", "shard")  # a share of one GPU: mps:N (percent by default), shard:N
GPU_MEMORY = "gpumem"  # gpumem:SIZE, the same as --gpu-mem=SIZE
GRES_EXPECTED = "gpu[:TYPE][:N], mps:N, shard:N and gpumem:SIZE, comma-separated"
MAX_SHARE = 10_000  # as gpusched.messages.jobs (not imported here: the quick path)
MAX_GPU_MEM_MB = 16 * 1024 * 1024


class Gres:
    """A --gres value: its GPUs (``gpu`` None: no gpu item), a share of one GPU
    (``mode``: mps or shard, ``units``) and GPU memory (``memory_mb``, MiB)."""

    __slots__ = ("gpu", "mode", "units", "memory_mb")

    def __init__(self) -> None:
        self.gpu: tuple[tuple[str, ...], int] | None = None
        self.mode: str | None = None
        self.units = 0
        self.memory_mb: int | None = None


def parse_gres_list(text: str) -> Gres:
    """``gpu:a100:1,mps:50,gpumem:20g``: each item once; mps and shard not together."""
    from gpusched.core.shapes import ShapeError, parse_gres

    whole, gres = text.strip(), Gres()
    seen: set[str] = set()
    for item in whole.split(","):
        item = item.strip()
        name, _, value = item.partition(":")
        key = "share" if name in SHARE_MODES else name
        if key in seen:
            raise ShapeError(f"invalid --gres {whole!r}: "
                             + ("give mps:N or shard:N, not both" if name in SHARE_MODES
                                else f"{name} is given twice"))
        seen.add(key)
        if name == "gpu":
            gres.gpu = parse_gres(item)
        elif name in SHARE_MODES:
            gres.mode, gres.units = name, _units(value, name, whole)
        elif name == GPU_MEMORY:
            gres.memory_mb = gpu_memory(value, f"--gres {whole!r}: gpumem")
        else:
            raise ShapeError(f"invalid --gres {whole!r}: {item!r} is not a resource here "
                             f"(expected {GRES_EXPECTED})")
    return gres


def _units(text: str, mode: str, whole: str) -> int:
    """N of mps:N or shard:N: 1 to MAX_SHARE units of one GPU."""
    from gpusched.core.shapes import ShapeError

    if not (text.isascii() and text.isdigit() and len(text) <= 18 and 1 <= int(text) <= MAX_SHARE):
        raise ShapeError(f"invalid --gres {whole!r}: {mode}:N takes N from 1 to {MAX_SHARE} "
                         f"units of one GPU, not {text!r}")
    return int(text)


def gpu_memory(text: str, what: str = "--gpu-mem") -> int:
    """A GPU memory size in MiB, 1 MiB to 16 TiB: ``20G``, ``512M``, ``40960``."""
    from gpusched.core.shapes import ShapeError, parse_memory

    try:
        size = parse_memory(text, "size" if what != "--gpu-mem" else what)
    except ValueError as err:  # ShapeError, or int() of more than 4300 digits
        if what == "--gpu-mem" and isinstance(err, ShapeError):
            raise
        # within a --gres value: its own message
        raise ShapeError(f"invalid {what}: {text.strip()!r} is not a size such as "
                         "20G or 512M") from None
    if not 1 <= size <= MAX_GPU_MEM_MB:
        raise ShapeError(f"invalid {what} {text.strip()!r}: expected 1M to 16T of GPU memory")
    return size


def job_shape(values: dict[str, Any], origins: dict[str, str]) -> dict[str, Any]:
    """GPUs in all, their types, nodes, CPUs and memory per node, and a share of one GPU
    or GPU memory, from the options."""

    def parse(key: str, parser: Callable[..., Any], *args: Any) -> Any:
        return option_value(values, origins, key, lambda text: parser(text, *args))

    gres = (parse("gres", trailing_comma_allowed(parse_gres_list)) if values["gres"] is not None
            else None)
    given = [name for name in ("gpus", "gres", "gpus_per_node", "gpus_per_task")
             if values[name] is not None and (name != "gres" or (gres is not None
                                                                 and gres.gpu is not None))]
    if len(given) > 1:
        raise UsageError("give only one of --gpus, --gres, --gpus-per-node and --gpus-per-task")
    memory = [name for name in ("mem", "mem_per_gpu", "mem_per_cpu") if values[name] is not None]
    if len(memory) > 1:
        raise UsageError("give only one of --mem, --mem-per-gpu and --mem-per-cpu")

    hosts = trailing_comma_allowed(_hosts)
    nodelist = tuple(parse("nodelist", hosts, "--nodelist")) if values["nodelist"] else ()
    exclude = tuple(parse("exclude", hosts, "--exclude")) if values["exclude"] else ()
    nodes = (parse("nodes", node_count) if values["nodes"] is not None else 0) or len(nodelist) or 1
    if nodelist and nodes != len(nodelist):
        raise UsageError(f"--nodelist names {len(nodelist)} node(s) but --nodes asks for "
                         f"{nodes}: a job with --nodelist runs on exactly the nodes it names")

    kinds: tuple[str, ...] = ()
    per_node = 0
    if given == ["gpus"]:
        kinds, total = parse("gpus", gpu_request)
        if total % nodes:
            raise UsageError(f"--gpus {total} cannot be spread evenly over {nodes} nodes; "
                             f"use --gpus-per-node")
        per_node = total // nodes
    elif given == ["gres"]:
        assert gres is not None and gres.gpu is not None
        kinds, per_node = gres.gpu
    elif given == ["gpus_per_node"]:
        kinds, per_node = parse("gpus_per_node", gpu_request, "--gpus-per-node")
    tasks, per_task = values["ntasks"], values["cpus_per_task"]
    per_gpu = values.get("ntasks_per_gpu")
    if per_gpu is not None:
        tasks, per_node = tasks_per_gpu(per_gpu, tasks, per_node, nodes, given)
    node_tasks = values["ntasks_per_node"]
    # sbatch: each node runs its share of the tasks (or --ntasks-per-node of them).
    tasks_here = node_tasks or -(-(tasks or nodes) // nodes)
    if given == ["gpus_per_task"]:
        kinds, per_task_gpus = parse("gpus_per_task", gpu_request, "--gpus-per-task")
        per_node = per_task_gpus * tasks_here
        if node_tasks is None and tasks is not None and tasks % nodes:
            # sbatch would place the tasks unevenly (3 on 2 nodes: 2 and 1) and give each
            # node GPUs for its own; a job here holds as many GPUs on each of its nodes.
            raise UsageError(f"--gpus-per-task with {tasks} tasks on {nodes} nodes: the "
                             "tasks do not spread evenly, and a job holds the same GPUs on "
                             "each of its nodes; give --ntasks a multiple of --nodes, or "
                             "--gpus-per-node")
    if values["cpus_per_gpu"] is not None and (
            tasks is not None or per_task is not None or node_tasks is not None):
        raise UsageError("give --cpus-per-gpu, or --ntasks/--ntasks-per-node/--cpus-per-task, "
                         "not both")
    if tasks is not None or per_task is not None or node_tasks is not None:
        cpus = tasks_here * (per_task or 1)
    else:
        cpus = (values["cpus_per_gpu"] or 0) * per_node
    if values.get("overcommit") and cpus:
        cpus = per_task or 1  # sbatch: one CPU per node (each task's CPUs, with -c)
    cpus = max(cpus, values.get("mincpus") or 0)
    if memory:
        from gpusched.core.shapes import parse_memory
    mem = (parse("mem", parse_memory) if values["mem"] is not None
           else parse("mem_per_gpu", parse_memory, "--mem-per-gpu") * per_node
           if values["mem_per_gpu"] is not None
           else parse("mem_per_cpu", parse_memory, "--mem-per-cpu") * max(1, cpus)
           if values["mem_per_cpu"] is not None else 0)
    if tasks is None and node_tasks is not None:
        tasks = node_tasks * nodes
    gpus = per_node * nodes
    mode, units, gpu_mem = _share(values, origins, gres, gpus, nodes)
    return {"gpus": 1 if mode is not None or gpu_mem is not None else gpus,
            "gpu_types": kinds, "nodes": nodes, "cpus": cpus, "mem_mb": mem, "ntasks": tasks,
            "cpus_per_task": per_task, "ntasks_per_node": node_tasks, "nodelist": nodelist,
            "ntasks_per_gpu": per_gpu,
            "exclude": exclude, "share_mode": mode, "share": units, "gpu_mem_mb": gpu_mem}


def tasks_per_gpu(per_gpu: int, tasks: int | None, per_node: int, nodes: int,
                  given: list[str]) -> tuple[int | None, int]:
    """--ntasks-per-gpu N, as sbatch reads it: with GPUs asked for, N tasks for each
    (--ntasks, when given too, wins); with --ntasks alone, GPUs for them (ceil(tasks / N)
    in all, spread evenly over the nodes). The tasks and the GPUs per node."""
    if given == ["gpus_per_task"]:
        raise UsageError("give --ntasks-per-gpu or --gpus-per-task, not both")
    if given and per_node:
        return (per_gpu * per_node * nodes if tasks is None else tasks), per_node
    if tasks is None:
        raise UsageError(f"--ntasks-per-gpu {per_gpu}: give the job GPUs (--gpus, "
                         "--gpus-per-node, --gres) or --ntasks")
    gpus = -(-tasks // per_gpu)
    if gpus % nodes:
        raise UsageError(f"--ntasks-per-gpu {per_gpu} with {tasks} tasks needs {gpus} GPUs, "
                         f"which do not spread evenly over {nodes} nodes; give --gpus-per-node")
    return tasks, gpus // nodes


def _share(values: dict[str, Any], origins: dict[str, str], gres: Gres | None, gpus: int,
           nodes: int) -> tuple[str | None, int | None, int | None]:
    """The share of one GPU (--gres=mps:N or shard:N) and the GPU memory (--gpu-mem or
    --gres=gpumem:SIZE) a job asks for: either is one GPU on one node."""
    mode = None if gres is None else gres.mode
    units = None if gres is None or mode is None else gres.units
    from_gres = None if gres is None else gres.memory_mb
    gpu_mem = values.get("gpu_mem")
    if gpu_mem is not None and from_gres is not None:
        raise UsageError("give --gpu-mem or --gres=gpumem:SIZE, not both")
    memory = from_gres if gpu_mem is None else option_value(values, origins, "gpu_mem",
                                                            gpu_memory)
    if mode is None and memory is None:
        return None, None, None
    what = (f"--gres={mode}:{units} asks for a share of one GPU" if mode is not None
            else "--gpu-mem asks for one GPU with that memory" if from_gres is None
            else "--gres=gpumem asks for one GPU with that memory")
    if gpus > 1:
        raise UsageError(f"{what}, not {gpus} GPUs: give no GPU count, or 1")
    if nodes > 1:
        raise UsageError(f"{what} on one node, not {nodes} nodes")
    if values.get("exclusive"):
        raise UsageError(f"{what}: it cannot take whole nodes (--exclusive)")
    return mode, units, memory


def gpu_request(text: str, what: str = "--gpus") -> tuple[tuple[str, ...], int]:
    """``[TYPE:]N`` as parse_gpus reads it; a TYPE alone (``v100``, ``a100|h100``,
    ``1g.10gb``) is one GPU of it, as in sbatch."""
    from gpusched.core.shapes import is_gpu_kind, is_mig_profile, parse_gpus

    whole = text.strip()
    if whole and ":" not in whole and not whole.isdigit() and all(  # re only for a type
            is_mig_profile(kind) or kind[:1].isalpha() and is_gpu_kind(kind)
            for kind in whole.lower().split("|")):
        whole += ":1"
    return parse_gpus(whole, what)


MAX_NODES = 100_000  # far above any cluster; the controller holds the real bound


def node_count(text: str | int) -> int:
    """``-N K`` or sbatch's range ``-N K-MAX``: K nodes (the job runs on its minimum;
    a range is not scheduled here). 0 never: K is at least 1. A number (galloc's and
    gsrun's -N, parsed already) is checked the same way."""
    text = str(text)
    low, dash, high = text.strip().partition("-")
    for part in (low, high) if dash else (low,):
        if not (part.isascii() and part.isdigit() and len(part) <= 6):
            raise UsageError(f"invalid --nodes {text.strip()[:32]!r}: expected N or MIN-MAX")
    count, whole = int(low), text.strip()
    why = ("below the minimum of 1" if count < 1 else
           f"above the maximum of {MAX_NODES}" if count > MAX_NODES else
           "its MAX is below its MIN" if dash and int(high) < count else "")
    if why:
        raise UsageError(f"invalid --nodes {whole!r}: {why}")
    return count


def share_fields(mode: str | None, units: int | None, gpu_mem: int | None) -> dict[str, Any]:
    """A ``POST /v1/jobs`` body's share_mode, share and gpu_mem_mb, those given only: a
    job asking for none sends the body it always did."""
    fields = {"share_mode": mode, "share": units, "gpu_mem_mb": gpu_mem}
    return {key: value for key, value in fields.items() if value is not None}


def _hosts(text: str, flag: str) -> list[str]:
    """The node names of a host list (sbatch: node[01-04],gpu7)."""
    from gpusched.core.hostlist import HostlistError, expand_hostlist

    try:
        return expand_hostlist(text)
    except HostlistError as err:
        raise HostlistError(f"invalid {flag} {text!r}: {err}") from None
