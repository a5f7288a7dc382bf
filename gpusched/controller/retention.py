"""Job retention (docs/admin-guide.md, "Job retention"): the leader's periodic purge of
finished jobs, each batch written to a compressed archive file before its rows are
deleted, and the reading of those files for ``GET /v1/accounting``.

One archive file per batch: ``jobs-SEQ-EARLIEST-LATEST-LOWID-HIGHID.jsonl.gz`` (SEQ
counts up; EARLIEST/LATEST bound its jobs' times in epoch seconds, LOWID/HIGHID their
ids and array ids, so that a reader skips files that cannot match). Gzipped JSON lines:
a header (format, version, job ids), then one entry per job (``db.retention``).

A batch: lock the purgeable rows, write the file under a temporary name, fsync it, link
it to its name (never over another file), fsync the directory, then delete the rows in
the same transaction. A crash before the commit leaves the newest archive holding jobs
still stored: the next run finishes that batch first (deletes those that may still go,
and rewrites the file without the others), so no job is ever in two archives, and a
reader skips an archived copy of a job still stored.
"""

from __future__ import annotations

import gzip
import json
import logging
import math
import os
import re
import secrets
import stat
import zlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import RetentionConfig
from gpusched.db.accounting import SHOWN_STATES
from gpusched.db.leadership import Leadership, NotLeader
from gpusched.db.retention import archive_entries, delete_jobs, lock_purgeable, present
from gpusched.errors import ConfigError, GpuschedError

log = logging.getLogger(__name__)
ARCHIVE_FORMAT = "gpusched-job-archive"
ARCHIVE_VERSION = 1
_NAME = re.compile(r"^jobs-(\d{10})-(\d{1,12})-(\d{1,12})-(\d{1,19})-(\d{1,19})\.jsonl\.gz\Z")
_TEMPORARY = ".tmp-"
_MAX_LINE = 64 * 1024 * 1024  # bytes of one entry; a longer line is a damaged file


class ArchiveError(GpuschedError):
    """An archive file that cannot be read (not ours, damaged, of another format)."""


@dataclass(frozen=True)
class ArchiveFile:
    """An archive as its name describes it."""

    path: Path
    seq: int
    earliest: int  # epoch seconds: the earliest start (else end, else submit) of its jobs
    latest: int  # epoch seconds: the latest end
    low_id: int  # the lowest id or array id
    high_id: int

    @classmethod
    def named(cls, path: Path) -> ArchiveFile | None:
        """The archive of ``path``; None for a name that is not an archive's."""
        m = _NAME.match(path.name)
        if m is None:
            return None
        seq, earliest, latest, low, high = map(int, m.groups())
        return cls(path, seq, earliest, latest, low, high)


@dataclass(frozen=True)
class ArchiveQuery:
    """Which archived jobs an accounting request asks for (``uid``: only that user's
    jobs; None: everyone's, for an administrator)."""

    users: list[str] | None = None
    accounts: list[str] | None = None
    states: list[str] | None = None
    ids: list[int] | None = None
    start: datetime | None = None
    end: datetime | None = None
    uid: int | None = None

    def may_hold(self, archive: ArchiveFile) -> bool:
        """Whether ``archive`` may hold a job asked for, from its name alone."""
        if self.start is not None and archive.latest < self.start.timestamp():
            return False
        if self.end is not None and archive.earliest > self.end.timestamp():
            return False
        return not self.ids or any(archive.low_id <= i <= archive.high_id for i in self.ids)

    def may_match(self, header: dict[str, Any]) -> bool:
        """Whether an archive of ``header`` may hold a job asked for."""
        def meets(wanted: Any, key: str) -> bool:
            return not wanted or key not in header or bool(set(wanted) & set(header[key]))
        return (meets([] if self.uid is None else [self.uid], "uids")
                and meets(self.users, "users") and meets(self.accounts, "accounts")
                and meets(self.states or SHOWN_STATES, "states")
                and (not self.ids or bool(set(self.ids) & {
                    *header["job_ids"], *header.get("array_job_ids", ())})))

    def wants(self, entry: dict[str, Any]) -> bool:
        """Whether the archived ``entry`` is asked for, as ``db.accounting`` chooses
        stored jobs."""
        record, job = entry["record"], entry["job"]
        if self.uid is not None and job.get("uid") != self.uid:
            return False
        if self.users and record["user"] not in self.users:
            return False
        if self.accounts and record["account"] not in self.accounts:
            return False
        if record["state"] not in (self.states or SHOWN_STATES):
            return False
        if self.ids and record["job_id"] not in self.ids and record["array_job_id"] not in self.ids:
            return False
        if self.start is not None and record["end_time"] is not None \
                and _when(record["end_time"]) < self.start:
            return False
        began = record["start_time"] or record["end_time"] or record["submit_time"]
        return self.end is None or _when(began) <= self.end


