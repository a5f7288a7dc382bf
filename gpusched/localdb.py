"""The embedded PostgreSQL of ``gpusched up``: its data and socket directories in the
local cluster's state directory (see gpusched.local), started, secured and brought up
to date."""

from __future__ import annotations

import os
import pwd
import stat
import tempfile
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpusched.errors import Unavailable

if TYPE_CHECKING:
    from gpusched.db.embedded import EmbeddedPostgres
    from gpusched.local import LocalCluster

DATABASE = "gpusched"
_SOCKET_MAX = 100


def embedded_server(cluster: LocalCluster, socket_dir: Path | None = None) -> EmbeddedPostgres:
    from gpusched.db.embedded import EmbeddedPostgres

    return EmbeddedPostgres(cluster.state_dir / "pgdata", socket_dir)


def _socket_dir_fits(path: Path) -> bool:
    return len(str(path)) + 16 <= _SOCKET_MAX


def _recorded_socket_dir(cluster: LocalCluster, owner: pwd.struct_passwd) -> Path | None:
    """The socket directory named in ``pg-socket-dir`` if it is still fit to use."""
    from gpusched.db.embedded import directory_is_private

    try:
        fd = os.open(cluster.pg_socket_record, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        text = f.read(4096).decode(errors="replace").strip()
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    path = Path(text)
    if (path.parent != Path(tempfile.gettempdir()) or not path.name.startswith("gpusched-pg-")
            or not _socket_dir_fits(path)):
        return None
    return path if directory_is_private(path, owner) else None


def pg_socket_dir(cluster: LocalCluster, owner: pwd.struct_passwd) -> Path:
    """The PostgreSQL socket directory, owned by ``owner`` and 0700.

    ``pg/`` in the state directory; when that path is too long for a Unix socket, a
    directory with an unguessable name in the temporary directory, made once and named
    in ``pg-socket-dir``. One that has gone or is no longer private is replaced."""
    from gpusched.db.embedded import private_directory, write_private_file

    preferred = cluster.state_dir / "pg"
    if _socket_dir_fits(preferred):
        return preferred
    recorded = _recorded_socket_dir(cluster, owner)
    if recorded is not None:
        return recorded
    made = Path(tempfile.mkdtemp(prefix="gpusched-pg-"))
    if not _socket_dir_fits(made):
        os.rmdir(made)
        raise Unavailable(f"the state directory {cluster.state_dir} and the temporary "
                          f"directory {made.parent} are too long a path for PostgreSQL's socket")
    private_directory(made, owner, "PostgreSQL socket directory", just_made=True)
    write_private_file(cluster.pg_socket_record, f"{made}\n", pwd.getpwuid(os.geteuid()))
    return made


def start_database(cluster: LocalCluster, say: Callable[[str], None]) -> str:
    """Start the embedded PostgreSQL, or bring a running one up to date; return its URL.

    A cluster that an older gpusched set up (trust authentication, an open socket) gets
    the owner-only pg_hba.conf and pg_ident.conf; a running server is reloaded, or
    restarted where its socket is not the private one."""
    from gpusched.db.embedded import server_user

    owner = server_user()
    pg = embedded_server(cluster, pg_socket_dir(cluster, owner))
    fresh = not pg.initialised()
    pg.init()
    secured = not fresh and pg.secure_access()
    if not pg.running():
        pg.start()
        note = ("; it now accepts only its owner and root (peer authentication)"
                if secured else "")
        say(f"started PostgreSQL ({'new' if fresh else 'existing'} data in {pg.data_dir}){note}")
    elif not pg.serving_privately():
        pg.stop()
        pg.start()
        say(f"restarted PostgreSQL so that only its owner and root may connect "
            f"(peer authentication, socket directory {pg.socket_dir} 0700)")
    elif secured:
        pg.reload()
        say("PostgreSQL now accepts only its owner and root (peer authentication); "
            "its configuration was reloaded")
    pg.create_database(DATABASE)
    return pg.url(DATABASE)


def configured_database_url(cluster: LocalCluster) -> str | None:
    try:
        with open(cluster.config_file, "rb") as f:
            url = tomllib.load(f).get("database", {}).get("url")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return url if isinstance(url, str) else None
