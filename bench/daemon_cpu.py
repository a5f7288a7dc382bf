"""CPU time of a local cluster's daemons, each with every process under it (the benches'
accounting: bench/lifecycle.py, bench/cli_loop.py)."""

from __future__ import annotations

import os
from pathlib import Path


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (every core, /proc/stat), for the
    share of the machine a run used."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _, _, irq, softirq = values[:7]  # not idle, iowait, steal
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def cpu_of_trees(root: Path) -> dict[str, float]:
    """CPU seconds (user and system, reaped children included) of the cluster's
    daemons, each with every process under it: by kind (controller, agent, postgres);
    and the agent's split: ``agent_process`` (the agent, and what it ran and reaped
    itself), ``agent_spawner`` (its supervisor spawners alone), ``agent_supervisors``
    (the supervisors they forked, with the jobs those ran)."""
    parent: dict[int, int] = {}
    own: dict[int, float] = {}  # the process itself
    reaped: dict[int, float] = {}  # the children it has waited for
    kind: dict[int, str] = {}
    spawners: set[int] = set()
    tick = os.sysconf("SC_CLK_TCK")
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            line = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        pid = int(proc.name)
        parent[pid] = int(fields[1])
        own[pid] = (int(fields[11]) + int(fields[12])) / tick
        reaped[pid] = (int(fields[13]) + int(fields[14])) / tick
        if str(root) in line:
            kind[pid] = next((k for k in ("controller", "agent", "postgres") if k in line),
                             "")
        elif "supervisor.py --spawner" in line:
            spawners.add(pid)  # or a supervisor it forked (same command line)
    totals = dict.fromkeys(("controller", "agent", "postgres", "agent_process",
                            "agent_spawner", "agent_supervisors"), 0.0)
    for pid in own:
        at, below, seen = pid, None, 0
        while at in parent and seen < 64:  # the nearest daemon above (or at) this one
            if kind.get(at):
                totals[kind[at]] += own[pid] + reaped[pid]
                if kind[at] == "agent":
                    # A spawner is the agent's child; what it forked is below it.
                    spawner = below if below in spawners else None
                    _split_agent(totals, pid, spawner, own[pid], reaped[pid])
                break
            at, below, seen = parent[at], at, seen + 1
    return totals


def _split_agent(totals: dict[str, float], pid: int, spawner: int | None, own: float,
                 reaped: float) -> None:
    """Add a process of the agent's tree to its part of the agent's split."""
    if spawner is None:
        totals["agent_process"] += own + reaped
    elif spawner == pid:
        totals["agent_spawner"] += own
        totals["agent_supervisors"] += reaped
    else:
        totals["agent_supervisors"] += own + reaped
