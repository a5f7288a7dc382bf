"""Controller failover figures; prints ``name: value`` lines.

    .venv/bin/python bench/failover.py [--rounds 3] [--rate 20]

Two controllers on one scratch PostgreSQL (the second a standby), one agent that talks
to the standby's socket, and a client submitting a stream of short jobs (``--rate`` a
second) to the leader, turning to the standby when the leader stops answering.
Each round ends the leader one way, then starts a fresh pair:

- ``kill9``: SIGKILL; its connections close, so its lock goes at once.
- ``frozen``: SIGSTOP; its connections stay open until PostgreSQL ends the idle lock
  connection (db/leadership.py, LEADER_IDLE_TIMEOUT).

- ``failover_<how>_s``: from ending the leader to the first job the standby starts (the
  creation of the first launch command of the standby's epoch); median and max.
- ``submissions_acknowledged``, ``submissions_lost`` (acknowledged, yet not in the
  database), ``jobs_started_twice`` (by their scripts' own log and by launch commands
  per run), ``submit_errors_during_failover`` (refused or unanswered while no
  controller led; a client retries those).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.failover import one_round  # noqa: E402
from tests.pg import ScratchPostgres  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=20.0)
    opts = parser.parse_args()
    pg = ScratchPostgres()
    try:
        results: dict[str, list[dict[str, Any]]] = {"kill9": [], "frozen": []}
        for _ in range(opts.rounds):
            for how in results:
                results[how].append(one_round(pg, how, opts.rate))
    finally:
        pg.close()
    for how, rounds in results.items():
        times = [r["failover"] for r in rounds]
        print(f"failover_{how}_s_median: {statistics.median(times):.2f}")
        print(f"failover_{how}_s_max: {max(times):.2f}")
    every = [r for rounds in results.values() for r in rounds]
    print(f"rounds: {len(every)}")
    print(f"submissions_acknowledged: {sum(r['acknowledged'] for r in every)}")
    print(f"submissions_lost: {sum(r['lost'] for r in every)}")
    print(f"acknowledged_jobs_never_run: {sum(r['not_run'] for r in every)}")
    print(f"jobs_started_twice: {sum(r['twice'] for r in every)}")
    print(f"submit_errors_during_failover: {sum(r['errors'] for r in every)}")


if __name__ == "__main__":
    main()
