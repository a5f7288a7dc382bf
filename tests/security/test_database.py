"""The embedded database accepts only its owner: other local users reach neither its
socket nor, where the socket is opened up, its superuser; clusters set up with trust by an
older gpusched are closed by the next ``gpusched up``."""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from gpusched.db.embedded import EmbeddedPostgres, bin_dir, ensure_system_user
from gpusched.local import LocalCluster, start_database
from tests.security.conftest import LocalUser, run_as

BIN = Path(sys.executable).parent

CONNECT = """\
import sys, psycopg
try:
    with psycopg.connect(host=sys.argv[1], port=int(sys.argv[2]), user=sys.argv[3],
                         dbname="postgres", connect_timeout=10) as conn:
        print("connected as", conn.execute("SELECT current_user").fetchone()[0])
except psycopg.OperationalError as exc:
    print(exc)
    sys.exit(3)
"""


def _connect_as(user: LocalUser, pg: EmbeddedPostgres, role: str = "postgres"
                ) -> subprocess.CompletedProcess[str]:
    """A real process of ``user`` that opens a session as ``role`` (psycopg, no password)."""
    return run_as(user, [sys.executable, "-c", CONNECT, str(pg.socket_dir), str(pg.port), role],
                  cwd="/")


def _socket_connect_as(user: LocalUser, path: Path) -> int:
    """connect(2) on ``path`` from a child that became ``user``: 0, or the errno."""
    pid = os.fork()
    if pid == 0:
        code = 100
        try:
            os.setgroups([])
            os.setgid(user.gid)
            os.setuid(user.uid)
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(path))
            code = 0
        except OSError as exc:
            code = exc.errno or 100
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _server_user() -> LocalUser:
    entry = ensure_system_user()
    return LocalUser(entry.pw_uid, entry.pw_gid, entry.pw_name)


def _root_says_postgres(pg: EmbeddedPostgres) -> None:
    with psycopg.connect(pg.url().replace("+psycopg", "")) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)


@pytest.fixture
def scratch_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(dir="/tmp", prefix="gpusched-dbsec-"))
    os.chmod(root, 0o755)
    yield root
    for data in root.rglob("PG_VERSION"):
        EmbeddedPostgres(data.parent).stop("immediate")
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def server(scratch_root: Path) -> EmbeddedPostgres:
    pg = EmbeddedPostgres(scratch_root / "data", scratch_root / "sock")
    pg.init()
    pg.start({"fsync": "off"})
    return pg


def test_another_user_cannot_reach_the_socket(
        attackers: tuple[LocalUser, LocalUser], server: EmbeddedPostgres) -> None:
    mallory, _ = attackers
    import errno

    assert _socket_connect_as(mallory, server.socket_file) == errno.EACCES
    refused = _connect_as(mallory, server)
    assert refused.returncode == 3 and "Permission denied" in refused.stdout, refused
    # The server's own user and root do get in, through the same paths.
    allowed = _connect_as(_server_user(), server)
    assert allowed.returncode == 0 and "connected as postgres" in allowed.stdout, allowed
    _root_says_postgres(server)


def test_peer_authentication_refuses_another_user_even_on_an_open_socket(
        attackers: tuple[LocalUser, LocalUser], server: EmbeddedPostgres) -> None:
    mallory, alice = attackers
    os.chmod(server.socket_dir, 0o755)
    os.chmod(server.socket_file, 0o777)
    assert _socket_connect_as(mallory, server.socket_file) == 0  # the socket is reachable now
    for user, role in [(mallory, "postgres"), (mallory, mallory.name), (alice, "gpusched")]:
        refused = _connect_as(user, server, role)
        assert refused.returncode == 3, refused
        assert f'Peer authentication failed for user "{role}"' in refused.stdout, refused
    allowed = _connect_as(_server_user(), server)
    assert allowed.returncode == 0 and "connected as postgres" in allowed.stdout, allowed


def _run_pg(*argv: str | Path) -> None:
    owner = ensure_system_user()
    subprocess.run([str(bin_dir() / str(argv[0])), *map(str, argv[1:])], check=True,
                   capture_output=True, text=True, user=owner.pw_uid, group=owner.pw_gid,
                   extra_groups=[], cwd="/", timeout=120)


def _older_gpusched_cluster(state: Path, *, running: bool, private_socket: bool = False,
                            sock: Path | None = None) -> EmbeddedPostgres:
    """A cluster as ``gpusched up`` set it up before: initdb --auth=trust, socket directory
    0755, socket 0777 (or, with ``private_socket``, both 0700 but still trust)."""
    owner = ensure_system_user()
    data, log = state / "pgdata", state / "postgres.log"
    sock = sock or state / "pg"
    state.mkdir(mode=0o755, exist_ok=True)
    for path in (data, sock):
        path.mkdir(mode=0o700 if private_socket or path == data else 0o755)
        os.chmod(path, 0o700 if private_socket or path == data else 0o755)
        os.chown(path, owner.pw_uid, owner.pw_gid)
    log.touch(mode=0o644)
    os.chown(log, owner.pw_uid, owner.pw_gid)
    _run_pg("initdb", "-D", data, "-U", "postgres", "--auth=trust", "--encoding=UTF8",
            "--no-instructions", "--no-sync")
    if running:
        options = f"-k {sock} -h '' -p 5432 -c fsync=off"
        if private_socket:
            options += " -c unix_socket_permissions=0700"
        _run_pg("pg_ctl", "-D", data, "-l", log, "-w", "-o", options, "start")
    return EmbeddedPostgres(data, sock)


