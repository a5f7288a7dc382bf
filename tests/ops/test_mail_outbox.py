"""The mail job against a real PostgreSQL: two controllers' rounds at once record and
send each mail once; a controller that dies while sending leaves the mail unsent rather
than sent twice; a server that is down costs bounded retries and one log line; and the
[mail] settings are checked at load."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import parse_config
from gpusched.controller.mail import MailConfig, MailJob
from gpusched.db import mail as db
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.errors import ConfigError
from tests.ops.test_mail_e2e import SmtpSink


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(db_url)
    made = make_sessionmaker(engine)
    with made() as session, session.begin():
        session.execute(text("INSERT INTO partitions (name) VALUES ('gpu')"))
    yield made
    engine.dispose()


@pytest.fixture
def sink() -> Iterator[SmtpSink]:
    server = SmtpSink()
    yield server
    server.close()


def ended_jobs(sessions: sessionmaker[Session], count: int, types: list[str] | None = None
               ) -> list[int]:
    """``count`` jobs that ran and completed, asking for BEGIN and END mail."""
    now = datetime.now(UTC)
    with sessions() as session, session.begin():
        script = session.execute(text(
            "INSERT INTO job_scripts (script) VALUES ('#!/bin/sh') RETURNING id")).scalar_one()
        return list(session.execute(text(
            "INSERT INTO jobs (name, uid, gid, user_name, partition, work_dir, script_id, state,"
            " submit_time, start_time, end_time, exit_code, mail_types, mail_user)"
            " SELECT 'j' || n, 0, 0, 'root', 'gpu', '/tmp', :script, 'COMPLETED', :t0, :t1,"
            " :t2, 0, CAST(:types AS text[]), 'ada@example.org' FROM generate_series(1, :n) AS n"
            " RETURNING id"), {"script": script, "n": count, "types": types or ["BEGIN", "END"],
                               "t0": now - timedelta(seconds=9), "t1": now - timedelta(seconds=5),
                               "t2": now}).scalars())


def mail_job(sessions: sessionmaker[Session], **settings: Any) -> MailJob:
    return MailJob(MailConfig(**{"method": "smtp", "smtp_host": "127.0.0.1", "interval": 1,
                                 **settings}), sessions, lambda: True)


def rows(sessions: sessionmaker[Session]) -> list[tuple[Any, ...]]:
    with sessions() as session:
        return [tuple(r) for r in session.execute(text(
            "SELECT job_id, run, event, state, attempts FROM mail_events"
            " ORDER BY job_id, event"))]


def together(*calls: Callable[[], object]) -> list[object]:
    """Run ``calls`` in threads released at once; their results."""
    gate = threading.Barrier(len(calls))
    results: list[object] = [None] * len(calls)

    def go(i: int) -> None:
        gate.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_two_controllers_record_and_send_each_mail_once(
        sessions: sessionmaker[Session], sink: SmtpSink) -> None:
    jobs = ended_jobs(sessions, 40)
    first, second = (mail_job(sessions, smtp_port=sink.port, batch=30) for _ in range(2))
    now = datetime.now(UTC)
    recorded = together(lambda: first.record_due(now), lambda: second.record_due(now))
    assert sum(recorded) == 80  # type: ignore[arg-type]
    assert len(rows(sessions)) == 80
    with sessions() as session:
        assert session.execute(text("SELECT count(*) FROM jobs WHERE mail_done_at IS NULL")
                               ).scalar_one() == 0
    assert first.record_due(now) == 0  # nothing left to watch
    while sum(together(first.send_due, second.send_due)):  # type: ignore[arg-type]
        pass
    subjects = [str(m["Subject"]) for _, _, m in sink.messages()]
    assert len(subjects) == 80 and len(set(subjects)) == 80
    assert {s.split(" Name=")[0] for s in subjects} == {f"gpusched Job_id={j}" for j in jobs}
    assert {state for *_, state, _ in rows(sessions)} == {"sent"}


def test_a_mail_claimed_by_a_controller_that_died_is_never_sent(
        sessions: sessionmaker[Session], sink: SmtpSink) -> None:
    (job,) = ended_jobs(sessions, 1)
    survivor = mail_job(sessions, smtp_port=sink.port)
    survivor.record_due(datetime.now(UTC))
    with sessions() as session, session.begin():  # a controller claims both, then dies
        claimed = db.claim_due(session, 1)
    assert [(c.job_id, c.attempt) for c in claimed] == [(job, 1)]
    assert survivor.send_due() == 1  # the other one
    assert survivor.send_due() == 0
    assert [str(m["Subject"]).split(",")[0] for _, _, m in sink.messages()] == [
        f"gpusched Job_id={job} Name=j1 " + ("Ended" if claimed[0].event == "BEGIN" else
                                             "Began")]
    assert sorted(r[2:4] for r in rows(sessions)) == sorted(
        [(claimed[0].event, "sending"), ("END" if claimed[0].event == "BEGIN" else "BEGIN",
                                          "sent")])


def test_a_server_that_is_down_costs_bounded_retries_and_one_log_line(
        sessions: sessionmaker[Session], caplog: pytest.LogCaptureFixture) -> None:
    (job,) = ended_jobs(sessions, 1, ["END"])
    closed = SmtpSink()
    port = closed.port
    closed.close()  # nothing listens there now
    down = mail_job(sessions, smtp_port=port, max_attempts=3, retry_after=1, smtp_timeout=2)
    caplog.set_level(logging.WARNING, "gpusched.controller.mail")
    down.run()
    assert rows(sessions) == [(job, 0, "END", "queued", 1)]
    down.run()  # not yet due again
    assert rows(sessions) == [(job, 0, "END", "queued", 1)]
    for attempt in (2, 3):
        with sessions() as session, session.begin():
            session.execute(text("UPDATE mail_events SET next_attempt_at = now()"))
        down.run()
        assert rows(sessions)[0][3:] == ("queued" if attempt < 3 else "failed", attempt)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and f"mail about job {job} (END)" in warnings[0], warnings
    assert down.failed == 3 and down.sent == 0


def test_a_header_that_is_not_one_line_is_never_sent(
        sessions: sessionmaker[Session], sink: SmtpSink) -> None:
    (job,) = ended_jobs(sessions, 1, ["END"])
    with sessions() as session, session.begin():
        session.execute(text(
            "INSERT INTO mail_events (job_id, run, event, recipient, subject, body) VALUES"
            " (:j, 0, 'BEGIN', 'ada@example.org', E'hi\\r\\nBcc: eve@example.net', 'x')"),
            {"j": job})
    mailer = mail_job(sessions, smtp_port=sink.port)
    mailer.run()
    assert [str(m["Subject"]) for _, _, m in sink.messages()] == [
        f"gpusched Job_id={job} Name=j1 Ended, Run time 00:00:05, COMPLETED, ExitCode 0"]
    assert rows(sessions) == [(job, 0, "BEGIN", "failed", 1), (job, 0, "END", "sent", 1)]


def test_credentials_and_starttls(sessions: sessionmaker[Session], tmp_path: Path) -> None:
    """The password file's first line logs in; a wrong one is retried as a failure; with
    smtp_starttls, a server that offers no STARTTLS gets nothing in the clear."""
    (job,) = ended_jobs(sessions, 1, ["END"])
    server = SmtpSink(password="s3cret")
    try:
        secret = tmp_path / "password"
        secret.write_text("wrong\n")
        settings = {"smtp_port": server.port, "smtp_user": "gpusched",
                    "smtp_password_file": secret}
        mail_job(sessions, **settings).run()
        assert rows(sessions) == [(job, 0, "END", "queued", 1)]
        with sessions() as session, session.begin():
            session.execute(text("UPDATE mail_events SET next_attempt_at = now()"))
        mail_job(sessions, smtp_starttls=True, **settings).run()
        with sessions() as session:
            error = session.execute(text("SELECT error FROM mail_events")).scalar_one()
        assert "STARTTLS" in error and server.messages() == []
        assert rows(sessions) == [(job, 0, "END", "queued", 2)]
        secret.write_text("s3cret\nanything after the first line\n")
        with sessions() as session, session.begin():
            session.execute(text("UPDATE mail_events SET next_attempt_at = now()"))
        mail_job(sessions, **settings).run()
        assert rows(sessions) == [(job, 0, "END", "sent", 3)]
        assert server.server.logins == ["gpusched:wrong", "gpusched:s3cret"]
        assert len(server.messages()) == 1
    finally:
        server.close()


def test_a_standby_sends_nothing(sessions: sessionmaker[Session], sink: SmtpSink) -> None:
    ended_jobs(sessions, 1)
    MailJob(MailConfig(method="smtp", smtp_host="127.0.0.1", smtp_port=sink.port), sessions,
            lambda: False).run()
    assert rows(sessions) == [] and sink.messages() == []


def test_a_round_that_overlaps_a_running_one_returns_at_once(
        sessions: sessionmaker[Session], sink: SmtpSink) -> None:
    ended_jobs(sessions, 1)
    mailer = mail_job(sessions, smtp_port=sink.port)
    with mailer._round:  # a round in progress (a slow server)
        mailer.run()
    assert rows(sessions) == []
    mailer.run()
    assert len(sink.messages()) == 2


@pytest.mark.parametrize(("table", "key"), [
    ({"method": "pigeon"}, "mail.method"),
    ({"smtp_port": 0}, "mail.smtp_port"),
    ({"smtp_port": 70000}, "mail.smtp_port"),
    ({"from": "gpusched@example.org\r\nBcc: eve@example.net"}, "mail.from"),
    ({"from": "a@b, c@d"}, "mail.from"),
    ({"domain": "example.org\n"}, "mail.domain"),
    ({"smtp_host": "mail server"}, "mail.smtp_host"),
    ({"smtp_user": "ada"}, "mail.smtp_password_file"),
    ({"smtp_password_file": "/etc/pw"}, "mail.smtp_user"),
    ({"smtp_user": "ada\r\nX", "smtp_password_file": "/etc/pw"}, "mail.smtp_user"),
    ({"interval": 0}, "mail.interval"),
    ({"batch": 10**9}, "mail.batch"),
    ({"max_attempts": 0}, "mail.max_attempts"),
    ({"sendmail": "sendmail"}, "mail.sendmail"),
    ({"smtp_timeout": float("nan")}, "mail.smtp_timeout"),
    ({"colour": "blue"}, "mail.colour"),
])
def test_bad_mail_settings_name_their_key(table: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"mail": table}, "gpusched.toml")
    assert str(refused.value).startswith(f"gpusched.toml: {key}"), refused.value


def test_mail_settings_load() -> None:
    config = parse_config({"mail": {
        "method": "smtp", "smtp_host": "mail.example.org", "smtp_port": 587,
        "smtp_starttls": True, "smtp_user": "gpusched", "smtp_password_file": "/etc/pw",
        "from": "hpc@example.org", "domain": "example.org", "interval": 5}}, "t.toml").mail
    assert (config.method, config.smtp_host, config.smtp_port, config.smtp_starttls,
            config.sender, config.domain, config.interval) == (
        "smtp", "mail.example.org", 587, True, "hpc@example.org", "example.org", 5.0)
    assert parse_config({}, "t.toml").mail == MailConfig()
