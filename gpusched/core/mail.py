"""Mail about jobs, sbatch's ``--mail-type``/``--mail-user`` (pure): which types a job
asks for, whom to tell, which events are due for a job given what was already sent,
and each message's subject and body. No clock: ``now`` is passed in.

Each event is sent at most once per run of a job: its key is (job id, run, event),
the run being the job's ``restarts`` when it happened. Without ARRAY_TASKS, BEGIN, END,
FAIL, REQUEUE and INVALID_DEPEND of an array are about the array as a whole (keyed by
the array's own id, run 0); the TIME_LIMIT events are always about one task.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

BEGIN, END, FAIL, REQUEUE = "BEGIN", "END", "FAIL", "REQUEUE"
INVALID_DEPEND, STAGE_OUT = "INVALID_DEPEND", "STAGE_OUT"
TIME_LIMIT, TIME_LIMIT_50, TIME_LIMIT_80, TIME_LIMIT_90 = (
    "TIME_LIMIT", "TIME_LIMIT_50", "TIME_LIMIT_80", "TIME_LIMIT_90")
ARRAY_TASKS = "ARRAY_TASKS"
# Every type a job may store, in the order they are shown.
MAIL_TYPES = (BEGIN, END, FAIL, REQUEUE, INVALID_DEPEND, STAGE_OUT, TIME_LIMIT,
              TIME_LIMIT_90, TIME_LIMIT_80, TIME_LIMIT_50, ARRAY_TASKS)
# sbatch's ALL. STAGE_OUT (burst buffers) is accepted and never sent: there are none.
ALL_TYPES = (BEGIN, END, FAIL, INVALID_DEPEND, REQUEUE, STAGE_OUT)
# The events a message is about (the types less ARRAY_TASKS and STAGE_OUT).
EVENTS = (BEGIN, END, FAIL, REQUEUE, INVALID_DEPEND, TIME_LIMIT, TIME_LIMIT_50,
          TIME_LIMIT_80, TIME_LIMIT_90)
_THRESHOLDS = ((TIME_LIMIT_90, 0.9), (TIME_LIMIT_80, 0.8), (TIME_LIMIT_50, 0.5))
MAX_MAIL_TYPE_TEXT = 200  # characters of a --mail-type value
MAX_MAIL_USER = 254  # characters of a mail address (RFC 5321's path, less its brackets)
_OK_STATES = ("COMPLETED", "CANCELLED")  # ended without failing (Slurm: END, not FAIL)
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "DEADLINE")
DEPENDENCY_NEVER_SATISFIED = "DependencyNeverSatisfied"

# A user name, or an address: a dot-atom local part of letters, digits and . _ % + -
# (first a letter, digit or _: never an option to sendmail, nor a pipe or a path) and
# a domain of DNS labels. No spaces, commas, quotes, brackets or controls: one
# recipient, nothing a header could be split or extended by.
_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_LOCAL = r"[A-Za-z0-9_][A-Za-z0-9_%+-]*(?:\.[A-Za-z0-9_%+-]+)*"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_ADDRESS = re.compile(rf"(?P<local>{_LOCAL})@(?P<domain>{_LABEL}(?:\.{_LABEL})*)")
_DOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
MAIL_USER_EXPECTED = ("a user name or one mail address such as ada@example.org (letters, "
                      "digits and . _ %% + - before the @, at most %d characters)"
                      % MAX_MAIL_USER)


class MailError(ValueError):
    """A mail type or recipient that cannot be used; the message says why."""


def parse_mail_types(values: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The types a ``--mail-type`` value (comma-separated, or a list of names) asks for,
    ALL expanded, in MAIL_TYPES order; () for NONE, which wins over anything else."""
    names = values.split(",") if isinstance(values, str) else list(values)
    if isinstance(values, str) and len(values) > MAX_MAIL_TYPE_TEXT:
        raise MailError(f"mail_type: {len(values)} characters, more than the "
                        f"{MAX_MAIL_TYPE_TEXT} allowed")
    if len(names) > len(MAIL_TYPES) + 2:
        raise MailError(f"mail_type: more than {len(MAIL_TYPES) + 2} types")
    wanted: set[str] = set()
    none = False
    for raw in names:
        if not isinstance(raw, str):
            raise MailError(f"mail_type: expected type names, got {str(type(raw).__name__)}")
        name = raw.strip().upper()
        if name == "NONE":
            none = True
        elif name == "ALL":
            wanted.update(ALL_TYPES)
        elif name in MAIL_TYPES:
            wanted.add(name)
        else:
            shown = repr(raw[:40])
            raise MailError(f"invalid mail type {shown}: expected NONE, ALL, "
                            f"{', '.join(MAIL_TYPES)} (comma-separated)")
    if none:
        return ()
    return tuple(t for t in MAIL_TYPES if t in wanted)


