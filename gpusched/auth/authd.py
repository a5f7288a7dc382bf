"""``gpusched authd``: the local signer of the ``key`` back-end.

It runs as root, holds this host's key (which users cannot read) and listens on a Unix
socket (mode 0666, in a directory owned by root, mode 0755). Whoever connects gets a
token for exactly the uid and gid the kernel reports for its process (SO_PEERCRED) and
this host: nothing the caller sends is read, so there is nothing to forge.

Answer: one line, ``OK <token>`` or ``ERR <message>``.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import struct
import threading
from pathlib import Path

from gpusched.auth.credential import (
    MAX_TOKEN,
    SCHEME_KEY,
    authorization_value,
    check_token,
)
from gpusched.auth.keytoken import KeySigner
from gpusched.errors import AuthError, ConfigError, Unavailable
from gpusched.paths import claim_socket_path

log = logging.getLogger("gpusched.authd")
_PEERCRED = struct.Struct("3i")
CLIENT_TIMEOUT = 5.0
SEND_TIMEOUT = 1.0


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, gid = _PEERCRED.unpack(raw)
    return pid, uid & 0xFFFFFFFF, gid & 0xFFFFFFFF


def _check_directory(path: Path) -> None:
    """The socket's directory: made 0755 when missing, else owned by root (or this
    user) and writable by its owner only, so nobody else can put a socket there."""
    try:
        os.mkdir(path, 0o755)
        os.chmod(path, 0o755)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigError(f"{path}: cannot create the authd socket directory: "
                          f"{exc.strerror}") from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{path}: refused: the authd socket directory is not a directory")
    if st.st_uid not in (0, os.geteuid()):
        raise ConfigError(f"{path}: refused: the authd socket directory is owned by uid "
                          f"{st.st_uid}; it must be owned by root")
    if st.st_mode & 0o022:
        raise ConfigError(f"{path}: refused: the authd socket directory has mode "
                          f"{stat.S_IMODE(st.st_mode):04o}; others must not write to it "
                          "(chmod 0755)")


def _claim(path: Path) -> None:
    """Remove a stale socket left by an authd that is gone; refuse anything else."""
    try:
        free = claim_socket_path(path)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if free:
        return
    raise ConfigError(f"{path}: another gpusched authd is already serving this socket")


class Authd:
    """The signer daemon: ``bind()``, then ``serve()`` until ``stop()``."""

    def __init__(self, signer: KeySigner, path: Path) -> None:
        self.signer, self.path = signer, path
        self._sock: socket.socket | None = None
        self._stopping = threading.Event()
        self.issued = 0

    def bind(self) -> None:
        """Create the listening socket (0666) in its checked directory."""
        _check_directory(self.path.parent)
        _claim(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(self.path))
            os.chmod(self.path, 0o666)
            sock.listen(128)
        except OSError:
            sock.close()
            raise
        sock.settimeout(0.5)
        self._sock = sock

    def serve(self) -> None:
        """Answer callers until stop() is called."""
        assert self._sock is not None, "bind() first"
        log.info("gpusched authd signing as host %s (key id %s) on %s", self.signer.key.host,
                 self.signer.key.key_id, self.path)
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):
                    self._stopping.wait(0.1)
                    continue
                if self._stopping.is_set():
                    break
                raise
            with conn:
                self._answer(conn)
        self._close()

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(SEND_TIMEOUT)
        try:
            pid, uid, gid = peer_credentials(conn)
            try:
                answer = f"OK {self.signer.sign(uid, gid)}\n"
            except ValueError as exc:  # a uid the kernel could not map (another namespace)
                answer = f"ERR {exc}\n"
            conn.sendall(answer.encode("ascii"))
            if answer.startswith("OK"):
                self.issued += 1
            log.debug("answered uid %d gid %d (pid %d): %s", uid, gid, pid, answer[:3])
        except OSError as exc:
            log.warning("could not answer a caller: %s", exc)

    def stop(self) -> None:
        """Make serve() return within half a second."""
        self._stopping.set()

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        try:
            if stat.S_ISSOCK(os.lstat(self.path).st_mode):
                self.path.unlink()
        except FileNotFoundError:
            pass


class AuthdClient:
    """A user's way to a credential under the ``key`` back-end: ask the local authd."""

    scheme = SCHEME_KEY

    def __init__(self, path: Path, timeout: float = CLIENT_TIMEOUT) -> None:
        self.path, self.timeout = path, timeout

    def token(self) -> str:
        """A fresh token for this process's uid/gid, from authd."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            try:
                sock.connect(str(self.path))
            except OSError as exc:
                raise Unavailable(f"cannot reach gpusched authd at {self.path}: "
                                  f"{exc.strerror or exc} (is it running on this host?)") from None
            _, server_uid, _ = peer_credentials(sock)
            if server_uid not in (0, os.geteuid()):
                raise AuthError(f"{self.path} is served by uid {server_uid}, not by root; "
                                "refusing its token")
            answer = _read_line(sock, MAX_TOKEN + 8)
        except TimeoutError:
            raise Unavailable(f"gpusched authd at {self.path} did not answer in "
                              f"{self.timeout:g} s") from None
        finally:
            sock.close()
        status, _, rest = answer.partition(" ")
        if status == "OK":
            check_token(rest)
            return rest
        if status == "ERR":
            raise AuthError(f"gpusched authd refused: {rest[:200]}")
        raise AuthError("gpusched authd sent an answer that is not a token")

    def authorization(self, *, node: str | None = None) -> str:
        """A header value carrying a fresh token (user credentials only)."""
        if node is not None:
            raise AuthError("a node credential is signed with the host key by the agent, "
                            "not by authd")
        return authorization_value(SCHEME_KEY, self.token())


def _read_line(sock: socket.socket, limit: int) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(limit + 1 - len(data))
        if not chunk:
            break
        data += chunk
        if len(data) > limit:
            raise AuthError("gpusched authd sent an answer over the size limit")
    try:
        return data.rstrip(b"\n").decode("ascii")
    except UnicodeDecodeError:
        raise AuthError("gpusched authd sent an answer that is not ASCII") from None
