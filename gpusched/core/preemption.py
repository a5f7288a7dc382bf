"""Preemption: which running jobs of a preemptable QOS to stop so that a job can start,
losing the least work, and giving their resources back early.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from gpusched.core.model import RunningJob
from gpusched.core.node_timeline import NodeTimeline
from gpusched.core.resources import PassResources
from gpusched.core.units import Shape


class PreemptionMixin(PassResources):
    """Choosing victims for a job, and stopping them."""

    def release_early(self, job: RunningJob, at: float) -> None:
        """``job`` is being stopped: it gives everything back at ``at``."""
        self.preempted.add(job.job_id)
        self._gave_back += 1
        for name in job.nodes or (job.node,):
            index = self.index.get(name)
            if index is not None:
                node = self._own(index)
                node.releases = [e for e in node.releases if e[5] != job.job_id]
                self._touched(index)
        self._add_releases(job, at)

    def _cheapest(self, node: NodeTimeline, kind: str, shape: Shape,
                  candidates: list[RunningJob]) -> tuple[float, list[RunningJob]] | None:
        """The victims on ``node`` whose stopping frees room for ``shape`` at the least
        loss of work (GPU-seconds run so far, all lost on a requeue); None if none do."""
        def frees(job: RunningJob) -> int:
            return sum(1 for u in job.gpu_uuids if self.kind_of.get(u) == (node.index, kind))

        def loss(job: RunningJob) -> float:
            ran = self.now - job.start_time if job.start_time is not None else 0.0
            return max(1, len(job.gpu_uuids)) * max(ran, 0.0)

        def enough(chosen: Sequence[RunningJob]) -> bool:
            return (node.count(kind) + sum(frees(j) for j in chosen) >= shape.gpus
                    and node.cpus + sum(j.cpus for j in chosen) >= shape.cpus
                    and node.mem + sum(j.mem_mb for j in chosen) >= shape.mem_mb)

        best: tuple[float, int, list[RunningJob]] | None = None
        if len(candidates) <= 10:
            for size in range(1, len(candidates) + 1):
                for chosen in combinations(candidates, size):
                    if enough(chosen):
                        cost = sum(loss(j) for j in chosen)
                        if best is None or (cost, size) < best[:2]:
                            best = (cost, size, list(chosen))
        else:  # many small jobs: cheapest per GPU first
            chosen_list: list[RunningJob] = []
            for job in sorted(candidates, key=lambda j: (loss(j) / max(1, frees(j)), j.job_id)):
                chosen_list.append(job)
                if enough(chosen_list):
                    best = (sum(loss(j) for j in chosen_list), len(chosen_list), chosen_list)
                    break
        return None if best is None else (best[0], best[2])

    def victims_for(self, shape: Shape, members: frozenset[int], preemptable: frozenset[str]
                    ) -> tuple[list[tuple[int, str]], list[RunningJob]] | None:
        """Nodes for ``shape`` and the running jobs of ``preemptable`` QOS to stop for it,
        losing the least work; None when no choice makes room. Nodes holding a
        reservation are left alone."""
        options: list[tuple[float, int, int, str, list[RunningJob]]] = []
        for index in sorted(members - self.reserved_nodes):
            node = self.nodes[index]
            if not self._usable(node, shape):
                continue
            candidates = [job for job in self.on_node.get(index, ())
                          if job.qos in preemptable and not job.preempting
                          and job.job_id not in self.preempted]
            for kind in (self.matching(shape.kinds) if shape.gpus else [""]):
                if kind and node.total.get(kind, 0) < shape.gpus:
                    continue
                if self._fits_now(node, kind, shape):  # a multi-node job's free node
                    options.append((0.0, 0, index, kind, []))
                    continue
                found = self._cheapest(node, kind, shape, candidates) if candidates else None
                if found is not None:
                    options.append((found[0], len(found[1]), index, kind, found[1]))
        options.sort(key=lambda o: (o[0], o[1], o[2]))
        where: list[tuple[int, str]] = []
        victims: dict[int, RunningJob] = {}
        for _, _, index, kind, chosen in options:
            if all(index != i for i, _ in where):
                where.append((index, kind))
                victims.update((job.job_id, job) for job in chosen)
            if len(where) == shape.nodes:
                return (where, sorted(victims.values(), key=lambda j: j.job_id)) \
                    if victims else None
        return None
