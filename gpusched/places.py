"""Where things live, as plain path strings (``os`` only): what a user command needs to
find the controller without loading pathlib. ``gpusched.paths`` gives the same places
as Path objects, from here."""

from __future__ import annotations

import os

SYSTEM_STATE_DIR = "/var/lib/gpusched"
SYSTEM_SOCKET = "/run/gpusched/controller.sock"
SYSTEM_CONFIG = "/etc/gpusched/gpusched.toml"
SOCKET_NAME = "controller.sock"


def local_state_dir() -> str:
    """State directory of the local cluster that ``gpusched up`` manages.

    ``$XDG_STATE_HOME/gpusched`` (default ``~/.local/state/gpusched``); for root
    without ``XDG_STATE_HOME`` it is ``/var/lib/gpusched``, a place the unprivileged
    PostgreSQL user can reach.
    """
    xdg = os.environ.get("XDG_STATE_HOME")
    if xdg:
        return os.path.join(xdg, "gpusched")
    if os.geteuid() == 0:
        return SYSTEM_STATE_DIR
    return os.path.join(os.path.expanduser("~"), ".local", "state", "gpusched")


def default_socket() -> str:
    """The controller socket a CLI talks to when none is given.

    ``$GPUSCHED_SOCKET``, else the local cluster's socket if it exists, else the
    system one.
    """
    env = os.environ.get("GPUSCHED_SOCKET")
    if env:
        return env
    local = os.path.join(local_state_dir(), SOCKET_NAME)
    if os.path.exists(local):
        return local
    return SYSTEM_SOCKET
