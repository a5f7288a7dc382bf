"""Licenses (sbatch's -L) in the database: the cluster's counts (``licenses``, written by
``gpusched admin apply``), the check of a submission against them, and what running
jobs hold (``gcontrol show licenses``)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpusched.core.licenses import (
    Licenses,
    LicenseUse,
    license_use,
    refusal,
    stored_licenses,
)
from gpusched.db.models import Job, License
from gpusched.errors import UsageError


def license_totals(session: Session) -> dict[str, int]:
    """Every license the admin configuration declares, with its count."""
    return {name: count for name, count in session.execute(select(License.name, License.count))}


def check_licenses(session: Session, asked: Licenses) -> None:
    """Refuse a job asking for a license the cluster lacks, or more than it has."""
    if not asked:
        return
    why = refusal(asked, license_totals(session))
    if why is not None:
        raise UsageError(why)


class _Held:
    """A running job's licenses, as core/licenses.py reads them."""

    __slots__ = ("licenses",)

    def __init__(self, licenses: Licenses) -> None:
        self.licenses = licenses


def license_usage(session: Session) -> list[LicenseUse]:
    """Each license with its total and what running jobs hold of it now."""
    held = session.scalars(select(Job.licenses).where(
        Job.state == "RUNNING", Job.licenses.is_not(None))).all()
    return license_use(license_totals(session),
                       [_Held(stored_licenses(text)) for text in held])
