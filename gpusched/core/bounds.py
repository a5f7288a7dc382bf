"""Bounds on every field of a job's request: sizes, ranges and characters (pure).

The controller checks a submission against these before it stores anything, because
the API is reachable without gsubmit and runs as root; gsubmit meets them by
construction. Each check raises ``BoundError`` with one line that names the field.

The figures follow the system's own limits where there is one: PATH_MAX for paths,
the kernel's argument and environment space for a job's ``execve`` (2 MiB in all with
the usual 8 MiB stack), Slurm's default ``max_script_size`` (4 MiB) for the script,
and PostgreSQL's column types for numbers (``jobs.id`` is a BIGINT, counts INTEGERs).
"""

from __future__ import annotations

TYPE_CHECKING = False  # gsrun loads this module: collections costs its start ~1 ms
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

MAX_JOB_ID = 2**63 - 1  # jobs.id, a BIGINT
MAX_COMMANDS_ACKED = 500  # command numbers one POST /agent/v1/commands/done carries
MAX_ACKS_IN_POLL = 200  # command numbers one GET /agent/v1/work?done= carries
MAX_ENDS_REPORTED = 500  # runs' ends one POST /agent/v1/jobs/ended carries
MAX_INT32 = 2**31 - 1  # the INTEGER columns: time limit, counts, sizes
PATH_MAX = 4096  # bytes, with the terminating NUL on Linux: 4095 usable
MAX_NAME = 200  # characters of a job name
MAX_WORD = 256  # characters of a partition, account, QOS or node name
MAX_SCRIPT_BYTES = 4 * 1024 * 1024
MAX_ARGS = 4096
MAX_ARGS_BYTES = 256 * 1024
MAX_ENV_VARS = 10_000
MAX_ENV_BYTES = 1024 * 1024  # names, values and '=' of every variable
MAX_GPUS = 65_536  # GPUs of one job, over all its nodes
MAX_NODES = 65_536
MAX_CPUS = 1_048_576  # per node
MAX_MEM_MB = MAX_INT32  # MiB per node (2 PiB)
MAX_TIME_LIMIT = MAX_INT32  # seconds (68 years)
MAX_LIST = 10_000  # ids or names in one list (nodelist, ids=...)


class BoundError(ValueError):
    """A field is out of its bounds; the message names it."""


def first_unprintable(text: str) -> str | None:
    """The first character of ``text`` a terminal would not show as itself: C0 and C1
    controls, format characters such as the bidi overrides (U+202E) and zero-width
    joiners, line and paragraph separators, surrogates and unassigned code points."""
    if text.isprintable():  # the common case, in C
        return None
    return next(c for c in text if not c.isprintable())


def describe(char: str) -> str:
    """A character as a message shows it: ``U+001B``."""
    return f"U+{ord(char):04X}"


def check_text(field: str, value: str, max_chars: int) -> str:
    """A one-line, printable text of 1 to ``max_chars`` characters."""
    if not value:
        raise BoundError(f"{field}: expected 1 to {max_chars} characters, got none")
    if len(value) > max_chars:
        raise BoundError(f"{field}: expected at most {max_chars} characters, got {len(value)}")
    bad = first_unprintable(value)
    if bad is not None:
        raise BoundError(f"{field}: the character {describe(bad)} is not allowed (control, "
                         "format and bidirectional characters are refused)")
    return value


def check_path(field: str, value: str) -> str:
    """An absolute or relative path: printable, shorter than PATH_MAX bytes."""
    size = len(value.encode("utf-8", "surrogatepass"))
    if size >= PATH_MAX:
        raise BoundError(f"{field}: expected a path shorter than {PATH_MAX} bytes, got {size}")
    return check_text(field, value, PATH_MAX)


