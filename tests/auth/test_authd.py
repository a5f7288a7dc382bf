"""'gpusched authd', the real daemon started by root with a host key: real unprivileged
users get tokens for their own uid and gid, and cannot read the key."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpusched.auth.authd import AuthdClient
from gpusched.auth.credential import parse_authorization
from gpusched.auth.keys import read_master_key
from gpusched.auth.keytoken import KeyVerifier
from gpusched.errors import AuthError, Unavailable
from tests.e2e.cluster import wait_for
from tests.security.conftest import LocalUser, run_as

GPUSCHED = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "gpusched"


@dataclass
class Site:
    """A login host's files: the master key (the controller's), this host's key, a
    config naming them, and the authd socket."""

    dir: Path
    config: Path
    master: Path
    host_key: Path
    socket: Path

    def verifier(self) -> KeyVerifier:
        return KeyVerifier(read_master_key(self.master))


def gpusched(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(GPUSCHED), *argv], capture_output=True, text=True, timeout=60)


def make_site() -> Site:
    # Users must reach the config and the socket: a directory all may pass through.
    base = Path(tempfile.mkdtemp(prefix="gpusched-authd-", dir="/tmp"))
    os.chmod(base, 0o755)
    master, host_key = base / "master.key", base / "host.key"
    assert gpusched("auth", "keygen", "-o", str(master)).returncode == 0
    assert gpusched("auth", "derive", "--host", "login1", "--key-file", str(master),
                    "-o", str(host_key)).returncode == 0
    socket_path = base / "run" / "authd.sock"
    config = base / "gpusched.toml"
    config.write_text(f'[auth]\nmethod = "key"\nkey_file = "{master}"\n'
                      f'host_key_file = "{host_key}"\nauthd_socket = "{socket_path}"\n')
    os.chmod(config, 0o644)
    return Site(base, config, master, host_key, socket_path)


def start_authd(site: Site) -> subprocess.Popen[str]:
    proc = subprocess.Popen([str(GPUSCHED), "authd", "-c", str(site.config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for(lambda: site.socket.exists() or proc.poll() is not None, what="authd's socket")
    assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
    return proc


def stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    return out


@pytest.fixture(scope="module")
def site() -> Iterator[Site]:
    made = make_site()
    yield made
    shutil.rmtree(made.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def authd(site: Site) -> Iterator[subprocess.Popen[str]]:
    proc = start_authd(site)
    yield proc
    stop(proc)


def user_token(user: LocalUser, site: Site, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_as(user, [str(GPUSCHED), "auth", "token", "-c", str(site.config), *extra],
                  cwd="/")


def test_a_user_gets_a_token_for_their_own_uid_and_gid(
        site: Site, authd: subprocess.Popen[str], attackers: tuple[LocalUser, LocalUser]) -> None:
    verifier = site.verifier()
    for user in attackers:
        done = user_token(user, site)
        assert done.returncode == 0, done.stderr
        _, token = parse_authorization(done.stdout.strip())
        identity = verifier.verify(token, time.time())
        assert (identity.uid, identity.gid) == (user.uid, user.gid)
        assert (identity.host, identity.node) == ("login1", None)


def test_root_asking_authd_gets_root(site: Site, authd: subprocess.Popen[str]) -> None:
    identity = site.verifier().verify(AuthdClient(site.socket).token(), time.time())
    assert (identity.uid, identity.gid) == (0, 0)


def test_the_user_cannot_read_the_keys(site: Site, authd: subprocess.Popen[str],
                                       attackers: tuple[LocalUser, LocalUser]) -> None:
    mallory, _ = attackers
    for key in (site.host_key, site.master):
        done = run_as(mallory, ["cat", str(key)])
        assert done.returncode != 0 and "Permission denied" in done.stderr
        assert "secret" not in done.stdout


def test_a_user_cannot_get_a_node_credential(site: Site, authd: subprocess.Popen[str],
                                             attackers: tuple[LocalUser, LocalUser]) -> None:
    done = user_token(attackers[0], site, "--node", "login1")
    assert done.returncode == 1
    assert "node credential" in done.stderr and done.stderr.strip().count("\n") == 0
    assert done.stdout == ""


def test_root_with_the_host_key_signs_node_credentials_itself(
        site: Site, authd: subprocess.Popen[str]) -> None:
    done = gpusched("auth", "token", "-c", str(site.config), "--node", "login1")
    assert done.returncode == 0, done.stderr
    _, token = parse_authorization(done.stdout.strip())
    identity = site.verifier().verify(token, time.time())
    assert (identity.uid, identity.node) == (0, "login1")


def test_the_socket_is_open_to_all_in_a_directory_only_root_writes(
        site: Site, authd: subprocess.Popen[str]) -> None:
    sock, parent = os.lstat(site.socket), os.lstat(site.socket.parent)
    assert stat.S_ISSOCK(sock.st_mode) and stat.S_IMODE(sock.st_mode) == 0o666
    assert parent.st_uid == 0 and stat.S_IMODE(parent.st_mode) == 0o755


def test_each_token_is_fresh(site: Site, authd: subprocess.Popen[str]) -> None:
    client = AuthdClient(site.socket)
    tokens = {client.token() for _ in range(20)}
    verifier = site.verifier()
    assert len(tokens) == 20
    assert all(verifier.verify(t, time.time()).uid == 0 for t in tokens)


def test_a_second_authd_on_the_same_socket_is_refused(
        site: Site, authd: subprocess.Popen[str]) -> None:
    done = gpusched("authd", "-c", str(site.config))
    assert done.returncode == 2
    assert "already serving" in done.stderr
    assert AuthdClient(site.socket).token()  # the first one still answers


def test_authd_refuses_a_key_others_can_read_and_starts_nothing() -> None:
    other = make_site()
    try:
        os.chmod(other.host_key, 0o644)
        done = gpusched("authd", "-c", str(other.config))
        assert done.returncode == 2
        assert "has mode 0644" in done.stderr and done.stderr.strip().count("\n") == 0
        assert not other.socket.exists()
    finally:
        shutil.rmtree(other.dir, ignore_errors=True)


def test_authd_refuses_a_socket_directory_others_may_write() -> None:
    other = make_site()
    try:
        other.socket.parent.mkdir(mode=0o777)
        os.chmod(other.socket.parent, 0o777)
        done = gpusched("authd", "-c", str(other.config))
        assert done.returncode == 2
        assert "others must not write to it" in done.stderr
        assert not other.socket.exists()
    finally:
        shutil.rmtree(other.dir, ignore_errors=True)


def test_authd_refuses_another_method() -> None:
    other = make_site()
    try:
        other.config.write_text(other.config.read_text().replace('"key"', '"munge"'))
        done = gpusched("authd", "-c", str(other.config))
        assert done.returncode == 2 and "serves the 'key' method" in done.stderr
    finally:
        shutil.rmtree(other.dir, ignore_errors=True)


def test_sigterm_stops_authd_and_removes_its_socket() -> None:
    other = make_site()
    try:
        proc = start_authd(other)
        assert AuthdClient(other.socket).token()
        stop(proc)
        assert proc.returncode == 0
        assert not other.socket.exists()
        with pytest.raises(Unavailable, match="cannot reach gpusched authd"):
            AuthdClient(other.socket).token()
    finally:
        shutil.rmtree(other.dir, ignore_errors=True)


def test_a_socket_not_served_by_root_is_not_trusted(
        site: Site, attackers: tuple[LocalUser, LocalUser]) -> None:
    """A socket some user serves (in a place a client was pointed to) gives no token."""
    mallory, _ = attackers
    spot = Path(tempfile.mkdtemp(prefix="gpusched-fake-authd-", dir="/tmp"))
    os.chmod(spot, 0o777)
    fake = spot / "authd.sock"
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: mallory's process serving a socket
        try:
            os.setgroups([])
            os.setgid(mallory.gid)
            os.setuid(mallory.uid)
            server = socket.socket(socket.AF_UNIX)
            server.bind(str(fake))
            server.listen(1)
            os.write(ready_w, b"x")
            conn, _ = server.accept()
            conn.sendall(b"OK 1:forged\n")
            conn.close()
        finally:
            os._exit(0)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"x"
        with pytest.raises(AuthError, match=f"served by uid {mallory.uid}, not by root"):
            AuthdClient(fake).token()
    finally:
        os.close(ready_r)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        shutil.rmtree(spot, ignore_errors=True)


def test_a_key_change_reaches_authd_on_sighup_and_both_keys_verify_meanwhile() -> None:
    other = make_site()
    proc = start_authd(other)
    try:
        old_master = read_master_key(other.master)
        before, unused = AuthdClient(other.socket).token(), AuthdClient(other.socket).token()
        new_master_file = other.dir / "master.key.new"
        assert gpusched("auth", "keygen", "-o", str(new_master_file)).returncode == 0
        done = gpusched("auth", "derive", "--host", "login1", "--key-file", str(new_master_file),
                        "-o", str(other.host_key), "--force")
        assert done.returncode == 0, done.stderr
        new_master = read_master_key(new_master_file)
        proc.send_signal(signal.SIGHUP)
        after = wait_for(lambda: (t := AuthdClient(other.socket).token()).split(":")[1]
                         == new_master.key_id and t, what="a token of the new key")
        during = KeyVerifier(new_master, previous=old_master)
        assert during.verify(before, time.time()).uid == 0
        assert during.verify(after, time.time()).uid == 0
        # once the previous key is no longer configured, its tokens are refused
        with pytest.raises(AuthError, match=f"unknown key \\(key id {old_master.key_id}\\)"):
            KeyVerifier(new_master).verify(unused, time.time())
    finally:
        stop(proc)
        shutil.rmtree(other.dir, ignore_errors=True)
