"""Resource matching: can a request fit on a node's free GPUs, and which GPUs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpusched.core.model import GpuView, NodeState, NodeView, RunningJob


def free_gpus_by_node(
    nodes: Iterable[NodeView], running: Iterable[RunningJob]
) -> dict[str, list[GpuView]]:
    """Healthy, unallocated GPUs of every usable node, in index order."""
    allocated = {uuid for job in running for uuid in job.gpu_uuids}
    return {
        node.name: sorted(
            (gpu for gpu in node.gpus if gpu.healthy and gpu.uuid not in allocated),
            key=lambda gpu: gpu.index,
        )
        for node in nodes
        if node.state is NodeState.UP
    }


def node_can_run(node: NodeView, uid: int) -> bool:
    """True if the node's agent may run a job of ``uid``."""
    return node.run_uid is None or node.run_uid == uid


def first_fit(
    candidates: Iterable[NodeView],
    free: Mapping[str, list[GpuView]],
    gpus: int,
    uid: int,
) -> tuple[str, tuple[GpuView, ...]] | None:
    """The first candidate node with ``gpus`` free GPUs, and the lowest-index ones."""
    for node in candidates:
        available = free.get(node.name)
        if available is None or not node_can_run(node, uid):
            continue
        if len(available) >= gpus:
            return node.name, tuple(available[:gpus])
    return None