def check_mail_user(value: str) -> str:
    """A ``--mail-user`` value: a user name or one mail address (see _ADDRESS)."""
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_MAIL_USER:
        raise MailError(f"mail_user: expected {MAIL_USER_EXPECTED}")
    match = _ADDRESS.fullmatch(value)
    if match is not None and len(match["local"]) <= 64 and len(match["domain"]) <= 253:
        return value
    if "@" not in value and _USER.fullmatch(value):
        return value
    shown = repr(value) if value.isprintable() and len(value) <= 60 else repr(value[:60])
    raise MailError(f"invalid mail user {shown}: expected {MAIL_USER_EXPECTED}")


def check_mail_domain(value: str) -> str:
    """A mail domain (Slurm's MailDomain) appended to bare user names."""
    if not isinstance(value, str) or len(value) > 253 or not _DOMAIN.fullmatch(value):
        raise MailError("expected a domain name such as example.org")
    return value


def recipient(mail_user: str, domain: str | None) -> str:
    """The address mail for ``mail_user`` goes to: a bare user name gets ``@domain``."""
    if "@" in mail_user or domain is None:
        return mail_user
    return f"{mail_user}@{domain}"


def header_safe(value: str) -> bool:
    """Whether ``value`` may go into a mail header as it is: printable, one line."""
    return value.isprintable() and "\r" not in value and "\n" not in value


@dataclass(frozen=True)
class Run:
    """One job row as the mail job reads it: a plain job, or one task of an array."""

    job_id: int
    state: str
    reason: str
    restarts: int
    submit_time: datetime
    start_time: datetime | None = None
    end_time: datetime | None = None
    time_limit: int | None = None  # seconds; None: unlimited
    exit_code: int | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None


@dataclass(frozen=True)
class Watched:
    """A job with mail asked for: its settings, and its rows (itself, or every row of
    its array, the record among them)."""

    job_id: int
    name: str
    user_name: str
    mail_types: tuple[str, ...]
    mail_user: str
    runs: tuple[Run, ...]
    is_array: bool = False


@dataclass(frozen=True)
class Mail:
    """One message due: its key (job id, run, event), whom to, and its text."""

    job_id: int
    run: int
    event: str
    to: str
    subject: str
    body: str


def due_mail(job: Watched, sent: set[tuple[int, int, str]], now: datetime,
             stale_after: float | None = None) -> tuple[list[Mail], bool]:
    """The messages due for ``job`` that ``sent`` (keys already recorded) lacks, and
    whether nothing more can ever be due (every row ended). Events of runs that ended
    more than ``stale_after`` seconds before ``now`` are not sent."""
    types = set(job.mail_types)
    per_task = not job.is_array or ARRAY_TASKS in types
    due: list[Mail] = []
    for run in job.runs:
        if stale_after is not None and run.end_time is not None and \
                (now - run.end_time).total_seconds() > stale_after:
            continue
        events = _run_events(run, types, sent, now, per_task)
        # Built only when not recorded yet: most rounds find a job's events all recorded.
        due.extend(_mail(job, run, key, event, now) for key, event in events
                   if (*key, event) not in sent)
    if not per_task:
        due.extend(_array_mail(job, types, sent, now, stale_after))
    done = all(r.state in TERMINAL for r in job.runs)
    return due, done


def _run_events(run: Run, types: set[str], sent: set[tuple[int, int, str]], now: datetime,
                per_task: bool) -> list[tuple[tuple[int, int], str]]:
    """(job id, run) and event of each message one row calls for."""
    key = (run.job_id, run.restarts)
    found: list[tuple[tuple[int, int], str]] = []
    if per_task and REQUEUE in types and run.restarts > 0:
        found.append(((run.job_id, run.restarts - 1), REQUEUE))
    if per_task and BEGIN in types and run.start_time is not None:
        found.append((key, BEGIN))
    if run.state == "RUNNING" and run.start_time is not None and run.time_limit:
        elapsed = (now - run.start_time).total_seconds() / run.time_limit
        reached = [event for event, share in _THRESHOLDS if event in types and elapsed >= share]
        # Only the highest threshold reached, and only above any already sent.
        before = [event for event, _ in _THRESHOLDS if (run.job_id, run.restarts, event) in sent]
        if reached and (not before or _rank(reached[0]) > _rank(before[0])):
            found.append((key, reached[0]))
    if run.state == "TIMEOUT" and TIME_LIMIT in types:
        found.append((key, TIME_LIMIT))
    if per_task and run.state in TERMINAL:
        failed = run.state not in _OK_STATES
        if failed and FAIL in types:
            found.append((key, FAIL))
        elif END in types:
            found.append((key, END))
    if per_task and INVALID_DEPEND in types and run.state == "PENDING" \
            and run.reason == DEPENDENCY_NEVER_SATISFIED:
        found.append((key, INVALID_DEPEND))
    return found


def _rank(event: str) -> int:
    return {TIME_LIMIT_50: 1, TIME_LIMIT_80: 2, TIME_LIMIT_90: 3}[event]


