"""Mail about jobs, sent by the leader controller: the two ways
out (an SMTP server, or the local ``sendmail`` program) and the periodic job.

The periodic job runs on APScheduler's threads, apart from the scheduling loop and the
API: each round it records the events due for the jobs it watches (gpusched.core.mail
decides which, gpusched.db.mail records them, once per job, run and event), then
claims and sends a batch of recorded mails. The database holds every step, so a
controller that takes over carries on where the last one stopped. A mail that cannot
be sent is tried again later, a bounded number of times; failures are logged at most
once a period per kind, and never stop the round or the controller.

The settings are gpusched.mailconfig's (read with the configuration, which the agent
and the CLIs read too).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpusched.core.mail import (
    due_mail,
    header_safe,
    recipient,
)
from gpusched.errors import ConfigError
from gpusched.mailconfig import MailConfig as MailConfig
from gpusched.mailconfig import parse_mail as parse_mail

if TYPE_CHECKING:
    from email.message import EmailMessage

    from sqlalchemy.orm import Session, sessionmaker

    from gpusched.db.mail import Claimed

log = logging.getLogger(__name__)
PAGE = 500  # watched jobs read in one transaction
LOG_EVERY = 300.0  # seconds between two log lines about one kind of failure
MAX_RETRY_DELAY = 6 * 3600.0  # seconds: the longest wait between two attempts
MAX_PASSWORD_BYTES = 1024


class SendError(Exception):
    """A mail was not sent; ``kind`` groups failures for the log, ``final`` is true
    when trying again cannot help (a recipient refused, a header that is not safe),
    ``connection`` when none of the batch's other mails can go either."""

    def __init__(self, kind: str, message: str, final: bool = False,
                 connection: bool = False) -> None:
        super().__init__(message)
        self.kind, self.final, self.connection = kind, final, connection


def compose(config: MailConfig, to: str, subject: str, body: str) -> EmailMessage:
    """The message, every header value checked to be one printable line."""
    from email.message import EmailMessage
    from email.policy import default
    from email.utils import formatdate

    sender = recipient(config.sender, config.domain)
    for name, value in (("To", to), ("From", sender), ("Subject", subject)):
        if not header_safe(value):
            raise SendError("header", f"{name}: not one printable line", final=True)
    # Headers as long as RFC 5322 allows (998): a subject stays one line, as Slurm's.
    message = EmailMessage(policy=default.clone(max_line_length=998))
    message["From"] = sender
    message["To"] = to
    message["Subject"] = subject
    message["Date"] = formatdate(localtime=True)
    message["Auto-Submitted"] = "auto-generated"
    message.set_content(body)
    return message


