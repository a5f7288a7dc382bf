"""The ``[agent]`` table of gpusched.toml: a node agent's settings, its static GPU
inventory, confinement, site programs (prolog, epilog, health check) and GPU health
loop, validated into frozen objects (gpusched.config reads the whole file)."""

from __future__ import annotations

import re
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpusched.agent.containers import container_settings
from gpusched.configfile import TableReader
from gpusched.core.shapes import is_gpu_kind, is_mig_profile
from gpusched.core.topology import LINK_KINDS
from gpusched.errors import ConfigError
from gpusched.messages.agent import GPU_UUID

_DEMO_NAMESPACE = uuid.UUID("6c4d1f0e-2b7a-4f4e-9a53-0f6d5b2c9e11")

_ADDRESS = re.compile(r"[A-Za-z0-9._:\-]+")
MAX_ADDRESS = 255
# A program the agent runs: an absolute path, or a name looked up on its PATH.
_PROGRAM_NAME = re.compile(r"[A-Za-z0-9._+\-]{1,255}")
MAX_PROGRAM_PATH = 4095
GPU_SOURCES = ("auto", "nvml", "static")
CGROUP_MODES = ("auto", "required", "off")


@dataclass(frozen=True)
class StaticGpu:
    """One GPU of a static inventory."""

    index: int
    uuid: str
    name: str = "Demo GPU"
    memory_mb: int = 0
    pci_bus_id: str = ""
    type: str = "gpu"  # normalised GPU type requests name (a100-80gb, h100-80gb, l4)
    mig_profile: str | None = None  # a MIG slice: its profile (1g.10gb) ...
    parent: int | None = None  # ... and the index of the GPU it is cut from
    # The device minor (/dev/nvidiaN; a slice: None, its parent's is used), the NUMA node
    # nearest the GPU (None: unknown), and a slice's GPU and compute instance ids.
    minor: int | None = None
    numa_node: int | None = None
    gi_id: int | None = None
    ci_id: int | None = None


@dataclass(frozen=True)
class AgentConfig:
    """Settings of ``gpusched agent``."""

    node_name: str = field(default_factory=lambda: socket.gethostname().split(".")[0])
    # Where other nodes and clients reach this node (a job step's MASTER_ADDR): a host
    # name or IP address; None: the local address of the agent's connection to the
    # controller (127.0.0.1 over the local socket).
    address: str | None = None
    state_dir: Path = Path("/var/lib/gpusched/agent")
    poll_wait: float = 20.0
    kill_grace: float = 30.0
    # "nvml": discover GPUs through NVML; "static": the inventory below; "auto": NVML when
    # its library loads, else the static inventory.
    gpu_source: str = "auto"
    static_gpus: tuple[StaticGpu, ...] = ()
    # (index, index, kind, nvlinks): how two GPUs of the static inventory are connected.
    static_links: tuple[tuple[int, int, str, int], ...] = ()
    block: str | None = None  # topology block (switch, rack) multi-node jobs keep within
    rediscover_interval: float = 60.0  # seconds between checks that the GPUs are unchanged
    # The GPU health loop (NVML only): Xids that are a job's own fault, the temperature
    # (Celsius) over which a GPU leaves service, and seconds between checks.
    ignore_xids: tuple[int, ...] = (13, 31, 43, 45, 68, 109)
    max_temperature: float = 90.0
    health_interval: float = 10.0
    # Jobs of a uid below this are refused (0 lets root's jobs run).
    min_job_uid: int = 1
    # Whom the agent trusts to serve the controller's socket besides root and itself:
    # a user name or uid, or None.
    controller_user: str | None = None
    # Confinement of jobs in cgroups: "auto" (where a cgroup can be made; said once at
    # start otherwise), "required" (the agent does not start without) or "off"; the
    # directory the agent owns (None: found at start); whether jobs may swap.
    cgroups: str = "auto"
    cgroup_root: Path | None = None
    allow_swap: bool = False
    # Site programs run as root on this node with the job's variables: before each job
    # (a failure requeues it and drains the node) and after (a failure drains the
    # node), each within its timeout (seconds).
    prolog: Path | None = None
    epilog: Path | None = None
    prolog_timeout: float = 60.0
    epilog_timeout: float = 60.0
    # The node health check: run every health_check_interval seconds and before the
    # node takes work; a failure drains the node with its first line of output, and a
    # pass lifts a drain an earlier failure made.
    health_check: Path | None = None
    health_check_interval: float = 300.0
    health_check_timeout: float = 60.0
    # The MPS control program run for GPUs shared by MPS (gpusched.agent.mps): an
    # absolute path, or a name looked up on the agent's PATH when a job needs it.
    mps_control: str = "nvidia-cuda-mps-control"
    # Containers (gpusched.agent.containers): the runtime ("podman", "enroot",
    # "apptainer", "none"; None: the first found on PATH), its program (None: found on
    # PATH), options before and after its run subcommand, and how GPUs reach a container.
    container_runtime: str | None = None
    container_program: str | None = None
    container_runtime_args: tuple[str, ...] = ()
    container_run_args: tuple[str, ...] = ()
    container_gpus: str = "devices"