def _array_mail(job: Watched, types: set[str], sent: set[tuple[int, int, str]],
                now: datetime, stale_after: float | None) -> list[Mail]:
    """The whole array's messages (no ARRAY_TASKS): BEGIN at its first task's start,
    REQUEUE at its first requeue, END or FAIL when every task has ended."""
    runs, events = job.runs, []
    if BEGIN in types and any(r.start_time is not None for r in runs):
        events.append(BEGIN)
    if REQUEUE in types and any(r.restarts > 0 for r in runs):
        events.append(REQUEUE)
    if INVALID_DEPEND in types and any(r.state == "PENDING" and r.job_id == job.job_id
                                       and r.reason == DEPENDENCY_NEVER_SATISFIED for r in runs):
        events.append(INVALID_DEPEND)
    ended = [r.end_time for r in runs if r.end_time is not None]
    if runs and all(r.state in TERMINAL for r in runs) and not (
            stale_after is not None and ended
            and (now - max(ended)).total_seconds() > stale_after):
        failed = any(r.state not in _OK_STATES for r in runs)
        if failed and FAIL in types:
            events.append(FAIL)
        elif END in types:
            events.append(END)
    return [_summary(job, event, now) for event in events
            if (job.job_id, 0, event) not in sent]


def _clock(seconds: float) -> str:
    """Seconds as Slurm's mail shows a duration: HH:MM:SS (days folded into hours)."""
    total = max(0, int(seconds))
    return f"{total // 3600:02d}:{total % 3600 // 60:02d}:{total % 60:02d}"


def _run_time(run: Run, now: datetime) -> str:
    if run.start_time is None:
        return _clock(0)
    return _clock(((run.end_time or now) - run.start_time).total_seconds())


def _what(event: str, run: Run, now: datetime) -> str:
    """The part of a subject after the job's name, as Slurm words it."""
    if event == BEGIN:
        began = run.start_time or now
        return f"Began, Queued time {_clock((began - run.submit_time).total_seconds())}"
    if event in (END, FAIL):
        verb = "Ended" if event == END else "Failed"
        return (f"{verb}, Run time {_run_time(run, now)}, {run.state}, "
                f"ExitCode {run.exit_code if run.exit_code is not None else 0}")
    if event == REQUEUE:
        return f"Requeued, Restarts {run.restarts}"
    if event == TIME_LIMIT:
        return f"Reached time limit, Run time {_run_time(run, now)}"
    if event == INVALID_DEPEND:
        return "Failed, Invalid dependency"
    percent = event.rsplit("_", 1)[1]
    return f"Reached {percent}% of time limit, Run time {_run_time(run, now)}"


def _mail(job: Watched, run: Run, key: tuple[int, int], event: str, now: datetime) -> Mail:
    if run.array_job_id is not None and run.array_task_id is not None:
        who = (f"gpusched Array Task Job_id={run.array_job_id}_{run.array_task_id} "
               f"({run.job_id}) Name={job.name}")
    else:
        who = f"gpusched Job_id={run.job_id} Name={job.name}"
    subject = f"{who} {_what(event, run, now)}"
    return Mail(key[0], key[1], event, job.mail_user, subject, _body(job, run, subject))


def _summary(job: Watched, event: str, now: datetime) -> Mail:
    """A message about a whole array."""
    runs = job.runs
    who = f"gpusched Array Summary Job_id={job.job_id}_* ({job.job_id}) Name={job.name}"
    if event == BEGIN:
        first = min((r for r in runs if r.start_time is not None),
                    key=lambda r: r.start_time or now)
        what = _what(BEGIN, first, now)
    elif event in (END, FAIL):
        states = {r.state for r in runs}
        codes = [r.exit_code or 0 for r in runs]
        what = (f"{'Ended' if event == END else 'Failed'}, "
                f"{states.pop() if len(states) == 1 else 'Mixed'}, "
                f"ExitCode [{min(codes)}-{max(codes)}]")
    elif event == REQUEUE:
        what = f"Requeued, Restarts {sum(r.restarts for r in runs)}"
    else:
        what = _what(event, runs[0], now)
    subject = f"{who} {what}"
    lines = [subject, "", f"Array job: {job.job_id}", f"Tasks: {len(runs)} started or pending",
             *(f"  {_task_line(r)}" for r in runs[:50])]
    if len(runs) > 50:
        lines.append(f"  ... and {len(runs) - 50} more")
    return Mail(job.job_id, 0, event, job.mail_user, subject, "\n".join(lines) + "\n")


def _task_line(run: Run) -> str:
    task = "pending" if run.array_task_id is None else str(run.array_task_id)
    code = "" if run.exit_code is None else f" exit code {run.exit_code}"
    return f"task {task} (job {run.job_id}): {run.state}{code}"


def _body(job: Watched, run: Run, subject: str) -> str:
    """A short plain-text body: the subject and the job's facts."""
    times = [("Submitted", run.submit_time), ("Started", run.start_time),
             ("Ended", run.end_time)]
    lines = [subject, "", f"Job id: {run.job_id}", f"Name: {job.name}",
             f"User: {job.user_name}", f"State: {run.state}",
             *(f"{label}: {value.isoformat(timespec='seconds')}"
               for label, value in times if value is not None)]
    if run.time_limit:
        lines.append(f"Time limit: {_clock(run.time_limit)}")
    if run.exit_code is not None:
        lines.append(f"Exit code: {run.exit_code}")
    if run.restarts:
        lines.append(f"Restarts: {run.restarts}")
    return "\n".join(lines) + "\n"
