"""Licenses (sbatch's ``-L/--licenses name[:N][,name[:N]...]``): cluster-wide counts of
something jobs use besides GPUs (a floating software licence, a database connection
pool). A job asking for licenses starts only while the running jobs leave enough of
each free; else it waits with reason ``Licenses``.

A job held for its licenses blocks nobody and gets no reservation (no expected start):
running jobs hold licenses until they end, and the pass does not plan licenses over
time, so a job behind it that asks for fewer, or for other licenses, may start first.
A job whose licenses are free but that waits for GPUs and gets a reservation keeps its
licenses against the jobs after it in the pass (``LimitTracker.reserved``): backfill
never takes a license the reservation will need, so the reservation's start is one the
licenses allow too (as Slurm's backfill does with ``bf_licenses``). Jobs waiting for
GPUs beyond the reservation depth keep nothing.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpusched.errors import UsageError

MAX_LICENSE_NAME = 64  # characters of one license's name
MAX_LICENSE_COUNT = 1_000_000  # of one license, in a job's request or the cluster's total
MAX_JOB_LICENSES = 32  # different licenses one job may ask for
MAX_LICENSES_TEXT = 4096  # characters of a -L value
MAX_CLUSTER_LICENSES = 1024  # licenses the admin configuration may declare
# A name as Slurm writes them, with its ``name@server`` form for remote licenses.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,%d}" % (MAX_LICENSE_NAME - 1))
_COUNT = re.compile(r"[0-9]{1,8}")

# A job's licenses: (name, count) pairs sorted by name, each name once.
Licenses = tuple[tuple[str, int], ...]


class LicenseError(UsageError):
    """A -L value that cannot be taken."""


class HoldsLicenses(Protocol):
    """A job as this module sees it: the licenses it holds or asks for."""

    @property
    def licenses(self) -> Licenses: ...


def valid_name(name: str) -> bool:
    """Whether ``name`` may name a license."""
    return _NAME.fullmatch(name) is not None


def parse_licenses(text: str) -> Licenses:
    """A -L value, ``name[:N][,name[:N]...]`` (N defaults to 1), as sorted pairs.

    Slurm's ``|`` ("any one of these") is refused: a job here names the licenses it
    needs. An empty item (a trailing comma) is skipped, as sbatch does.
    """
    if len(text) > MAX_LICENSES_TEXT:
        raise LicenseError(f"--licenses: longer than {MAX_LICENSES_TEXT} characters")
    if "|" in text:
        raise LicenseError(f"--licenses {text[:80]!r}: '|' (any one of several licenses) is "
                           "not supported: name the licenses the job needs, joined by ','")
    found: dict[str, int] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, count_text = item.partition(":")
        if not valid_name(name):
            raise LicenseError(f"--licenses: {name[:80]!r} is not a license name (letters, "
                               f"digits, '_', '.', '@', '+', '-', at most {MAX_LICENSE_NAME})")
        count = 1
        if sep:
            if _COUNT.fullmatch(count_text) is None or not 1 <= int(count_text) <= MAX_LICENSE_COUNT:
                raise LicenseError(f"--licenses: {item[:80]!r}: the count must be a whole "
                                   f"number from 1 to {MAX_LICENSE_COUNT}")
            count = int(count_text)
        if name in found:
            raise LicenseError(f"--licenses: {name!r} is named twice")
        found[name] = count
    if not found:
        raise LicenseError("--licenses: expected name[:N][,name[:N]...]")
    if len(found) > MAX_JOB_LICENSES:
        raise LicenseError(f"--licenses: more than {MAX_JOB_LICENSES} different licenses")
    return tuple(sorted(found.items()))


def format_licenses(licenses: Licenses) -> str:
    """The canonical text of a job's licenses (``ansys:2,matlab:1``; "" for none)."""
    return ",".join(f"{name}:{count}" for name, count in licenses)


def stored_licenses(text: str | None) -> Licenses:
    """A job's licenses from their stored canonical text (None or "": none)."""
    return parse_licenses(text) if text else ()


def refusal(asked: Licenses, totals: Mapping[str, int]) -> str | None:
    """Why a job asking for ``asked`` can never start on a cluster with ``totals``: the
    first license it names that the cluster lacks or has fewer of; None if none."""
    for name, count in asked:
        total = totals.get(name)
        if total is None:
            known = ", ".join(sorted(totals)[:10]) or "none"
            return f"--licenses: the cluster has no license {name!r} (it has: {known})"
        if count > total:
            return (f"--licenses: {name}:{count} asks for more than the cluster's {total} "
                    f"{name} license{'s' if total != 1 else ''}")
    return None


class LicenseTracker:
    """The licenses running jobs hold, updated as a pass starts jobs."""

    def __init__(self, totals: Mapping[str, int], running: Iterable[HoldsLicenses]) -> None:
        self.totals = totals
        self.used: Counter[str] = Counter()
        for job in running:
            self.take(job.licenses)

    def free(self, name: str) -> int:
        """How many of license ``name`` no running job holds (0 for one not declared)."""
        return max(0, self.totals.get(name, 0) - self.used[name])

    def fits(self, asked: Licenses) -> bool:
        """Whether every license of ``asked`` is free in its count now."""
        return all(self.free(name) >= count for name, count in asked)

    def take(self, asked: Licenses) -> None:
        """Count the licenses of a job that runs (or starts in this pass)."""
        for name, count in asked:
            self.used[name] += count


@dataclass(frozen=True, slots=True)
class LicenseUse:
    """One license of the cluster: its total, how many running jobs hold, how many
    are free (never below 0: a total lowered under what jobs hold shows 0 free)."""

    name: str
    total: int
    used: int

    @property
    def free(self) -> int:
        """What no running job holds."""
        return max(0, self.total - self.used)


def license_use(totals: Mapping[str, int], running: Iterable[HoldsLicenses]) -> list[LicenseUse]:
    """Every declared license, by name, with what running jobs hold of it."""
    tracker = LicenseTracker(totals, running)
    return [LicenseUse(name, totals[name], tracker.used[name]) for name in sorted(totals)]


def license_detail(asked: Licenses, totals: Mapping[str, int],
                   running: Sequence[HoldsLicenses]) -> str:
    """Why a job waits for its licenses, in words: each one short, with its use."""
    tracker = LicenseTracker(totals, running)
    short = [f"{name}:{count} ({tracker.free(name)} of {totals.get(name, 0)} free)"
             for name, count in asked if tracker.free(name) < count]
    if not short:  # free beside running jobs: kept for jobs ahead of it in this pass
        return (f"its licenses {format_licenses(asked)} are free now, but jobs ahead of it "
                "start with them or keep them for their reservations")
    return ("its licenses are not free: " + ", ".join(short)
            + "; it starts when running jobs holding them end")
