"""Talking to munged: libmunge through ctypes, or the ``munge``/``unmunge`` programs when
the library cannot be loaded. Both give the same results for the same credential.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import ipaddress
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpusched.errors import Unavailable

DEFAULT_SOCKET = Path("/run/munge/munge.socket.2")
MAX_PAYLOAD = 1024
PROGRAM_TIMEOUT = 10.0

# munge_opt_t and munge_err_t of munge.h (stable since MUNGE 0.5).
OPT_TTL = 4
OPT_ADDR4 = 5
OPT_ENCODE_TIME = 6
OPT_SOCKET = 8
EMUNGE_SUCCESS = 0
EMUNGE_SOCKET = 6
EMUNGE_TIMEOUT = 7
EMUNGE_CRED_EXPIRED = 15
EMUNGE_CRED_REWOUND = 16
EMUNGE_CRED_REPLAYED = 17
# Failures of munged or of the connection to it, not of the credential.
DAEMON_ERRORS = frozenset({1, 5, EMUNGE_SOCKET, EMUNGE_TIMEOUT})  # snafu, no memory


@dataclass(frozen=True)
class Decoded:
    """What munged said of a credential. ``status`` 0 is a good one; any other is
    munged's error number (replayed, expired, bad credential...)."""

    status: int
    message: str
    uid: int = -1
    gid: int = -1
    address: str = ""
    encode_time: int = 0
    ttl: int = 0
    payload: bytes = b""


class MungeClient(Protocol):
    """Encodes and decodes credentials through one munged socket."""

    socket: Path
    kind: str

    def encode(self, payload: bytes, ttl: int) -> str:
        """A credential of the calling process carrying ``payload``."""
        ...

    def decode(self, credential: str) -> Decoded:
        """munged's verdict on ``credential``."""
        ...


class _InAddr(ctypes.Structure):
    _fields_ = [("s_addr", ctypes.c_uint32)]


def _load_libmunge() -> Any:
    name = ctypes.util.find_library("munge") or "libmunge.so.2"
    lib = ctypes.CDLL(name, use_errno=True)
    lib.munge_ctx_create.restype = ctypes.c_void_p
    lib.munge_ctx_create.argtypes = []
    lib.munge_ctx_destroy.restype = None
    lib.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
    lib.munge_ctx_strerror.restype = ctypes.c_char_p
    lib.munge_ctx_strerror.argtypes = [ctypes.c_void_p]
    lib.munge_strerror.restype = ctypes.c_char_p
    lib.munge_strerror.argtypes = [ctypes.c_int]
    lib.munge_encode.restype = ctypes.c_int
    lib.munge_encode.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                 ctypes.c_void_p, ctypes.c_int]
    lib.munge_decode.restype = ctypes.c_int
    lib.munge_decode.argtypes = [ctypes.c_char_p, ctypes.c_void_p,
                                 ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int),
                                 ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32)]
    # munge_ctx_set/get are variadic: no argtypes, every argument passed as a ctypes value.
    lib.munge_ctx_set.restype = ctypes.c_int
    lib.munge_ctx_get.restype = ctypes.c_int
    return lib


_LIBC: Any = None
_LIB_LOCK = threading.Lock()


def _libc() -> Any:
    global _LIBC
    with _LIB_LOCK:
        if _LIBC is None:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.free.restype = None
            libc.free.argtypes = [ctypes.c_void_p]
            _LIBC = libc
        return _LIBC


class LibMunge:
    """libmunge through ctypes: one context per call, so it is safe across threads."""

    kind = "library"

    def __init__(self, socket: Path = DEFAULT_SOCKET) -> None:
        self.socket = socket
        self._lib = _load_libmunge()
        self._free = _libc().free
        self._socket_arg = ctypes.c_char_p(str(socket).encode())

    def _context(self) -> Any:
        ctx = self._lib.munge_ctx_create()
        if not ctx:
            raise MemoryError("munge_ctx_create failed")
        err = self._lib.munge_ctx_set(ctypes.c_void_p(ctx), ctypes.c_int(OPT_SOCKET),
                                      self._socket_arg)
        if err != EMUNGE_SUCCESS:
            self._lib.munge_ctx_destroy(ctx)
            raise Unavailable(f"munge: cannot use socket {self.socket}")
        return ctx

    def _message(self, ctx: Any, err: int) -> str:
        text = self._lib.munge_ctx_strerror(ctx) or self._lib.munge_strerror(err) or b""
        return bytes(text).decode("utf-8", "replace")

    def encode(self, payload: bytes, ttl: int) -> str:
        ctx = self._context()
        try:
            self._lib.munge_ctx_set(ctypes.c_void_p(ctx), ctypes.c_int(OPT_TTL),
                                    ctypes.c_int(ttl))
            out = ctypes.c_void_p()
            buf = ctypes.create_string_buffer(payload, len(payload))
            err = self._lib.munge_encode(ctypes.byref(out), ctx, buf, len(payload))
            credential = ctypes.string_at(out.value) if out.value else b""
            if out.value:
                self._free(out)
            if err != EMUNGE_SUCCESS:
                raise Unavailable(f"munge: cannot make a credential: {self._message(ctx, err)}")
            return credential.decode("ascii")
        finally:
            self._lib.munge_ctx_destroy(ctx)

    def decode(self, credential: str) -> Decoded:
        ctx = self._context()
        buf, length = ctypes.c_void_p(), ctypes.c_int(0)
        uid, gid = ctypes.c_uint32(0), ctypes.c_uint32(0)
        try:
            err = self._lib.munge_decode(credential.encode("ascii"), ctx, ctypes.byref(buf),
                                         ctypes.byref(length), ctypes.byref(uid),
                                         ctypes.byref(gid))
            payload = ctypes.string_at(buf, length.value) if buf and length.value > 0 else b""
            if buf:
                self._free(buf)
            if err != EMUNGE_SUCCESS:
                return Decoded(status=err, message=self._message(ctx, err))
            addr, encoded, ttl = _InAddr(), ctypes.c_long(0), ctypes.c_int(0)
            self._lib.munge_ctx_get(ctypes.c_void_p(ctx), ctypes.c_int(OPT_ADDR4),
                                    ctypes.byref(addr))
            self._lib.munge_ctx_get(ctypes.c_void_p(ctx), ctypes.c_int(OPT_ENCODE_TIME),
                                    ctypes.byref(encoded))
            self._lib.munge_ctx_get(ctypes.c_void_p(ctx), ctypes.c_int(OPT_TTL),
                                    ctypes.byref(ttl))
            # in_addr holds the address in network order: its bytes are the dotted quad.
            address = str(ipaddress.IPv4Address(bytes(addr)))
            return Decoded(status=0, message="Success", uid=uid.value, gid=gid.value,
                           address=address, encode_time=encoded.value, ttl=ttl.value,
                           payload=payload)
        finally:
            self._lib.munge_ctx_destroy(ctx)


