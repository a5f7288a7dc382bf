"""What a submission made in one statement costs PostgreSQL as the cluster grows; prints
``name: value`` lines.

    .venv/bin/python bench/submit_facts.py [--nodes 1 100 1000] [--submits 2000]

For each size, a scratch database with that many registered nodes of 8 GPUs each, all
in the default partition (``nodes = "*"``), and one user with an association. Then, on
one connection, medians of the server's CPU time (its backend's user and system time)
per statement:

- ``facts_hash_us_N``: reading the stable facts again and hashing them
  (``md5(CAST(stable AS text))`` over submit_facts.STABLE, the partition with its nodes
  and their GPUs), the check a known submission's statement once made;
- ``facts_version_us_N``: reading their version (submit_facts.FACTS_VERSION), the check
  it makes now;
- ``submit_statement_us_N``: a whole held submission in one statement
  (db/submit_known.store_known on a DirectConnections connection, the facts known from
  a first submission), the server's part; ``submit_client_us_N``: this process's CPU
  per such submission (its checks and the driver).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from gpusched.adminconfig import parse_admin_config  # noqa: E402
from gpusched.db import agents  # noqa: E402
from gpusched.db.admin import apply_config  # noqa: E402
from gpusched.db.direct import DirectConnections  # noqa: E402
from gpusched.db.engine import make_engine, make_sessionmaker, psycopg_dsn  # noqa: E402
from gpusched.db.jobs import Identity  # noqa: E402
from gpusched.db.submit_facts import FACTS_VERSION, STABLE  # noqa: E402
from gpusched.db.submit_known import store, store_known  # noqa: E402
from gpusched.db.submit_store import KnownFacts  # noqa: E402
from tests.pg import ScratchPostgres  # noqa: E402

USER = Identity(1000, 1000, "alice")
CONFIG = {"partition": [{"name": "gpu", "nodes": "*", "default": True}],
          "account": [{"name": "physics"}],
          "user": [{"name": "alice", "accounts": ["physics"]}]}


def backend_cpu(pid: int) -> float:
    """User and system CPU seconds of a PostgreSQL backend so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_statement_us(conn: psycopg.Connection[Any], statement: str,
                     params: Mapping[str, object], count: int) -> float:
    """Median over 5 rounds of the backend's CPU microseconds per run of ``statement``."""
    pid = conn.info.backend_pid
    for _ in range(20):
        conn.execute(statement, params).fetchall()
    rounds = []
    for _ in range(5):
        before = backend_cpu(pid)
        for _ in range(count):
            conn.execute(statement, params).fetchall()
        rounds.append((backend_cpu(pid) - before) / count * 1e6)
    return statistics.median(rounds)


def one_size(pg: ScratchPostgres, nodes: int, count: int) -> None:
    url = pg.fresh_database()
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    with sessions() as s, s.begin():
        apply_config(s, parse_admin_config([("bench.toml", CONFIG)]))
    for n in range(nodes):
        with sessions() as s, s.begin():
            agents.register_node(s, {"node": f"n{n:04d}", "uid": 0, "cpus": 64,
                                     "memory_mb": 512_000, "gpus": [
                                         {"index": i, "uuid": f"GPU-{n}-{i}", "name": "A100",
                                          "memory_mb": 81920} for i in range(8)]})
    params: dict[str, object] = {"part": None, "user": USER.user, "account": None, "qos": None}
    with psycopg.connect(psycopg_dsn(url), autocommit=True) as conn:
        hashed = per_statement_us(
            conn, f"WITH {STABLE} SELECT md5(CAST(stable AS text)) FROM stable", params, count)
        version = per_statement_us(conn, f"SELECT {FACTS_VERSION}", {}, count)
    print(f"facts_hash_us_{nodes}: {hashed:.0f}")
    print(f"facts_version_us_{nodes}: {version:.0f}")
    direct = DirectConnections.of(engine, 1)
    known = KnownFacts()
    body = {"script": "#!/bin/sh\ntrue\n", "work_dir": "/tmp", "hold": True, "gpus": 1}
    store(sessions, body, USER, known, direct=direct)  # the ordinary way: facts now known
    taken = direct.take()
    assert taken is not None
    pid = taken.info.backend_pid
    bodies = [{**body, "submit_key": os.urandom(16).hex()} for _ in range(count)]
    server, client = backend_cpu(pid), time.process_time()
    for each in bodies:
        if store_known(taken, each, USER, known) is None:
            raise SystemExit("a submission was not made in one statement")
    print(f"submit_statement_us_{nodes}: {(backend_cpu(pid) - server) / count * 1e6:.0f}")
    print(f"submit_client_us_{nodes}: {(time.process_time() - client) / count * 1e6:.0f}")
    direct.give(taken)
    engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 100, 1000])
    parser.add_argument("--submits", type=int, default=2000)
    args = parser.parse_args()
    pg = ScratchPostgres()
    try:
        for nodes in args.nodes:
            one_size(pg, nodes, args.submits)
    finally:
        pg.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