def demo_gpus(node_name: str, count: int) -> tuple[StaticGpu, ...]:
    """A demo inventory of ``count`` GPUs with UUIDs stable for this node name."""
    return tuple(
        StaticGpu(
            index=i,
            uuid=f"GPU-{uuid.uuid5(_DEMO_NAMESPACE, f'{node_name}/{i}')}",
            name="gpusched demo GPU",
            memory_mb=81920,
            pci_bus_id=f"00000000:{0x10 + i % 0xE0:02X}:{i // 0xE0:02X}.0",
            minor=i if i < 255 else None,
        )
        for i in range(count)
    )


def _static_gpus(r: TableReader, node_name: str) -> tuple[StaticGpu, ...]:
    count = r.get("count", int, None, "a number of demo GPUs (0 or more)")
    listed = r.table.get("static", [])
    if not isinstance(listed, list):
        raise r.fail("static", "an array of tables [[agent.gpus.static]]")
    if count is not None:
        if count < 0:
            raise r.fail("count", "a number of demo GPUs (0 or more)")
        if listed:
            raise ConfigError(f"{r.source}: {r.prefix}count and {r.prefix}static: give one, not both")
        return demo_gpus(node_name, count)
    gpus: list[StaticGpu] = []
    for i, entry in enumerate(listed):
        if not isinstance(entry, dict):
            raise r.fail("static", "an array of tables [[agent.gpus.static]]")
        g = TableReader(r.source, entry, f"{r.prefix}static[{i}].")
        g.check_keys({"index", "uuid", "name", "memory_mb", "pci_bus_id", "type", "mig_profile",
                      "parent", "minor", "numa_node", "gi_id", "ci_id"})
        profile = g.get("mig_profile", str, None, "a MIG profile such as 1g.10gb")
        parent = g.get("parent", int, None, "the index of the GPU the slice is cut from")
        if (profile is None) != (parent is None):
            raise g.fail("parent" if parent is None else "mig_profile",
                         "both mig_profile and parent for a MIG slice, or neither")
        if profile is not None and not is_mig_profile(profile):
            raise g.fail("mig_profile", "a MIG profile such as 1g.10gb or 3g.40gb")
        gpu_type = g.get("type", str, "gpu", "a GPU type such as a100-80gb or l4")
        if not is_gpu_kind(gpu_type):
            raise g.fail("type", "a GPU type such as a100-80gb or l4 (lower case)")
        index = g.get("index", int, i, "a GPU index (0 or more)")
        expected = "a GPU UUID such as 'GPU-8c3f…' (GPU- or MIG- and a UUID)"
        gpu_uuid = g.get("uuid", str, None, expected)
        if gpu_uuid is None or not GPU_UUID.fullmatch(gpu_uuid):
            raise g.fail("uuid", expected)
        if index < 0:
            raise g.fail("index", "a GPU index (0 or more)")
        if g.get("memory_mb", int, 0, "memory in MiB (0 or more)") < 0:
            raise g.fail("memory_mb", "memory in MiB (0 or more)")
        gpus.append(StaticGpu(
            index=index, uuid=gpu_uuid,
            name=g.get("name", str, "GPU", "a product name"),
            memory_mb=g.get("memory_mb", int, 0, "memory in MiB"),
            pci_bus_id=g.get("pci_bus_id", str, "", "a PCI bus id"),
            type=gpu_type, mig_profile=profile, parent=parent,
            **_static_device_ids(g, index, parent is not None),
        ))
    if len({g.uuid for g in gpus}) != len(gpus) or len({g.index for g in gpus}) != len(gpus):
        raise r.fail("static", "GPUs with distinct indexes and UUIDs")
    whole = {g.index for g in gpus if g.parent is None}
    if any(g.parent is not None and g.parent not in whole for g in gpus):
        raise r.fail("static", "MIG slices whose parent is the index of a whole GPU listed here")
    return tuple(gpus)




