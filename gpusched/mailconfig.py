"""The ``[mail]`` settings of gpusched.toml: how the leader controller sends mail about
jobs (gpusched.controller.mail sends it). Read with the rest of the configuration."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpusched.core.mail import (
    MailError,
    check_mail_domain,
    check_mail_user,
    header_safe,
)

if TYPE_CHECKING:
    from gpusched.configfile import TableReader

METHODS = ("off", "smtp", "sendmail")


@dataclass(frozen=True)
class MailConfig:
    """The ``[mail]`` table: how mail leaves (``method``: off, smtp or sendmail), from
    whom, the domain bare user names get (Slurm's MailDomain), and the periodic job's
    pace and retries."""

    method: str = "off"
    sender: str = "gpusched"  # the From: address ("from" in the file)
    domain: str | None = None
    smtp_host: str = "localhost"
    smtp_port: int = 25
    smtp_starttls: bool = False
    smtp_user: str | None = None
    smtp_password_file: Path | None = None
    smtp_timeout: float = 10.0
    sendmail: Path = Path("/usr/sbin/sendmail")
    interval: float = 10.0  # seconds between two rounds
    batch: int = 100  # mails sent in one round at most
    max_attempts: int = 5
    retry_after: float = 60.0  # seconds before the second attempt (doubling after)
    max_age: float = 86_400.0  # seconds after a job's end when its mail is no news


def _bounded(r: TableReader, key: str, default: float, low: float, high: float,
             what: str) -> float:
    expected = f"{what} from {low:g} to {high:g}"
    value = r.get(key, float, default, expected)
    if not low <= value <= high:  # NaN fails too
        raise r.fail(key, expected)
    return float(value)


def _whole(r: TableReader, key: str, default: int, low: int, high: int, what: str) -> int:
    expected = f"a whole number of {what} from {low} to {high}"
    value = r.get(key, int, default, expected)
    if not low <= value <= high:
        raise r.fail(key, expected)
    return int(value)


def _checked(r: TableReader, key: str, default: str | None, check: Callable[[str], str],
             expected: str) -> str | None:
    value = r.get(key, str, default, expected)
    if value is None:
        return None
    try:
        return check(value)
    except MailError:
        raise r.fail(key, expected) from None


def _path(r: TableReader, key: str, default: Path | None) -> Path | None:
    value = r.get(key, str, None if default is None else str(default), "an absolute path")
    if value is None:
        return None
    if not value.startswith("/") or not value.isprintable() or len(value) > 1024:
        raise r.fail(key, "an absolute path")
    return Path(value)


def parse_mail(r: TableReader) -> MailConfig:
    """Validate the ``[mail]`` table into a MailConfig."""
    r.check_keys({"method", "from", "domain", "smtp_host", "smtp_port", "smtp_starttls",
                  "smtp_user", "smtp_password_file", "smtp_timeout", "sendmail", "interval",
                  "batch", "max_attempts", "retry_after", "max_age"})
    d = MailConfig()
    method = r.get("method", str, d.method, "one of 'off', 'smtp', 'sendmail'")
    if method not in METHODS:
        raise r.fail("method", "one of 'off', 'smtp', 'sendmail'")
    host = _checked(r, "smtp_host", d.smtp_host, check_mail_domain,
                    "a host name such as mail.example.org")
    user = r.get("smtp_user", str, None, "a user name of 1 to 256 printable characters")
    if user is not None and not (0 < len(user) <= 256 and header_safe(user)):
        raise r.fail("smtp_user", "a user name of 1 to 256 printable characters")
    password = _path(r, "smtp_password_file", None)
    if (user is None) != (password is None):
        raise r.fail("smtp_user" if user is None else "smtp_password_file",
                     "smtp_user and smtp_password_file together, or neither")
    return MailConfig(
        method=method,
        sender=_checked(r, "from", d.sender, check_mail_user,
                        "a user name or one mail address") or d.sender,
        domain=_checked(r, "domain", None, check_mail_domain,
                        "a domain name such as example.org"),
        smtp_host=host or d.smtp_host,
        smtp_port=_whole(r, "smtp_port", d.smtp_port, 1, 65535, "a TCP port"),
        smtp_starttls=r.get("smtp_starttls", bool, d.smtp_starttls, "true or false"),
        smtp_user=user,
        smtp_password_file=password,
        smtp_timeout=_bounded(r, "smtp_timeout", d.smtp_timeout, 1, 300, "seconds"),
        sendmail=_path(r, "sendmail", d.sendmail) or d.sendmail,
        interval=_bounded(r, "interval", d.interval, 0.2, 3600, "seconds"),
        batch=_whole(r, "batch", d.batch, 1, 10_000, "mails"),
        max_attempts=_whole(r, "max_attempts", d.max_attempts, 1, 100, "attempts"),
        retry_after=_bounded(r, "retry_after", d.retry_after, 1, 86_400, "seconds"),
        max_age=_bounded(r, "max_age", d.max_age, 60, 365 * 86_400, "seconds"),
    )
