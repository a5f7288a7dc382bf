"""Fake NVML for tests: build the C library and drive it from subprocesses.

``tests/fakenvml/fakenvml.c`` is a small C implementation of the parts of
the NVML API that pynvml wraps.  Built as ``libnvidia-ml.so.1`` and put
first on ``LD_LIBRARY_PATH``, it lets the *real* pynvml, in a subprocess,
see an invented GPU inventory (a JSON file, see
``tests/fakenvml/README.md``) and faults injected at run time.

pynvml loads the library once per process with ``ctypes.CDLL`` and the
dynamic loader reads ``LD_LIBRARY_PATH`` only at process start, so code that
talks to the fake must run in a child process started with
:meth:`FakeNvml.env`.

Typical use::

    def test_something(fake_nvml_factory):
        fake = fake_nvml_factory("dgx_a100_8.json")
        proc = subprocess.Popen([...], env=fake.env())
        fake.inject("xid 3 79")
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

FAKENVML_DIR = Path(__file__).resolve().parent / "fakenvml"
INVENTORY_DIR = FAKENVML_DIR / "inventories"
REPL_SCRIPT = FAKENVML_DIR / "nvml_repl.py"
LIB_NAME = "libnvidia-ml.so.1"

#: Compiler flags; part of the cache key.
CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra")
LDLIBS = ("-lpthread",)


def host_has_gpus() -> bool:
    """Whether NVML finds a GPU on this host without the fake library (a GPU machine):
    the agent's own discovery, in a child process."""
    probe = subprocess.run([sys.executable, "-c", (
        "from gpusched.agent.nvml import discover\n"
        "import sys\n"
        "try:\n    sys.exit(0 if discover().gpus else 1)\n"
        "except Exception:\n    sys.exit(1)\n")],
        env={k: v for k, v in os.environ.items() if not k.startswith("FAKENVML")},
        capture_output=True, timeout=60)
    return probe.returncode == 0


def _sources() -> list[Path]:
    return sorted(p for p in FAKENVML_DIR.iterdir() if p.suffix in (".c", ".h"))


def _compiler() -> str | None:
    cc = os.environ.get("CC", "gcc")
    return shutil.which(cc)


def fake_nvml_build_key() -> str:
    """sha256 over the C sources (names and contents) and the compiler flags."""
    h = hashlib.sha256()
    h.update(repr((CFLAGS, LDLIBS, os.environ.get("CC", "gcc"))).encode())
    for src in _sources():
        h.update(src.name.encode() + b"\0")
        h.update(src.read_bytes() + b"\0")
    return h.hexdigest()


def build_fake_nvml(cache_dir: Path) -> Path:
    """Compile the fake library (once per source hash) and return its directory.

    The result lives in ``cache_dir/fakenvml-<sha256 prefix>/libnvidia-ml.so.1``.
    Each build goes to a private temporary directory that is then renamed
    into place, so concurrent builders (pytest-xdist workers) never see a
    half-written library: the first rename wins and the others discard their
    copy.
    """
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set CC or install gcc)")
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    final = cache_dir / f"fakenvml-{fake_nvml_build_key()[:24]}"
    if (final / LIB_NAME).is_file():
        return final

    tmp = Path(tempfile.mkdtemp(prefix=".fakenvml-build-", dir=cache_dir))
    try:
        cmd = [cc, *CFLAGS, "-o", str(tmp / LIB_NAME), *map(str, _c_files()), *LDLIBS]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise RuntimeError(f"building the fake NVML failed:\n$ {' '.join(cmd)}\n{res.stderr}")
        (tmp / "build.log").write_text(" ".join(cmd) + "\n" + res.stderr)
        tmp.chmod(0o755)  # mkdtemp makes it private; daemons under test may run as others
        try:
            os.rename(tmp, final)
        except OSError:
            # Somebody else renamed theirs first; theirs is as good as ours.
            if not (final / LIB_NAME).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _c_files() -> list[Path]:
    return [p for p in _sources() if p.suffix == ".c"]


def inventory_path(name: str | Path) -> Path:
    """A bundled inventory by file name (``"dgx_a100_8.json"``), or a path."""
    p = Path(name)
    if not p.is_absolute() and (INVENTORY_DIR / p).is_file():
        return INVENTORY_DIR / p
    return p.resolve()


