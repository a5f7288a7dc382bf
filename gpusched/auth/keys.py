"""Key files of the ``key`` back-end: the controller's master key and each host's
derived key, their format, how they are checked before use and how they are written.

The master key lives on controller hosts only. Every other host gets
``HMAC-SHA256(master, "host:" + name)``, so holding one host's key lets a process sign
as that host and no other. A key file is refused unless it is a regular file (not a
link), owned by root or by the user reading it, and readable by its owner only.

Format (text, at most 4 KiB)::

    gpusched-key 1
    kind = master | host
    host = NAME              (host keys only)
    key_id = 16 hex digits   (of the master key; a host key names its master's)
    secret = base64 of 32 bytes
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from gpusched.auth.credential import HOST_NAME
from gpusched.errors import ConfigError, UsageError

SECRET_BYTES = 32
MAX_KEY_FILE = 4096
_MAGIC = "gpusched-key 1"


@dataclass(frozen=True)
class MasterKey:
    """The controller's key: verifies every host's credentials."""

    key_id: str
    secret: bytes = b""

    def __repr__(self) -> str:
        return f"MasterKey(key_id={self.key_id!r})"


@dataclass(frozen=True)
class HostKey:
    """One host's derived key: signs that host's credentials and nothing else."""

    host: str
    key_id: str
    secret: bytes = b""

    def __repr__(self) -> str:
        return f"HostKey(host={self.host!r}, key_id={self.key_id!r})"


def key_id_of(secret: bytes) -> str:
    """The public name of a master secret, carried in tokens to pick the key."""
    return hmac.new(secret, b"gpusched key id", hashlib.sha256).hexdigest()[:16]


def new_master_key() -> MasterKey:
    """A fresh random master key."""
    secret = secrets.token_bytes(SECRET_BYTES)
    return MasterKey(key_id_of(secret), secret)


def derive_host_key(master: MasterKey, host: str) -> HostKey:
    """The key of ``host``: HMAC-SHA256(master, "host:" + host)."""
    if not HOST_NAME.fullmatch(host):
        raise UsageError(f"invalid host name {host!r}: expected letters, digits, '_', '.', "
                         "'-' (at most 253, starting with a letter or digit)")
    secret = hmac.new(master.secret, b"host:" + host.encode("ascii"), hashlib.sha256).digest()
    return HostKey(host, master.key_id, secret)


def _refusal(path: Path, st: os.stat_result, owners: frozenset[int]) -> str | None:
    """Why a key file with this status may not be used, or None when it may."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link; a key file must be a regular file"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid not in owners:
        return (f"is owned by uid {st.st_uid}; a key file must be owned by root or by the "
                f"user reading it (uid {os.geteuid()})")
    if st.st_mode & 0o077:
        return (f"has mode {stat.S_IMODE(st.st_mode):04o}; a key file must be readable by "
                "its owner only (chmod 0600)")
    return None


def read_key_file(path: Path) -> dict[str, str]:
    """The fields of a checked key file; a ConfigError says what is wrong with it."""
    owners = frozenset({0, os.geteuid()})
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such key file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the key file: {exc.strerror}") from None
    if (why := _refusal(path, st, owners)) is not None:
        raise ConfigError(f"{path}: refused: the key file {why}")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the key file: {exc.strerror}") from None
    try:
        fst = os.fstat(fd)
        # The file opened must be the one checked: a swap in between is refused.
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            raise ConfigError(f"{path}: refused: the key file changed while it was read")
        if (why := _refusal(path, fst, owners)) is not None:
            raise ConfigError(f"{path}: refused: the key file {why}")
        data = os.read(fd, MAX_KEY_FILE + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE:
        raise ConfigError(f"{path}: not a gpusched key file: over {MAX_KEY_FILE} bytes")
    return _parse(path, data)


def _parse(path: Path, data: bytes) -> dict[str, str]:
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a gpusched key file: not ASCII text") from None
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    if not lines or lines[0] != _MAGIC:
        raise ConfigError(f"{path}: not a gpusched key file: the first line must be "
                          f"'{_MAGIC}' (write one with 'gpusched auth keygen')")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = (part.strip() for part in line.partition("="))
        if not sep or name not in ("kind", "host", "key_id", "secret") or name in fields:
            raise ConfigError(f"{path}: not a gpusched key file: unexpected line {line[:40]!r}")
        fields[name] = value
    return fields


def _secret(path: Path, fields: dict[str, str]) -> tuple[str, bytes]:
    key_id, text = fields.get("key_id", ""), fields.get("secret", "")
    if len(key_id) != 16 or any(c not in "0123456789abcdef" for c in key_id):
        raise ConfigError(f"{path}: key_id: expected 16 lower-case hex digits")
    try:
        secret = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        secret = b""
    if len(secret) != SECRET_BYTES:
        raise ConfigError(f"{path}: secret: expected base64 of {SECRET_BYTES} bytes")
    return key_id, secret


def read_master_key(path: Path) -> MasterKey:
    """The master key in ``path``, checked (owner, mode, format) before use."""
    fields = read_key_file(path)
    if fields.get("kind") != "master" or "host" in fields:
        raise ConfigError(f"{path}: not a master key (kind = {fields.get('kind')!r}); the "
                          "controller needs the file written by 'gpusched auth keygen'")
    key_id, secret = _secret(path, fields)
    if key_id_of(secret) != key_id:
        raise ConfigError(f"{path}: key_id does not match the secret; the file is damaged")
    return MasterKey(key_id, secret)


def read_host_key(path: Path) -> HostKey:
    """The host key in ``path``, checked (owner, mode, format) before use."""
    fields = read_key_file(path)
    if fields.get("kind") != "host":
        raise ConfigError(f"{path}: not a host key (kind = {fields.get('kind')!r}); a host "
                          "needs the file written by 'gpusched auth derive --host NAME'")
    host = fields.get("host", "")
    if not HOST_NAME.fullmatch(host):
        raise ConfigError(f"{path}: host: expected a host name, got {host[:64]!r}")
    key_id, secret = _secret(path, fields)
    return HostKey(host, key_id, secret)


def render_master_key(key: MasterKey) -> str:
    """The text of a master key file."""
    return (f"# gpusched master key: controller hosts only; root (or the controller's user), "
            f"mode 0600\n{_MAGIC}\nkind = master\nkey_id = {key.key_id}\n"
            f"secret = {base64.b64encode(key.secret).decode()}\n")


def render_host_key(key: HostKey) -> str:
    """The text of a host key file."""
    return (f"# gpusched host key of {key.host}: that host only; root, mode 0600\n{_MAGIC}\n"
            f"kind = host\nhost = {key.host}\nkey_id = {key.key_id}\n"
            f"secret = {base64.b64encode(key.secret).decode()}\n")


def write_key_file(path: Path, text: str, *, replace: bool = False) -> None:
    """Write a key file 0600, whole or not at all; an existing file only with ``replace``."""
    if not replace and os.path.lexists(path):
        raise UsageError(f"{path}: already exists; give --force to replace it")
    if not path.parent.is_dir():
        raise UsageError(f"{path.parent}: no such directory")
    temp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode("ascii"))
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(temp)
        raise
    os.close(fd)
    try:
        if replace:
            os.replace(temp, path)
        else:
            os.link(temp, path)  # fails if the name was taken meanwhile
            os.unlink(temp)
    except FileExistsError:
        os.unlink(temp)
        raise UsageError(f"{path}: already exists; give --force to replace it") from None
    except BaseException:
        os.unlink(temp)
        raise
