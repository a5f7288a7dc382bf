"""JSON text of the client's requests and answers, written and read by the interpreter's
C accelerator (``_json``) without loading the ``json`` package.

``import json`` costs a user command about as much as starting the interpreter: its
decoder loads ``re`` and compiles patterns that the C scanner never uses. A command
sends one small request and reads one answer, and ``_json`` does both at the same C
speed. Where the interpreter has no ``_json``, the ``json`` package does the work.
The text written is what ``json.dumps(value, separators=(",", ":"))`` writes, and
what is read is what ``json.loads`` reads of a UTF-8 answer.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_WHITESPACE = " \t\n\r"
_CONSTANTS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


class _Settings:
    """What the C scanner reads of a decoder: json.loads's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


_scan_once: Callable[[str, int], tuple[Any, int]] | None
try:
    from _json import encode_basestring_ascii as _quote
    from _json import make_scanner as _make_scanner
except ImportError:  # another interpreter: the json package it has
    _scan_once = None
else:
    # (typeshed types the context as a scanner; the C code reads only the attributes.)
    _scan_once = _make_scanner(_Settings())  # type: ignore[arg-type]


def loads(data: bytes | str) -> Any:
    """The value of a JSON text; ValueError when it is not one."""
    if _scan_once is None:
        import json

        return json.loads(data)
    text = data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan_once(text, start)
    except StopIteration as stop:
        raise ValueError(f"not JSON: expecting a value at character {stop.value}") from None
    if text[end:].strip(_WHITESPACE):
        raise ValueError(f"not JSON: extra data at character {end}")
    return value


def dumps(value: Any) -> str:
    """Compact JSON text of ``value`` (dicts with string keys, lists, tuples, strings,
    numbers, booleans and None); TypeError for anything else."""
    if _scan_once is None:
        import json

        return json.dumps(value, separators=(",", ":"))
    parts: list[str] = []
    _write(value, parts.append)
    return "".join(parts)


def _write(value: Any, out: Callable[[str], object]) -> None:
    if isinstance(value, str):
        out(_quote(value))
    elif value is None:
        out("null")
    elif value is True:
        out("true")
    elif value is False:
        out("false")
    elif isinstance(value, int):
        out(int.__repr__(value))
    elif isinstance(value, float):
        out(_float_text(value))
    elif isinstance(value, dict):
        out("{")
        for index, (key, item) in enumerate(value.items()):
            if not isinstance(key, str):
                raise TypeError(f"keys must be str, not {type(key).__name__}")
            out(("," if index else "") + _quote(key) + ":")
            _write(item, out)
        out("}")
    elif isinstance(value, (list, tuple)):
        out("[")
        for index, item in enumerate(value):
            if index:
                out(",")
            _write(item, out)
        out("]")
    else:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _float_text(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)
