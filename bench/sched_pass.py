"""One full scheduling pass on a large cluster; prints ``name: value`` lines.

    .venv/bin/python bench/sched_pass.py [--nodes 1000] [--pending 20000] [--running 5000]
                                         [--repeat 5] [--reservations 100]
                                         [--backfill easy|conservative] [--budget 0]
                                         [--shares] [--packing bestfit|fgd]

1,000 nodes of 8 NVLinked GPUs (A100s and H100s; one node in ten has two GPUs in MIG
mode, each cut into seven 1g.10gb slices), 5,000 running jobs with time limits, and a
queue of mixed shapes: 1-8 GPUs, typed requests, multi-node jobs, MIG slices and job
arrays, from 500 users in a 3-level account tree. ``pass_ms`` is the median time of
``core.plan.plan`` (priority, Fair Tree, EASY backfill with the top ``--reservations``
reservations) over ``--repeat`` passes on the same snapshot. ``--backfill conservative``
gives every job that cannot start a reservation instead (``--reservations`` is then not
used). ``--budget`` gives the pass a time budget as the controller does: half for
reservations under EASY (0.8 under conservative), then backfill only. ``pass_cpu_ms`` is the median CPU time of the same
passes (steadier than wall time on a shared machine); ``reservations`` is the last pass's
count, ``reservations_min`` the fewest of any pass (with ``--budget``, passes differ).

``--shares``: every whole GPU is shared by MPS (100 units, 80 GB), a fifth of the
running jobs hold shares, and every pending job asks for a share of one GPU (10-50
units, some with a GPU-memory limit), placed by ``--packing``.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.priority import build  # noqa: E402
from gpusched.core.model import (  # noqa: E402
    PACKINGS,
    GpuView,
    NodeState,
    NodeView,
    PartitionView,
    PendingJob,
    Plan,
    Policy,
    RunningJob,
    Snapshot,
    StartKind,
)
from gpusched.core.plan import plan  # noqa: E402
from gpusched.core.sharing import shared_node  # noqa: E402
from gpusched.core.topology import link_rank  # noqa: E402

NOW = 14 * 86400.0


def cluster(count: int, rng: random.Random) -> list[NodeView]:
    """``count`` 8-GPU nodes, all pairs NVLinked; every tenth has MIG on two GPUs."""
    links = {(a, b): link_rank("NVLINK", 12) for a in range(8) for b in range(a + 1, 8)}
    nodes = []
    for n in range(count):
        kind = "h100-80gb" if n % 3 else "a100-80gb"
        gpus: list[GpuView] = []
        for g in range(8):
            mig = n % 10 == 0 and g >= 6
            gpus.append(GpuView(f"GPU-{n}-{g}", g, gpu_type=kind, mig_mode=mig))
            if mig:
                gpus.extend(GpuView(f"MIG-{n}-{g}-{s}", 100 + 10 * g + s, gpu_type=kind,
                                    mig_profile="1g.10gb", parent=g) for s in range(7))
        nodes.append(NodeView(f"gpu{n:04d}", NodeState.UP, tuple(gpus), cpus=128,
                              memory_mb=1_000_000, block=f"rack{n // 32}", links=links))
    return nodes


def shared(nodes: list[NodeView]) -> list[NodeView]:
    """The nodes with every whole GPU shared by MPS: 100 units of 80 GB."""
    return [shared_node(node, "mps", 100, 80_000) for node in nodes]


def with_shares(jobs: list[RunningJob], rng: random.Random) -> list[RunningJob]:
    """A fifth of the 1-GPU running jobs hold a share of their GPU instead (with others'
    shares beside it, of one user each)."""
    out = []
    for job in jobs:
        if len(job.gpu_uuids) == 1 and rng.random() < 0.2:
            units = rng.choice((25, 50, 75))
            out.append(replace(job, gpu_uuids=(), user=f"user{job.job_id % 7}",
                               shares=((job.gpu_uuids[0], units, 800 * units),)))
        else:
            out.append(job)
    return out


def share_queue(jobs: list[PendingJob], rng: random.Random) -> list[PendingJob]:
    """The queue with every job asking for a share of one GPU instead."""
    return [replace(job, gpus=1, nodes=1, gpu_kinds=(), array_job_id=None, array_tasks=None,
                    array_max_running=None, cpus=2, share=rng.choice((10, 20, 25, 30, 50)),
                    share_mode="mps",
                    gpu_mem_mb=rng.choice((0, 0, 0, 8_000, 16_000)), user=f"user{job.job_id % 7}")
            for job in jobs]


def running_jobs(nodes: list[NodeView], count: int, rng: random.Random) -> list[RunningJob]:
    """``count`` running jobs packed onto the nodes, each ending within a day."""
    jobs: list[RunningJob] = []
    free = {n.name: [g.uuid for g in n.gpus if not g.mig_mode and g.mig_profile is None]
            for n in nodes}
    names = [n.name for n in nodes]
    misses = 0
    while len(jobs) < count:
        name = rng.choice(names)
        want = rng.choice((1, 1, 1, 2))
        if len(free[name]) < want:
            misses += 1
            if misses > 100 * count:
                raise SystemExit(f"cannot place {count} running jobs on {len(nodes)} nodes")
            continue
        taken, free[name] = free[name][:want], free[name][want:]
        jobs.append(RunningJob(10_000_000 + len(jobs), name, tuple(taken),
                               end_time=NOW + rng.uniform(60, 86400), cpus=8 * want))
    return jobs


def queue(count: int, rng: random.Random, users: list[tuple[str, str]],
          waited: list[float]) -> list[PendingJob]:
    """Mixed shapes: mostly small, some whole-node, multi-node, MIG and arrays."""
    jobs = []
    for i in range(count):
        user, account = users[i % len(users)]
        roll = rng.random()
        shape: dict[str, object] = {}
        if roll < 0.55:
            gpus = 1
        elif roll < 0.70:
            gpus = 2
        elif roll < 0.80:
            gpus = 4
        elif roll < 0.90:
            gpus = 8
        elif roll < 0.94:
            gpus, shape = 8, {"nodes": rng.choice((2, 4))}
        elif roll < 0.97:
            gpus, shape = 1, {"gpu_kinds": ("1g.10gb",)}
        elif roll < 0.99:
            gpus, shape = rng.choice((1, 2)), {"gpu_kinds": (rng.choice(("a100", "h100")),)}
        else:
            gpus, shape = 1, {"array_job_id": i + 1, "array_tasks": "0-99",
                              "array_max_running": 10}
        jobs.append(PendingJob(i + 1, "gpu", gpus, 1000, NOW - waited[i],
                               rng.choice((600, 3600, 4 * 3600, 86400)), user=user,
                               account=account, qos="normal", cpus=8 * gpus, **shape))  # type: ignore[arg-type]
    return jobs


def digest(result: Plan) -> str:
    """A short hash of every decision in the plan: starts (job, task, node(s), GPUs, kind),
    reservations, pending reasons with expected starts, and preemptions, in plan order."""
    text = repr((
        [(s.job_id, s.array_task_id, s.node, s.nodes, s.gpu_uuids, str(s.kind))
         + ((s.shares,) if s.shares else ()) for s in result.starts],
        [(r.job_id, r.start_time, r.nodes) for r in result.reservations],
        [(p.job_id, str(p.reason), p.expected_start) for p in result.pending],
        [(p.job_id, p.by, p.mode) for p in result.preemptions],
        result.resume_after,
    ))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def standard_snapshot(node_count: int, pending_count: int, running_count: int,
                      rng: random.Random, shares: bool = False) -> Snapshot:
    """The cluster and queue the pass benches time: ``node_count`` nodes of 8 GPUs in one
    partition, ``pending_count`` waiting jobs of 500 users under a fair-share tree, and
    ``running_count`` running ones (with ``shares``, GPUs shared by MPS and a queue of
    shares)."""
    tree, usage, sample = build(pending_count, 500)
    users = sorted({(m.user, m.account) for _, m, _, _ in sample})
    nodes = cluster(node_count, rng)
    pending = queue(pending_count, rng, users, [w for _, _, _, w in sample])
    running = running_jobs(nodes, running_count, rng)
    if shares:
        nodes, pending, running = shared(nodes), share_queue(pending, rng), with_shares(running, rng)
    return Snapshot(
        nodes=tuple(nodes), partitions=(PartitionView("gpu", tuple(n.name for n in nodes)),),
        pending=tuple(pending), running=tuple(running),
        accounts=tuple(a for a in tree.accounts.values() if a.name != "root"),
        user_shares=tuple(tree.users.values()), usage=usage, qos_priority={"normal": 100},
    )


def main() -> None:
    """Build the cluster and queue, then time whole passes."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pending", type=int, default=20_000)
    parser.add_argument("--running", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--reservations", type=int, default=100,
                        help="reservations per partition with --backfill easy")
    parser.add_argument("--backfill", choices=("easy", "conservative"), default="easy")
    parser.add_argument("--budget", type=float, default=0.0,
                        help="seconds a pass may plan for, as the controller's pass_budget "
                             "(0: no limit)")
    parser.add_argument("--shares", action="store_true",
                        help="GPUs shared by MPS and a queue of shares (see above)")
    parser.add_argument("--packing", choices=PACKINGS, default="bestfit")
    opts = parser.parse_args()
    snapshot = standard_snapshot(opts.nodes, opts.pending, opts.running, random.Random(11),
                                 opts.shares)
    policy = (Policy(backfill="easy", reservations=opts.reservations, packing=opts.packing)
              if opts.backfill == "easy" else Policy(backfill="conservative", packing=opts.packing))
    times, cpu_times, reserved, result = [], [], [], None
    for _ in range(opts.repeat):
        started, cpu_started = time.perf_counter(), time.process_time()
        spent = (lambda: (time.perf_counter() - started) / opts.budget) if opts.budget else None
        result = plan(snapshot, NOW, policy, spent=spent)
        times.append(time.perf_counter() - started)
        cpu_times.append(time.process_time() - cpu_started)
        reserved.append(len(result.reservations))
    assert result is not None
    if opts.backfill != "easy":
        print(f"backfill: {opts.backfill}")
    if opts.shares:
        print(f"packing: {opts.packing}")
        print(f"share_starts: {sum(bool(s.shares) for s in result.starts)}")
    print(f"nodes: {opts.nodes}")
    print(f"pending_jobs: {opts.pending}")
    print(f"running_jobs: {opts.running}")
    print(f"starts: {len(result.starts)}")
    print(f"backfilled: {sum(s.kind is StartKind.BACKFILLED for s in result.starts)}")
    print(f"reservations: {len(result.reservations)}")
    print(f"reservations_min: {min(reserved)}")
    print(f"pass_ms: {statistics.median(times) * 1000:.1f}")
    print(f"pass_ms_min: {min(times) * 1000:.1f}")
    print(f"pass_cpu_ms: {statistics.median(cpu_times) * 1000:.1f}")
    print(f"pass_cpu_ms_min: {min(cpu_times) * 1000:.1f}")
    print(f"stopped_after_job: {result.resume_after}")
    print(f"plan_digest: {digest(result)}")


if __name__ == "__main__":
    main()
