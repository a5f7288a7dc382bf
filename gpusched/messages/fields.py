"""Reading one field of a decoded JSON object: its type, then its bounds (pure).

Every reader raises ``UsageError`` with one line that names the field; a field that is
absent or null takes its default. The messages (``gpusched.messages``) are built on
these, so the same kind of field is refused with the same words wherever it travels.
"""

from __future__ import annotations

from gpusched.core import bounds
from gpusched.core.bounds import BoundError
from gpusched.errors import UsageError

# gsrun checks its step request with these: typing and collections stay for type
# checking (they cost its every start a few milliseconds).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection
    from typing import Any, TypeVar

    T = TypeVar("T")
    D = TypeVar("D")
    Body = dict[str, Any]
else:
    Body = dict  # a decoded JSON object: dict[str, Any]

MAX_UID = 2**32 - 2  # uid_t is 32 bits wide; (uid_t)-1 means "no change" to the kernel


def shown(value: Any) -> str:
    """A value as an error message quotes it: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def as_object(raw: object, what: str) -> Body:
    """``raw`` as a JSON object (string keys), or a UsageError naming ``what``."""
    if not isinstance(raw, dict) or not all(isinstance(k, str) for k in raw):
        raise UsageError(f"{what}: expected a JSON object, got {shown(raw)}")
    return raw


def refuse_unknown(body: Body, known: Collection[str], what: str) -> None:
    """Refuse a key ``known`` does not list: a misspelt field must not pass unseen."""
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise UsageError(f"unknown field {shown(unknown[0])} in {what}")


def bounded(check: Callable[..., T], *args: Any) -> T:
    """``check(*args)`` from ``gpusched.core.bounds``, its BoundError as a UsageError."""
    try:
        return check(*args)
    except BoundError as exc:
        raise UsageError(str(exc)) from None


def typed(body: Body, key: str, kind: type[T], default: D, expected: str) -> T | D:
    """The value of ``key`` if it is a ``kind`` (a bool is no int), ``default`` if
    absent or null."""
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise UsageError(f"{key}: expected {expected}, got {shown(value)}")
    return value


def integer(body: Body, key: str, default: int, low: int, high: int, expected: str) -> int:
    """An integer from ``low`` to ``high``."""
    return bounded(bounds.check_int, key, typed(body, key, int, default, expected), low, high,
                   expected)


def required_integer(body: Body, key: str, low: int, high: int, expected: str) -> int:
    """An integer from ``low`` to ``high`` that must be there."""
    if body.get(key) is None:
        raise UsageError(f"{key}: expected {expected}, got nothing")
    return integer(body, key, low, low, high, expected)


def optional_integer(body: Body, key: str, low: int, high: int, expected: str) -> int | None:
    """An integer from ``low`` to ``high``, or None when absent or null."""
    if body.get(key) is None:
        return None
    return integer(body, key, low, low, high, expected)


def text(body: Body, key: str, max_chars: int, expected: str) -> str | None:
    """An optional one-line printable text of at most ``max_chars`` characters."""
    value = typed(body, key, str, None, expected)
    return None if value is None else bounded(bounds.check_text, key, value, max_chars)


def required_text(body: Body, key: str, max_chars: int, expected: str) -> str:
    """A one-line printable text that must be there."""
    value = text(body, key, max_chars, expected)
    if value is None:
        raise UsageError(f"{key}: expected {expected}, got nothing")
    return value


def path(body: Body, key: str, expected: str) -> str | None:
    """An optional path: printable, shorter than PATH_MAX bytes."""
    value = typed(body, key, str, None, expected)
    return None if value is None else bounded(bounds.check_path, key, value)


def flag(body: Body, key: str, default: bool = False) -> bool:
    """true or false."""
    return typed(body, key, bool, default, "true or false")


def words(body: Body, key: str, limit: int, noun: str) -> tuple[str, ...]:
    """A list of at most ``limit`` names (``noun``: nodes, GPU UUIDs), each printable and
    of 1 to MAX_WORD characters."""
    values = typed(body, key, list, [], f"a list of {noun}")
    if len(values) > limit:
        raise UsageError(f"{key}: more than {limit} {noun}")
    if not all(isinstance(v, str) and v for v in values):
        raise UsageError(f"{key}: expected a list of {noun}")
    return tuple(bounded(bounds.check_text, key, v, bounds.MAX_WORD) for v in values)


def strings(body: Body, key: str) -> list[str]:
    """A list of strings (the script's arguments), not yet bounded."""
    values = typed(body, key, list, [], "a list of strings")
    if not all(isinstance(a, str) for a in values):
        raise UsageError(f"{key}: expected a list of strings")
    return values


def string_map(body: Body, key: str) -> dict[str, str]:
    """An object of strings (the environment), not yet bounded."""
    values = typed(body, key, dict, {}, "an object of strings")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
        raise UsageError(f"{key}: expected an object mapping names to strings")
    return values


def one_of(body: Body, key: str, choices: Collection[str]) -> str:
    """One of ``choices``."""
    value = body.get(key)
    if not isinstance(value, str) or value not in choices:
        raise UsageError(f"{key}: expected one of {sorted(choices)}, got {shown(value)}")
    return value