def _assert_owner_only(pg: EmbeddedPostgres, mallory: LocalUser) -> None:
    owner = ensure_system_user()
    for path, mode in [(pg.socket_dir, 0o700), (pg.socket_file, 0o700),
                       (pg.data_dir / "pg_hba.conf", 0o600), (pg.data_dir / "pg_ident.conf", 0o600),
                       (pg.log_file, 0o600)]:
        st = os.lstat(path)
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (mode, owner.pw_uid), path
    refused = _connect_as(mallory, pg)
    assert refused.returncode == 3 and "Permission denied" in refused.stdout, refused
    with psycopg.connect(pg.url().replace("+psycopg", "")) as conn:
        methods = conn.execute("SELECT DISTINCT type, auth_method FROM pg_hba_file_rules"
                               ).fetchall()
    assert methods == [("local", "peer")]


@pytest.mark.parametrize("running", [True, False])
def test_a_trust_cluster_of_an_older_gpusched_is_closed_by_the_next_up(
        attackers: tuple[LocalUser, LocalUser], scratch_root: Path, running: bool) -> None:
    mallory, _ = attackers
    state = scratch_root / "gpusched"
    old = _older_gpusched_cluster(state, running=running)
    if running:
        opened = _connect_as(mallory, old)  # what the older layout let anyone do
        assert opened.returncode == 0 and "connected as postgres" in opened.stdout, opened

    said: list[str] = []
    start_database(LocalCluster(state), said.append)

    expected = ("restarted PostgreSQL so that only its owner and root may connect" if running
                else "started PostgreSQL (existing data in")
    assert len(said) == 1 and said[0].startswith(expected), said
    assert "only its owner and root" in said[0]
    _assert_owner_only(old, mallory)
    said.clear()
    start_database(LocalCluster(state), said.append)
    assert said == []  # nothing left to change


def test_a_trust_cluster_behind_a_private_socket_is_reloaded(
        attackers: tuple[LocalUser, LocalUser], scratch_root: Path) -> None:
    mallory, _ = attackers
    state = scratch_root / "gpusched"
    old = _older_gpusched_cluster(state, running=True, private_socket=True)
    pid = (old.data_dir / "postmaster.pid").read_text().split()[0]

    said: list[str] = []
    start_database(LocalCluster(state), said.append)

    assert said == ["PostgreSQL now accepts only its owner and root (peer authentication); "
                    "its configuration was reloaded"]
    assert (old.data_dir / "postmaster.pid").read_text().split()[0] == pid  # not restarted
    _assert_owner_only(old, mallory)
    os.chmod(old.socket_dir, 0o755)  # the reload, not the directory, is what refuses now
    os.chmod(old.socket_file, 0o777)
    refused = _connect_as(mallory, old)
    assert 'Peer authentication failed for user "postgres"' in refused.stdout, refused


def test_gpusched_up_closes_an_older_cluster_and_keeps_its_files_private(
        attackers: tuple[LocalUser, LocalUser], scratch_root: Path) -> None:
    mallory, _ = attackers
    state = scratch_root / "gpusched"
    old = _older_gpusched_cluster(state, running=True)
    logs = state / "logs"
    logs.mkdir(mode=0o755)
    for leftover in (logs / "controller.log", logs / "agent.log", state / "gpusched.toml"):
        leftover.write_text("from before\n")
        os.chmod(leftover, 0o644)
    env = {**os.environ, "XDG_STATE_HOME": str(scratch_root)}
    env.pop("GPUSCHED_SOCKET", None)
    try:
        up = subprocess.run([str(BIN / "gpusched"), "up", "--gpus", "1"], env=env, cwd="/",
                            capture_output=True, text=True, timeout=180)
        assert up.returncode == 0, up.stderr
        lines = up.stdout.splitlines()
        assert [line for line in lines if "PostgreSQL" in line] == [
            "restarted PostgreSQL so that only its owner and root may connect "
            f"(peer authentication, socket directory {state / 'pg'} 0700)"], up.stdout
        _assert_owner_only(old, mallory)
        for private in (logs / "controller.log", logs / "agent.log", state / "gpusched.toml"):
            st = os.lstat(private)
            assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, 0), private
        assert "from before" not in (state / "gpusched.toml").read_text()
        queue = subprocess.run([str(BIN / "gqueue")], env=env, cwd="/", capture_output=True,
                               text=True, timeout=60)
        assert queue.returncode == 0, queue.stderr  # the controller works on the new database
    finally:
        subprocess.run([str(BIN / "gpusched"), "down"], env=env, cwd="/", capture_output=True,
                       timeout=120)


