"""The fault-injection soak, short: a four-node cluster (one node with MIG slices, one
shared by shards) runs a seeded stream of jobs of every kind while at least 50 faults
kill, pause and starve its controllers, agents, nodes and PostgreSQL; afterwards every
process is back, the queue drains, and the database's history breaks no invariant.

``GPUSCHED_CHAOS_SEED`` picks the seed (printed on failure), ``GPUSCHED_CHAOS_KEEP`` a
directory to keep the logs and records in; ``bench/chaos.py`` runs the same soak for as
long as asked.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.chaos import invariants
from tests.chaos.faults import Soak, run_soak

DEFAULT_SEED = 20
MIN_FAULTS = 50


def test_a_soak_under_faults_loses_no_job_and_breaks_no_invariant(fake_nvml_lib: Path) -> None:
    seed = int(os.environ.get("GPUSCHED_CHAOS_SEED", DEFAULT_SEED))
    print(f"chaos seed: {seed} (GPUSCHED_CHAOS_SEED={seed} reproduces the run)")
    keep = os.environ.get("GPUSCHED_CHAOS_KEEP")  # a directory for the logs and records
    outcome = run_soak(Soak(seed=seed), fake_nvml_lib, invariants,
                       keep=Path(keep) if keep else None)
    shown = "\n".join(outcome.figures())
    print(shown)
    for message, count in outcome.errors.most_common():
        print(f"ended with {count}x: {message}")
    findings = outcome.findings()
    print("\n".join(findings))
    assert sum(outcome.faults.values()) >= MIN_FAULTS, f"seed {seed}: too few faults\n{shown}"
    assert outcome.submitted >= 50, f"seed {seed}: too few jobs submitted\n{shown}"
    assert findings == [], f"seed {seed}: {len(findings)} findings:\n" + "\n".join(findings)
    assert outcome.unfinished == 0, f"seed {seed}: the queue did not drain\n{shown}"