def _static_device_ids(g: TableReader, index: int, is_slice: bool) -> dict[str, int | None]:
    """minor and numa_node of a static GPU (minor defaults to its index), and a slice's
    gi_id and ci_id; each bounded as the kernel and NVML bound them."""
    found: dict[str, int | None] = {}
    for key, upper, default, expected in (
            ("minor", 254, None if is_slice or index > 254 else index,
             "the device minor number, /dev/nvidiaN (0 to 254)"),
            ("numa_node", 1023, None, "a NUMA node number (0 to 1023)"),
            ("gi_id", 255, None, "a MIG GPU instance id (0 to 255)"),
            ("ci_id", 255, None, "a MIG compute instance id (0 to 255)")):
        value = g.get(key, int, default, expected)
        if value is not None and not 0 <= value <= upper:
            raise g.fail(key, expected)
        found[key] = value
    if is_slice and found["minor"] is not None:
        raise g.fail("minor", "no minor for a MIG slice (its parent's is used)")
    if not is_slice and (found["gi_id"] is not None or found["ci_id"] is not None):
        raise g.fail("gi_id" if found["gi_id"] is not None else "ci_id",
                     "gi_id and ci_id only for a MIG slice")
    return found


def _static_links(r: TableReader) -> tuple[tuple[int, int, str, int], ...]:
    listed = r.table.get("links", [])
    if not isinstance(listed, list):
        raise r.fail("links", "an array of tables [[agent.gpus.links]]")
    links = []
    for i, entry in enumerate(listed):
        if not isinstance(entry, dict):
            raise r.fail("links", "an array of tables [[agent.gpus.links]]")
        g = TableReader(r.source, entry, f"{r.prefix}links[{i}].")
        g.check_keys({"gpus", "kind", "nvlinks"})
        pair = g.get("gpus", list, None, "two GPU indexes, such as [0, 1]")
        if (pair is None or len(pair) != 2 or not all(isinstance(x, int) for x in pair)
                or pair[0] == pair[1]):
            raise g.fail("gpus", "two different GPU indexes, such as [0, 1]")
        kind = g.get("kind", str, "NVLINK", f"one of {', '.join(LINK_KINDS)}")
        if kind not in LINK_KINDS:
            raise g.fail("kind", f"one of {', '.join(LINK_KINDS)}")
        links.append((min(pair), max(pair), kind, g.get("nvlinks", int, 0, "a number of links")))
    return tuple(links)


