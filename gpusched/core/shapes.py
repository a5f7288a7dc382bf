"""sbatch's resource options, parsed: ``--gpus [TYPE[|TYPE...]:]N``, ``--gres gpu[:TYPE]:N``,
and memory sizes (``--mem 64G``).

A TYPE is a GPU type as the cluster names them (``a100``, ``h100-80gb``, ``l4``; a
prefix such as ``a100`` takes every A100 variant) or a MIG profile (``1g.10gb``).
"""

from __future__ import annotations

# Patterns, matched through re's own cache: re is loaded by the first check that needs
# one, so gsubmit -G 2 (a plain count) never loads it.
_KIND = r"^[a-z0-9][a-z0-9._+-]*$"
_MIG_PROFILE = r"^\d+g\.\d+gb(\+me)?$"
_MEM = r"(?i)^(\d+)([KMGT]?)B?$"
_MEM_FACTORS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024, "": 1}


def is_mig_profile(kind: str) -> bool:
    """``1g.10gb``, ``3g.40gb``, ``1g.10gb+me``: names of MIG slices, not GPU types."""
    import re

    return re.match(_MIG_PROFILE, kind) is not None


def is_gpu_kind(kind: str) -> bool:
    """Whether ``kind`` is written as a GPU type or MIG profile may be (lower case)."""
    import re

    return re.match(_KIND, kind) is not None


class ShapeError(ValueError):
    """A resource option is malformed."""


def _count(text: str, what: str, whole: str) -> int:
    if not text.isascii() or not text.isdigit():
        raise ShapeError(f"invalid {what} {whole!r}: {text!r} is not a whole number of GPUs")
    if len(text) > 18:  # past any bound (and int()'s limit on digits)
        raise ShapeError(f"invalid {what} {whole[:40]!r}: {text[:24]}... GPUs is too many")
    return int(text)


def parse_kinds(text: str, what: str, whole: str) -> tuple[str, ...]:
    """``a100|H100-80gb`` -> (``a100``, ``h100-80gb``): GPU types or MIG profiles."""
    kinds = tuple(k.strip().lower() for k in text.split("|"))
    for kind in kinds:
        if not is_gpu_kind(kind):
            raise ShapeError(f"invalid {what} {whole!r}: {kind!r} is not a GPU type or MIG "
                             f"profile (such as a100, h100-80gb or 1g.10gb)")
    return kinds


def parse_gpus(text: str, what: str = "--gpus") -> tuple[tuple[str, ...], int]:
    """``2``, ``a100:2``, ``a100|h100:2``, ``1g.10gb:1``: the acceptable kinds and the count."""
    whole = text.strip()
    kinds_text, colon, count_text = whole.rpartition(":")
    if not colon:
        return (), _count(whole, what, whole)
    if not kinds_text:
        raise ShapeError(f"invalid {what} {whole!r}: expected N or TYPE:N")
    return parse_kinds(kinds_text, what, whole), _count(count_text, what, whole)


def parse_gres(text: str) -> tuple[tuple[str, ...], int]:
    """``gpu:2``, ``gpu:a100:2``, ``gpu`` (one GPU): Slurm's generic resource for GPUs."""
    whole = text.strip()
    parts = whole.split(":")
    if parts[0] != "gpu":
        raise ShapeError(f"invalid --gres {whole!r}: only gpu[:TYPE]:N is a resource here")
    if len(parts) == 1:
        return (), 1
    if len(parts) == 2:
        if parts[1].isdigit():
            return (), _count(parts[1], "--gres", whole)
        return parse_kinds(parts[1], "--gres", whole), 1
    if len(parts) == 3:
        return parse_kinds(parts[1], "--gres", whole), _count(parts[2], "--gres", whole)
    raise ShapeError(f"invalid --gres {whole!r}: expected gpu[:TYPE]:N")


def parse_memory(text: str, what: str = "--mem") -> int:
    """A memory size in MiB: ``4096``, ``64G``, ``512M``, ``1T`` (no unit: MiB, as in Slurm)."""
    import re

    match = re.match(_MEM, text.strip())
    if not match:
        raise ShapeError(f"invalid {what} {text.strip()[:60]!r}: expected a size such as 4096, "
                         f"512M, 64G or 1T")
    if len(match.group(1)) > 18:  # past any bound (and int()'s limit on digits)
        raise ShapeError(f"invalid {what} {text.strip()[:40]!r}: too large")
    value = int(match.group(1)) * _MEM_FACTORS[match.group(2).upper()]
    return max(1, round(value)) if int(match.group(1)) else 0
