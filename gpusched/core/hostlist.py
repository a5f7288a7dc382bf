"""Slurm-style host lists: ``gpu[01-16,20],login1`` <-> a list of node names (pure)."""

from __future__ import annotations

import re
from collections.abc import Iterable

_PLAIN = re.compile(r"^[A-Za-z0-9_.-]+$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_SPLIT = re.compile(r"^(.*?)(\d+)$")
MAX_HOSTS = 100_000
MAX_DIGITS = 18  # a host number's digits: far past any cluster, well within int()


class HostlistError(ValueError):
    """The text is not a valid host list."""


def _top_level_items(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    items, depth, current = [], 0, ""
    for char in text:
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested brackets in host list {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in host list {text!r}")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise HostlistError(f"unbalanced '[' in host list {text!r}")
    items.append(current)
    return items


def _expand_item(item: str) -> list[str]:
    match = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)", item)
    if match is None:
        if not _PLAIN.fullmatch(item):
            raise HostlistError(f"invalid host name {item!r}")
        return [item]
    prefix, ranges, suffix = match.groups()
    if not (_PLAIN.fullmatch(prefix) or prefix == "") or not (_PLAIN.fullmatch(suffix)
                                                                or suffix == ""):
        raise HostlistError(f"invalid host name around {'[' + ranges + ']'!r} in {item!r}")
    names: list[str] = []
    for part in ranges.split(","):
        bounds = _RANGE.match(part.strip())
        if bounds is not None and max(len(b or "") for b in bounds.groups()) > MAX_DIGITS:
            raise HostlistError(f"invalid range {part!r} in {item!r}: a host number has at "
                                f"most {MAX_DIGITS} digits")
        if bounds is None:
            raise HostlistError(f"invalid range {part!r} in {item!r}: expected N or N-M")
        first, last = bounds.group(1), bounds.group(2) or bounds.group(1)
        if int(last) < int(first):
            raise HostlistError(f"range {part!r} in {item!r} runs backwards")
        if int(last) - int(first) + len(names) >= MAX_HOSTS:
            raise HostlistError(f"host list {item!r} names more than {MAX_HOSTS} hosts")
        width = len(first) if first.startswith("0") else 0
        names += [f"{prefix}{n:0{width}d}{suffix}" for n in range(int(first), int(last) + 1)]
    return names


def expand_hostlist(text: str) -> list[str]:
    """Node names of a host list, in order, without duplicates."""
    if not text.strip():
        raise HostlistError("empty host list")
    names: list[str] = []
    for item in _top_level_items(text.strip()):
        names += _expand_item(item.strip())
    return list(dict.fromkeys(names))


def compress_hostlist(names: Iterable[str]) -> str:
    """The shortest usual host-list form: runs of numbered names folded into brackets."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    order: list[tuple[str, int] | str] = []
    for name in dict.fromkeys(names):
        match = _SPLIT.match(name)
        if match is None or len(match[2]) > MAX_DIGITS:
            plain.append(name)
            order.append(name)
            continue
        prefix, digits = match.groups()
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        key = (prefix, width)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(digits))
    parts = []
    for entry in order:
        if isinstance(entry, str):
            parts.append(entry)
            continue
        prefix, width = entry
        numbers = sorted(set(groups[entry]))
        if len(numbers) == 1:
            parts.append(f"{prefix}{numbers[0]:0{width}d}")
            continue
        parts.append(f"{prefix}[{','.join(_runs(numbers, width))}]")
    return ",".join(parts)


def _runs(numbers: list[int], width: int) -> list[str]:
    runs, start = [], numbers[0]
    for previous, current in zip(numbers, numbers[1:] + [None]):
        if current is None or current != previous + 1:
            runs.append(f"{start:0{width}d}" if start == previous
                        else f"{start:0{width}d}-{previous:0{width}d}")
            start = current if current is not None else start
    return runs
