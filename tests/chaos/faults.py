"""Seeded fault schedules, the injector that plays one on a chaos cluster, and a soak:
a workload submitted while the schedule plays, everything brought back, the queue
drained, and the history checked (tests/chaos/invariants.py).

Kinds of fault (docs/faults.md): ``leader_kill`` and ``standby_kill`` (kill -9 of that
controller, started again after the hold), ``agent_kill`` (kill -9 of an agent alone; its
supervisors and jobs live on), ``node_die`` (the agent, its supervisors and jobs at
once; the agent back after the hold), ``postgres_kill`` (kill -9 of the postmaster,
started again), ``controller_stop`` and ``agent_stop`` (SIGSTOP for the hold, then
SIGCONT: a partition or a slow host), ``disk_full`` (the agent's state disk filled with
one file for the hold, then freed).
"""

from __future__ import annotations

import heapq
import random
import re
import shutil
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, pool, text

from tests.chaos.cluster import CONTROLLERS, ChaosCluster
from tests.chaos.workload import Shape, Submitter, plan_jobs

# (kind, weight, shortest hold, longest hold) in seconds.
KINDS = (("leader_kill", 12, 0.2, 2.0), ("standby_kill", 8, 0.2, 2.0),
         ("agent_kill", 15, 0.2, 2.5), ("node_die", 12, 0.5, 6.0),
         ("postgres_kill", 8, 0.2, 2.0), ("controller_stop", 12, 1.0, 5.0),
         ("agent_stop", 18, 1.0, 6.0), ("disk_full", 15, 1.0, 4.0))
RECOVERY = 1.0  # seconds a target is left alone after its fault ends


@dataclass(frozen=True)
class Fault:
    """One fault: ``at`` seconds after the start, on ``target`` (a node, "leader" or
    "standby", "postgres"), undone ``hold`` seconds later."""

    at: float
    kind: str
    target: str
    hold: float


def schedule(seed: int, seconds: float, rate: float, nodes: Sequence[str],
             only: Sequence[str] = ()) -> list[Fault]:
    """Faults at about ``rate`` a second for ``seconds``, from ``seed`` (of the kinds
    ``only`` names, if any): never two at once on one node, on the controllers, or on
    PostgreSQL."""
    rng = random.Random(f"faults-{seed}")
    kinds = [k for k in KINDS if not only or k[0] in only]
    busy: dict[str, float] = {}  # group -> when it is free again
    faults: list[Fault] = []
    at = 1.0
    while True:
        at += rng.expovariate(rate)
        if at >= seconds:
            return faults
        for _ in range(10):  # a few draws for a kind whose target is free
            kind, _, low, high = rng.choices(kinds, [k[1] for k in kinds])[0]
            hold = round(rng.uniform(low, high), 2)
            if kind in ("leader_kill", "standby_kill", "controller_stop"):
                group = "controllers"
                target = ("leader" if kind == "leader_kill" else "standby"
                          if kind == "standby_kill" else rng.choice(("leader", "standby")))
            elif kind == "postgres_kill":
                group = target = "postgres"
            else:
                group = target = rng.choice(list(nodes))
            if busy.get(group, 0.0) <= at:
                busy[group] = at + hold + RECOVERY
                faults.append(Fault(round(at, 2), kind, target, hold))
                break


