"""Mail about jobs, in the database: a job's mail settings, the jobs the mail job still
watches, and the outbox of mail events (``mail_events``).

Each event is a row keyed by (job, run, event), inserted (ON CONFLICT DO NOTHING)
before anything is sent: a controller that takes over finds what was recorded and
records nothing twice. A row is claimed (``queued`` -> ``sending``, one attempt more)
in a transaction of its own before it is sent, so that no two controllers send it; a
controller that dies while sending leaves it ``sending``, never sent again (at most
once), and a failure to send puts it back ``queued`` for a later attempt, or ``failed``
after the last one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.orm import Session

from gpusched.core.mail import Mail, Run, Watched

# The jobs still watched, a page of them after ``after`` in id order.
_WATCHED = text(
    "SELECT id, name, user_name, mail_types, mail_user, array_job_id IS NOT NULL"
    " FROM jobs WHERE mail_types IS NOT NULL AND mail_done_at IS NULL AND id > :after"
    " ORDER BY id LIMIT :limit")
# Their rows: each plain job, and every row of each array (its record and its tasks).
_ROWS = text(
    "SELECT COALESCE(array_job_id, id), id, state, reason, restarts, submit_time,"
    " start_time, end_time, time_limit, exit_code, array_job_id, array_task_id"
    " FROM jobs WHERE id = ANY(CAST(:plain AS bigint[]))"
    " OR array_job_id = ANY(CAST(:arrays AS bigint[])) ORDER BY id")
_SENT = text("SELECT job_id, run, event FROM mail_events"
             " WHERE job_id = ANY(CAST(:ids AS bigint[]))")
_RECORD = text(
    "INSERT INTO mail_events (job_id, run, event, recipient, subject, body)"
    " SELECT * FROM unnest(CAST(:jobs AS bigint[]), CAST(:runs AS integer[]),"
    " CAST(:events AS text[]), CAST(:tos AS text[]), CAST(:subjects AS text[]),"
    " CAST(:bodies AS text[]))"
    " ON CONFLICT DO NOTHING RETURNING job_id, run, event")
_DONE = text("UPDATE jobs SET mail_done_at = now()"
             " WHERE id = ANY(CAST(:ids AS bigint[])) AND mail_done_at IS NULL")
_CLAIM = text(
    "UPDATE mail_events AS m SET state = 'sending', attempts = m.attempts + 1"
    " FROM (SELECT job_id, run, event FROM mail_events WHERE state = 'queued'"
    "  AND next_attempt_at <= now() ORDER BY next_attempt_at LIMIT :limit"
    "  FOR UPDATE SKIP LOCKED) AS due"
    " WHERE (m.job_id, m.run, m.event) = (due.job_id, due.run, due.event)"
    " RETURNING m.job_id, m.run, m.event, m.recipient, m.subject, m.body, m.attempts")
_SENT_OK = text(
    "UPDATE mail_events SET state = 'sent', sent_at = now(), error = NULL"
    " WHERE job_id = :job AND run = :run AND event = :event AND state = 'sending'")
_SEND_FAILED = text(
    "UPDATE mail_events SET state = CASE WHEN attempts >= :most THEN 'failed'"
    " ELSE 'queued' END, error = :error,"
    " next_attempt_at = now() + CAST(:delay AS double precision) * interval '1 second'"
    " WHERE job_id = :job AND run = :run AND event = :event AND state = 'sending'"
    " RETURNING state")
MAX_ERROR = 500  # characters of a send error kept


def watched_jobs(session: Session, after: int, limit: int) -> list[Watched]:
    """Up to ``limit`` jobs whose mail is still watched, of ids above ``after``, each
    with its rows (an array's: every task started and its record)."""
    heads = session.execute(_WATCHED, {"after": after, "limit": limit}).all()
    if not heads:
        return []
    plain = [h[0] for h in heads if not h[5]]
    arrays = [h[0] for h in heads if h[5]]
    runs: dict[int, list[Run]] = {}
    for watch, *row in session.execute(_ROWS, {"plain": plain, "arrays": arrays}):
        runs.setdefault(watch, []).append(Run(*row))
    return [Watched(job_id=h[0], name=h[1], user_name=h[2], mail_types=tuple(h[3]),
                    mail_user=h[4], runs=tuple(runs.get(h[0], ())), is_array=bool(h[5]))
            for h in heads]


def sent_keys(session: Session, job_ids: Sequence[int]) -> set[tuple[int, int, str]]:
    """The (job, run, event) keys recorded for these jobs, whatever their state."""
    rows = session.execute(_SENT, {"ids": list(job_ids)})
    return {(int(job), int(run), str(event)) for job, run, event in rows}


def record_mail(session: Session, mails: Sequence[Mail], done: Sequence[int]) -> int:
    """Record ``mails`` (those already recorded are left as they are) and mark the jobs
    ``done`` as no longer watched; how many were recorded now."""
    recorded = 0
    if mails:
        recorded = len(session.execute(_RECORD, {
            "jobs": [m.job_id for m in mails], "runs": [m.run for m in mails],
            "events": [m.event for m in mails], "tos": [m.to for m in mails],
            "subjects": [m.subject for m in mails], "bodies": [m.body for m in mails],
        }).all())
    if done:
        session.execute(_DONE, {"ids": list(done)})
    return recorded


@dataclass(frozen=True)
class Claimed:
    """A mail claimed for sending: its key, recipient (as stored), text and attempt."""

    job_id: int
    run: int
    event: str
    recipient: str
    subject: str
    body: str
    attempt: int


def claim_due(session: Session, limit: int) -> list[Claimed]:
    """Claim up to ``limit`` queued mails whose time has come (``sending``, one attempt
    more); none that another controller holds."""
    return [Claimed(*row) for row in session.execute(_CLAIM, {"limit": limit})]


def mark_sent(session: Session, mail: Claimed) -> None:
    """A claimed mail went out."""
    session.execute(_SENT_OK, {"job": mail.job_id, "run": mail.run, "event": mail.event})


def mark_failed(session: Session, mail: Claimed, error: str, most: int,
                retry_after: float) -> str | None:
    """A claimed mail could not be sent: queued again ``retry_after`` seconds on, or
    ``failed`` after ``most`` attempts; its new state."""
    row = session.execute(_SEND_FAILED, {
        "job": mail.job_id, "run": mail.run, "event": mail.event, "most": most,
        "error": error[:MAX_ERROR], "delay": retry_after}).first()
    return None if row is None else str(row[0])


def mail_events(session: Session, job_id: int) -> list[dict[str, object]]:
    """Every mail recorded for a job, oldest first (for tests and admins)."""
    rows = session.execute(text(
        "SELECT run, event, recipient, subject, state, attempts, sent_at, error"
        " FROM mail_events WHERE job_id = :id ORDER BY created_at, run, event"), {"id": job_id})
    return [dict(row._mapping) for row in rows]


def last_watched(jobs: Sequence[Watched]) -> int:
    """The id a next page of watched jobs starts after."""
    return max((j.job_id for j in jobs), default=0)