def test_up_moves_a_database_from_the_guessable_tmp_directory_and_restarts_the_controller(
        attackers: tuple[LocalUser, LocalUser], scratch_root: Path) -> None:
    mallory, _ = attackers
    # Too long for pg/.s.PGSQL.5432, short enough for controller.sock (88 characters).
    state = scratch_root / ("s" * (78 - len(str(scratch_root)))) / "gpusched"
    state.mkdir(parents=True)
    os.chmod(state.parent, 0o755)
    digest = hashlib.sha1(str(state).encode()).hexdigest()[:12]
    guessable = Path(tempfile.gettempdir()) / f"gpusched-pg-{digest}"  # the older layout
    old = _older_gpusched_cluster(state, running=True, sock=guessable)
    old.create_database("gpusched")
    env = {**os.environ, "XDG_STATE_HOME": str(state.parent)}
    env.pop("GPUSCHED_SOCKET", None)

    def run(*argv: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / argv[0]), *argv[1:]], env={**env, **extra}, cwd="/",
                              capture_output=True, text=True, timeout=180)

    try:
        # The controller and agent of before, on the database in the guessable directory.
        before = run("gpusched", "up", "--gpus", "1", GPUSCHED_DATABASE_URL=old.url("gpusched"))
        assert before.returncode == 0, before.stderr
        assert f"host={guessable}&" in (state / "gpusched.toml").read_text()

        after = run("gpusched", "up", "--gpus", "1")
        assert after.returncode == 0, after.stderr
        sock = Path((state / "pg-socket-dir").read_text().strip())
        assert sock != guessable and sock.name.startswith("gpusched-pg-")
        said = [line for line in after.stdout.splitlines() if not line.startswith("GPUs: ")]
        assert said[:3] == [
            "restarted PostgreSQL so that only its owner and root may connect "
            f"(peer authentication, socket directory {sock} 0700)",
            "stopped the controller", f"started the controller (socket {state / 'controller.sock'})",
        ], after.stdout
        assert f"host={sock}&" in (state / "gpusched.toml").read_text()
        _assert_owner_only(EmbeddedPostgres(state / "pgdata", sock), mallory)
        queue = run("gqueue")
        assert queue.returncode == 0, queue.stderr
    finally:
        run("gpusched", "down")
        shutil.rmtree(guessable, ignore_errors=True)
        record = state / "pg-socket-dir"
        if record.exists():
            shutil.rmtree(record.read_text().strip(), ignore_errors=True)


START_OWN_SERVER = """\
import sys
from pathlib import Path
from gpusched.db.embedded import EmbeddedPostgres
root = Path(sys.argv[1])
pg = EmbeddedPostgres(root / "data", root / "sock")
pg.init()
pg.start({"fsync": "off"})
"""


def test_a_server_started_by_an_ordinary_user_admits_that_user_and_root_only(
        attackers: tuple[LocalUser, LocalUser], scratch_root: Path) -> None:
    developer, alice = attackers
    os.chown(scratch_root, developer.uid, developer.gid)
    started = run_as(developer, [sys.executable, "-c", START_OWN_SERVER, str(scratch_root)],
                     cwd="/", timeout=120)
    pg = EmbeddedPostgres(scratch_root / "data", scratch_root / "sock")
    try:
        assert started.returncode == 0, started.stderr
        for path in (pg.data_dir, pg.socket_dir, pg.socket_file):
            assert (stat.S_IMODE(os.lstat(path).st_mode), os.lstat(path).st_uid) == (
                0o700, developer.uid), path
        with psycopg.connect(pg.url().replace("+psycopg", "")) as conn:  # root
            mapped = conn.execute("SELECT sys_name, pg_username FROM pg_ident_file_mappings "
                                  "ORDER BY sys_name").fetchall()
        assert mapped == [(developer.name, "postgres"), ("root", "postgres")]
        refused = _connect_as(alice, pg)
        assert refused.returncode == 3 and "Permission denied" in refused.stdout, refused
        os.chmod(pg.socket_dir, 0o755)
        os.chmod(pg.socket_file, 0o777)
        refused = _connect_as(alice, pg)
        assert 'Peer authentication failed for user "postgres"' in refused.stdout, refused
        allowed = _connect_as(developer, pg)
        assert allowed.returncode == 0 and "connected as postgres" in allowed.stdout, allowed
    finally:
        run_as(developer, [str(bin_dir() / "pg_ctl"), "-D", str(pg.data_dir), "-m", "immediate",
                           "-w", "stop"], cwd="/")


def test_the_log_of_a_private_server_is_not_readable_by_others(
        attackers: tuple[LocalUser, LocalUser], server: EmbeddedPostgres) -> None:
    mallory, _ = attackers
    read = run_as(mallory, ["cat", str(server.log_file)], cwd="/")
    assert read.returncode != 0 and "Permission denied" in read.stderr, read
    assert pwd.getpwuid(os.lstat(server.log_file).st_uid).pw_name == "gpusched"
