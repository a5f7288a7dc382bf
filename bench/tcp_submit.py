"""Submissions per second through ApiClient, over the Unix socket and over TCP with each
authentication method; prints ``name: value`` lines.

    .venv/bin/python bench/tcp_submit.py [--submits 300]

A real controller (and agent) on a scratch PostgreSQL listens on its socket and on
127.0.0.1. Each submission is what one gsubmit invocation sends (a script, its
directory, a submit_key; held, so that no pass starts jobs meanwhile) on a connection
of its own, one after another:

- ``unix_submits_per_s``: over the Unix socket (the caller known by SO_PEERCRED);
- ``tcp_key_submits_per_s``: over TCP with a key-method token signed in process (as
  root or an agent does, holding a host key);
- ``tcp_key_authd_submits_per_s``: the same with each token fetched from a real
  ``gpusched authd`` (what an ordinary user's gsubmit does);
- ``tcp_munge_submits_per_s``: over TCP with a MUNGE credential from a private munged,
  through libmunge;
- ``unix_submits_per_s_munge_cluster``: the Unix socket again, on the munge cluster, as
  a check that the two clusters compare.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpusched.auth.authd import AuthdClient  # noqa: E402
from gpusched.auth.keys import (  # noqa: E402
    derive_host_key,
    new_master_key,
    render_host_key,
    render_master_key,
    write_key_file,
)
from gpusched.auth.keytoken import KeySigner  # noqa: E402
from gpusched.auth.munge import MungeSigner  # noqa: E402
from gpusched.auth.mungeclient import munge_client  # noqa: E402
from gpusched.client import ApiClient  # noqa: E402
from gpusched.client.endpoints import Endpoint  # noqa: E402
from tests.auth.munged import Munged  # noqa: E402
from tests.e2e.cluster import BIN, scratch_cluster, wait_for  # noqa: E402


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def submits_per_s(make_client: Callable[[], ApiClient], work: Path, count: int) -> float:
    """Sequential submissions, each on a client (and connection) of its own."""
    body = {"script": "#!/bin/sh\ntrue\n", "work_dir": str(work), "hold": True, "gpus": 1}
    for _ in range(10):  # warm up: connections, caches, the first queries
        with make_client() as client:
            client.request("POST", "/v1/jobs", {**body, "submit_key": os.urandom(16).hex()})
    began = time.perf_counter()
    for _ in range(count):
        with make_client() as client:
            client.request("POST", "/v1/jobs", {**body, "submit_key": os.urandom(16).hex()})
    return count / (time.perf_counter() - began)


def tcp(port: int, credentials: Callable[[], str]) -> Callable[[], ApiClient]:
    return lambda: ApiClient(controllers=[Endpoint("127.0.0.1", port)], credentials=credentials)


def key_figures(count: int) -> None:
    site = Path(tempfile.mkdtemp(prefix="gpusched-bench-tcp-", dir="/tmp"))
    os.chmod(site, 0o755)
    master = new_master_key()
    write_key_file(site / "master.key", render_master_key(master))
    write_key_file(site / "login1.key", render_host_key(derive_host_key(master, "login1")))
    socket_path = site / "authd" / "authd.sock"
    auth = (f'[auth]\nmethod = "key"\nkey_file = "{site / "master.key"}"\n'
            f'host_key_file = "{site / "login1.key"}"\nauthd_socket = "{socket_path}"\n'
            "replay_cache = 10000000\n")
    (site / "login.toml").write_text(auth)
    authd = subprocess.Popen([str(BIN / "gpusched"), "authd", "-c", str(site / "login.toml")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port = free_port()
    try:
        wait_for(lambda: socket_path.exists() or authd.poll() is not None, what="authd")
        with scratch_cluster(listen=[f"127.0.0.1:{port}"], auth_toml=auth) as (cluster, _):
            print(f"unix_submits_per_s: "
                  f"{submits_per_s(lambda: ApiClient(cluster.socket), cluster.work, count):.0f}")
            signer = KeySigner(derive_host_key(master, "login1"))
            print(f"tcp_key_submits_per_s: "
                  f"{submits_per_s(tcp(port, signer.authorization), cluster.work, count):.0f}")
            authd_client = AuthdClient(socket_path)
            print(f"tcp_key_authd_submits_per_s: "
                  f"{submits_per_s(tcp(port, authd_client.authorization), cluster.work, count):.0f}")
    finally:
        authd.send_signal(signal.SIGTERM)
        authd.wait(timeout=10)
        shutil.rmtree(site, ignore_errors=True)


def munge_figures(count: int) -> None:
    daemon = Munged(origin="127.0.0.1")
    port = free_port()
    try:
        auth = f'[auth]\nmethod = "munge"\nmunge_socket = "{daemon.socket}"\n'
        with scratch_cluster(listen=[f"127.0.0.1:{port}"], auth_toml=auth) as (cluster, _):
            signer = MungeSigner(munge_client(daemon.socket, "library"))
            print(f"tcp_munge_submits_per_s: "
                  f"{submits_per_s(tcp(port, signer.authorization), cluster.work, count):.0f}")
            print(f"unix_submits_per_s_munge_cluster: "
                  f"{submits_per_s(lambda: ApiClient(cluster.socket), cluster.work, count):.0f}")
    finally:
        daemon.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submits", type=int, default=300)
    args = parser.parse_args(argv)
    key_figures(args.submits)
    munge_figures(args.submits)
    return 0


if __name__ == "__main__":
    sys.exit(main())
