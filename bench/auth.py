"""Credentials made and checked per second, for each authentication back-end; prints
``name: value`` lines.

    .venv/bin/python bench/auth.py [--seconds 3]

Each figure is one thread making a credential and verifying it, in a loop, for
``--seconds``:

- ``key_sign_verify_per_s``: key tokens signed with a host key and verified with the
  master key (replay cache included), in process;
- ``key_authd_verify_per_s``: a token fetched from a real ``gpusched authd`` over its
  Unix socket (what a user command does), then verified;
- ``munge_library_sign_verify_per_s`` / ``munge_programs_sign_verify_per_s``: a MUNGE
  credential encoded and decoded through a private munged (own key and socket), by
  libmunge through ctypes and by the munge/unmunge programs;
- ``munge_library_4_threads_per_s``: the library path from four threads at once (the
  controller's server is threaded; ctypes releases the GIL while munged works).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpusched.auth.authd import AuthdClient  # noqa: E402
from gpusched.auth.keys import (  # noqa: E402
    derive_host_key,
    new_master_key,
    render_host_key,
    write_key_file,
)
from gpusched.auth.keytoken import KeySigner, KeyVerifier  # noqa: E402
from gpusched.auth.munge import MungeSigner, MungeVerifier  # noqa: E402
from gpusched.auth.mungeclient import munge_client  # noqa: E402
from gpusched.auth.replay import ReplayCache  # noqa: E402
from tests.auth.munged import Munged  # noqa: E402


def rate(step: Callable[[], object], seconds: float, threads: int = 1) -> float:
    """Calls of ``step`` per second over ``seconds`` (from ``threads`` threads together)."""
    counts = [0] * threads
    stop = time.perf_counter() + seconds

    def loop(slot: int) -> None:
        n = 0
        while time.perf_counter() < stop:
            step()
            n += 1
        counts[slot] = n

    began = time.perf_counter()
    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return sum(counts) / (time.perf_counter() - began)


def key_figures(seconds: float) -> None:
    master = new_master_key()
    signer = KeySigner(derive_host_key(master, "login1"))
    verifier = KeyVerifier(master, replay=ReplayCache(10_000_000, per_owner=10_000_000))
    now = time.time
    print(f"key_sign_verify_per_s: "
          f"{rate(lambda: verifier.verify(signer.sign(1000, 1000), now()), seconds):.0f}")
    site = Path(tempfile.mkdtemp(prefix="gpusched-bench-authd-", dir="/tmp"))
    os.chmod(site, 0o755)
    write_key_file(site / "host.key", render_host_key(derive_host_key(master, "login1")))
    socket_path = site / "run" / "authd.sock"
    (site / "gpusched.toml").write_text(
        f'[auth]\nmethod = "key"\nhost_key_file = "{site / "host.key"}"\n'
        f'authd_socket = "{socket_path}"\n')
    authd = subprocess.Popen([str(ROOT / ".venv" / "bin" / "gpusched"), "authd", "-c",
                              str(site / "gpusched.toml")])
    try:
        deadline = time.monotonic() + 20
        while not socket_path.exists():
            if time.monotonic() > deadline or authd.poll() is not None:
                raise SystemExit("gpusched authd did not start")
            time.sleep(0.05)
        client = AuthdClient(socket_path)
        print(f"key_authd_verify_per_s: "
              f"{rate(lambda: verifier.verify(client.token(), now()), seconds):.0f}")
    finally:
        authd.send_signal(signal.SIGTERM)
        authd.wait(timeout=10)
        shutil.rmtree(site, ignore_errors=True)


def munge_figures(seconds: float) -> None:
    daemon = Munged()
    try:
        for kind in ("library", "programs"):
            client = munge_client(daemon.socket, kind)
            signer, verifier = MungeSigner(client), MungeVerifier(client)
            print(f"munge_{kind}_sign_verify_per_s: "
                  f"{rate(lambda: verifier.verify(signer.sign(), 0.0), seconds):.0f}")
        client = munge_client(daemon.socket, "library")
        signer, verifier = MungeSigner(client), MungeVerifier(client)
        print(f"munge_library_4_threads_per_s: "
              f"{rate(lambda: verifier.verify(signer.sign(), 0.0), seconds, threads=4):.0f}")
    finally:
        daemon.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    print(f"cpus: {os.cpu_count()}")
    key_figures(args.seconds)
    munge_figures(args.seconds)


if __name__ == "__main__":
    main()
