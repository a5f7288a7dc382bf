"""The cluster a simulation runs on: uniform (N nodes x G GPUs), a cluster file, or the
node list a trace brings.

A cluster file (TOML) lists nodes, and optionally partitions in the same form as
``etc/partitions.toml``::

    [[node]]
    names = "gpu[01-30]"     # a host list
    gpus = 8
    type = "a100-80gb"       # optional; default "gpu"
    cpus = 64                # optional; 0 or absent: not counted
    memory = "512G"          # optional
    block = "rack1"          # optional topology block for multi-node jobs

    [[partition]]
    name = "batch"
    nodes = "gpu[01-24]"
    default = true

Without partitions every node is in one partition, ``sim``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpusched.adminconfig import parse_admin_config
from gpusched.config import TableReader, demo_gpus, read_toml
from gpusched.core.hostlist import HostlistError, expand_hostlist
from gpusched.core.model import GpuView, NodeState, NodeView, PartitionView
from gpusched.core.shapes import ShapeError, parse_memory
from gpusched.core.sharing import shared_node
from gpusched.errors import ConfigError

DEFAULT_PARTITION = "sim"


@dataclass(frozen=True)
class SimCluster:
    """Nodes and partitions as the core sees them, and where jobs go."""

    nodes: tuple[NodeView, ...]
    partitions: tuple[PartitionView, ...]
    default_partition: str

    @property
    def gpus(self) -> int:
        """GPUs in the whole cluster."""
        return sum(len(node.gpus) for node in self.nodes)

    @property
    def max_gpus_per_node(self) -> int:
        """The most GPUs any node has."""
        return max((len(node.gpus) for node in self.nodes), default=0)

    def shared(self, mode: str, shares: int) -> SimCluster:
        """This cluster with every whole GPU shared by ``mode``, ``shares`` units each."""
        return replace(self, nodes=tuple(shared_node(node, mode, shares)
                                         for node in self.nodes))

    def describe(self) -> str:
        """One line: how many nodes and GPUs, and per node when uniform."""
        sizes = {len(node.gpus) for node in self.nodes}
        per = f" x {sizes.pop()} GPUs" if len(sizes) == 1 else ""
        return f"{len(self.nodes)} nodes{per} = {self.gpus} GPUs"


def node_view(name: str, gpus: int, gpu_type: str = "gpu", cpus: int = 0, memory_mb: int = 0,
              block: str | None = None) -> NodeView:
    """A node with ``gpus`` GPUs whose UUIDs are those a static agent of this name reports."""
    return NodeView(name, NodeState.UP, tuple(
        GpuView(g.uuid, g.index, gpu_type=gpu_type) for g in demo_gpus(name, gpus)),
        cpus=cpus, memory_mb=memory_mb, block=block)


def _one_partition(nodes: tuple[NodeView, ...]) -> SimCluster:
    part = PartitionView(DEFAULT_PARTITION, tuple(n.name for n in nodes))
    return SimCluster(nodes, (part,), DEFAULT_PARTITION)


def uniform(count: int, gpus_per_node: int, prefix: str = "node") -> SimCluster:
    """``count`` nodes named node01, node02, ... with ``gpus_per_node`` GPUs each."""
    if count < 1 or gpus_per_node < 1:
        raise ConfigError("a cluster needs at least 1 node and 1 GPU per node")
    width = max(2, len(str(count)))
    return _one_partition(tuple(node_view(f"{prefix}{i:0{width}d}", gpus_per_node)
                                for i in range(1, count + 1)))


def from_node_list(nodes: Sequence[tuple[str, int, str, int, int]]) -> SimCluster:
    """A cluster from a trace's own node list: (name, GPUs, GPU type, CPUs, memory MB)."""
    if not nodes:
        raise ConfigError("the trace lists no GPU nodes")
    return _one_partition(tuple(node_view(name, gpus, gpu_type, cpus, mem)
                                for name, gpus, gpu_type, cpus, mem in nodes))


def load_cluster(path: Path) -> SimCluster:
    """Read a cluster file; a ConfigError names the file and the key at fault."""
    data = read_toml(path)
    return parse_cluster(str(path), data)


def parse_cluster(source: str, data: dict[str, Any]) -> SimCluster:
    """Validate a parsed cluster file."""
    TableReader(source, data, "").check_keys({"node", "partition"})
    raw = data.get("node")
    if not isinstance(raw, list) or not raw or not all(isinstance(e, dict) for e in raw):
        raise ConfigError(f"{source}: node: expected one or more [[node]] tables")
    nodes: dict[str, NodeView] = {}
    for i, entry in enumerate(raw):
        r = TableReader(source, entry, f"node[{i}].")
        r.check_keys({"names", "gpus", "type", "cpus", "memory", "block"})
        names_text = r.get("names", str, None, "a host list such as 'gpu[01-16]'")
        if names_text is None:
            raise r.fail("names", "a host list such as 'gpu[01-16]'")
        try:
            names = expand_hostlist(names_text)
        except HostlistError as exc:
            raise r.fail("names", f"a host list such as 'gpu[01-16]' ({exc})") from None
        gpus = r.get("gpus", int, None, "a number of GPUs (1 or more)")
        if gpus is None or gpus < 1:
            raise r.fail("gpus", "a number of GPUs (1 or more)")
        gpu_type = r.get("type", str, "gpu", "a GPU type such as 'a100-80gb'")
        cpus = r.get("cpus", int, 0, "a number of CPUs (0 or more)")
        if cpus < 0:
            raise r.fail("cpus", "a number of CPUs (0 or more)")
        memory = r.get("memory", str, None, "a size such as '512G'")
        try:
            memory_mb = parse_memory(memory) if memory is not None else 0
        except ShapeError:
            raise r.fail("memory", "a size such as '512G'") from None
        block = r.get("block", str, None, "a block name")
        for name in names:
            if name in nodes:
                raise ConfigError(f"{source}: node[{i}].names: node {name!r} is declared twice")
            nodes[name] = node_view(name, gpus, gpu_type, cpus, memory_mb, block)
    views = tuple(nodes.values())
    if "partition" not in data:
        return _one_partition(views)
    admin = parse_admin_config([(source, {"partition": data["partition"]})])
    parts: list[PartitionView] = []
    default = None
    for spec in admin.partitions or ():
        members = tuple(nodes) if spec.nodes == ("*",) else spec.nodes
        unknown = [n for n in members if n not in nodes]
        if unknown:
            raise ConfigError(f"{source}: partition {spec.name!r}: node {unknown[0]!r} is not "
                              "declared in a [[node]] table")
        parts.append(PartitionView(spec.name, members, up=spec.state == "UP",
                                   tier=spec.priority_tier, max_time=spec.max_time,
                                   max_gpus_per_job=spec.max_gpus_per_job))
        if spec.default:
            default = spec.name
    return SimCluster(views, tuple(parts), default or parts[0].name)
