"""GPUs shared by MPS on this node: one MPS control daemon per GPU, and what a job that
holds a share of one is told.

A GPU whose jobs share it by MPS (``LaunchOrder.share``, mode "mps") gets a control
daemon of its own, ``nvidia-cuda-mps-control -d`` (the ``[agent] mps_control``
program), started with ``CUDA_VISIBLE_DEVICES`` set to the GPU's UUID and a pipe and a
log directory of its own, ``<state_dir>/mps/<uuid>/{pipe,log}`` (root's, 0755). It is
started before the first MPS job on the GPU is launched and told ``quit`` (``echo quit
| nvidia-cuda-mps-control`` with the same pipe directory) once no job here needs it.

The job directories are the truth, as for the launcher: a job needs its GPU's daemon
from its launch until its status.json is written. So a restarted agent keeps the
daemons its surviving jobs use, and stops those a previous run left that no job needs.
The daemon says it runs by the pid file it writes in its pipe directory
(``nvidia-cuda-mps-control.pid``), which must name a live process of that program.

Jobs get ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY`` (the daemon's),
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (their units in percent of the GPU's, rounded up)
and, with a memory share, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``. A shard job gets the GPU
with no limit, as under Slurm, and variables that say so. See docs/gpu-sharing.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpusched.messages.agent import GPU_UUID, ShareGrant

log = logging.getLogger(__name__)

MPS_DIR = "mps"  # under the agent's state directory
PID_FILE = "nvidia-cuda-mps-control.pid"  # what the daemon writes in its pipe directory
DAEMON_FILE = "daemon.json"  # which GPU and program a daemon directory is for
START_OUTPUT = "control-start.out"  # what ``-d`` printed, in the log directory
START_TIMEOUT = 20.0  # seconds for ``-d`` to return and the daemon's pid file to appear
QUIT_TIMEOUT = 10.0  # seconds for ``quit`` to be taken and the daemon to exit
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class MpsError(Exception):
    """A GPU's MPS control daemon cannot be had: the job that needs it fails to launch."""


def daemon_dir(root: Path, gpu_uuid: str) -> Path:
    """The directory of a GPU's daemon under ``root`` (``<state_dir>/mps``): named for
    its UUID, the ``/`` of the older MIG form as ``_`` (which no UUID holds)."""
    if not GPU_UUID.fullmatch(gpu_uuid):
        raise MpsError(f"{gpu_uuid!r} is not a GPU UUID")
    return root / gpu_uuid.replace("/", "_")


