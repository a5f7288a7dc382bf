"""How an agent confines its jobs: the cgroup subtree it opens at start, and the part
of each job's spec that tells the supervisor what cgroup to make (or None).

Under cgroup v2 without a configured root the agent owns the cgroup it was started in
(systemd's ``Delegate=yes``): it moves itself into a leaf of its own there, so that
controllers can be enabled for the job subtree beside it ("no internal processes").
Names carry the node name and a hash of the state directory, so that several agents
on one host (``gpusched up --nodes N``, parallel tests) never share a subtree.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpusched.agent.cgroups import (
    CgroupTree,
    CgroupUnavailable,
    JobCgroup,
    detect,
    gpu_device_rules,
)
from gpusched.agent.cgroups.devices import (
    MIG_MINORS,
    mig_cap_minors,
    parse_mig_minors,
    parse_proc_devices,
)
from gpusched.agent.cgroups.tree import DEFAULT_BASE
from gpusched.agent.cpubind import BindingError, choose_cpus, parse_cpulist
from gpusched.agent.settings import AgentConfig
from gpusched.errors import GpuschedError
from gpusched.messages import LaunchOrder

log = logging.getLogger(__name__)
NUMA_NODES = Path("/sys/devices/system/node")
MIB = 1024 * 1024
MAX_ENFORCEMENT = 256  # characters of the registered description (the controller's bound)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


class ConfinementUnavailable(GpuschedError):
    """[agent.cgroups] enforce = "required", and no cgroup can be made here."""


class LaunchRefused(GpuschedError):
    """This job cannot be confined as it asks (its launch fails with the message)."""


@dataclass(frozen=True)
class Confinement:
    """The tree jobs are confined in (None: not confined) and, in words, how."""

    tree: CgroupTree | None
    description: str
    allow_swap: bool = False

    @property
    def enforced(self) -> bool:
        return self.tree is not None

    def registration(self) -> dict[str, Any]:
        """The fields a node registers about its confinement; the description as at
        most MAX_ENFORCEMENT printable characters, as the controller takes it."""
        text = "".join(c if c.isprintable() else " " for c in self.description)
        if len(text) > MAX_ENFORCEMENT:
            text = text[:MAX_ENFORCEMENT - 3] + "..."
        return {"enforced": self.enforced, "enforcement": text}


def subtree_name(node_name: str, state_dir: Path) -> str:
    """``gpusched-<node>-<hash of the state dir>``: unique per agent on a host."""
    digest = hashlib.sha256(str(Path(state_dir).absolute()).encode()).hexdigest()[:10]
    return f"gpusched-{_UNSAFE.sub('_', node_name)[:40]}-{digest}"


def open_confinement(config: AgentConfig, base: Path = DEFAULT_BASE) -> Confinement:
    """Find the cgroup tree for this agent's jobs, as [agent.cgroups] enforce says.

    "off": none (said at info level); "auto": none where no cgroup can be made (one
    warning naming why); "required": ConfinementUnavailable instead.
    """
    if config.cgroups == "off":
        log.info("jobs are not confined: [agent.cgroups] enforce is off")
        return Confinement(None, "not confined: [agent.cgroups] enforce is off")
    name = subtree_name(config.node_name, config.state_dir)
    try:
        tree = _open_tree(config.cgroup_root, base, name)
    except CgroupUnavailable as exc:
        if config.cgroups == "required":
            raise ConfinementUnavailable(
                f"[agent.cgroups] enforce is required, but no cgroup can be made: {exc}"
            ) from None
        log.warning("jobs are NOT confined (GPU devices, memory and CPUs are not enforced, "
                    "and a job's processes are not killed as a whole): %s", exc)
        return Confinement(None, f"not confined: {exc}")
    missing = sorted({"memory", "cpuset"} - tree.controllers())
    description = tree.describe() + (f" (no {' or '.join(missing)} controller: not limited)"
                                     if missing else "")
    log.info("jobs are confined in %s", description)
    return Confinement(tree, description, config.allow_swap)


def _open_tree(root: Path | None, base: Path, name: str) -> CgroupTree:
    if root is not None:
        return detect(root)
    if not (base / "cgroup.controllers").is_file():
        return detect(base=base, name=name)
    own = own_v2_cgroup(base)
    if own.name == f"{name}.agent":  # started inside the leaf of an earlier agent
        own = own.parent
    enter_v2_leaf(own, f"{name}.agent")
    return detect(own / name)


def own_v2_cgroup(base: Path) -> Path:
    """This process's cgroup in the v2 hierarchy mounted at ``base``."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return base / line[3:].strip().lstrip("/")
    raise CgroupUnavailable("this process is in no cgroup v2")


def enter_v2_leaf(own: Path, leaf: str) -> None:
    """Move this process (all its threads) into ``own/leaf``, so that ``own`` holds no
    process and may enable controllers for its children."""
    path = own / leaf
    try:
        path.mkdir(exist_ok=True)
        (path / "cgroup.procs").write_text(str(os.getpid()))
    except OSError as exc:
        raise CgroupUnavailable(f"cannot move the agent into {path}: "
                                f"{exc.strerror or exc}") from None


def release(confinement: Confinement) -> None:
    """Remove the agent's job subtree if no job is left in it (else leave it be)."""
    tree = confinement.tree
    if tree is None:
        return
    for path in [tree.root] if tree.version == 2 else list(tree.roots.values()):
        try:
            if path is not None:
                path.rmdir()
        except OSError:
            pass


# ------------------------------------------------------------------ a job's cgroup