class FakeNvml:
    """One fake node: the library directory, an inventory and a fault file."""

    def __init__(self, lib_dir: Path, inventory: str | Path, fault_path: Path) -> None:
        self.lib_dir = Path(lib_dir)
        self.inventory_path = inventory_path(inventory)
        self.fault_path = Path(fault_path)
        self.fault_path.parent.mkdir(parents=True, exist_ok=True)
        self.fault_path.touch()

    @property
    def inventory(self) -> dict[str, Any]:
        """The inventory JSON as a dict (handy for expected values)."""
        data: dict[str, Any] = json.loads(self.inventory_path.read_text())
        return data

    def variables(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Just the three variables the fake needs, LD_LIBRARY_PATH prepended."""
        base = os.environ if base is None else base
        old = base.get("LD_LIBRARY_PATH", "")
        return {
            "LD_LIBRARY_PATH": str(self.lib_dir) + (os.pathsep + old if old else ""),
            "FAKENVML_CONFIG": str(self.inventory_path),
            "FAKENVML_FAULTS": str(self.fault_path),
        }

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """A complete environment for a subprocess: ``base`` (default
        ``os.environ``) plus :meth:`variables`."""
        base = os.environ if base is None else base
        env = dict(base)
        env.update(self.variables(base))
        return env

    def inject(self, line: str) -> None:
        """Append one fault line (see README.md) to the fault file.

        A single ``write`` on an ``O_APPEND`` descriptor, then ``fsync``:
        readers never see half a line mixed with another writer's.
        """
        line = line.strip()
        if not line or "\n" in line or "\r" in line:
            raise ValueError(f"a fault is one non-empty line, got {line!r}")
        data = (line + "\n").encode()
        fd = os.open(self.fault_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, data)
            if written != len(data):  # pragma: no cover - tiny writes are atomic
                raise OSError(f"short write to {self.fault_path}")
            os.fsync(fd)
        finally:
            os.close(fd)

    def repl(self, *args: str, timeout: float = 20.0) -> PynvmlRepl:
        """Start ``nvml_repl.py`` (real pynvml) against this fake node."""
        return PynvmlRepl(self, list(args), timeout=timeout)


class PynvmlRepl:
    """A child Python process running the real pynvml against the fake.

    It speaks JSON lines (see ``tests/fakenvml/nvml_repl.py``): on start it
    initialises NVML, registers events on every GPU, and reports
    ``{"ready": ...}``; then each request gets one reply.
    """

    def __init__(self, fake: FakeNvml, args: list[str], timeout: float = 20.0) -> None:
        self.timeout = timeout
        self.proc = subprocess.Popen(
            [sys.executable, str(REPL_SCRIPT), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=fake.env(),
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self._lines), daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()
        self.hello = self._read()

    def _pump(self, stream: Any, out: queue.Queue[str | None]) -> None:
        for line in stream:
            out.put(line)
        out.put(None)

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    def _read(self, timeout: float | None = None) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=self.timeout if timeout is None else timeout)
        except queue.Empty:
            raise TimeoutError(f"no reply from nvml_repl.py; stderr:\n{self.stderr}") from None
        if line is None:
            self.proc.wait(5)
            raise RuntimeError(f"nvml_repl.py exited ({self.proc.returncode}); stderr:\n{self.stderr}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def send(self, request: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def request(self, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        self.send(request)
        return self._read(timeout)

    def reply(self, timeout: float | None = None) -> dict[str, Any]:
        """The reply to an earlier :meth:`send`."""
        return self._read(timeout)

    def call(self, fn: str, *args: Any, gpu: int | None = None, mig: int | None = None) -> dict[str, Any]:
        """Call ``pynvml.<fn>``; ``gpu``/``mig`` put a device handle first.

        Returns ``{"ok": value}`` or ``{"error": "NVMLError_..."}``.
        """
        req: dict[str, Any] = {"op": "call", "fn": fn, "args": list(args)}
        if gpu is not None:
            req["gpu"] = gpu
        if mig is not None:
            req["mig"] = mig
        return self.request(req)

    def wait(self, timeout_ms: int) -> dict[str, Any]:
        """``nvmlEventSetWait`` on the REPL's event set."""
        return self.request({"op": "wait", "timeout_ms": timeout_ms},
                            timeout=timeout_ms / 1000 + self.timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"op": "exit"})
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass

    def __enter__(self) -> PynvmlRepl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------
# pytest fixtures


def _cache_dir(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = getattr(config, "cache", None)
    if cache is not None:
        # .pytest_cache/d/fakenvml: survives between runs, shared by workers.
        return Path(cache.mkdir("fakenvml"))
    # Without the cache plugin: the run's base temp dir, which all xdist
    # workers of this run share (each worker's basetemp is a child of it).
    return tmp_path_factory.getbasetemp().parent / "fakenvml-cache"


@pytest.fixture(scope="session")
def fake_nvml_lib(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory holding the built fake ``libnvidia-ml.so.1``."""
    if _compiler() is None:  # gcc is part of the test machine: its absence is a failure
        pytest.fail(f"no C compiler ({os.environ.get('CC', 'gcc')}) to build the fake NVML library")
    return build_fake_nvml(_cache_dir(request.config, tmp_path_factory))


@pytest.fixture
def fake_nvml_factory(fake_nvml_lib: Path, tmp_path: Path) -> Iterator[Callable[..., FakeNvml]]:
    """``make(inventory, name="node")`` -> a :class:`FakeNvml` with its own
    fault file under the test's tmp_path."""
    made: list[FakeNvml] = []

    def make(inventory: str | Path = "dgx_a100_8.json", name: str | None = None) -> FakeNvml:
        name = name or f"node{len(made)}"
        fake = FakeNvml(fake_nvml_lib, inventory, tmp_path / f"{name}.faults")
        made.append(fake)
        return fake

    yield make


@pytest.fixture
def fake_nvml(fake_nvml_factory: Callable[..., FakeNvml]) -> FakeNvml:
    """A fake 8 × A100 DGX node (``dgx_a100_8.json``)."""
    return fake_nvml_factory("dgx_a100_8.json")


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0, interval: float = 0.02) -> bool:
    """Poll ``predicate`` until true or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