class Transport:
    """One round's way out: an SMTP connection opened at the first mail, or sendmail."""

    def __init__(self, config: MailConfig, password: str | None) -> None:
        self.config, self.password = config, password
        self.smtp: Any = None

    def send(self, message: EmailMessage, to: str) -> None:
        """Send one message to one recipient, or raise SendError."""
        if self.config.method == "sendmail":
            self._sendmail(message, to)
        else:
            self._smtp(message, to)

    def _sendmail(self, message: EmailMessage, to: str) -> None:
        import subprocess

        sender = recipient(self.config.sender, self.config.domain)
        # The recipient follows "--": never an option, whatever it looks like.
        command = [str(self.config.sendmail), "-oi", "-f", sender, "--", to]
        try:
            done = subprocess.run(command, input=message.as_bytes(), capture_output=True,
                                  timeout=self.config.smtp_timeout, check=False,
                                  env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        except (OSError, subprocess.SubprocessError) as exc:
            raise SendError("sendmail", f"{command[0]}: {exc}", connection=True) from None
        if done.returncode != 0:
            said = done.stderr.decode("utf-8", "replace").strip().splitlines()
            raise SendError("sendmail", f"{command[0]} exited with status {done.returncode}"
                            + (f": {said[-1][:200]}" if said else ""))

    def _smtp(self, message: EmailMessage, to: str) -> None:
        import smtplib

        where = f"{self.config.smtp_host}:{self.config.smtp_port}"
        if self.smtp is None:
            try:
                self.smtp = self._connect()
            except (smtplib.SMTPException, OSError) as exc:  # refused, TLS, login
                raise SendError("smtp", f"{where}: {exc}", connection=True) from None
        try:
            self.smtp.send_message(message, from_addr=recipient(self.config.sender,
                                                                self.config.domain),
                                   to_addrs=[to])
        except smtplib.SMTPRecipientsRefused as exc:
            raise SendError("refused", f"recipient refused: {exc.recipients}",
                            final=True) from None
        except (smtplib.SMTPServerDisconnected, smtplib.SMTPConnectError,
                smtplib.SMTPAuthenticationError, OSError) as exc:
            self.close()
            raise SendError("smtp", f"{where}: {exc}", connection=True) from None
        except smtplib.SMTPException as exc:
            raise SendError("smtp", f"{where}: {exc}") from None

    def _connect(self) -> Any:
        import smtplib
        import ssl

        c = self.config
        smtp = smtplib.SMTP(c.smtp_host, c.smtp_port, timeout=c.smtp_timeout)
        try:
            if c.smtp_starttls:
                smtp.starttls(context=ssl.create_default_context())
            if c.smtp_user is not None and self.password is not None:
                smtp.login(c.smtp_user, self.password)
        except BaseException:
            smtp.close()
            raise
        return smtp

    def close(self) -> None:
        """End the SMTP session, if one is open."""
        smtp, self.smtp = self.smtp, None
        if smtp is not None:
            try:
                smtp.quit()
            except Exception:  # the server went away first: nothing to end
                smtp.close()


def read_password(path: Path | None) -> str | None:
    """The SMTP password: the first line of its file (at most 1 KiB)."""
    if path is None:
        return None
    try:
        data = path.read_bytes()[:MAX_PASSWORD_BYTES + 1]
    except OSError as exc:
        raise ConfigError(f"mail.smtp_password_file: cannot read {path}: "
                          f"{exc.strerror}") from None
    if len(data) > MAX_PASSWORD_BYTES:
        raise ConfigError(f"mail.smtp_password_file: {path}: more than "
                          f"{MAX_PASSWORD_BYTES} bytes")
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[0] if lines else ""


class ThrottledLog:
    """Logs a failure of each kind at most once per LOG_EVERY seconds, saying how many
    were not logged since."""

    def __init__(self, every: float = LOG_EVERY, logger: logging.Logger = log) -> None:
        self.every = every
        self.log = logger
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def warning(self, kind: str, message: str) -> bool:
        """Log ``message`` unless one of ``kind`` was logged lately; whether it was."""
        now = time.monotonic()
        last = self._last.get(kind)
        if last is not None and now - last < self.every:
            self._quiet[kind] = self._quiet.get(kind, 0) + 1
            return False
        quiet = self._quiet.pop(kind, 0)
        self._last[kind] = now
        self.log.warning("%s%s", message, f" ({quiet} more like it not logged)" if quiet else "")
        return True


class MailJob:
    """The leader's periodic mail round (see the module's docstring)."""

    def __init__(self, config: MailConfig, sessions: sessionmaker[Session],
                 is_leader: Callable[[], bool]) -> None:
        self.config, self.sessions, self.is_leader = config, sessions, is_leader
        self.password = read_password(config.smtp_password_file)
        self.failures = ThrottledLog()
        self.recorded = self.sent = self.failed = 0  # since the start, for logs and tests
        # A round that outlasts the interval (a slow mail server) makes the next one
        # return at once, rather than APScheduler logging each skipped run.
        self._round = threading.Lock()

    def run(self) -> None:
        """One round, on the leader only; nothing it meets escapes it."""
        if not self.is_leader() or not self._round.acquire(blocking=False):
            return
        try:
            self.record_due(datetime.now(UTC))
            self.send_due()
        except Exception as exc:  # the database went away, a bug: the next round retries
            self.failures.warning("round", f"mail round failed: {exc!r}; trying again in "
                                  f"{self.config.interval:g} s")
        finally:
            self._round.release()

    def record_due(self, now: datetime) -> int:
        """Record the mails due for every watched job, a page per transaction; how many."""
        from gpusched.db import mail as db

        recorded, after = 0, 0
        while True:
            with self.sessions() as session, session.begin():
                jobs = db.watched_jobs(session, after, PAGE)
                if not jobs:
                    break
                sent = db.sent_keys(session, [r.job_id for j in jobs for r in j.runs]
                                    + [j.job_id for j in jobs])
                mails, done = [], []
                for job in jobs:
                    due, finished = due_mail(job, sent, now, self.config.max_age)
                    mails.extend(due)
                    if finished:
                        done.append(job.job_id)
                recorded += db.record_mail(session, mails, done)
                after = db.last_watched(jobs)
            if len(jobs) < PAGE:
                break
        self.recorded += recorded
        return recorded

    def send_due(self) -> int:
        """Claim a batch of recorded mails and send them; how many went out."""
        from gpusched.db import mail as db

        with self.sessions() as session, session.begin():
            claimed = db.claim_due(session, self.config.batch)
        if not claimed:
            return 0
        outcomes = self._send(claimed)
        sent = 0
        with self.sessions() as session, session.begin():
            for mail, error in outcomes:
                if error is None:
                    db.mark_sent(session, mail)
                    sent += 1
                    continue
                most = mail.attempt if error.final else self.config.max_attempts
                delay = min(self.config.retry_after * 2 ** (mail.attempt - 1), MAX_RETRY_DELAY)
                state = db.mark_failed(session, mail, str(error), most, delay)
                self.failed += 1
                self.failures.warning(error.kind, (
                    f"mail about job {mail.job_id} ({mail.event}) to {mail.recipient!r} "
                    f"not sent, attempt {mail.attempt}: {error}; "
                    + ("given up" if state == "failed" else f"trying again in {delay:g} s")))
        self.sent += sent
        return sent

    def _send(self, claimed: list[Claimed]) -> list[tuple[Claimed, SendError | None]]:
        """Send each claimed mail; once the way out is down, the rest wait for a retry."""
        transport = Transport(self.config, self.password)
        outcomes: list[tuple[Claimed, SendError | None]] = []
        down: SendError | None = None
        try:
            for mail in claimed:
                if down is not None:
                    outcomes.append((mail, down))
                    continue
                try:
                    to = recipient(mail.recipient, self.config.domain)
                    transport.send(compose(self.config, to, mail.subject, mail.body), to)
                    outcomes.append((mail, None))
                except SendError as exc:
                    outcomes.append((mail, exc))
                    down = exc if exc.connection else None
                except Exception as exc:  # a message the email package refused to build
                    outcomes.append((mail, SendError("message", repr(exc), final=True)))
        finally:
            transport.close()
        return outcomes
