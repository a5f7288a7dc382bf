"""A seeded stream of jobs of every kind, and the client that submits it through faults.

Each job's batch script records every run it starts in the records directory, one file
per run named ``<job_id>.<restart>``, appending ``start <node> <time>`` first and
``end <code> <time>`` last, each with one ``printf ... >>`` (tests/chaos/invariants.py
reads them). The node is the one whose agent wrote the script: the script lies in
``<state dirs>/<node>/jobs/<job>/script``. Every exit code is chosen here.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpusched.client import ApiClient
from gpusched.errors import Conflict, NotFound, PermissionDenied, UsageError

# (kind, weight): how often each kind of job comes.
KINDS = (("plain", 30), ("array", 10), ("afterok", 10), ("afterany", 6),
         ("multinode", 10), ("preemptor", 5), ("mig", 15), ("share", 10))
MIG_PROFILES = ("1g.10gb", "1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb")
TIME_LIMIT = 300  # seconds; far above any run, so that no fault is mistaken for a timeout
SUBMIT_PATIENCE = 30.0  # seconds one submission is retried through failovers
REFUSED = (UsageError, Conflict, NotFound, PermissionDenied)  # an answer, not a fault

SCRIPT = """#!/bin/sh
r={records}/$SLURM_JOB_ID.$SLURM_RESTART_COUNT
n=${{0%/jobs/*}}; n=${{n##*/}}
printf 'start %s %s\\n' "$n" "$(date +%s.%N)" >> "$r"
sleep {run_s:.2f}
printf 'end %s %s\\n' {code} "$(date +%s.%N)" >> "$r"
exit {code}
"""


@dataclass(frozen=True)
class JobPlan:
    """One submission: its body (less script and dependency), how long it runs, the
    code it exits with, and (afterok/afterany) the earlier plan it depends on."""

    index: int
    kind: str
    body: dict[str, Any]
    run_s: float
    exit_code: int
    after: int | None = None


@dataclass(frozen=True)
class Shape:
    """What the cluster offers the workload."""

    nodes: tuple[str, ...]
    gpus_per_node: int
    mig: bool  # a node with MIG slices
    shared_node: str | None  # the node of the "shared" partition (shards)


def plan_jobs(seed: int, count: int, shape: Shape, work: Path) -> list[JobPlan]:
    """``count`` submissions drawn from ``seed``: the same seed, the same stream."""
    rng = random.Random(f"workload-{seed}")
    kinds = [k for k, _ in KINDS if (k != "mig" or shape.mig)
             and (k != "share" or shape.shared_node)]
    weights = [w for k, w in KINDS if k in kinds]
    plans = []
    for index in range(count):
        kind = rng.choices(kinds, weights)[0] if index else "plain"
        body: dict[str, Any] = {"name": f"chaos-{index}-{kind}", "work_dir": str(work),
                                "output": "/dev/null", "time_limit": TIME_LIMIT, "gpus": 1}
        run_s = round(rng.uniform(0.2, 2.5), 2)
        code = 0 if rng.random() < 0.85 else rng.randint(1, 9)
        after = None
        if kind == "plain":
            body["gpus"] = rng.choice((1, 1, 2))
        elif kind == "array":
            tasks = rng.randint(2, 4)
            body["array"] = f"0-{tasks - 1}" + (f"%{rng.randint(1, 2)}" if rng.random() < 0.3
                                                else "")
        elif kind in ("afterok", "afterany"):
            after = rng.randint(max(0, index - 8), index - 1)
        elif kind == "multinode":
            body.update(nodes=2, gpus=2)
        elif kind == "preemptor":  # all of one node's GPUs, ahead of everything there
            body.update(qos="high", nodelist=[shape.nodes[0]], gpus=shape.gpus_per_node)
            run_s, code = round(rng.uniform(0.3, 1.0), 2), 0
        elif kind == "mig":
            body["gpu_types"] = [rng.choice(MIG_PROFILES)]
        elif kind == "share":
            body.update(partition="shared", share_mode="shard", share=rng.randint(1, 2))
        plans.append(JobPlan(index, kind, body, run_s, code, after))
    return plans


def script(records: Path, plan: JobPlan) -> str:
    return SCRIPT.format(records=records, run_s=plan.run_s, code=plan.exit_code)


class Submitter:
    """Submits the plans at ``rate`` a second to whichever controller answers, each
    with a key of its own kept through retries (a retry after a lost answer gives the
    job already stored)."""

    def __init__(self, plans: Sequence[JobPlan], sockets: Sequence[Path], records: Path,
                 rate: float, seed: int) -> None:
        self.plans, self.sockets, self.records = plans, list(sockets), records
        self.rate, self.seed = rate, seed
        self.acknowledged: dict[int, int] = {}  # plan index -> job id
        self.kinds: Counter[str] = Counter()  # kinds as submitted
        self.existing = 0  # retries answered with the job a lost answer had stored
        self.errors = 0  # attempts that failed (no answer, 503): each retried
        self.given_up: list[int] = []  # plans never acknowledged
        self.refused: list[tuple[int, str]] = []  # plans the controller refused, and why
        self._which = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="submitter")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=SUBMIT_PATIENCE + 10)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def _run(self) -> None:
        began = time.monotonic()
        for n, plan in enumerate(self.plans):
            if self._stop.wait(max(0.0, began + n / self.rate - time.monotonic())):
                return
            self._submit(plan)

    def _submit(self, plan: JobPlan) -> None:
        body = {**plan.body, "script": script(self.records, plan),
                "submit_key": f"chaos-{self.seed}-{plan.index}"}
        kind = plan.kind
        if plan.after is not None:
            parent = self.acknowledged.get(plan.after)
            if parent is None:
                kind = "plain"  # its parent was never stored: nothing to depend on
            else:
                body["dependency"] = f"{plan.kind}:{parent}"
        deadline = time.monotonic() + SUBMIT_PATIENCE
        while not self._stop.is_set():
            socket = self.sockets[self._which]
            try:
                with ApiClient(socket, timeout=5.0) as client:
                    answer = client.request("POST", "/v1/jobs", body)
            except REFUSED as exc:
                self.refused.append((plan.index, str(exc)))
                return
            except Exception:  # noqa: BLE001 - down, paused, no database: the other one
                self.errors += 1
                self._which = (self._which + 1) % len(self.sockets)
                if time.monotonic() > deadline:
                    break
                self._stop.wait(0.2)
                continue
            self.acknowledged[plan.index] = int(answer["job_id"])
            self.existing += bool(answer.get("existing"))
            self.kinds[kind] += 1
            return
        self.given_up.append(plan.index)
