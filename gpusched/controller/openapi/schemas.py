"""JSON Schemas of what the field readers of ``gpusched.messages.fields`` take, from
their evaluated arguments, and of a dataclass field's type (for the OpenAPI document,
gpusched.controller.openapi; ``reading`` finds the calls)."""

from __future__ import annotations

import types
import typing
from datetime import datetime
from typing import Any

from gpusched.core import bounds

__all__ = ["PRINTABLE", "READERS", "hint_schema", "reader_schema"]

# Printable one-line text: what gpusched.core.bounds.check_text takes, approximately
# (C0 and C1 controls out; format and unassigned characters it also refuses).
PRINTABLE = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"


def hint_schema(hint: Any) -> dict[str, Any]:
    """A dataclass field's type as a JSON Schema type."""
    kinds: list[str] = []
    for arg in typing.get_args(hint) if _is_union(hint) else (hint,):
        origin = typing.get_origin(arg) or arg
        kind = {int: "integer", float: "number", str: "string", bool: "boolean",
                tuple: "array", list: "array", dict: "object", datetime: "string",
                type(None): "null"}.get(origin)
        if kind is None:
            return {}
        if kind not in kinds:
            kinds.append(kind)
    if "integer" in kinds and "number" in kinds:
        kinds.remove("integer")
    return {"type": kinds[0] if len(kinds) == 1 else kinds}


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _nullable(kind: str, nullable: bool) -> Any:
    return [kind, "null"] if nullable else kind


def _text(high: Any, nullable: bool) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": _nullable("string", nullable), "minLength": 1,
                              "pattern": PRINTABLE}
    if isinstance(high, int):
        schema["maxLength"] = high
    return schema


def _integer(low: Any, high: Any, nullable: bool) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": _nullable("integer", nullable)}
    if isinstance(low, int):
        schema["minimum"] = low
    if isinstance(high, int):
        schema["maximum"] = high
    return schema


_KINDS = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array",
          dict: "object"}


def reader_schema(name: str, args: list[Any]) -> tuple[dict[str, Any], bool] | None:
    """The schema and whether required of ``fields.<name>(body, key, *args)``, from its
    evaluated arguments (``...`` where one could not be evaluated)."""
    def arg(i: int) -> Any:
        return args[i] if i < len(args) else ...
    if name == "integer":  # the default left out
        return _integer(arg(0), arg(1), True), False
    if name == "required_integer":
        return _integer(arg(0), arg(1), False), True
    if name == "optional_integer":
        return _integer(arg(0), arg(1), True), False
    if name in ("text", "required_text"):
        return _text(arg(0), name == "text"), name == "required_text"
    if name == "path":
        return _text(bounds.PATH_MAX - 1, True), False
    if name == "flag":
        return {"type": ["boolean", "null"]}, False
    if name == "words":
        items = _text(bounds.MAX_WORD, False)
        schema = {"type": ["array", "null"], "items": items}
        if isinstance(arg(0), int):
            schema["maxItems"] = arg(0)
        return schema, False
    if name == "strings":
        return {"type": ["array", "null"], "items": {"type": "string"}}, False
    if name == "string_map":
        return {"type": ["object", "null"], "additionalProperties": {"type": "string"}}, False
    if name == "one_of":
        choices = arg(0)
        return ({"enum": sorted(choices)} if isinstance(choices, (tuple, list, set, frozenset))
                else {"type": "string"}), True
    if name == "typed":
        kind = _KINDS.get(arg(0))
        return ({"type": [kind, "null"]} if kind else {}), False
    return None


READERS = frozenset({"integer", "required_integer", "optional_integer", "text",
                     "required_text", "path", "flag", "words", "strings", "string_map",
                     "one_of", "typed"})
