"""Finding the cgroup hierarchy and the subtree the agent owns."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

V1_CONTROLLERS = ("memory", "cpuset", "devices", "freezer", "pids", "cpuacct")
DEFAULT_BASE = Path("/sys/fs/cgroup")
DEFAULT_NAME = "gpusched"


class CgroupUnavailable(Exception):
    """No cgroup can be made here (no hierarchy, or no permission)."""


class CgroupUnsupported(Exception):
    """The cgroup exists but the controller a setting needs is not available."""


@dataclass(frozen=True)
class CgroupTree:
    """version 2: ``root`` is the owned directory. version 1: ``roots`` maps each
    mounted controller to the owned directory in its hierarchy."""

    version: int
    root: Path | None = None
    roots: dict[str, Path] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        """The tree as a job's spec carries it to the supervisor."""
        return {"version": self.version,
                "root": None if self.root is None else str(self.root),
                "roots": {ctrl: str(path) for ctrl, path in self.roots.items()}}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> CgroupTree:
        """The tree a spec carries; ValueError when it is not one."""
        version, root, roots = data.get("version"), data.get("root"), data.get("roots")
        if version == 2 and isinstance(root, str) and os.path.isabs(root):
            return cls(version=2, root=Path(root))
        if version == 1 and isinstance(roots, dict) and roots and all(
                c in V1_CONTROLLERS and isinstance(p, str) and os.path.isabs(p)
                for c, p in roots.items()):
            return cls(version=1, roots={c: Path(p) for c, p in roots.items()})
        raise ValueError(f"not a cgroup tree: {data!r:.200}")

    def describe(self) -> str:
        """Where the tree is, in words: ``cgroup v2 at /sys/fs/cgroup/...``."""
        if self.version == 2:
            return f"cgroup v2 at {self.root}"
        first = next(iter(self.roots.values()))
        return (f"cgroup v1 at {first.parent.parent}/{{{','.join(self.roots)}}}/"
                f"{first.name}")

    def controllers(self) -> set[str]:
        if self.version == 1:
            return set(self.roots)
        assert self.root is not None
        try:
            return set((self.root / "cgroup.controllers").read_text().split())
        except OSError:
            return set()


def _own_v2_cgroup(base: Path) -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return base / line[3:].lstrip("/")
    return base


def _make(path: Path) -> None:
    try:
        path.mkdir(exist_ok=True)
    except OSError as exc:
        raise CgroupUnavailable(
            f"cannot create cgroup {path}: {exc.strerror}"
        ) from None


def _copy_cpuset(path: Path) -> None:
    for name in ("cpuset.cpus", "cpuset.mems"):
        own = path / name
        if not own.read_text().strip():
            own.write_text((path.parent / name).read_text().strip() or "\n")


def _enable_v2_controllers(path: Path) -> None:
    """Turn on, for the children of ``path``, every controller ``path`` has."""
    try:
        wanted = (path / "cgroup.controllers").read_text().split()
    except OSError:
        return
    for ctrl in wanted:
        if ctrl in ("memory", "cpuset", "pids", "cpu"):
            try:
                (path / "cgroup.subtree_control").write_text(f"+{ctrl}")
            except OSError:
                pass


def detect(
    root: Path | None = None, *, base: Path = DEFAULT_BASE, name: str = DEFAULT_NAME
) -> CgroupTree:
    """Find the hierarchy and make (or reuse) the agent's subtree.

    ``root`` is a configured owned directory: a cgroup v2 directory, or a v1 mount base
    holding one directory per controller. Without it: v2 uses the caller's own cgroup
    (with ``Delegate=yes`` the unit's) plus ``name``; v1 uses ``name`` in each
    controller's hierarchy under ``base``. Raises CgroupUnavailable with the reason.
    """
    if root is not None and (
        (root / "cgroup.controllers").is_file()
        or (root.parent / "cgroup.controllers").is_file()
    ):
        _make(root)
        _enable_v2_controllers(root)
        return CgroupTree(version=2, root=root)
    if root is None and (base / "cgroup.controllers").is_file():
        owned = _own_v2_cgroup(base) / name
        _make(owned)
        _enable_v2_controllers(owned)
        return CgroupTree(version=2, root=owned)
    v1_base = root if root is not None else base
    mounted = [c for c in V1_CONTROLLERS if (v1_base / c / "cgroup.procs").is_file()]
    if not mounted:
        raise CgroupUnavailable(f"no cgroup hierarchy found at {v1_base}")
    roots: dict[str, Path] = {}
    for ctrl in mounted:
        owned = v1_base / ctrl / name
        _make(owned)
        if ctrl == "cpuset":
            _copy_cpuset(owned)
        roots[ctrl] = owned
    if not os.access(next(iter(roots.values())), os.W_OK):
        raise CgroupUnavailable(f"cgroup {next(iter(roots.values()))} is not writable")
    return CgroupTree(version=1, roots=roots)