def job_cgroup_spec(confinement: Confinement, order: LaunchOrder,
                    gpus: Mapping[str, Mapping[str, Any]],
                    held_cpus: Collection[int]) -> dict[str, Any] | None:
    """What the supervisor must make for this job (the spec's ``cgroup``), or None when
    jobs here are not confined. ``gpus`` is the registered inventory by UUID and
    ``held_cpus`` the CPUs of the jobs running here. LaunchRefused when the job cannot
    be confined as it asks."""
    tree = confinement.tree
    if tree is None:
        return None
    notes: list[str] = []
    controllers = tree.controllers()
    memory = order.mem_mb * MIB if order.mem_mb > 0 else None
    if memory is not None and "memory" not in controllers:
        notes.append(f"memory not limited: no memory controller in {tree.describe()}")
        memory = None
    cpus = mems = None
    if "cpuset" in controllers:
        # A job counting no CPUs gets no cpuset, whatever the node's CPUs: they are
        # read (from /sys, at every launch) only for one that counts some.
        counts = order.cpus > 0
        numa = numa_cpus() if counts else {}
        gpu_numa = {gpus[u]["numa_node"] for u in order.gpu_uuids
                    if counts and u in gpus and gpus[u].get("numa_node") is not None}
        try:
            choice = choose_cpus(order.cpus, agent_cpus(tree) if counts else set(),
                                 held_cpus, gpu_numa, numa, order.gres_flags)
        except BindingError as exc:
            raise LaunchRefused(str(exc)) from None
        cpus, mems = choice.cpus, choice.mems
        if choice.note:
            notes.append(choice.note)
    elif order.gres_flags == "enforce-binding":
        raise LaunchRefused("--gres-flags=enforce-binding: this node has no cpuset "
                            "controller to bind CPUs with")
    else:
        notes.append(f"no cpuset: no cpuset controller in {tree.describe()}")
    return {
        "tree": tree.to_json(), "name": f"job-{order.job_id}-{order.run}",
        "memory_bytes": memory, "swap": confinement.allow_swap,
        "cpus": None if cpus is None else list(cpus),
        "mems": None if mems is None else list(mems),
        "devices": [list(rule) for rule in device_rules(order.gpu_uuids, gpus)],
        "notes": notes,
    }


def device_rules(uuids: Collection[str], gpus: Mapping[str, Mapping[str, Any]]
                 ) -> list[tuple[str, int, int | None]]:
    """The device allow-list of a job holding these GPUs and MIG slices: those of this
    node's inventory (``gpus``, by UUID); no other GPU is allowed."""
    by_index = {g["index"]: g for g in gpus.values()}
    majors = parse_proc_devices(Path("/proc/devices").read_text())
    minors: set[int] = set()
    caps: list[int] = []
    mig_table: dict[str, int] | None = None
    for uuid in uuids:
        gpu = gpus.get(uuid)
        if gpu is None:
            continue  # another node's GPU (a multi-node job's order names them all)
        whole = gpu if gpu.get("parent") is None else by_index.get(gpu["parent"])
        if whole is None or whole.get("minor") is None:
            raise LaunchRefused(f"the device minor of GPU {uuid} is not known")
        minors.add(int(whole["minor"]))
        # Without the nvidia-caps driver a slice has no capability devices to allow.
        if gpu.get("parent") is not None and "nvidia-caps" in majors:
            if gpu.get("gi_id") is None or gpu.get("ci_id") is None:
                raise LaunchRefused(f"the MIG instance ids of {uuid} are not known")
            if mig_table is None:
                mig_table = _read_mig_minors()
            try:
                caps += mig_cap_minors(mig_table, int(whole["minor"]), int(gpu["gi_id"]),
                                       int(gpu["ci_id"]))
            except ValueError as exc:
                raise LaunchRefused(str(exc)) from None
    try:
        return gpu_device_rules(minors, majors, caps)
    except ValueError as exc:
        raise LaunchRefused(str(exc)) from None


def _read_mig_minors() -> dict[str, int]:
    try:
        return parse_mig_minors(MIG_MINORS.read_text())
    except OSError as exc:
        raise LaunchRefused(f"cannot read {MIG_MINORS}: {exc.strerror}") from None


def numa_cpus(root: Path = NUMA_NODES) -> dict[int, set[int]]:
    """Each NUMA node's CPUs (empty where the kernel shows none)."""
    found: dict[int, set[int]] = {}
    try:
        entries = list(root.iterdir())
    except OSError:
        return found
    for entry in entries:
        number = entry.name.removeprefix("node")
        if entry.name.startswith("node") and number.isdigit():
            try:
                found[int(number)] = parse_cpulist((entry / "cpulist").read_text())
            except (OSError, ValueError):
                continue
    return found


def agent_cpus(tree: CgroupTree) -> set[int]:
    """The CPUs jobs may be given: the agent's own affinity, within the subtree's
    cpuset where one is set."""
    cpus = set(os.sched_getaffinity(0))
    path = tree.root if tree.version == 2 else tree.roots.get("cpuset")
    if path is not None:
        try:
            text = (path / "cpuset.cpus.effective").read_text()
        except OSError:
            try:
                text = (path / "cpuset.cpus").read_text()
            except OSError:
                text = ""
        try:
            owned = parse_cpulist(text)
        except ValueError:
            owned = set()
        if owned:
            cpus &= owned
    return cpus


def remove_lost_job_cgroup(job: str, spec: Mapping[str, Any]) -> None:
    """Kill whatever is left in the cgroup of job ``job`` (its directory's name), whose
    supervisor was lost, and remove it; ``spec`` is its spec (no cgroup: nothing)."""
    cgroup = spec.get("cgroup")
    if not isinstance(cgroup, dict):
        return
    try:
        found = JobCgroup.existing(CgroupTree.from_json(cgroup["tree"]), str(cgroup["name"]))
        found.kill()
        found.remove()
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("job %s: cannot remove its cgroup: %s", job, exc)