def parse_agent(r: TableReader) -> AgentConfig:
    """The [agent] table (with its gpus, health, cgroups and site-program tables)."""
    r.check_keys({"node_name", "address", "state_dir", "poll_wait", "kill_grace", "gpus", "block", "health",
                  "min_job_uid", "controller_user", "cgroups", "prolog", "epilog",
                  "health_check", "mps_control", "container_runtime", "container"})
    defaults = AgentConfig()
    min_job_uid = r.get("min_job_uid", int, defaults.min_job_uid, "a uid from 0 to 4294967294")
    if isinstance(min_job_uid, bool) or not 0 <= min_job_uid <= 4294967294:
        raise r.fail("min_job_uid", "a uid from 0 to 4294967294")
    controller_user = r.get("controller_user", (str, int), None, "a user name or uid")
    if isinstance(controller_user, bool) or (
            isinstance(controller_user, int) and not 0 <= controller_user <= 4294967294) or (
            isinstance(controller_user, str) and not 0 < len(controller_user) <= 64):
        raise r.fail("controller_user", "a user name or uid")
    node_name = r.name("node_name", defaults.node_name)
    gpus = r.sub("gpus")
    gpus.check_keys({"source", "count", "static", "links", "rediscover_interval"})
    source = gpus.get("source", str, "auto", "one of 'auto', 'nvml', 'static'")
    if source not in GPU_SOURCES:
        raise gpus.fail("source", "one of 'auto', 'nvml', 'static'")
    return AgentConfig(
        node_name=node_name,
        address=_address(r),
        state_dir=r.absolute_path("state_dir", defaults.state_dir),
        poll_wait=r.positive("poll_wait", defaults.poll_wait),
        kill_grace=r.positive("kill_grace", defaults.kill_grace, allow_zero=True),
        gpu_source=source,
        static_gpus=_static_gpus(gpus, node_name),
        static_links=_static_links(gpus),
        block=r.get("block", str, None, "a topology block name"),
        min_job_uid=min_job_uid,
        mps_control=_program(r, "mps_control", defaults.mps_control),
        controller_user=None if controller_user is None else str(controller_user),
        rediscover_interval=gpus.positive("rediscover_interval", defaults.rediscover_interval),
        **_health(r.sub("health"), defaults),
        **_cgroups(r.sub("cgroups"), defaults),
        **_site_programs(r, defaults),
        **container_settings(r, defaults),
    )


def _address(r: TableReader) -> str | None:
    expected = "a host name or IP address (at most 255 characters)"
    value: str | None = r.get("address", str, None, expected)
    if value is not None and (not 0 < len(value) <= MAX_ADDRESS
                              or not _ADDRESS.fullmatch(value)):
        raise r.fail("address", expected)
    return value


def _program(r: TableReader, key: str, default: str) -> str:
    """A program to run: an absolute path, or a plain name found on PATH when run."""
    expected = "an absolute path or a program name found on PATH"
    value: str = r.get(key, str, default, expected)
    if value.startswith("/"):
        if "\0" in value or len(value) > MAX_PROGRAM_PATH or not value.isprintable():
            raise r.fail(key, expected)
    elif not _PROGRAM_NAME.fullmatch(value) or value in (".", ".."):
        raise r.fail(key, expected)
    return value


def _optional_path(r: TableReader, key: str) -> Path | None:
    value = r.get(key, str, None, "an absolute path")
    if value is None:
        return None
    if not value.startswith("/") or "\0" in value or len(value) > 4096:
        raise r.fail(key, "an absolute path")
    return Path(value)


def _cgroups(r: TableReader, defaults: AgentConfig) -> dict[str, Any]:
    r.check_keys({"enforce", "root", "allow_swap"})
    enforce = r.get("enforce", str, defaults.cgroups, "one of 'auto', 'required', 'off'")
    if enforce not in CGROUP_MODES:
        raise r.fail("enforce", "one of 'auto', 'required', 'off'")
    return {"cgroups": enforce, "cgroup_root": _optional_path(r, "root"),
            "allow_swap": r.get("allow_swap", bool, defaults.allow_swap, "true or false")}


def _site_programs(r: TableReader, defaults: AgentConfig) -> dict[str, Any]:
    """[agent.prolog], [agent.epilog], [agent.health_check]: program, timeout (and the
    health check's interval)."""
    found: dict[str, Any] = {}
    for key in ("prolog", "epilog", "health_check"):
        table = r.sub(key)
        table.check_keys({"program", "timeout", "interval"} if key == "health_check"
                         else {"program", "timeout"})
        found[key] = _optional_path(table, "program")
        found[f"{key}_timeout"] = table.positive("timeout", getattr(defaults, f"{key}_timeout"))
        if key == "health_check":
            found["health_check_interval"] = table.positive(
                "interval", defaults.health_check_interval)
    return found


def _health(r: TableReader, defaults: AgentConfig) -> dict[str, Any]:
    r.check_keys({"ignore_xids", "max_temperature", "interval"})
    xids = r.get("ignore_xids", list, list(defaults.ignore_xids), "a list of Xid numbers")
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in xids):
        raise r.fail("ignore_xids", "a list of Xid numbers")
    return {"ignore_xids": tuple(xids),
            "max_temperature": r.positive("max_temperature", defaults.max_temperature),
            "health_interval": r.positive("interval", defaults.health_interval)}
