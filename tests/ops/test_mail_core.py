"""gpusched.core.mail: which types a --mail-type asks for, which recipients pass, and
which mails are due for a job given what was recorded (pure, no clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpusched.core.mail import (
    ALL_TYPES,
    MailError,
    Run,
    Watched,
    check_mail_user,
    due_mail,
    header_safe,
    parse_mail_types,
    recipient,
)

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_all_is_sbatchs_set_and_none_wins() -> None:
    assert set(parse_mail_types("ALL")) == {"BEGIN", "END", "FAIL", "INVALID_DEPEND", "REQUEUE",
                                            "STAGE_OUT"}
    assert parse_mail_types("all,time_limit_80") == (*ALL_TYPES[:3], "REQUEUE",
                                                     "INVALID_DEPEND", "STAGE_OUT",
                                                     "TIME_LIMIT_80")
    assert parse_mail_types(" end , FAIL ") == ("END", "FAIL")
    assert parse_mail_types("END,NONE,BEGIN") == ()
    assert parse_mail_types(["ARRAY_TASKS", "END"]) == ("END", "ARRAY_TASKS")


@pytest.mark.parametrize("value", ["", "END,", "EVERYTHING", "END\r\nBEGIN", "E" * 300,
                                   ",".join(["END"] * 20)])
def test_unknown_or_oversized_types_are_refused(value: str) -> None:
    with pytest.raises(MailError) as refused:
        parse_mail_types(value)
    assert "\n" not in str(refused.value) and "\r" not in str(refused.value)


@pytest.mark.parametrize("value", ["ada", "ada@example.org", "a.l+x%y_z-w@mail.example.org",
                                   "root", "_svc@host1"])
def test_good_recipients_pass(value: str) -> None:
    assert check_mail_user(value) == value


@pytest.mark.parametrize("value", [
    "ada@example.org\r\nBcc: eve@example.net", "ada@example.org\n", "ada@example.org,eve@x.org",
    "Ada <ada@example.org>", "ada@example.org ", "-oQ/tmp@example.org", "|cat@example.org",
    "/tmp/x@example.org", '"a b"@example.org', "ada@[127.0.0.1]", "ada@-example.org",
    "ada@example..org", "ada@@example.org", "a" * 65 + "@example.org", "ada@" + "b" * 251 + ".org",
    "", "ad\x00a", "ada\u202e@example.org", "ädä@example.org", "-ada", "a" * 65])
def test_bad_recipients_are_refused_in_one_line(value: str) -> None:
    with pytest.raises(MailError) as refused:
        check_mail_user(value)
    message = str(refused.value)
    assert message.isprintable(), message


def test_a_bare_user_gets_the_domain() -> None:
    assert recipient("ada", "example.org") == "ada@example.org"
    assert recipient("ada@lab.org", "example.org") == "ada@lab.org"
    assert recipient("ada", None) == "ada"
    assert header_safe("x") and not header_safe("x\r\nBcc: y") and not header_safe("x\x1b")


def job(*runs: Run, types: str = "ALL", is_array: bool = False) -> Watched:
    return Watched(job_id=runs[0].array_job_id or runs[0].job_id, name="train",
                   user_name="ada", mail_types=parse_mail_types(types), mail_user="ada",
                   runs=runs, is_array=is_array)


def run(state: str, started: float | None = None, ended: float | None = None,
        job_id: int = 12, restarts: int = 0, limit: int | None = None, code: int | None = None,
        reason: str = "None", task: int | None = None, array: int | None = None) -> Run:
    return Run(job_id=job_id, state=state, reason=reason, restarts=restarts, submit_time=T0,
               start_time=None if started is None else at(started),
               end_time=None if ended is None else at(ended), time_limit=limit, exit_code=code,
               array_job_id=array, array_task_id=task)


def subjects(watched: Watched, now: float, sent: set[tuple[int, int, str]] | None = None,
             stale_after: float | None = None) -> list[str]:
    return [m.subject for m in due_mail(watched, sent or set(), at(now), stale_after)[0]]


def test_begin_then_end_with_slurms_subjects() -> None:
    running = job(run("RUNNING", started=2), types="BEGIN,END")
    assert subjects(running, 3) == ["gpusched Job_id=12 Name=train Began, Queued time 00:00:02"]
    assert subjects(running, 3, {(12, 0, "BEGIN")}) == []
    ended = job(run("COMPLETED", started=2, ended=3663, code=0), types="BEGIN,END")
    assert subjects(ended, 4000, {(12, 0, "BEGIN")}) == [
        "gpusched Job_id=12 Name=train Ended, Run time 01:01:01, COMPLETED, ExitCode 0"]
    mails, done = due_mail(ended, set(), at(4000))
    assert [(m.job_id, m.run, m.event, m.to) for m in mails] == [
        (12, 0, "BEGIN", "ada"), (12, 0, "END", "ada")]
    assert done and not due_mail(running, set(), at(3))[1]


def test_fail_replaces_end_and_cancel_is_an_end() -> None:
    failed = run("FAILED", started=1, ended=5, code=3)
    assert subjects(job(failed, types="END,FAIL"), 6) == [
        "gpusched Job_id=12 Name=train Failed, Run time 00:00:04, FAILED, ExitCode 3"]
    assert subjects(job(failed, types="END"), 6) == [
        "gpusched Job_id=12 Name=train Ended, Run time 00:00:04, FAILED, ExitCode 3"]
    assert subjects(job(failed, types="BEGIN"), 6) == [
        "gpusched Job_id=12 Name=train Began, Queued time 00:00:01"]
    cancelled = job(run("CANCELLED", ended=5), types="END,FAIL")  # never started
    assert subjects(cancelled, 6) == [
        "gpusched Job_id=12 Name=train Ended, Run time 00:00:00, CANCELLED, ExitCode 0"]


def test_time_limit_thresholds_send_the_highest_reached_once() -> None:
    watched = job(run("RUNNING", started=0, limit=100), types="TIME_LIMIT_50,TIME_LIMIT_80")
    assert subjects(watched, 49) == []
    assert subjects(watched, 51) == [
        "gpusched Job_id=12 Name=train Reached 50% of time limit, Run time 00:00:51"]
    assert subjects(watched, 79, {(12, 0, "TIME_LIMIT_50")}) == []
    assert subjects(watched, 85, {(12, 0, "TIME_LIMIT_50")}) == [
        "gpusched Job_id=12 Name=train Reached 80% of time limit, Run time 00:01:25"]
    assert subjects(watched, 85) == [  # first seen past 80%: that one only
        "gpusched Job_id=12 Name=train Reached 80% of time limit, Run time 00:01:25"]
    assert subjects(watched, 95, {(12, 0, "TIME_LIMIT_80")}) == []  # 90 was not asked for
    timed_out = job(run("TIMEOUT", started=0, ended=101, limit=100), types="TIME_LIMIT,FAIL")
    assert subjects(timed_out, 102) == [
        "gpusched Job_id=12 Name=train Reached time limit, Run time 00:01:41",
        "gpusched Job_id=12 Name=train Failed, Run time 00:01:41, TIMEOUT, ExitCode 0"]
    assert subjects(job(run("RUNNING", started=0), types="TIME_LIMIT_50"), 10**6) == []


def test_requeue_is_keyed_by_the_run_that_ended() -> None:
    again = job(run("RUNNING", started=30, restarts=2), types="BEGIN,REQUEUE")
    mails = due_mail(again, {(12, 0, "BEGIN"), (12, 0, "REQUEUE")}, at(31))[0]
    assert [(m.run, m.event, m.subject) for m in mails] == [
        (1, "REQUEUE", "gpusched Job_id=12 Name=train Requeued, Restarts 2"),
        (2, "BEGIN", "gpusched Job_id=12 Name=train Began, Queued time 00:00:30")]


def test_invalid_dependency() -> None:
    waiting = job(run("PENDING", reason="DependencyNeverSatisfied"), types="ALL")
    assert subjects(waiting, 5) == ["gpusched Job_id=12 Name=train Failed, Invalid dependency"]
    assert subjects(job(run("PENDING", reason="Dependency"), types="ALL"), 5) == []


def test_an_array_mails_as_a_whole_unless_array_tasks() -> None:
    tasks = (run("COMPLETED", 1, 4, job_id=20, task=0, array=20, code=0),
             run("FAILED", 2, 5, job_id=21, task=1, array=20, code=2),
             run("RUNNING", 2, job_id=22, task=2, array=20))
    whole = job(*tasks, types="BEGIN,END,FAIL", is_array=True)
    mails, done = due_mail(whole, set(), at(6))
    assert [(m.job_id, m.run, m.event, m.subject) for m in mails] == [
        (20, 0, "BEGIN", "gpusched Array Summary Job_id=20_* (20) Name=train Began, Queued "
                         "time 00:00:01")]
    assert not done
    ended = job(*tasks[:2], run("COMPLETED", 2, 9, job_id=22, task=2, array=20, code=0),
                types="BEGIN,END,FAIL", is_array=True)
    mails, done = due_mail(ended, {(20, 0, "BEGIN")}, at(10))
    assert [m.subject for m in mails] == [
        "gpusched Array Summary Job_id=20_* (20) Name=train Failed, Mixed, ExitCode [0-2]"]
    assert done
    per_task = job(*tasks, types="END,ARRAY_TASKS", is_array=True)
    assert subjects(per_task, 6) == [
        "gpusched Array Task Job_id=20_0 (20) Name=train Ended, Run time 00:00:03, "
        "COMPLETED, ExitCode 0",
        "gpusched Array Task Job_id=20_1 (21) Name=train Ended, Run time 00:00:03, "
        "FAILED, ExitCode 2"]


def test_ended_long_ago_is_no_news() -> None:
    old = job(run("COMPLETED", started=0, ended=10), types="END")
    assert subjects(old, 100, stale_after=60) == []
    assert due_mail(old, set(), at(100), 60)[1]  # and no longer watched
    assert len(subjects(old, 50, stale_after=60)) == 1
