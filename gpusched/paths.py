"""Where things live: state directories and sockets (stdlib only, cheap to import)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpusched import places

SYSTEM_STATE_DIR = Path(places.SYSTEM_STATE_DIR)
SYSTEM_SOCKET = Path(places.SYSTEM_SOCKET)
SYSTEM_CONFIG = Path(places.SYSTEM_CONFIG)
SOCKET_NAME = places.SOCKET_NAME


def local_state_dir() -> Path:
    """State directory of the local cluster that ``gpusched up`` manages (see
    ``gpusched.places.local_state_dir``)."""
    return Path(places.local_state_dir())


def default_socket_path() -> Path:
    """The controller socket a CLI talks to when none is given (see
    ``gpusched.places.default_socket``)."""
    return Path(places.default_socket())


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
    import socket

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
