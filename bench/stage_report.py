"""Read the stage lines of a controller's and an agent's logs (gpusched/stages.py) and
split submit → start, and a drain's end → next start, by stage.

Used by bench/lifecycle.py; every figure is a median over jobs (or passes), in ms.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

_LINE = re.compile(r"gpusched\.stages DEBUG stage (\S+) t=(\S+) jobs=(\S+)(.*)$")


@dataclass
class Pass:
    """One scheduling pass: when woken, when it began and ended, whom it started."""

    woken: float | None
    began: float
    ended: float
    jobs: list[int]


@dataclass
class Stamps:
    """Every stage line of the logs: per stage, the first time each job passed it."""

    first: dict[str, dict[int, float]] = field(default_factory=dict)
    extra: dict[str, dict[int, dict[str, str]]] = field(default_factory=dict)
    passes: list[Pass] = field(default_factory=list)

    def at(self, stage: str, job: int) -> float | None:
        """When ``job`` first passed ``stage``, if it did."""
        return self.first.get(stage, {}).get(job)

    def field(self, stage: str, job: int, key: str) -> float | None:
        """A number logged with ``job``'s first ``stage`` line."""
        value = self.extra.get(stage, {}).get(job, {}).get(key)
        return None if value in (None, "-") else float(value)

    def pass_of(self, job: int) -> Pass | None:
        """The pass that started ``job`` (its latest start)."""
        found = None
        for p in self.passes:
            if job in p.jobs:
                found = p
        return found


def read(paths: Iterable[Path]) -> Stamps:
    """The stage lines of the given log files."""
    stamps = Stamps()
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            match = _LINE.search(line)
            if match is None:
                continue
            stage, when, ids, rest = match.groups()
            t = float(when)
            jobs = [int(i) for i in ids.split(",") if i.isdigit()]
            fields = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)
            if stage == "pass":
                woken = fields.get("woken")
                stamps.passes.append(Pass(None if woken in (None, "-") else float(woken),
                                          float(fields["began"]), t, jobs))
                continue
            firsts = stamps.first.setdefault(stage, {})
            extras = stamps.extra.setdefault(stage, {})
            for job in jobs:
                if job not in firsts:
                    firsts[job] = t
                    extras[job] = fields
    stamps.passes.sort(key=lambda p: p.ended)
    return stamps


def _median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.1f}" if values else "n/a"


def _gap(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def launch_stages(stamps: Stamps, job: int) -> dict[str, float | None]:
    """From a job's starting pass to its first instruction's fork, stage by stage."""
    started = stamps.pass_of(job)
    sent, received = stamps.at("sent", job), stamps.at("received", job)
    spawned = stamps.at("spawned", job)
    forked = stamps.field("end_seen", job, "started")
    return {
        "pass_to_sent": _gap(started.ended if started else None, sent),
        "sent_to_received": _gap(sent, received),
        "received_to_spawned": _gap(received, spawned),
        "spawned_to_forked": _gap(spawned, forked),
    }


def submit_to_start(stamps: Stamps, trials: list[tuple[int, float, float]]) -> list[str]:
    """``name: value`` lines splitting submit → start; ``trials``: (job id, time before
    the submit call, time of the job's first instruction)."""
    rows: dict[str, list[float]] = {}

    def add(name: str, value: float | None) -> None:
        if value is not None:
            rows.setdefault(name, []).append(value)

    for job, before, first in trials:
        committed = stamps.at("committed", job)
        started = stamps.pass_of(job)
        add("call_to_committed", _gap(before, committed))
        if started is not None:
            add("committed_to_pass_woken", _gap(committed, started.woken))
            add("pass_woken_to_began", _gap(started.woken, started.began))
            add("pass", started.ended - started.began)
        for name, value in launch_stages(stamps, job).items():
            add(name, value)
        add("forked_to_first_instruction", _gap(stamps.field("end_seen", job, "started"), first))
    return [f"stage_{name}_median_ms: {_median_ms(values)}" for name, values in rows.items()]


def drain(stamps: Stamps, jobs: list[int], first: float, last: float) -> list[str]:
    """``name: value`` lines of a drain of ``jobs`` from ``first`` submit to ``last``
    end: how often passes ran and how many they started, and the way from one job's
    end to the pass that uses its GPU again."""
    wanted = set(jobs)
    passes = [p for p in stamps.passes if first <= p.ended <= last and wanted & set(p.jobs)]
    span = max(last - first, 1e-9)
    lines = [f"drain_passes: {len(passes)}", f"drain_passes_per_s: {len(passes) / span:.1f}"]
    if passes:
        lines.append(f"drain_started_per_pass_median: "
                     f"{statistics.median(len(p.jobs) for p in passes):.0f}")
        lines.append(f"drain_pass_median_ms: {_median_ms([p.ended - p.began for p in passes])}")
        woke = [p.began - p.woken for p in passes if p.woken is not None]
        lines.append(f"drain_pass_woken_to_began_median_ms: {_median_ms(woke)}")
    rows: dict[str, list[float]] = {}
    begins = sorted(p.began for p in stamps.passes)
    for job in jobs:
        forked = stamps.field("end_seen", job, "started")
        ended = stamps.field("end_seen", job, "ended")
        recorded = stamps.at("ended", job)
        nxt = next((b for b in begins if recorded is not None and b >= recorded), None)
        stages = {**launch_stages(stamps, job), "forked_to_end": _gap(forked, ended),
                  "end_to_end_seen": _gap(ended, stamps.at("end_seen", job)),
                  "end_seen_to_recorded": _gap(stamps.at("end_seen", job), recorded),
                  "recorded_to_next_pass_began": _gap(recorded, nxt)}
        for name, value in stages.items():
            if value is not None:
                rows.setdefault(name, []).append(value)
    lines += [f"drain_stage_{name}_median_ms: {_median_ms(values)}"
              for name, values in rows.items()]
    return lines + launch_turns(stamps, jobs)


def launch_turns(stamps: Stamps, jobs: list[int]) -> list[str]:
    """The agent launches the jobs of one work answer in turn: per answer, how many,
    from its receipt to its first supervisor spawned, and from one spawned to the next
    (received_to_spawned is about the first plus half the rest of these)."""
    answers: dict[float, list[float]] = {}  # a work answer's jobs share its stamp
    for job in jobs:
        received, spawned = stamps.at("received", job), stamps.at("spawned", job)
        if received is not None and spawned is not None:
            answers.setdefault(received, []).append(spawned)
    sizes, firsts, gaps = [], [], []
    for received, spawned in answers.items():
        spawned.sort()
        sizes.append(len(spawned))
        firsts.append(spawned[0] - received)
        gaps += [later - earlier for earlier, later in zip(spawned, spawned[1:])]
    if not sizes:
        return []
    return [f"drain_launches_per_answer_median: {statistics.median(sizes):.0f}",
            f"drain_launch_first_spawned_median_ms: {_median_ms(firsts)}",
            f"drain_launch_next_spawned_median_ms: {_median_ms(gaps)}"]
