"""One job's cgroup: create, add processes, set limits, kill everything, read usage."""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from gpusched.agent.cgroups import bpf
from gpusched.agent.cgroups.devices import DeviceRule, check_rules
from gpusched.agent.cgroups.tree import CgroupTree, CgroupUnavailable, CgroupUnsupported

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass(frozen=True)
class Usage:
    peak_memory: int | None  # bytes
    cpu_usec: int | None
    oom_killed: bool | None  # None: this hierarchy cannot tell


def format_cpus(cpus: set[int]) -> str:
    """{0,1,2,5} -> "0-2,5"."""
    out: list[str] = []
    ordered = sorted(cpus)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def read_file(path: Path) -> str:
    """A control file's text. The os calls, not a text file object: a job supervisor,
    forked from the spawner, copies each page it touches, and a file object touches
    many."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def write_file(path: Path, text: str) -> None:
    """Write a control file in one write (made if missing, as Path.write_text would)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read_int(path: Path) -> int | None:
    try:
        text = read_file(path).strip()
    except OSError:
        return None
    return None if text == "max" else int(text)


def _keyed(path: Path) -> dict[str, int]:
    try:
        lines = read_file(path).splitlines()
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


class JobCgroup:
    """A job's cgroup: one directory under v2, one per mounted controller under v1."""

    def __init__(self, tree: CgroupTree, name: str, paths: dict[str, Path]) -> None:
        self.tree = tree
        self.name = name
        self.paths = paths  # v2: {"": dir}; v1: controller -> dir

    @classmethod
    def create(cls, tree: CgroupTree, name: str) -> JobCgroup:
        if (
            not name
            or len(name) > 64
            or not set(name) <= _NAME_CHARS
            or name.startswith(".")
        ):
            raise ValueError(f"bad cgroup name: {name!r}")
        if tree.version == 2:
            assert tree.root is not None
            bases = {"": tree.root}
        else:
            bases = dict(tree.roots)
        paths: dict[str, Path] = {}
        job = cls(tree, name, paths)
        try:
            for ctrl, base in bases.items():
                path = base / name
                path.mkdir()
                paths[ctrl] = path
                if ctrl == "cpuset":
                    for f in ("cpuset.cpus", "cpuset.mems"):
                        write_file(path / f, read_file(base / f).strip() or "\n")
        except OSError as exc:
            job.remove()
            raise CgroupUnavailable(
                f"cannot create the job's cgroup {name}: {exc.strerror or exc}"
            ) from None
        return job

    @classmethod
    def existing(cls, tree: CgroupTree, name: str) -> JobCgroup:
        """The job cgroup ``name`` as far as it still exists (to kill and remove it)."""
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"bad cgroup name: {name!r}")
        bases = {"": tree.root} if tree.version == 2 else dict(tree.roots)
        paths = {ctrl: base / name for ctrl, base in bases.items()
                 if base is not None and (base / name).is_dir()}
        return cls(tree, name, paths)

    def _v2(self) -> Path:
        return self.paths[""]

    def _procs_file(self) -> Path:
        if self.tree.version == 2:
            return self._v2() / "cgroup.procs"
        return next(iter(self.paths.values())) / "cgroup.procs"

    def add(self, pid: int) -> None:
        for path in self.paths.values():
            write_file(path / "cgroup.procs", str(pid))

    def enter(self) -> None:
        """Move the calling process, which must have a single thread (a child just
        forked), into the cgroup. Under v1 its one thread moves through ``tasks`` as
        ``0`` (itself): the kernel then skips its global thread-group lock, whose taking
        waits for an RCU grace period (about 15 ms per move here), which moving a pid
        through ``cgroup.procs`` cannot."""
        name = "tasks" if self.tree.version == 1 else "cgroup.procs"
        for path in self.paths.values():
            # os-level: the forked child copies every page it touches, and a text
            # file object touches many
            fd = os.open(os.path.join(path, name), os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.paths.values():
            try:
                found.update(
                    int(p) for p in read_file(path / "cgroup.procs").split()
                )
            except FileNotFoundError:
                pass
        return found

    def set_memory(self, limit_bytes: int, swap: bool = False) -> None:
        if limit_bytes <= 0:
            raise ValueError("memory limit must be positive")
        if self.tree.version == 2:
            path = self._v2()
            if not (path / "memory.max").exists():
                raise CgroupUnsupported(
                    "the memory controller is not enabled in this cgroup v2 tree"
                )
            write_file(path / "memory.max", str(limit_bytes))
            if not swap and (path / "memory.swap.max").exists():
                write_file(path / "memory.swap.max", "0")
            return
        if "memory" not in self.paths:
            raise CgroupUnsupported("the cgroup v1 memory controller is not mounted")
        path = self.paths["memory"]
        memsw = path / "memory.memsw.limit_in_bytes"
        limit = path / "memory.limit_in_bytes"
        if memsw.exists():
            # memsw must stay >= the limit: raise it first when growing, last when shrinking
            current = _read_int(limit) or 0
            if swap:
                write_file(memsw, "-1")
                write_file(limit, str(limit_bytes))
            elif limit_bytes > current:
                write_file(memsw, str(limit_bytes))
                write_file(limit, str(limit_bytes))
            else:
                write_file(limit, str(limit_bytes))
                write_file(memsw, str(limit_bytes))
        else:
            write_file(limit, str(limit_bytes))
            if not swap:
                write_file(path / "memory.swappiness", "0")

    def set_cpus(self, cpus: set[int], mems: set[int] | None = None) -> None:
        if not cpus:
            raise ValueError("a cpuset needs at least one CPU")
        path = self._v2() if self.tree.version == 2 else self.paths.get("cpuset")
        if path is None or not (path / "cpuset.cpus").exists():
            raise CgroupUnsupported("the cpuset controller is not available")
        if mems:
            write_file(path / "cpuset.mems", format_cpus(mems))
        write_file(path / "cpuset.cpus", format_cpus(cpus))

    def allow_devices(self, rules: list[DeviceRule]) -> None:
        """Only these devices may be opened (read, written, or made with mknod)."""
        check_rules(rules)
        if self.tree.version == 2:
            prog = bpf.load_device_program(rules)
            try:
                fd = os.open(self._v2(), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                try:
                    bpf.attach_device_program(fd, prog)
                finally:
                    os.close(fd)
            finally:
                os.close(prog)
            return
        if "devices" not in self.paths:
            raise CgroupUnsupported("the cgroup v1 devices controller is not mounted")
        path = self.paths["devices"]
        write_file(path / "devices.deny", "a")
        for kind, major, minor in rules:
            write_file(path / "devices.allow",
                       f"{kind} {major}:{'*' if minor is None else minor} rwm")

    def kill(self, timeout: float = 10.0, *, freeze: bool = False) -> None:
        """Kill every process in the job; returns once the cgroup is empty.

        v2 writes cgroup.kill where the kernel has it (5.14+); otherwise, or with
        ``freeze``, the job is frozen, every process SIGKILLed, then thawed."""
        if not self.paths or not self.pids():
            return  # an empty cgroup gains no process by itself
        if (
            not freeze
            and self.tree.version == 2
            and (self._v2() / "cgroup.kill").exists()
        ):
            write_file(self._v2() / "cgroup.kill", "1")
        else:
            self._freeze(True)
            try:
                for _ in range(3):
                    pids = self.pids()
                    if not pids:
                        break
                    for pid in pids:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
            finally:
                self._freeze(False)
        deadline = time.monotonic() + timeout
        while True:
            pids = self.pids()
            if not pids:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"cgroup {self.name} still holds {len(pids)} process(es)"
                )
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.002)

    def can_freeze(self) -> bool:
        """Whether the cgroup exists and has a freezer (v2 cgroup.freeze, v1 freezer)."""
        if self.tree.version == 2:
            return "" in self.paths and (self._v2() / "cgroup.freeze").exists()
        return "freezer" in self.paths

    def set_frozen(self, frozen: bool) -> None:
        """Freeze every process of the job (gcontrol suspend), or thaw them."""
        self._freeze(frozen)

    def _freeze(self, frozen: bool) -> None:
        """Freeze (v1 freezer, v2 cgroup.freeze) so no process forks while being killed."""
        deadline = time.monotonic() + 2.0
        if self.tree.version == 2:
            control = self._v2() / "cgroup.freeze"
            if not control.exists():
                return
            write_file(control, "1" if frozen else "0")
            while (
                frozen and "frozen 1" not in read_file(self._v2() / "cgroup.events")
            ):
                if time.monotonic() > deadline:
                    return
                time.sleep(0.001)
            return
        freezer = self.paths.get("freezer")
        if freezer is None:
            return
        write_file(freezer / "freezer.state", "FROZEN" if frozen else "THAWED")
        while frozen and read_file(freezer / "freezer.state").strip() != "FROZEN":
            if time.monotonic() > deadline:
                return
            time.sleep(0.001)

    def usage(self) -> Usage:
        if self.tree.version == 2:
            path = self._v2()
            peak = _read_int(path / "memory.peak")
            if peak is None:
                peak = _read_int(path / "memory.current")
            cpu = _keyed(path / "cpu.stat").get("usage_usec")
            events = _keyed(path / "memory.events")
            killed = events["oom_kill"] > 0 if "oom_kill" in events else None
            return Usage(peak, cpu, killed)
        peak = None
        oom: bool | None = None
        mem = self.paths.get("memory")
        if mem is not None:
            peak = _read_int(mem / "memory.max_usage_in_bytes")
            control = _keyed(mem / "memory.oom_control")
            if "oom_kill" in control:
                oom = control["oom_kill"] > 0
            else:
                fail = _read_int(mem / "memory.failcnt")
                oom = None if fail is None else fail > 0
        cpu = None
        acct = self.paths.get("cpuacct")
        if acct is not None:
            ns = _read_int(acct / "cpuacct.usage")
            cpu = None if ns is None else ns // 1000
        return Usage(peak, cpu, oom)

    def remove(self, timeout: float = 5.0) -> None:
        """Remove the job's directories (they must be empty of processes)."""
        for path in list(self.paths.values()):
            deadline = time.monotonic() + timeout
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        raise
                    time.sleep(0.002)
        self.paths.clear()