class MungePrograms:
    """The ``munge`` and ``unmunge`` programs: slower, needing only the munge package."""

    kind = "programs"

    def __init__(self, socket: Path = DEFAULT_SOCKET) -> None:
        self.socket = socket
        self.munge, self.unmunge = shutil.which("munge"), shutil.which("unmunge")
        if self.munge is None or self.unmunge is None:
            raise Unavailable("munge: neither libmunge nor the munge and unmunge programs "
                              "are installed (Debian/Ubuntu: apt-get install munge)")

    def _run(self, argv: list[str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
        try:
            return subprocess.run(argv, input=stdin, capture_output=True,
                                  timeout=PROGRAM_TIMEOUT, env={"PATH": "/usr/bin:/bin"})
        except subprocess.TimeoutExpired:
            raise Unavailable(f"munge: {Path(argv[0]).name} did not answer in "
                              f"{PROGRAM_TIMEOUT:g} s") from None

    def encode(self, payload: bytes, ttl: int) -> str:
        assert self.munge is not None
        done = self._run([self.munge, "-S", str(self.socket), "-t", str(ttl)], payload)
        if done.returncode != 0:
            message = done.stderr.decode("utf-8", "replace").strip().splitlines()
            raise Unavailable("munge: cannot make a credential: "
                              + (message[-1] if message else f"exit {done.returncode}"))
        return done.stdout.decode("ascii").strip()

    def decode(self, credential: str) -> Decoded:
        assert self.unmunge is not None
        done = self._run([self.unmunge, "-S", str(self.socket), "-N"],
                         credential.encode("ascii") + b"\n")
        meta, _, payload = done.stdout.partition(b"\n\n")
        fields: dict[str, str] = {}
        for line in meta.decode("utf-8", "replace").splitlines():
            name, _, value = line.partition(":")
            fields[name.strip()] = value.strip()
        if done.returncode != 0 or fields.get("STATUS") != "0":
            status = done.returncode or 1
            lines = done.stderr.decode("utf-8", "replace").strip().splitlines()
            message = lines[-1].removeprefix("unmunge: Error: ") if lines else ""
            return Decoded(status=status, message=message or _STATUS_TEXT.get(status, "error"))
        try:
            return Decoded(status=0, message="Success", uid=int(fields["UID"]),
                           gid=int(fields["GID"]), address=fields["ENCODE_HOST"],
                           encode_time=int(fields["ENCODE_TIME"]), ttl=int(fields["TTL"]),
                           payload=payload[:MAX_PAYLOAD + 1])
        except (KeyError, ValueError):
            return Decoded(status=1, message="unmunge printed something unexpected")


_STATUS_TEXT = {EMUNGE_CRED_EXPIRED: "Expired credential",
                EMUNGE_CRED_REWOUND: "Rewound credential",
                EMUNGE_CRED_REPLAYED: "Replayed credential", 8: "Invalid credential format",
                14: "Invalid credential", EMUNGE_SOCKET: "Socket communication error"}


def munge_client(socket: Path = DEFAULT_SOCKET, prefer: str = "auto") -> MungeClient:
    """libmunge when it loads (``prefer`` "auto" or "library"), else the programs."""
    if prefer not in ("auto", "library", "programs"):
        raise ValueError(f"prefer must be auto, library or programs, not {prefer!r}")
    if prefer != "programs":
        try:
            return LibMunge(socket)
        except OSError:
            if prefer == "library":
                raise Unavailable("munge: libmunge.so.2 cannot be loaded "
                                  "(Debian/Ubuntu: apt-get install libmunge2)") from None
    return MungePrograms(socket)
