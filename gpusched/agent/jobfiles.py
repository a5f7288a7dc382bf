"""A job directory's own files, written whole or not at all, and the room set aside so
that a full state disk never loses how a job ended. Standard library only: the
supervisor (run as ``python -I -S``) imports it."""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Callable
from typing import Any


def write_json_atomic(path: str, data: dict[str, Any], mode: int = 0o600,
                      durable: bool = True) -> None:
    """Write JSON so readers see the old file or the whole new one; with ``durable``,
    even after a crash of the machine (it is on disk before this returns). Readable by
    the writer alone unless ``mode`` says otherwise. A write that fails leaves no
    temporary file behind."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        try:
            encoded = json.dumps(data, separators=(",", ":")).encode()  # C encoder
            if os.write(fd, encoded) != len(encoded):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    os.rename(tmp, path)
    if not durable:
        return
    dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# Room set aside in a job's directory by the launcher before anything else of the job
# is written, given up to write status.json (or supervisor.json) when the state disk is
# full: a full disk never loses how a job ended. It holds several such small files.
RESERVE = "status.reserve"
RESERVE_BYTES = 64 * 1024
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
# How long a supervisor keeps trying to write a file the full disk refuses (the job's
# end waits meanwhile; the agent sees it running).
FULL_DISK_PATIENCE = 600.0


def make_reserve(jobdir: str) -> None:
    """Set RESERVE_BYTES aside in ``jobdir`` (one set aside already, in a spare
    directory, is kept); OSError when the disk has not got them."""
    path = os.path.join(jobdir, RESERVE)
    try:
        if os.stat(path).st_blocks * 512 >= RESERVE_BYTES:
            return
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError as exc:
            if exc.errno in DISK_FULL:
                raise
            os.write(fd, bytes(RESERVE_BYTES))  # a file system without fallocate
            os.fsync(fd)  # blocks given now, not at a later write-back
    except BaseException:
        os.close(fd)
        _unlink_quietly(path)
        raise
    os.close(fd)


def write_job_file(path: str, data: dict[str, Any], durable: bool = True,
                   patience: float = 0.0) -> None:
    """write_json_atomic for a job directory's own files: when the disk is full, the
    directory's reserve is given up and the write tried again; after that, tried every
    half second for ``patience`` seconds, then the OSError is raised."""
    deadline = time.monotonic() + patience
    while True:
        try:
            write_json_atomic(path, data, durable=durable)
            return
        except OSError as exc:
            if exc.errno not in DISK_FULL:
                raise
            if _unlink_quietly(os.path.join(os.path.dirname(path), RESERVE)):
                continue
            if time.monotonic() >= deadline:
                raise
        time.sleep(0.5)


def write_then_tell(path: str, data: dict[str, Any], patience: float,
                    tell: Callable[[], None]) -> None:
    """write_job_file, made durable only after ``tell()``: whoever is told may read the
    file at once, while it goes to disk. Durable when this returns, as with
    write_job_file."""
    write_job_file(path, data, durable=False, patience=patience)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)  # opened first: it may be removed
    try:
        dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY)
        try:
            tell()
            os.fsync(fd)
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        os.close(fd)


def write_script(path: str, text: str, uid: int, gid: int) -> None:
    """Write a job's script, new, executable and readable by its owner alone: the job's
    user when the agent runs as root (the job execs it after dropping to that user)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o700)
    with open(fd, "wb") as f:
        if os.geteuid() == 0:
            os.fchown(fd, uid, gid)
        os.fchmod(fd, 0o700)
        f.write(text.encode())


def _unlink_quietly(path: str) -> bool:
    """Remove ``path``; whether it was there to remove."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
