"""Where things live: state directories and sockets (stdlib only, cheap to import)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

SYSTEM_STATE_DIR = Path("/var/lib/gpusched")
SYSTEM_SOCKET = Path("/run/gpusched/controller.sock")
SYSTEM_CONFIG = Path("/etc/gpusched/gpusched.toml")
SOCKET_NAME = "controller.sock"


def local_state_dir() -> Path:
    """State directory of the local cluster that ``gpusched up`` manages.

    ``$XDG_STATE_HOME/gpusched`` (default ``~/.local/state/gpusched``); for root
    without ``XDG_STATE_HOME`` it is ``/var/lib/gpusched``, a place the unprivileged
    PostgreSQL user can reach.
    """
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg:
        return Path(xdg) / "gpusched"
    if os.geteuid() == 0:
        return SYSTEM_STATE_DIR
    return Path.home() / ".local" / "state" / "gpusched"


def default_socket_path() -> Path:
    """The controller socket a CLI talks to when none is given.

    ``$GPUSCHED_SOCKET``, else the local cluster's socket if it exists, else the
    system one.
    """
    env = os.environ.get("GPUSCHED_SOCKET")
    if env:
        return Path(env)
    local = local_state_dir() / SOCKET_NAME
    if local.exists():
        return local
    return SYSTEM_SOCKET


def default_config_path() -> Path | None:
    """``$GPUSCHED_CONFIG``, else the system config if it exists."""
    env = os.environ.get("GPUSCHED_CONFIG")
    if env:
        return Path(env)
    return SYSTEM_CONFIG if SYSTEM_CONFIG.exists() else None


def claim_socket_path(path: Path) -> bool:
    """Free ``path`` for a server's new Unix socket: a socket file no server answers on
    any more (left by one that died) is removed. False, leaving it alone, while a live
    server answers there; ValueError when something other than a socket is there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    if not stat.S_ISSOCK(st.st_mode):
        raise ValueError(f"{path}: refused: exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()
        return True
    finally:
        probe.close()
    return False