def _when(text: str) -> datetime:
    return datetime.fromisoformat(text)


class ArchiveShelf:
    """The archive directory: its files, written atomically and read back."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def prepare(self) -> None:
        """Make the directory (mode 0700) if missing; refuse one that is not a directory
        of the controller's user that no one else may write."""
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = os.stat(self.directory, follow_symlinks=False)
        except OSError as exc:
            raise ConfigError(f"controller.retention.archive_dir: cannot make "
                              f"{self.directory}: {exc.strerror}") from None
        self._check_directory(info)

    def _check_directory(self, info: os.stat_result) -> None:
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() \
                or info.st_mode & 0o022:
            raise ConfigError(f"controller.retention.archive_dir: {self.directory} must be a "
                              "directory of the controller's user that no one else may "
                              "write (mode 0700)")

    def files(self) -> list[ArchiveFile]:
        """The archives, oldest first; none while the directory does not exist."""
        try:
            info = os.stat(self.directory, follow_symlinks=False)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise ArchiveError(f"archive directory {self.directory}: {exc.strerror}") from None
        self._check_directory(info)
        found = [a for a in map(ArchiveFile.named, self.directory.iterdir()) if a is not None]
        return sorted(found, key=lambda a: a.seq)

    def latest(self) -> ArchiveFile | None:
        """The newest archive, the only one a crash can have left unfinished."""
        found = self.files()
        return found[-1] if found else None

    def remove_temporaries(self) -> int:
        """Remove what an interrupted write left (never read: not an archive's name)."""
        removed = 0
        for path in self.directory.glob(f"{_TEMPORARY}*"):
            path.unlink(missing_ok=True)
            removed += 1
        return removed

    def write(self, entries: list[dict[str, Any]]) -> ArchiveFile:
        """A new archive of ``entries``: written under a temporary name, fsynced, linked
        to the next free name (never over another file), the directory fsynced."""
        jobs = [e["job"] for e in entries]
        earliest = min(int(_when(j["start_time"] or j["end_time"] or j["submit_time"])
                           .timestamp()) for j in jobs)
        latest = max(math.ceil(_when(j["end_time"]).timestamp()) for j in jobs)
        low, high = min(j["array_job_id"] or j["id"] for j in jobs), max(j["id"] for j in jobs)
        header = _header(entries)
        while True:
            seq = max((a.seq for a in self.files()), default=0) + 1
            name = f"jobs-{seq:010d}-{earliest}-{latest}-{low}-{high}.jsonl.gz"
            temporary = self._write_temporary(name, header, entries)
            try:
                os.link(temporary, self.directory / name)
            except FileExistsError:  # another writer took the name meanwhile
                continue
            finally:
                temporary.unlink()
            _sync_directory(self.directory)
            archive = ArchiveFile.named(self.directory / name)
            assert archive is not None
            return archive

    def replace(self, archive: ArchiveFile, entries: list[dict[str, Any]]) -> None:
        """Rewrite ``archive`` with ``entries`` only, atomically under its own name (its
        name's bounds still hold); remove it when none are left."""
        if entries:
            header = _header(entries)
            os.replace(self._write_temporary(archive.path.name, header, entries), archive.path)
        else:
            archive.path.unlink()
        _sync_directory(self.directory)

    def _write_temporary(self, name: str, header: dict[str, Any],
                         entries: list[dict[str, Any]]) -> Path:
        path = self.directory / f"{_TEMPORARY}{secrets.token_hex(4)}-{name}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "wb", closefd=False) as raw, \
                    gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as packed:
                for item in (header, *entries):
                    packed.write(json.dumps(item, separators=(",", ":")).encode() + b"\n")
            os.fsync(fd)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return path

    def header(self, archive: ArchiveFile) -> dict[str, Any]:
        """The header of ``archive`` (its job ids), read alone."""
        with self._lines(archive) as lines:
            return _read_header(archive, next(lines, b""))

    def entries(self, archive: ArchiveFile) -> list[dict[str, Any]]:
        """Every entry of ``archive``; ArchiveError when it is damaged or not ours."""
        with self._lines(archive) as lines:
            header = _read_header(archive, next(lines, b""))
            try:
                found = [json.loads(line) for line in lines]
            except ValueError:
                raise ArchiveError(f"archive {archive.path.name}: damaged (bad JSON)") from None
        if len(found) != header["jobs"]:
            raise ArchiveError(f"archive {archive.path.name}: damaged ({len(found)} of "
                               f"{header['jobs']} jobs)")
        return found

    @contextmanager
    def _lines(self, archive: ArchiveFile) -> Iterator[Iterator[bytes]]:
        """The lines of ``archive``, opened only if it is a plain file of ours."""
        try:
            fd = os.open(archive.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise ArchiveError(f"archive {archive.path.name}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as raw:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                raise ArchiveError(f"archive {archive.path.name}: not a file of the "
                                   "controller's user; not read")
            with gzip.GzipFile(fileobj=raw, mode="rb") as packed:
                try:
                    yield iter(lambda: packed.readline(_MAX_LINE), b"")
                except (OSError, EOFError, zlib.error) as exc:
                    raise ArchiveError(f"archive {archive.path.name}: damaged ({exc})") from None


def _header(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """An archive's first line: its jobs' ids, and the values a reader may skip the
    file by (uids, users, accounts, states, array ids), each listed once."""
    def once(values: Any) -> list[Any]:
        return sorted(set(values), key=lambda v: (v is None, v))

    jobs, records = [e["job"] for e in entries], [e["record"] for e in entries]
    return {"format": ARCHIVE_FORMAT, "version": ARCHIVE_VERSION,
            "created": datetime.now(UTC).isoformat(), "jobs": len(entries),
            "job_ids": [j["id"] for j in jobs],
            "array_job_ids": once(j["array_job_id"] for j in jobs if j["array_job_id"]),
            "uids": once(j["uid"] for j in jobs), "users": once(r["user"] for r in records),
            "accounts": once(r["account"] for r in records),
            "states": once(r["state"] for r in records)}


def _read_header(archive: ArchiveFile, line: bytes) -> dict[str, Any]:
    try:
        header = json.loads(line)
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != ARCHIVE_FORMAT \
            or header.get("version") != ARCHIVE_VERSION or not isinstance(header.get("jobs"), int) \
            or not isinstance(header.get("job_ids"), list):
        raise ArchiveError(f"archive {archive.path.name}: not a gpusched job archive of "
                           f"version {ARCHIVE_VERSION}")
    return header


def _sync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def with_archived(shelf: ArchiveShelf, records: list[dict[str, Any]],
                  query: ArchiveQuery) -> dict[str, Any]:
    """``GET /v1/accounting``'s answer: the stored ``records`` and the archived jobs
    the query asks for (a job still stored is shown as stored), by job id; an archive
    that cannot be read is named in ``archive_errors`` and left out."""
    shown = {r["job_id"] for r in records}
    archived: list[dict[str, Any]] = []

    def take(entry: dict[str, Any]) -> None:
        record = entry["record"]
        if record["job_id"] not in shown:
            shown.add(record["job_id"])
            archived.append(record)

    errors = _read_archived(shelf, query, take)
    answer: dict[str, Any] = {"jobs": sorted([*records, *archived], key=lambda r: r["job_id"])
                              if archived else records}
    if errors:
        answer["archive_errors"] = errors
    return answer


def with_archived_usage(shelf: ArchiveShelf, rows: list[dict[str, Any]], query: ArchiveQuery,
                        stored: Callable[[list[int]], set[int]]
                        ) -> tuple[list[dict[str, Any]], list[str]]:
    """``GET /v1/accounting/report``'s rows (``db.accounting.usage_report``'s) with the
    GPU time of the archived jobs the query asks for added, each holding cut to the
    window as for stored jobs (``stored``: which of some job ids are still stored, not
    counted twice); and the archives that could not be read."""
    assert query.start is not None and query.end is not None
    start, end = query.start, query.end
    used: dict[int, tuple[str, str, float, float]] = {}
    errors = _read_archived(shelf, query, lambda entry: used.setdefault(
        entry["job"]["id"], _held_within(entry, start, end)))
    totals = {(r["account"] or "", r["user"]): [r["jobs"], r["gpu_hours"], r["billed_gpu_hours"]]
              for r in rows}
    live = stored(sorted(used)) if used else set()
    for job_id, (account, user, gpu_s, billed_s) in used.items():
        if job_id in live or gpu_s <= 0:
            continue
        row = totals.setdefault((account, user), [0, 0.0, 0.0])
        row[0] += 1
        row[1] += gpu_s / 3600
        row[2] += billed_s / 3600
    return [{"account": account or None, "user": user, "jobs": int(n), "gpu_hours": hours,
             "billed_gpu_hours": billed}
            for (account, user), (n, hours, billed) in sorted(totals.items())], errors


def _held_within(entry: dict[str, Any], start: datetime, end: datetime
                 ) -> tuple[str, str, float, float]:
    """The archived job's account, user, GPU-seconds and billed GPU-seconds within
    [start, end], as ``db.accounting`` counts a stored job's."""
    gpu_s = billed_s = 0.0
    for held in entry["allocations"]:
        begin = max(_when(held["allocated_at"]), start)
        finish = min(_when(held["released_at"]), end) if held["released_at"] else end
        seconds = max(0.0, (finish - begin).total_seconds()) * held["fraction"]
        gpu_s += seconds
        billed_s += seconds * held["weight"]
    record = entry["record"]
    return record["account"] or "", record["user"], gpu_s, billed_s


def _read_archived(shelf: ArchiveShelf, query: ArchiveQuery,
                   take: Callable[[dict[str, Any]], object]) -> list[str]:
    """Hand ``take`` every archived entry ``query`` asks for, oldest archive first; the
    archives that could not be read."""
    errors: list[str] = []
    try:
        files = [a for a in shelf.files() if query.may_hold(a)]
    except (ArchiveError, ConfigError) as exc:
        files, errors = [], [str(exc)]
    for archive in files:
        try:
            if not query.may_match(shelf.header(archive)):
                continue
            entries = shelf.entries(archive)
        except ArchiveError as exc:
            log.error("%s", exc)
            errors.append(str(exc))
            continue
        try:
            for entry in [entry for entry in entries if query.wants(entry)]:
                take(entry)
        except (KeyError, TypeError, ValueError, AttributeError):
            errors.append(f"archive {archive.path.name}: damaged (an entry lacks a field)")
            log.error("%s", errors[-1])
    return errors


@dataclass(frozen=True)
class Purged:
    """What one run of the purge did."""

    jobs: int = 0
    scripts: int = 0
    archives: tuple[str, ...] = ()
    finished: int = 0  # jobs of an interrupted batch deleted first


class RetentionJob:
    """The leader's periodic purge (``[controller.retention]``)."""

    def __init__(self, sessions: sessionmaker[Session], settings: RetentionConfig,
                 leadership: Leadership) -> None:
        assert settings.purge_after is not None
        self.sessions = sessions
        self.settings = settings
        self.leadership = leadership
        self.shelf = ArchiveShelf(settings.archive_dir)

    def run(self) -> None:
        """One run, on the leader only (APScheduler's job)."""
        if not self.leadership.is_held:
            return
        try:
            purged = self.purge(datetime.now(UTC))
        except NotLeader as exc:
            log.warning("job purge refused: %s; stepping down", exc)
            self.leadership.release()
            return
        except (ArchiveError, ConfigError) as exc:  # nothing is purged until it is seen to
            log.error("job purge stopped: %s", exc)
            return
        except Exception:
            log.exception("job purge failed; the next run finishes its batch first")
            return
        if purged.jobs or purged.finished:
            log.info("purged %d jobs (%d scripts) ended before %s; archives: %s",
                     purged.jobs + purged.finished, purged.scripts,
                     self.horizon(datetime.now(UTC)).isoformat(),
                     ", ".join(purged.archives) or "none")

    def horizon(self, now: datetime) -> datetime:
        """Jobs that ended before this may be purged."""
        assert self.settings.purge_after is not None
        return now - timedelta(seconds=self.settings.purge_after)

    def purge(self, now: datetime) -> Purged:
        """Finish an interrupted batch, then purge in batches until none is left."""
        horizon = self.horizon(now)
        finished = 0
        if self.settings.archive:
            self.shelf.prepare()
            self.shelf.remove_temporaries()
            finished = self.finish_interrupted(horizon)
        jobs = scripts = 0
        archives: list[str] = []
        while True:
            deleted, gone, archive = self.purge_batch(horizon)
            jobs, scripts = jobs + deleted, scripts + gone
            if archive is not None:
                archives.append(archive.path.name)
            if deleted < self.settings.batch_size:
                return Purged(jobs, scripts, tuple(archives), finished)

    def purge_batch(self, horizon: datetime) -> tuple[int, int, ArchiveFile | None]:
        """One batch in one transaction: lock, archive (when archiving), delete."""
        with self.sessions() as session, session.begin():
            ids = lock_purgeable(session, horizon, self.settings.batch_size)
            if not ids:
                return 0, 0, None
            archive = self.shelf.write(archive_entries(session, ids)) \
                if self.settings.archive else None
            self.leadership.hold_epoch(session)
            deleted, scripts = delete_jobs(session, ids)
        return deleted, scripts, archive

    def finish_interrupted(self, horizon: datetime) -> int:
        """Delete the jobs of the newest archive that are still stored (a crash between
        its write and its commit), those that may no longer go taken out of the file
        first; the jobs deleted."""
        archive = self.shelf.latest()
        if archive is None:
            return 0
        ids: Sequence[int] = self.shelf.header(archive)["job_ids"]
        with self.sessions() as session, session.begin():
            still = present(session, ids)
            if not still:
                return 0
            going = set(lock_purgeable(session, horizon, len(still), sorted(still)))
            if still - going:
                self.shelf.replace(archive, [e for e in self.shelf.entries(archive)
                                             if e["job"]["id"] not in still - going])
            self.leadership.hold_epoch(session)
            deleted, _ = delete_jobs(session, sorted(going))
        log.warning("archive %s was written but its jobs not deleted: %d deleted now, %d "
                    "taken out of it (no longer purgeable)", archive.path.name, deleted,
                    len(still - going))
        return deleted