def check_utf8(field: str, value: str) -> str:
    """Text that UTF-8 can hold: no lone surrogate (what JSON's ``"\\ud800"`` or an
    undecodable byte read with ``surrogateescape`` leaves in a str)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BoundError(f"{field}: not valid UTF-8 text (a lone surrogate "
                         f"{describe(value[exc.start])})") from None
    return value


def check_int(field: str, value: int, low: int, high: int, expected: str) -> int:
    """``low <= value <= high``."""
    if not low <= value <= high:
        raise BoundError(f"{field}: expected {expected} from {low} to {high}, got {value}")
    return value


def check_script(text: str) -> str:
    """The batch script: at most MAX_SCRIPT_BYTES, no NUL (it is text)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_SCRIPT_BYTES:
        raise BoundError(f"script: {size} bytes, more than the {MAX_SCRIPT_BYTES} allowed")
    if "\0" in text:
        raise BoundError("script: contains a NUL character; a batch script is text")
    return check_utf8("script", text)


def check_args(args: Iterable[str]) -> list[str]:
    """The script's arguments: at most MAX_ARGS of them and MAX_ARGS_BYTES in all, no NUL."""
    found = list(args)
    if len(found) > MAX_ARGS:
        raise BoundError(f"args: {len(found)} arguments, more than the {MAX_ARGS} allowed")
    size = sum(len(a.encode("utf-8", "surrogatepass")) + 1 for a in found)
    if size > MAX_ARGS_BYTES:
        raise BoundError(f"args: {size} bytes, more than the {MAX_ARGS_BYTES} allowed")
    if any("\0" in a for a in found):
        raise BoundError("args: an argument contains a NUL character")
    for arg in found:
        check_utf8("args", arg)
    return found


def check_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The job's environment: names without '=' or NUL, values without NUL, at most
    MAX_ENV_VARS variables and MAX_ENV_BYTES in all."""
    if len(env) > MAX_ENV_VARS:
        raise BoundError(f"environment: {len(env)} variables, more than the {MAX_ENV_VARS} "
                         "allowed")
    size = 0
    for name, value in env.items():
        if not name or "=" in name or "\0" in name:
            raise BoundError(f"environment: {name[:40]!r} is not a variable name (it must be "
                             "non-empty, without '=' or NUL)")
        if "\0" in value:
            raise BoundError(f"environment: the value of {name[:40]} contains a NUL character")
        check_utf8("environment", name)
        check_utf8(f"environment: the value of {name[:40]}", value)
        size += len(name.encode("utf-8", "surrogatepass")) + len(
            value.encode("utf-8", "surrogatepass")) + 2
    if size > MAX_ENV_BYTES:
        raise BoundError(f"environment: {size} bytes, more than the {MAX_ENV_BYTES} allowed")
    return dict(env)


def parse_id_list(field: str, text: str, limit: int = MAX_LIST, what: str = "job ids"
                  ) -> list[int]:
    """``12,13,14``: job ids (1 to MAX_JOB_ID; or other numbers of that range, ``what``),
    de-duplicated in order, at most ``limit``; empty items are skipped."""
    ids: dict[int, None] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if not (item.isascii() and item.isdigit()) or len(item) > 19 \
                or not 1 <= int(item) <= MAX_JOB_ID:
            raise BoundError(f"{field}: expected {what} from 1 to {MAX_JOB_ID} separated by "
                             f"commas, got {item[:40]!r}")
        ids[int(item)] = None
        if len(ids) > limit:
            raise BoundError(f"{field}: more than {limit} {what}")
    return list(ids)


MAX_ARRAY_TASK_ID = 999_999  # gpusched.core.arrays.MAX_TASK_ID (a test holds them equal)


def parse_job_ref(text: str) -> tuple[int, int | None] | None:
    """A job id (``12``) or an array task id (``12_3``) as (job id, task id or None),
    or None when it can name neither; the one parser of job references, light enough
    for every command line (gpusched.core.jobcontrol builds on it)."""
    job, sep, task = text.strip().partition("_")
    job_id = parse_job_id(job)
    if job_id is None or not sep:
        return None if job_id is None else (job_id, None)
    if not (task.isascii() and task.isdigit()) or len(task) > 6 \
            or int(task) > MAX_ARRAY_TASK_ID:
        return None
    return job_id, int(task)


def parse_job_id(text: str) -> int | None:
    """A job id of a URL path (``12``), or None when it cannot name a job."""
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        return None
    value = int(text)
    return value if 1 <= value <= MAX_JOB_ID else None
