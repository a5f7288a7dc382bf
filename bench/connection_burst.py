"""How soon a controller answers a fresh request right after a burst of client
connections closes at once; prints ``name: value`` lines.

    .venv/bin/python bench/connection_burst.py [--connections 250] [--runs 3]
        [--read-after 0] [--jobs 3000] [--lists-only] [--default-caps] [--log FILE]

A real controller (no agent) on a scratch PostgreSQL, on its Unix socket and on TCP
(127.0.0.1, key credentials), its connection caps above the burst unless
``--default-caps``; ``--jobs`` held jobs stored first. Each run opens ``--connections``
connections on each transport, sending in turn what tests/controller/
test_connection_burst.py's KINDS say (nothing, half a head, whole ``GET /v1/jobs?all=1``
listings, a held submission, half a submission's body, a target the router does not
know; with ``--lists-only``, every one a listing), leaves them ``--read-after`` seconds
with the controller, closes them all at once (half with a reset), then times one fresh
request after another:

- ``burst_{unix,tcp}_{ping,jobs}_s``: seconds to each answer (the worst of the runs),
  beside ``..._quiet_s``, the same before any burst;
- ``burst_threads_peak`` / ``burst_threads_settled``: the controller's threads right
  after the run and once settled (``burst_settle_s`` later, at most 30 s; before the
  first burst: ``burst_threads_before``);
- ``burst_api_fds_settled``: descriptors of API connections it still holds then;
- ``burst_tracebacks``: lines of the controller's log that start a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.controller import test_connection_burst as b  # noqa: E402
from tests.pg import ScratchPostgres  # noqa: E402

SETTLE_MAX = 30.0
FRESH = (("unix_ping", "timed_unix", "/v1/ping"), ("unix_jobs", "timed_unix", "/v1/jobs?all=1"),
         ("tcp_ping", "timed_tcp", "/v1/ping"), ("tcp_jobs", "timed_tcp", "/v1/jobs?all=1"))


def fresh(live: b.Live) -> dict[str, float]:
    """Seconds to each fresh request's answer, one after another; an error answer
    counts as its time and is said on stderr."""
    took = {}
    for name, how, path in FRESH:
        began = time.monotonic()
        try:
            getattr(b, how)(live, path)
        except Exception as exc:  # noqa: BLE001 - an answer like any other, timed
            print(f"{name}: {exc}", file=sys.stderr)
        took[name] = time.monotonic() - began
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=b.PER_TRANSPORT,
                        help="connections per transport in each burst (1 to 500)")
    parser.add_argument("--runs", type=int, default=3, help="bursts (1 to 20)")
    parser.add_argument("--read-after", type=float, default=b.READ_AFTER,
                        help="seconds the requests are left with the controller before the "
                             "close (0 to 5)")
    parser.add_argument("--jobs", type=int, default=b.JOBS,
                        help="held jobs stored first (what GET /v1/jobs lists), 0 to 20000")
    parser.add_argument("--lists-only", action="store_true",
                        help="every connection of the burst sends a whole GET /v1/jobs?all=1")
    parser.add_argument("--default-caps", action="store_true",
                        help="the controller's default connection caps (TCP connections past "
                             "32 refused at accept)")
    parser.add_argument("--log", type=Path, help="copy the controller's log here at the end")
    args = parser.parse_args()
    if not (1 <= args.connections <= 500 and 1 <= args.runs <= 20
            and 0 <= args.read_after <= 5 and 0 <= args.jobs <= 20000):
        parser.error("--connections: 1 to 500; --runs: 1 to 20; --read-after: 0 to 5; "
                     "--jobs: 0 to 20000")
    if args.lists_only:
        b.KINDS = ("list",)
    pg = ScratchPostgres()
    try:
        with b.controller(pg.fresh_database(), not args.default_caps) as live:
            b.store_jobs(live, args.jobs)
            quiet = fresh(live)
            before = b.threads(live.pid)
            worst: dict[str, float] = {}
            peak = settled = fds = 0
            settle = 0.0
            for _ in range(args.runs):
                b.burst(live, args.connections, args.read_after)
                for name, seconds in fresh(live).items():
                    worst[name] = max(worst.get(name, 0.0), seconds)
                peak = max(peak, b.threads(live.pid))
                began = time.monotonic()
                while (time.monotonic() - began < SETTLE_MAX
                       and (b.threads(live.pid) > before + b.Workers.KEEP_IDLE
                            or b.api_connections(live))):
                    time.sleep(0.1)
                settle = max(settle, time.monotonic() - began)
                settled = max(settled, b.threads(live.pid))
                fds = max(fds, b.api_connections(live))
            for name, seconds in worst.items():
                print(f"burst_{name}_quiet_s: {quiet[name]:.3f}")
                print(f"burst_{name}_s: {seconds:.3f}")
            print(f"burst_threads_before: {before}")
            print(f"burst_threads_peak: {peak}")
            print(f"burst_threads_settled: {settled}")
            print(f"burst_settle_s: {settle:.1f}")
            print(f"burst_api_fds_settled: {fds}")
            print(f"burst_tracebacks: {len(b.tracebacks(live.log()))}")
            if args.log:
                args.log.write_text(live.log())
    finally:
        pg.close()


if __name__ == "__main__":
    main()
