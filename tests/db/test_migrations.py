"""Migrations produce exactly the models' schema, and undo cleanly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, pool, text
from sqlalchemy.exc import IntegrityError

from gpusched.db.migrate import current, downgrade, upgrade
from gpusched.db.models import Base
from tests.pg import ScratchPostgres


def _diff(url: str) -> list[object]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return list(compare_metadata(MigrationContext.configure(conn), Base.metadata))
    finally:
        engine.dispose()


def _tables(url: str) -> set[str]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_head_from_empty_matches_models(postgres: ScratchPostgres) -> None:
    url = postgres.empty_database()
    assert current(url) is None
    upgrade(url)
    assert current(url) is not None
    assert _tables(url) == set(Base.metadata.tables) | {"alembic_version"}
    assert _diff(url) == []


def test_job_scripts_move_out_of_jobs_and_back(postgres: ScratchPostgres) -> None:
    """Revision 0011 moves each job's script, arguments and environment to job_scripts
    (the script keeping the job's number) and back on downgrade; new scripts are
    numbered after the moved ones."""
    url = postgres.empty_database()
    upgrade(url, "0010")
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO partitions (name) VALUES ('gpu')"))
            conn.execute(text(
                "INSERT INTO jobs (id, name, uid, gid, user_name, partition, script, args, "
                "work_dir, environment) VALUES (41, 'a', 1, 1, 'u', 'gpu', 'echo a', "
                "'{x,y}', '/w', '{\"A\": \"1\"}'), (42, 'b', 1, 1, 'u', 'gpu', 'echo b', "
                "'{}', '/w', '{}')"))
        upgrade(url)
        with engine.begin() as conn:
            assert conn.execute(text(
                "SELECT j.id, j.script_id, s.script, s.args, s.environment FROM jobs j "
                "JOIN job_scripts s ON s.id = j.script_id ORDER BY j.id")).all() == [
                (41, 41, "echo a", ["x", "y"], {"A": "1"}), (42, 42, "echo b", [], {})]
            assert conn.scalar(text("INSERT INTO job_scripts (script) VALUES ('c') "
                                    "RETURNING id")) == 43
        downgrade(url, "0010")
        with engine.begin() as conn:
            assert conn.execute(text(
                "SELECT id, script, args, environment FROM jobs ORDER BY id")).all() == [
                (41, "echo a", ["x", "y"], {"A": "1"}), (42, "echo b", [], {})]
    finally:
        engine.dispose()


def test_downgrade_base_removes_everything_and_upgrade_again(postgres: ScratchPostgres) -> None:
    url = postgres.empty_database()
    upgrade(url)
    downgrade(url)
    assert _tables(url) == {"alembic_version"}
    assert current(url) is None
    upgrade(url)
    assert _diff(url) == []


def _gpusched(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(Path(sys.executable).parent / "gpusched"), *args],
                          capture_output=True, text=True, timeout=120)


def test_db_upgrade_command_and_controller_refusing_an_unmigrated_database(
        postgres: ScratchPostgres, tmp_path: Path) -> None:
    url = postgres.empty_database()
    config = tmp_path / "gpusched.toml"
    config.write_text(f'[database]\nurl = "{url}"\n[controller]\nsocket = "{tmp_path}/c.sock"\n')
    refused = _gpusched("controller", "--config", str(config))
    assert refused.returncode == 1
    assert refused.stderr.strip() == ("gpusched: error: the database has no gpusched schema; "
                                      "run 'gpusched db upgrade'")
    assert "none" in _gpusched("db", "current", "--database-url", url).stdout
    upgraded = _gpusched("db", "upgrade", "--config", str(config))
    assert upgraded.returncode == 0, upgraded.stderr
    assert upgraded.stdout.strip() == f"database at revision {current(url)}"
    assert _diff(url) == []


def test_sharing_columns_upgrade_an_existing_database(postgres: ScratchPostgres) -> None:
    """Revision 0019 keeps existing jobs, partitions and allocations as they were (whole
    GPUs, no sharing), lets several active shares hold one GPU but still only one whole
    allocation, checks its new columns' values, and undoes cleanly."""
    url = postgres.empty_database()
    upgrade(url, "0018")
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO partitions (name) VALUES ('gpu')"))
            conn.execute(text("INSERT INTO nodes (id, name) VALUES (1, 'n1')"))
            conn.execute(text("INSERT INTO gpus (id, node_id, index, uuid) VALUES "
                              "(1, 1, 0, 'GPU-a'), (2, 1, 1, 'GPU-b')"))
            conn.execute(text("INSERT INTO job_scripts (id, script) VALUES (1, 'x')"))
            conn.execute(text(
                "INSERT INTO jobs (id, name, uid, gid, user_name, partition, work_dir, "
                "script_id, gpus) VALUES (1, 'a', 1, 1, 'u', 'gpu', '/w', 1, 1), "
                "(2, 'b', 1, 1, 'u', 'gpu', '/w', 1, 1), (3, 'c', 1, 1, 'u', 'gpu', '/w', 1, 1)"))
            conn.execute(text("INSERT INTO allocations (job_id, gpu_id, node_id) "
                              "VALUES (1, 1, 1)"))
        upgrade(url)
        assert _diff(url) == []
        with engine.begin() as conn:
            assert conn.execute(text("SELECT share_mode, share_units, gpu_mem_mb FROM jobs "
                                     "WHERE id = 1")).one() == (None, None, None)
            assert conn.execute(text("SELECT sharing, shares FROM partitions")).one() == (
                None, None)
            assert conn.execute(text("SELECT units, mem_mb FROM allocations")).one() == (
                None, None)
            conn.execute(text("INSERT INTO allocations (job_id, gpu_id, node_id, units, "
                              "mem_mb) VALUES (2, 2, 1, 50, 20480), (3, 2, 1, 25, NULL)"))
        for bad in ("INSERT INTO allocations (job_id, gpu_id, node_id) VALUES (2, 1, 1)",
                    "UPDATE jobs SET share_mode = 'time' WHERE id = 1",
                    "UPDATE jobs SET share_units = 0 WHERE id = 1",
                    "UPDATE jobs SET gpu_mem_mb = 0 WHERE id = 1",
                    "UPDATE partitions SET sharing = 'mig'",
                    "UPDATE partitions SET shares = 10001",
                    "UPDATE partitions SET shares = 0"):
            with engine.begin() as conn, pytest.raises(IntegrityError):
                conn.execute(text(bad))
        downgrade(url, "0018")
        with engine.begin() as conn:  # the shares were released: one whole GPU each
            assert conn.execute(text("SELECT job_id FROM allocations WHERE released_at IS NULL"
                                     )).scalars().all() == [1]
        upgrade(url)
        assert _diff(url) == []
    finally:
        engine.dispose()
