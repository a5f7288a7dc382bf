"""gsubmit's option values that need more than a type: each checked (and put in its
canonical form) on its own, so that a bad one is refused before anything is sent. The
parsers of rarely used options are imported only when the option is given."""

from __future__ import annotations

from gpusched.cli.jobshape import trailing_comma_allowed
from gpusched.cli.shell import exported
from gpusched.core.timefmt import parse_begin, parse_time_limit
from gpusched.errors import UsageError

TYPE_CHECKING = False  # no typing at run time (see gpusched.cli.console)
if TYPE_CHECKING:
    from gpusched.core.signals import WarnSignal

UNLIMITED = "UNLIMITED"


def time_value(text: str) -> int | str:
    """Seconds of a --time value, or ``"UNLIMITED"``."""
    seconds = parse_time_limit(text)
    return UNLIMITED if seconds is None else seconds


def array_value(text: str) -> str:
    """An --array value, in its canonical form."""
    # Imported here, as the next one: most jobs are not arrays.
    from gpusched.core.arrays import parse_array

    try:
        return parse_array(without_empty_items(text)).text()
    except ValueError:
        parse_array(text)  # the refusal, quoting the value as it was given
        raise


def without_empty_items(text: str) -> str:
    """A comma list without its empty items (``1,`` is ``1``), as sbatch splits one
    (strtok skips them); a list of nothing but commas stays as it is, to be refused."""
    ids, percent, cap = text.partition("%")
    items = [item for item in ids.split(",") if item.strip()]
    return ",".join(items) + percent + cap if items else text


def warn_signal_value(text: str) -> WarnSignal:
    """A --signal value."""
    # The signal module builds its enums on import (~2 ms).
    from gpusched.core.signals import parse_warn_signal

    return parse_warn_signal(text)


def gres_flags_value(text: str) -> str:
    """A --gres-flags value: Slurm's enforce-binding or disable-binding."""
    from gpusched.messages.agent import GRES_FLAGS

    if text not in GRES_FLAGS:
        raise UsageError(f"invalid --gres-flags {text[:64]!r}: expected enforce-binding or "
                         "disable-binding")
    return text


def begin_value(text: str) -> str:
    """The --begin time as ISO 8601 in the local zone."""
    from datetime import datetime

    return parse_begin(text, datetime.now().astimezone()).isoformat()


def checked_dependency(text: str) -> str:
    """The --dependency value, checked here so that a bad one is never sent."""
    # Imported here: the dependency module pulls in the whole job model (~8 ms).
    from gpusched.core.dependency import parse_dependency

    text = text.rstrip()
    trailing_comma_allowed(parse_dependency)(text)
    return text.rstrip(",") or text  # "afterok:5," is "afterok:5", as in sbatch


def mail_type_value(text: str) -> tuple[str, ...]:
    """A --mail-type value: its types, ALL expanded; () for NONE."""
    # Imported here, as the next one: most jobs ask for no mail.
    from gpusched.core.mail import parse_mail_types

    return trailing_comma_allowed(parse_mail_types)(text)  # type: ignore[no-any-return]


def licenses_value(text: str) -> str:
    """A -L/--licenses value, checked and in its canonical form."""
    from gpusched.core.licenses import format_licenses, parse_licenses

    return format_licenses(parse_licenses(text))


def mail_user_value(text: str) -> str:
    """A --mail-user value: a user name or one mail address."""
    from gpusched.core.mail import check_mail_user

    return check_mail_user(text)


MAX_NICE = 2_147_483_645  # sbatch's bound (gpusched.messages.schedflags)


def nice_value(text: str) -> int:
    """A --nice=ADJ adjustment."""
    digits = text.strip().removeprefix("-").removeprefix("+")
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 10
            and abs(int(text)) <= MAX_NICE):
        raise UsageError(f"invalid --nice={text.strip()[:32]!r}: expected a whole number "
                         f"from -{MAX_NICE} to {MAX_NICE}")
    return int(text)


def priority_value(text: str) -> float:
    """A --priority value: a number of 0 or more."""
    word = text.strip()
    if word.upper() == "TOP":
        raise UsageError("--priority=TOP: not supported: move a pending job ahead of your "
                         "others with 'gcontrol top JOBID'")
    try:
        number = float(word) if len(word) <= 32 and word.isascii() else -1.0
    except ValueError:
        number = -1.0
    if not 0 <= number < float("inf"):
        raise UsageError(f"invalid --priority {word[:32]!r}: expected a number of 0 or more")
    return number


def open_mode_value(text: str) -> str:
    """An --open-mode value: append or truncate."""
    if text not in ("append", "truncate"):
        raise UsageError(f"invalid --open-mode {text[:32]!r}: expected append or truncate")
    return text


def time_min_value(text: str) -> int:
    """A --time-min value in seconds (--time's forms, but never UNLIMITED)."""
    seconds = parse_time_limit(text)
    if seconds is None:
        raise UsageError("invalid --time-min UNLIMITED: expected a time such as 30 or 1:00:00")
    return seconds


def deadline_value(text: str) -> str:
    """The --deadline time (--begin's forms) as ISO 8601 in the local zone."""
    from datetime import datetime

    try:
        moment = parse_begin(text, datetime.now().astimezone())
    except (ValueError, UsageError) as err:
        message = err.message if isinstance(err, UsageError) else str(err)
        raise UsageError(message.replace("--begin", "--deadline")) from None
    return moment.replace(microsecond=0).isoformat()  # whole seconds, as sbatch's


def checked_export(text: str) -> str:
    """The --export value, checked without reading the environment yet."""
    exported(text, {})
    return text
