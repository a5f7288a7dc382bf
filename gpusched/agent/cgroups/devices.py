"""Which device nodes a job may open, given its GPUs' minor numbers."""

from __future__ import annotations

from pathlib import Path

# (kind, major, minor): kind 'c' (character) or 'b' (block); minor None means any.
DeviceRule = tuple[str, int, int | None]

NVIDIA_MAJOR = 195
MAX_MAJOR = (1 << 12) - 1
MAX_MINOR = (1 << 20) - 1
MAX_RULES = 512
NVIDIACTL_MINOR = 255
# Devices every process needs: null, zero, full, random, urandom, tty, ptmx, pts.
BASIC_DEVICES: tuple[DeviceRule, ...] = (
    ("c", 1, 3),
    ("c", 1, 5),
    ("c", 1, 7),
    ("c", 1, 8),
    ("c", 1, 9),
    ("c", 5, 0),
    ("c", 5, 2),
    ("c", 136, None),
)
_DYNAMIC = ("nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps")


def check_rules(rules: list[DeviceRule]) -> None:
    """Raise ValueError, naming the first bad rule, unless every rule is well formed."""
    if len(rules) > MAX_RULES:
        raise ValueError(f"too many device rules: {len(rules)} (at most {MAX_RULES})")
    for rule in rules:
        kind, major, minor = rule
        if (
            kind not in ("c", "b")
            or not 0 <= major <= MAX_MAJOR
            or (minor is not None and not 0 <= minor <= MAX_MINOR)
        ):
            raise ValueError(f"bad device rule: {rule!r}")


def parse_proc_devices(text: str) -> dict[str, int]:
    """Character device names to major numbers, from the text of /proc/devices."""
    majors: dict[str, int] = {}
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if line.endswith(":"):
            section = line
            continue
        parts = line.split(None, 1)
        if section.startswith("Character") and len(parts) == 2 and parts[0].isdigit():
            majors.setdefault(parts[1], int(parts[0]))
    return majors


def gpu_device_rules(
    gpu_minors: set[int] | list[int],
    char_majors: dict[str, int] | None = None,
    cap_minors: set[int] | list[int] | tuple[int, ...] = (),
) -> list[DeviceRule]:
    """The allow-list for a job holding the GPUs with these minors (/dev/nvidiaN = N).

    nvidiactl and the nvidia-uvm devices are always allowed; the nvidia-caps devices
    only for the capability minors given (MIG slices). ``char_majors`` defaults to
    /proc/devices; a driver absent there contributes nothing.
    """
    if char_majors is None:
        char_majors = parse_proc_devices(Path("/proc/devices").read_text())
    rules: list[DeviceRule] = list(BASIC_DEVICES)
    for minor in sorted(set(gpu_minors)):
        if not 0 <= minor < NVIDIACTL_MINOR:
            raise ValueError(f"GPU minor number out of range: {minor}")
        rules.append(("c", NVIDIA_MAJOR, minor))
    rules.append(("c", NVIDIA_MAJOR, NVIDIACTL_MINOR))
    for name in ("nvidia-uvm", "nvidia-uvm-tools"):
        if name in char_majors:
            rules.append(("c", char_majors[name], None))
    if "nvidia-caps" in char_majors:
        for minor in sorted(set(cap_minors)):
            rules.append(("c", char_majors["nvidia-caps"], minor))
    return rules


MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")


def parse_mig_minors(text: str) -> dict[str, int]:
    """The nvidia-caps minors of MIG instances, from the text of
    /proc/driver/nvidia-caps/mig-minors: ``gpu0/gi1/access 12`` -> {"gpu0/gi1": 12}."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].endswith("/access") and parts[1].isdigit():
            minor = int(parts[1])
            if minor <= MAX_MINOR:
                found[parts[0].removesuffix("/access")] = minor
    return found


def mig_cap_minors(table: dict[str, int], parent_minor: int, gi_id: int,
                   ci_id: int) -> list[int]:
    """The capability minors a MIG slice's user needs: its GPU instance's and its
    compute instance's access devices; ValueError when the table lacks either."""
    keys = (f"gpu{parent_minor}/gi{gi_id}", f"gpu{parent_minor}/gi{gi_id}/ci{ci_id}")
    missing = [key for key in keys if key not in table]
    if missing:
        raise ValueError(f"no nvidia-caps minor for {missing[0]} in {MIG_MINORS}")
    return [table[key] for key in keys]