class Injector:
    """Plays a schedule on a cluster from its own thread; ``injected`` counts the
    faults done by kind, ``node_deaths`` the (node, time) of each node_die."""

    def __init__(self, cluster: ChaosCluster, faults: Sequence[Fault], log: Path) -> None:
        self.cluster, self.faults, self.log = cluster, list(faults), log
        self.injected: Counter[str] = Counter()
        self.node_deaths: list[tuple[str, float]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="injector")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop injecting; the faults under way are undone."""
        self._stop.set()
        self._thread.join(timeout=120)

    def done(self) -> bool:
        return not self._thread.is_alive()

    def _note(self, line: str) -> None:
        with open(self.log, "a") as f:
            f.write(f"{time.time():.3f} {line}\n")

    def _run(self) -> None:
        began = time.monotonic()
        events: list[tuple[float, int, str, Fault, Any]] = []
        for n, fault in enumerate(self.faults):
            heapq.heappush(events, (fault.at, n, "inject", fault, None))
        seq = len(events)
        while events:
            at, _, what, fault, state = heapq.heappop(events)
            stopping = self._stop.wait(max(0.0, began + at - time.monotonic()))
            if stopping and what == "inject":
                continue  # no new faults; those under way are still undone
            try:
                if what == "inject":
                    state = self._inject(fault)
                    if state is not None:
                        self.injected[fault.kind] += 1
                        seq += 1
                        heapq.heappush(events, (at + fault.hold, seq, "undo", fault, state))
                else:
                    self._undo(fault, state)
            except Exception as exc:  # noqa: BLE001 - reported, and the run goes on
                self.errors.append(f"{what} {fault}: {exc!r}")
                self._note(f"error {what} {fault.kind} {fault.target}: {exc!r}")

    def _controller(self, role: str) -> str:
        leader = self.cluster.leader()
        if leader is None:
            return CONTROLLERS[0 if role == "leader" else 1]
        return leader if role == "leader" else next(c for c in CONTROLLERS if c != leader)

    def _inject(self, fault: Fault) -> Any:
        """Do the fault; returns what undoing it needs, or None if it could not be done."""
        cluster, kind = self.cluster, fault.kind
        state: Any = None
        if kind in ("leader_kill", "standby_kill"):
            state = self._controller(fault.target)
            cluster.kill(state)
        elif kind == "controller_stop":
            state = self._controller(fault.target)
            state = state if cluster.pause(state) else None
        elif kind == "postgres_kill":
            assert cluster.postgres is not None
            state = "postgres" if cluster.postgres.kill() else None
        elif kind == "agent_kill":
            state = f"agent-{fault.target}"
            cluster.kill(state)
        elif kind == "node_die":
            self.node_deaths.append((fault.target, cluster.node_dies(fault.target)))
            state = f"agent-{fault.target}"
        elif kind == "agent_stop":
            state = f"agent-{fault.target}"
            state = state if cluster.pause(state) else None
        elif kind == "disk_full":
            state = cluster.fill_disk(fault.target)
        self._note(f"inject {kind} {fault.target} {state} hold {fault.hold}")
        return state

    def _undo(self, fault: Fault, state: Any) -> None:
        cluster, kind = self.cluster, fault.kind
        if kind in ("leader_kill", "standby_kill", "agent_kill", "node_die"):
            cluster.restart(state)
        elif kind in ("controller_stop", "agent_stop"):
            cluster.resume(state)
        elif kind == "postgres_kill":
            assert cluster.postgres is not None
            cluster.postgres.start()
        elif kind == "disk_full":
            cluster.free_disk(fault.target)
        self._note(f"undo {kind} {fault.target} {state}")


@dataclass(frozen=True)
class Soak:
    """How long and how hard: ``seconds`` of submissions (``rate`` jobs a second) and
    faults (``fault_rate`` a second), then at most ``drain`` seconds for the queue."""

    seed: int
    seconds: float = 70.0
    rate: float = 1.5
    fault_rate: float = 1.0
    nodes: int = 4
    drain: float = 60.0
    kinds: tuple[str, ...] = ()  # the kinds of fault to inject; none named: every kind


@dataclass
class Outcome:
    """What a soak did and found."""

    seed: int
    faults: Counter[str] = field(default_factory=Counter)
    submitted: int = 0
    jobs: int = 0  # job rows, array tasks included
    ended: int = 0
    unfinished: int = 0  # still pending or running when the drain ended
    lost: list[int] = field(default_factory=list)  # acknowledged, not stored
    duplicates: list[str] = field(default_factory=list)  # one submission stored twice
    double_starts: list[str] = field(default_factory=list)  # a run recorded twice
    violations: list[str] = field(default_factory=list)  # from the invariants' check
    states: Counter[str] = field(default_factory=Counter)  # jobs by final state
    kinds: Counter[str] = field(default_factory=Counter)  # "<kind> <state>": jobs
    requeues: int = 0  # runs ended and put back in the queue (restarts, summed)
    errors: Counter[str] = field(default_factory=Counter)  # ended jobs' error messages
    self_exits: dict[str, int] = field(default_factory=dict)
    injector_errors: list[str] = field(default_factory=list)
    submit_refused: list[tuple[int, str]] = field(default_factory=list)
    submit_given_up: int = 0
    stuck: list[str] = field(default_factory=list)  # the unfinished jobs, described
    seconds: float = 0.0

    def figures(self) -> list[str]:
        """``name: value`` lines."""
        lines = [f"seed: {self.seed}", f"wall_s: {self.seconds:.1f}",
                 f"faults_injected: {sum(self.faults.values())}"]
        lines += [f"faults_{kind}: {self.faults[kind]}" for kind, *_ in KINDS]
        lines += [f"jobs_submitted: {self.submitted}", f"jobs_stored: {self.jobs}",
                  f"jobs_ended: {self.ended}", f"jobs_unfinished: {self.unfinished}",
                  f"jobs_lost: {len(self.lost)}",
                  f"submissions_stored_twice: {len(self.duplicates)}",
                  f"submissions_refused: {len(self.submit_refused)}",
                  f"submissions_given_up: {self.submit_given_up}",
                  f"double_starts: {len(self.double_starts)}",
                  f"invariant_violations: {len(self.violations)}",
                  f"daemon_self_exits: {sum(self.self_exits.values())}",
                  f"injector_errors: {len(self.injector_errors)}"]
        lines += [f"jobs_{state.lower()}: {n}" for state, n in sorted(self.states.items())]
        lines += [f"jobs_requeued_runs: {self.requeues}"]
        lines += [f"kind_{kind}_{state.lower()}: {n}"
                  for (kind, state), n in sorted((tuple(k.split()), n)
                                                 for k, n in self.kinds.items())]
        return lines

    def findings(self) -> list[str]:
        """One line per thing found wrong; [] for a clean soak."""
        return ([f"lost: job {j} was acknowledged but is not stored" for j in self.lost]
                + [f"stored twice: {d}" for d in self.duplicates]
                + [f"double start: {d}" for d in self.double_starts]
                + [f"violation: {v}" for v in self.violations]
                + [f"unfinished: {s}" for s in self.stuck]
                + [f"injector error: {e}" for e in self.injector_errors]
                + [f"refused: plan {i}: {why}" for i, why in self.submit_refused])


def _query(url: str, sql: str) -> list[tuple[Any, ...]]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(sql))]
    finally:
        engine.dispose()


def unfinished(url: str) -> int:
    """Jobs still to end: pending or running, less those that can never start (held,
    their dependency never to be met, or waiting only on such jobs)."""
    rows = _query(url, "SELECT id, state, hold, reason, dependency FROM jobs "
                       "WHERE state IN ('PENDING', 'RUNNING')")
    waiting = {job_id: {int(word) for clause in (dependency or "").split(",")
                        for word in clause.split(":")[1:] if word.isdigit()}
               for job_id, state, _, reason, dependency in rows
               if state == "PENDING" and reason == "Dependency"}
    stuck = {job_id for job_id, state, hold, reason, _ in rows if state == "PENDING"
             and (hold is not None or reason == "DependencyNeverSatisfied")}
    pending = {row[0] for row in rows}
    grew = True
    while grew:
        grew = False
        for job_id, parents in waiting.items():
            open_parents = parents & pending
            if job_id not in stuck and open_parents and open_parents <= stuck:
                stuck.add(job_id)
                grew = True
    return len(rows) - len(stuck)


def drain(url: str, timeout: float) -> int:
    """Wait (at most ``timeout``) until no job is left to end; returns how many are."""
    deadline = time.monotonic() + timeout
    while True:
        left = unfinished(url)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def _double_starts(records: Path) -> list[str]:
    found = []
    for path in sorted(records.iterdir()):
        starts = [line for line in path.read_text(errors="replace").splitlines()
                  if line.startswith("start ")]
        if len(starts) > 1:
            found.append(f"{path.name}: {len(starts)} starts")
    return found


def run_soak(soak: Soak, nvml_lib: Path | None, checker: Any,
             keep: Path | None = None) -> Outcome:
    """One soak on a fresh cluster (removed at the end, whatever happens). ``checker``
    is tests.chaos.invariants (its Evidence and check). ``keep``: a directory to copy
    the logs, the fault log and the records into before the cluster is removed."""
    began = time.monotonic()
    outcome = Outcome(seed=soak.seed)
    cluster = ChaosCluster(nodes=soak.nodes, nvml_lib=nvml_lib)
    try:
        cluster.start()
        shape = Shape(tuple(cluster.nodes), cluster.gpus, cluster.mig_node is not None,
                      cluster.shared_node)
        plans = plan_jobs(soak.seed, int(soak.seconds * soak.rate) + 1, shape, cluster.work)
        submitter = Submitter(plans, [cluster.sockets[c] for c in CONTROLLERS],
                              cluster.records, soak.rate, soak.seed)
        injector = Injector(cluster, schedule(soak.seed, soak.seconds, soak.fault_rate,
                                              cluster.nodes, soak.kinds),
                            cluster.root / "faults.log")
        submitter.start()
        injector.start()
        deadline = time.monotonic() + soak.seconds + 60
        while not (submitter.done() and injector.done()) and time.monotonic() < deadline:
            time.sleep(0.5)
        injector.stop()
        submitter.stop()
        cluster.settle()
        outcome.unfinished = drain(cluster.url, soak.drain)
        if outcome.unfinished:
            outcome.stuck = _describe_unfinished(cluster.url)
        outcome.faults = injector.injected
        outcome.injector_errors = injector.errors
        outcome.submitted = len(submitter.acknowledged)
        outcome.submit_refused = submitter.refused
        outcome.submit_given_up = len(submitter.given_up)
        _count(cluster.url, submitter.acknowledged, outcome)
        outcome.double_starts = _double_starts(cluster.records)
        outcome.self_exits = cluster.self_exits()
        outcome.violations = list(checker.check(checker.Evidence(
            url=cluster.url, records=cluster.records, node_deaths=tuple(injector.node_deaths),
            finished=outcome.unfinished == 0)))
    finally:
        if keep is not None:
            _keep(cluster, keep)
        cluster.close()
        outcome.seconds = time.monotonic() - began
    return outcome


def _describe_unfinished(url: str, most: int = 30) -> list[str]:
    rows = _query(url, "SELECT j.id, j.state, j.reason, n.name, j.restarts, j.dependency, "
                       "extract(epoch FROM now() - coalesce(j.start_time, j.submit_time)) "
                       "FROM jobs j LEFT JOIN nodes n ON n.id = j.node_id "
                       "WHERE j.state IN ('PENDING', 'RUNNING') ORDER BY j.id")
    return [f"job {job_id} {state} ({reason}) node {node} restarts {restarts} "
            f"dependency {dependency} for {float(age):.0f} s"
            for job_id, state, reason, node, restarts, dependency, age in rows[:most]]


def _keep(cluster: ChaosCluster, keep: Path) -> None:
    keep.mkdir(parents=True, exist_ok=True)
    for path in [*cluster.root.glob("*.log"), *cluster.root.glob("*.toml")]:
        shutil.copy(path, keep / path.name)
    shutil.copytree(cluster.records, keep / "records", dirs_exist_ok=True)


def _count(url: str, acknowledged: dict[int, int], outcome: Outcome) -> None:
    """Jobs stored and ended, acknowledged ones missing, submissions stored twice."""
    rows = _query(url, "SELECT id, name, state, array_job_id, error_message, restarts "
                       "FROM jobs")
    outcome.jobs = len(rows)
    outcome.ended = sum(1 for row in rows if row[2] not in ("PENDING", "RUNNING"))
    outcome.states = Counter(row[2] for row in rows)
    outcome.kinds = Counter(f"{row[1].rsplit('-', 1)[-1]} {row[2]}" for row in rows)
    outcome.requeues = sum(row[5] for row in rows)
    outcome.errors = Counter(re.sub(r"\d+", "N", f"{row[2]}: {row[4]}") for row in rows
                             if row[4])
    ids = {row[0] for row in rows}
    outcome.lost = sorted(j for j in acknowledged.values() if j not in ids)
    by_name: dict[str, set[int]] = {}
    for job_id, name, _, array_job, *_ in rows:
        by_name.setdefault(name, set()).add(array_job or job_id)
    outcome.duplicates = sorted(f"{name}: jobs {sorted(v)}" for name, v in by_name.items()
                                if len(v) > 1)