def thread_percentage(units: int, of: int) -> int:
    """A share's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: its units in percent, rounded up,
    from 1 to 100."""
    return max(1, min(100, -(-units * 100 // of)))


def share_environment(share: ShareGrant | None, state_dir: Path) -> dict[str, str]:
    """The variables a job with this share gets (none without one)."""
    if share is None:
        return {}
    units = f"{share.units}/{share.of}"
    if share.mode == "shard":
        # Not enforced: the job may use the whole GPU; Slurm's variable says how many
        # shards it holds, for a program that limits itself.
        return {"GPUSCHED_GPU_SHARE": f"shard:{units}", "SLURM_SHARDS_ON_NODE": str(share.units)}
    directory = daemon_dir(state_dir / MPS_DIR, share.gpu_uuid)
    env = {"GPUSCHED_GPU_SHARE": f"mps:{units}",
           "CUDA_MPS_PIPE_DIRECTORY": str(directory / "pipe"),
           "CUDA_MPS_LOG_DIRECTORY": str(directory / "log"),
           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(thread_percentage(share.units, share.of))}
    if share.mem_mb:
        # "<device ordinal>=<limit>": the job sees its one GPU as device 0.
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={share.mem_mb}M"
    return env


def spec_entry(share: ShareGrant | None, control: str) -> dict[str, str] | None:
    """What a job's spec records for the launcher: the GPU whose daemon it needs and
    the program that runs it; None unless the job shares its GPU by MPS."""
    if share is None or share.mode != "mps":
        return None
    return {"gpu": share.gpu_uuid, "control": control}


def needed_gpus(jobs_dir: Path) -> set[str]:
    """The GPUs whose daemon a job here needs: those of the MPS jobs launched and not
    ended (no status.json)."""
    found: set[str] = set()
    try:
        entries = list(os.scandir(jobs_dir))
    except FileNotFoundError:
        return found
    for entry in entries:
        if not entry.name.isdigit() or not entry.is_dir(follow_symlinks=False):
            continue
        jobdir = Path(entry.path)
        if (jobdir / "status.json").exists():
            continue
        spec = _read_json(jobdir / "spec.json")
        need = spec.get("mps") if spec else None
        if isinstance(need, dict) and isinstance(need.get("gpu"), str):
            found.add(need["gpu"])
    return found


class MpsDaemons:
    """Starts and stops the MPS control daemons under ``root`` (``<state_dir>/mps``).

    The launcher calls ``ensure`` before it starts an MPS job and ``release`` after a
    job ends and at start, each under its launch lock, so a daemon is never stopped
    between the check and the start of a job that needs it."""

    def __init__(self, root: Path, start_timeout: float = START_TIMEOUT) -> None:
        self.root = Path(root)
        self.start_timeout = start_timeout

    def ensure(self, need: Mapping[str, Any] | None) -> None:
        """Have the daemon a job's spec entry (``spec_entry``) names running; MpsError
        when it cannot be started. Nothing for a job without one."""
        if need is None:
            return
        gpu, control = need.get("gpu"), need.get("control")
        if not isinstance(gpu, str) or not isinstance(control, str):
            raise MpsError(f"the job's MPS entry is not understood: {dict(need)!r}")
        directory = daemon_dir(self.root, gpu)
        if self.running(directory) is not None:
            return
        self._start(directory, gpu, control)

    def release(self, jobs_dir: Path) -> list[str]:
        """Stop each running daemon no job in ``jobs_dir`` needs; the GPUs stopped."""
        running = {}
        for directory in self._daemon_dirs():
            if self.running(directory) is not None:
                running[directory] = _read_json(directory / DAEMON_FILE) or {}
        if not running:
            return []
        needed = needed_gpus(jobs_dir)
        stopped = []
        for directory, info in running.items():
            gpu = info.get("gpu")
            if gpu not in needed:
                self._quit(directory, str(gpu), str(info.get("control")))
                stopped.append(str(gpu))
        return stopped

    def running(self, directory: Path) -> int | None:
        """The pid of the directory's live daemon, or None."""
        try:
            pid = int((directory / "pipe" / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        info = _read_json(directory / DAEMON_FILE) or {}
        program = os.path.basename(str(info.get("control", "")))
        return pid if pid > 0 and program and _runs(pid, program) else None

    # ------------------------------------------------------------ start, quit

    def _start(self, directory: Path, gpu: str, control: str) -> None:
        program = _resolve(control)
        if program is None:
            raise MpsError(f"cannot start the MPS control daemon for GPU {gpu}: no program "
                           f"{control!r} (agent.mps_control) on the agent's PATH")
        pipe, logs = directory / "pipe", directory / "log"
        for path in (self.root, directory, pipe, logs):
            _root_dir(path)
        _write_json(directory / DAEMON_FILE, {"gpu": gpu, "control": program})
        with contextlib.suppress(FileNotFoundError):
            (pipe / PID_FILE).unlink()  # a dead daemon's: not to be read as the new one's
        timeout = self.start_timeout
        deadline = time.monotonic() + timeout
        output = logs / START_OUTPUT
        try:
            with open(output, "wb") as out:  # a file, not a pipe: the daemon may keep it
                done = subprocess.run([program, "-d"], env=_environment(gpu, directory),
                                      stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                      cwd="/", start_new_session=True, timeout=timeout,
                                      check=False)
        except subprocess.TimeoutExpired:
            raise MpsError(f"cannot start the MPS control daemon for GPU {gpu}: {program} -d "
                           f"did not return within {timeout:g} s") from None
        except OSError as exc:
            raise MpsError(f"cannot start the MPS control daemon for GPU {gpu}: {exc}") from None
        if done.returncode != 0:
            said = _first_line(output)
            raise MpsError(f"cannot start the MPS control daemon for GPU {gpu}: {program} -d "
                           f"exited with status {done.returncode}" + (f": {said}" if said else ""))
        while self.running(directory) is None:
            if time.monotonic() >= deadline:
                raise MpsError(f"the MPS control daemon for GPU {gpu} did not start within "
                               f"{timeout:g} s: no live daemon in {pipe / PID_FILE}")
            time.sleep(0.02)
        log.info("MPS control daemon for GPU %s started (pid %s)", gpu, self.running(directory))

    def _quit(self, directory: Path, gpu: str, program: str) -> None:
        """Tell a daemon to quit and wait a little for it to go; failures are logged."""
        pid = self.running(directory)
        try:
            done = subprocess.run([program], input=b"quit\n", env=_environment(gpu, directory),
                                  capture_output=True, cwd="/", timeout=QUIT_TIMEOUT,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("MPS control daemon for GPU %s: cannot tell it to quit: %s", gpu, exc)
            return
        if done.returncode != 0:
            log.warning("MPS control daemon for GPU %s: quit failed with status %d: %s", gpu,
                        done.returncode, done.stderr.decode(errors="replace").strip()[:200])
            return
        deadline = time.monotonic() + QUIT_TIMEOUT
        while self.running(directory) is not None:
            if time.monotonic() >= deadline:
                log.warning("MPS control daemon for GPU %s (pid %s) still runs %g s after quit",
                            gpu, pid, QUIT_TIMEOUT)
                return
            time.sleep(0.02)
        log.info("MPS control daemon for GPU %s stopped", gpu)

    def _daemon_dirs(self) -> list[Path]:
        try:
            return [Path(e.path) for e in os.scandir(self.root)
                    if e.is_dir(follow_symlinks=False) and GPU_UUID.fullmatch(
                        e.name.replace("_", "/"))]
        except FileNotFoundError:
            return []


def _environment(gpu: str, directory: Path) -> dict[str, str]:
    """The daemon's environment (and its client's, to quit it): its GPU and directories,
    and the agent's PATH and library path, nothing else of the agent's."""
    env = {"PATH": os.environ.get("PATH") or DEFAULT_PATH, "CUDA_VISIBLE_DEVICES": gpu,
           "CUDA_MPS_PIPE_DIRECTORY": str(directory / "pipe"),
           "CUDA_MPS_LOG_DIRECTORY": str(directory / "log")}
    if os.environ.get("LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"]
    return env


def _resolve(control: str) -> str | None:
    """The program to run: an absolute path as it is, a name looked up on PATH."""
    if control.startswith("/"):
        return control if os.access(control, os.X_OK) and os.path.isfile(control) else None
    return shutil.which(control, path=os.environ.get("PATH") or DEFAULT_PATH)


def _root_dir(path: Path) -> None:
    """Make ``path`` a real directory, 0755, owned by the agent (root on a node)."""
    try:
        path.mkdir(mode=0o755)
    except FileExistsError:
        pass
    if path.is_symlink() or not path.is_dir():
        raise MpsError(f"{path} is not a directory")
    os.chmod(path, 0o755)
    if os.geteuid() == 0:
        os.chown(path, 0, 0)


def _runs(pid: int, program: str) -> bool:
    """Whether ``pid`` is a live process (not a zombie) of ``program`` (a base name among
    its arguments: a script runs under its interpreter)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return False
    if stat[stat.rindex(b")") + 2:].split()[0] in (b"Z", b"X"):
        return False
    return any(os.path.basename(arg.decode(errors="replace")) == program for arg in argv[:4])


def _first_line(path: Path) -> str:
    try:
        text = path.read_bytes()[:4096].decode(errors="replace")
    except OSError:
        return ""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:300]


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(dict(data)))
    os.replace(tmp, path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
