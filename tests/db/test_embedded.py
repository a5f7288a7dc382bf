"""The embedded PostgreSQL keeps its files and socket to its owner, and never follows a
link it did not make (the test process is root, so the server runs as ``gpusched``)."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from gpusched.db.embedded import EmbeddedPostgres, server_user
from gpusched.errors import Unavailable
from gpusched.local import LocalCluster, pg_socket_dir, start_database
from tests.pg import ScratchPostgres


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def scratch_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="gpusched-embedded-"))
    os.chmod(root, 0o755)  # the server's user must reach its data directory
    yield root
    for data in root.rglob("PG_VERSION"):
        EmbeddedPostgres(data.parent).stop("immediate")
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def bait(scratch_root: Path) -> Path:
    """A root-owned directory that a planted link points at: chowning it would be the harm."""
    target = scratch_root / "bait"
    target.mkdir(mode=0o755)
    return target


def test_the_servers_socket_and_files_belong_to_its_user(postgres: ScratchPostgres) -> None:
    pg = postgres.server
    owner = server_user()
    for path, mode in [(pg.socket_dir, 0o700), (pg.socket_file, 0o700),
                       (pg.data_dir / "pg_hba.conf", 0o600), (pg.data_dir / "pg_ident.conf", 0o600),
                       (pg.log_file, 0o600)]:
        st = os.lstat(path)
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (mode, owner.pw_uid), path
    with postgres.admin() as conn:
        assert conn.execute("SHOW unix_socket_permissions").fetchone() == ("0700",)
        assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
        rules = conn.execute("SELECT type, database, user_name, auth_method, options, error "
                             "FROM pg_hba_file_rules").fetchall()
        mappings = conn.execute("SELECT map_name, sys_name, pg_username, error "
                                "FROM pg_ident_file_mappings ORDER BY sys_name").fetchall()
    assert rules == [("local", ["all"], ["all"], "peer", ["map=gpusched"], None)]
    assert mappings == [("gpusched", "gpusched", "postgres", None),
                        ("gpusched", "root", "postgres", None)]


def test_a_linked_socket_directory_is_refused_and_its_target_left_alone(
        scratch_root: Path, bait: Path) -> None:
    (scratch_root / "sock").symlink_to(bait)
    pg = EmbeddedPostgres(scratch_root / "data", scratch_root / "sock")
    pg.init()
    with pytest.raises(Unavailable, match="sock is a symbolic link; refusing to use it"):
        pg.start()
    assert not pg.running()
    st = os.lstat(bait)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    assert list(bait.iterdir()) == []


def test_a_linked_data_directory_is_refused_and_its_target_left_alone(
        scratch_root: Path, bait: Path) -> None:
    (scratch_root / "data").symlink_to(bait)
    pg = EmbeddedPostgres(scratch_root / "data", scratch_root / "sock")
    with pytest.raises(Unavailable, match="data is a symbolic link"):
        pg.init()
    st = os.lstat(bait)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o755)
    assert list(bait.iterdir()) == []


def test_a_linked_log_file_is_refused(scratch_root: Path, bait: Path) -> None:
    victim = bait / "victim"
    victim.write_text("root's\n")
    (scratch_root / "postgres.log").symlink_to(victim)
    pg = EmbeddedPostgres(scratch_root / "data", scratch_root / "sock")
    with pytest.raises(Unavailable, match="postgres.log is a symbolic link; refusing to use it"):
        pg.init()
    assert not pg.running()
    assert (os.lstat(victim).st_uid, victim.read_text()) == (0, "root's\n")


@pytest.mark.parametrize(("uid", "mode", "refusal"), [
    (0, 0o700, "belongs to root, not to gpusched that runs PostgreSQL"),
    (None, 0o770, r"writable by group or others \(mode 0770\)"),
    (None, 0o703, r"writable by group or others \(mode 0703\)"),
])
def test_a_socket_directory_someone_else_could_change_is_refused(
        scratch_root: Path, uid: int | None, mode: int, refusal: str) -> None:
    owner = server_user()
    sock = scratch_root / "sock"
    sock.mkdir()
    os.chown(sock, owner.pw_uid if uid is None else uid, owner.pw_gid)
    os.chmod(sock, mode)
    pg = EmbeddedPostgres(scratch_root / "data", sock)
    pg.init()
    with pytest.raises(Unavailable, match=refusal):
        pg.start()
    assert not pg.running()
    assert _mode(sock) == mode


def test_an_existing_socket_directory_of_the_servers_user_is_closed_to_others(
        scratch_root: Path) -> None:
    owner = server_user()
    sock = scratch_root / "sock"
    sock.mkdir()
    os.chown(sock, owner.pw_uid, owner.pw_gid)
    os.chmod(sock, 0o755)  # as an older gpusched left it
    pg = EmbeddedPostgres(scratch_root / "data", sock)
    pg.init()
    pg.start()
    assert _mode(sock) == 0o700 and _mode(pg.socket_file) == 0o700
    assert pg.serving_privately()


def _long_state_dir(root: Path) -> Path:
    state = root / ("s" * (100 - len(str(root)))) / "gpusched"
    state.mkdir(parents=True)
    for path in (state, state.parent):
        os.chmod(path, 0o755)
    return state


def test_a_long_state_path_gets_an_unguessable_private_socket_directory_kept_across_restarts(
        scratch_root: Path, bait: Path) -> None:
    state = _long_state_dir(scratch_root)
    cluster = LocalCluster(state)
    owner = server_user()
    # Where the socket directory used to go: a link planted there must stay unused.
    digest = hashlib.sha1(str(state).encode()).hexdigest()[:12]
    guessable = Path(tempfile.gettempdir()) / f"gpusched-pg-{digest}"
    guessable.symlink_to(bait)
    made: list[Path] = []
    try:
        said: list[str] = []
        url = start_database(cluster, said.append)
        sock = pg_socket_dir(cluster, owner)
        made.append(sock)
        assert sock != guessable and sock.parent == Path(tempfile.gettempdir())
        assert sock.name.startswith("gpusched-pg-") and f"host={sock}&" in url
        st = os.lstat(sock)
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o700, owner.pw_uid)
        record = os.lstat(cluster.pg_socket_record)
        assert (stat.S_IMODE(record.st_mode), record.st_uid) == (0o600, 0)
        assert cluster.pg_socket_record.read_text() == f"{sock}\n"
        with psycopg.connect(url.replace("+psycopg", "")) as conn:
            assert conn.execute("SELECT current_user").fetchone() == ("postgres",)

        pg = EmbeddedPostgres(state / "pgdata", sock)
        pg.stop()
        assert start_database(cluster, said.append) == url  # the same directory again
        assert said[-1].startswith("started PostgreSQL (existing data")

        # Gone private no more (here: replaced by a link): a new directory is made.
        pg.stop()
        os.rmdir(sock)
        sock.symlink_to(bait)
        made.append(sock)
        fresh = pg_socket_dir(cluster, owner)
        made.append(fresh)
        assert fresh not in (sock, guessable)
        assert (_mode(fresh), os.lstat(fresh).st_uid) == (0o700, owner.pw_uid)
        assert cluster.pg_socket_record.read_text() == f"{fresh}\n"
        bait_st = os.lstat(bait)
        assert (bait_st.st_uid, stat.S_IMODE(bait_st.st_mode)) == (0, 0o755)
        assert list(bait.iterdir()) == []
    finally:
        EmbeddedPostgres(state / "pgdata").stop("immediate")
        guessable.unlink()
        for path in made:
            if path.is_symlink():
                path.unlink()
            else:
                shutil.rmtree(path, ignore_errors=True)
