"""Running a job's batch script in its container (``--container-image``, pyxis's
options): which runtime this node has, and the runtime's argument vector for a job.

The command is always a list of arguments, never a shell string; every value in it was
checked by gpusched.messages.containers (no leading ``-``, no ``,`` or ``:`` in a path)
and is joined to its option with ``=`` or placed after the image, so nothing a user
sends can be read by the runtime as an option of its own. The runtime runs as the job's
user (the supervisor drops privileges before it execs it), so a rootless runtime can
reach only what the user can; the job's sources are also checked, as the user, before
the exec (gpusched.agent.jobexec). Variables reach the container by name only
(``--env=NAME``: the runtime takes the value from its own environment, the job's), so
no value appears in a process listing.

``container_command`` is pure; ``detect_runtime`` and ``gpu_device_paths`` look at the
node.
"""

from __future__ import annotations

import os
import posixpath
import pwd
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpusched.configfile import TableReader
from gpusched.messages.containers import RUNTIMES, ContainerRequest, Mount

RUNTIME_SETTINGS = (*RUNTIMES, "none")
GPU_MODES = ("devices", "cdi")  # GPUs as their /dev/nvidia* nodes, or as CDI devices
SQUASHFS = (".sqsh", ".squashfs")  # enroot's image files
SCRIPT_IN_CONTAINER = "/.gpusched/script"  # where the batch script is bound, read-only
HOME_WHEN_ROOT = "/root"  # the home directory's place for a user remapped to root
# Variables an image defines for its own software: the image's value stays unless the
# job names them in --container-env (pyxis: the image's values take precedence).
IMAGE_OWNED = frozenset({"PATH", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CPATH",
                         "PYTHONPATH", "PYTHONHOME", "MANPATH", "HOME", "HOSTNAME",
                         "TERM", "SHELL", "container"})
# The node devices every CUDA program needs besides its GPUs' /dev/nvidiaN.
NVIDIA_CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                          "/dev/nvidia-modeset")
_ENV_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


class ContainerError(Exception):
    """The job's container cannot be run on this node; the message is for the user."""


@dataclass(frozen=True)
class ContainerRuntime:
    """This node's runtime, as the agent's settings choose it."""

    kind: str  # one of RUNTIMES
    program: str  # an absolute path, or a name found on PATH
    runtime_args: tuple[str, ...] = ()  # before the subcommand (podman's --runtime, --root)
    run_args: tuple[str, ...] = ()  # after it (podman run's --ulimit, --security-opt)
    gpus: str = "devices"  # one of GPU_MODES


@dataclass(frozen=True)
class ContainerJob:
    """What the command needs of the job and the node."""

    uid: int
    home: str  # the user's home directory on the node
    work_dir: str  # the job's working directory (relative mount sources start there)
    script: str  # the batch script's path on the node
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None  # the job's variables
    gpu_uuids: tuple[str, ...] = ()
    gpu_devices: tuple[str, ...] = ()  # /dev/nvidia* of its GPUs and the control devices
    name: str = "gpusched-job"  # a name for this run's container (podman)
    host_ipc: bool = True  # whether the node's IPC namespace can be shared (/dev/mqueue)


def container_command(runtime: ContainerRuntime, request: ContainerRequest,
                      job: ContainerJob) -> tuple[list[str], dict[str, str]]:
    """The argument vector that runs the job's script in its container, and the
    variables to add to the runtime's environment (ContainerError: not on this
    runtime)."""
    build = {"podman": _podman, "apptainer": _apptainer, "enroot": _enroot}[runtime.kind]
    return build(runtime, request, job)


def _sources(request: ContainerRequest, job: ContainerJob) -> list[tuple[Mount, str]]:
    """Each mount with its source on the node: relative ones from the working directory
    (which, like the home directory, must then hold no ``,`` or ``:``, the separators of
    a runtime's mount option)."""
    found = [(m, m.source if m.source == "tmpfs" else
              posixpath.normpath(posixpath.join(job.work_dir, m.source)))
             for m in request.mounts]
    for path in [source for _, source in found] + ([job.home] if request.mount_home else []):
        if "," in path or ":" in path:
            raise ContainerError(f"--container-mounts: {path}: a path with ',' or ':' cannot "
                                 "be mounted")
    return found


def mount_sources(request: ContainerRequest, work_dir: str) -> list[str]:
    """The node paths a request binds (checked as the job's user before the exec)."""
    return [source for m, source in _sources(request, ContainerJob(0, "", work_dir, ""))
            if m.source != "tmpfs"]


def _passed_names(request: ContainerRequest, job: ContainerJob) -> list[str]:
    """The job's variables that reach the container (by name), sorted."""
    wanted = set(request.env)
    return sorted(n for n in set(job.env or ()) | wanted
                  if n and set(n) <= _ENV_NAME_CHARS and not n[0].isdigit()
                  and (n in wanted or n not in IMAGE_OWNED))


def _podman(runtime: ContainerRuntime, request: ContainerRequest,
            job: ContainerJob) -> tuple[list[str], dict[str, str]]:
    argv = [runtime.program, *runtime.runtime_args, "run", "--rm", "--replace",
            f"--name={job.name}", "--network=host", "--uts=host", "--pid=host",
            "--log-driver=none"]
    if job.host_ipc:
        argv.append("--ipc=host")
    if not request.writable:
        argv.append("--read-only")
    root = job.uid == 0 or bool(request.remap_root)
    if job.uid != 0 and not request.remap_root:
        argv.append("--userns=keep-id")  # the user's own uid and gid inside
    if request.workdir:
        argv.append(f"--workdir={request.workdir}")
    argv.append(f"--volume={job.script}:{SCRIPT_IN_CONTAINER}:ro")
    if request.mount_home:
        argv.append(f"--volume={job.home}:{HOME_WHEN_ROOT if root and job.uid != 0 else job.home}")
    for mount, source in _sources(request, job):
        if source == "tmpfs":
            argv.append(f"--mount=type=tmpfs,destination={mount.target}")
        else:
            flags = f":{','.join(mount.flags)}" if mount.flags else ""
            argv.append(f"--volume={source}:{mount.target}{flags}")
    argv += _gpu_options(runtime, job)
    # The job's GPUs, and only them, for an NVIDIA hook the node may run (an image's own
    # NVIDIA_VISIBLE_DEVICES=all never reaches it).
    extra = {"NVIDIA_VISIBLE_DEVICES": ",".join(job.gpu_uuids) or "void"}
    argv += [f"--env={name}" for name in sorted({*_passed_names(request, job), *extra})]
    argv += runtime.run_args
    if not request.entrypoint:
        argv.append(f"--entrypoint={SCRIPT_IN_CONTAINER}")
    argv.append(_podman_image(request.image))
    if request.entrypoint:
        argv.append(SCRIPT_IN_CONTAINER)  # the image's entrypoint is given the script
    return argv + list(job.args), extra


def _gpu_options(runtime: ContainerRuntime, job: ContainerJob) -> list[str]:
    if not job.gpu_uuids:
        return []
    if runtime.gpus == "cdi":
        return [f"--device=nvidia.com/gpu={uuid}" for uuid in job.gpu_uuids]
    return [f"--device={path}" for path in job.gpu_devices]


def _podman_image(image: str) -> str:
    """pyxis's image forms as podman takes them: ``REGISTRY#IMAGE`` is
    ``REGISTRY/IMAGE`` (a ``USER@`` before it is left to podman's login); a path is an
    image archive, an OCI one when its name ends ``.oci`` or ``.oci.tar`` (``podman save
    --format oci-archive``), else a docker one (``podman save``'s default). The name
    alone decides: the agent never reads a file for a job (podman reads it, as the job's
    user)."""
    if image[0] in "/.":
        if image.endswith(SQUASHFS):
            raise ContainerError(f"--container-image {image}: a squashfs image needs enroot; "
                                 "this node runs containers with podman (give an OCI or "
                                 "docker image archive, or an image name)")
        return f"{archive_transport(image)}:{image}"
    if "#" in image:
        registry, rest = image.split("#", 1)
        return f"{registry.rsplit('@', 1)[-1]}/{rest}"
    return image


def archive_transport(path: str) -> str:
    """``oci-archive`` or ``docker-archive``: how podman reads the image archive at
    ``path``, by its name."""
    return "oci-archive" if path.endswith((".oci", ".oci.tar")) else "docker-archive"


def _apptainer(runtime: ContainerRuntime, request: ContainerRequest,
               job: ContainerJob) -> tuple[list[str], dict[str, str]]:
    argv = [runtime.program, *runtime.runtime_args, "run" if request.entrypoint else "exec"]
    if not request.mount_home:
        argv.append("--no-home")
    if request.remap_root and job.uid != 0:
        argv.append("--fakeroot")
    if request.writable:
        argv.append("--writable-tmpfs")
    if request.workdir:
        argv.append(f"--pwd={request.workdir}")
    argv.append(f"--bind={job.script}:{SCRIPT_IN_CONTAINER}:ro")
    for mount, source in _sources(request, job):
        if source == "tmpfs":
            raise ContainerError("--container-mounts: a tmpfs mount needs podman or enroot; "
                                 "this node runs containers with apptainer")
        access = [f for f in mount.flags if f in ("ro", "rw")]
        argv.append(f"--bind={source}:{mount.target}" + (f":{access[0]}" if access else ""))
    if job.gpu_uuids:
        argv.append("--nv")
    argv += runtime.run_args
    image = request.image
    if image[0] not in "/.":
        image = "docker://" + _podman_image(image)
    # Apptainer passes the job's variables itself (the image's own win, as with pyxis);
    # those named by --container-env win over the image's through APPTAINERENV_*.
    env = job.env or {}
    extra = {f"APPTAINERENV_{name}": env[name] for name in request.env if name in env}
    return [*argv, image, SCRIPT_IN_CONTAINER, *job.args], extra


def _enroot(runtime: ContainerRuntime, request: ContainerRequest,
            job: ContainerJob) -> tuple[list[str], dict[str, str]]:
    if request.workdir:
        raise ContainerError("--container-workdir: not supported with enroot on this node "
                             "(enroot start has no working directory option)")
    image = request.name or request.image
    if request.name is None and image[0] not in "/.":
        raise ContainerError(f"--container-image {image}: enroot runs a squashfs image file "
                             "or a container made with 'enroot create' (--container-name); "
                             "import the image first ('enroot import')")
    argv = [runtime.program, *runtime.runtime_args, "start"]
    if request.remap_root:
        argv.append("--root")
    if request.writable:
        argv.append("--rw")
    argv.append(f"--mount={job.script}:{SCRIPT_IN_CONTAINER}:ro,bind")
    for mount, source in _sources(request, job):
        flags = ",".join(mount.flags or ("rbind",))
        if source == "tmpfs":
            argv.append(f"--mount=tmpfs:{mount.target}:x-create=dir,{flags}")
        else:
            argv.append(f"--mount={source}:{mount.target}:x-create=auto,{flags}")
    argv += [f"--env={name}" for name in _passed_names(request, job)]
    argv += runtime.run_args
    extra = {"ENROOT_MOUNT_HOME": "y" if request.mount_home else "n",
             "NVIDIA_VISIBLE_DEVICES": ",".join(job.gpu_uuids) or "void"}
    return [*argv, image, SCRIPT_IN_CONTAINER, *job.args], extra


def detect_runtime(setting: str | None, program: str | None,
                   which: Callable[[str], str | None] = shutil.which) -> str | None:
    """The runtime this node runs containers with: the one set (``none``: no runtime),
    else the first of enroot, apptainer, podman found on PATH; None: none."""
    if setting == "none":
        return None
    if setting is not None:
        return setting
    if program is not None:
        name = os.path.basename(program)
        return name if name in RUNTIMES else None
    return next((kind for kind in ("enroot", "apptainer", "podman") if which(kind)), None)


def gpu_device_paths(minors: Iterable[int | None], exists: Callable[[str], bool] = os.path.exists
                     ) -> tuple[str, ...]:
    """The device nodes a container needs for GPUs of these minors: each GPU's
    /dev/nvidiaN and the control devices, those present on the node."""
    paths = [f"/dev/nvidia{m}" for m in sorted({m for m in minors if m is not None})]
    return tuple(p for p in [*paths, *NVIDIA_CONTROL_DEVICES] if exists(p))


def container_settings(r: TableReader, defaults: Any) -> dict[str, Any]:
    """``container_runtime`` of [agent] and its [agent.container] table."""
    expected = "one of " + ", ".join(map(repr, RUNTIME_SETTINGS))
    kind = r.get("container_runtime", str, None, expected)
    if kind is not None and kind not in RUNTIME_SETTINGS:
        raise r.fail("container_runtime", expected)
    table = r.sub("container")
    table.check_keys({"program", "runtime_args", "run_args", "gpus"})
    program = table.get("program", str, None, "an absolute path to the runtime's program")
    if program is not None and (not program.startswith("/") or "\0" in program
                                or len(program) > 4095 or not program.isprintable()):
        raise table.fail("program", "an absolute path to the runtime's program")
    gpus = table.get("gpus", str, defaults.container_gpus, "one of 'devices', 'cdi'")
    if gpus not in GPU_MODES:
        raise table.fail("gpus", "one of 'devices', 'cdi'")
    return {"container_runtime": kind, "container_program": program,
            "container_runtime_args": _arg_list(table, "runtime_args"),
            "container_run_args": _arg_list(table, "run_args"), "container_gpus": gpus}


def _arg_list(r: TableReader, key: str) -> tuple[str, ...]:
    expected = "a list of the runtime's options, each starting with '-'"
    values = r.get(key, list, [], expected)
    if not all(isinstance(v, str) and v.startswith("-") and v.isprintable()
               and len(v) <= 4096 for v in values) or len(values) > 64:
        raise r.fail(key, expected)
    return tuple(values)


def node_runtime(settings: Mapping[str, Any],
                 which: Callable[[str], str | None] = shutil.which) -> ContainerRuntime | None:
    """The runtime of an agent's settings (AgentConfig's fields as a mapping), or None:
    none on this node."""
    kind = detect_runtime(settings.get("container_runtime"), settings.get("container_program"),
                          which)
    if kind is None:
        return None
    program = settings.get("container_program") or which(kind)
    if program is None:
        return None
    return ContainerRuntime(kind, program, tuple(settings.get("container_runtime_args", ())),
                            tuple(settings.get("container_run_args", ())),
                            settings.get("container_gpus", "devices"))


def cleanup_command(runtime: ContainerRuntime, job: ContainerJob) -> list[str] | None:
    """What removes the run's container after the job, whatever became of the runtime's
    own process (a SIGKILL at the end of the grace time leaves podman's container
    running under its monitor); None where the container ends with its processes."""
    if runtime.kind != "podman":
        return None
    return [runtime.program, *runtime.runtime_args, "rm", "--force", "--time=0", "--ignore",
            job.name]


def container_kind(config: Any) -> str | None:
    """What an agent registers as its node's runtime (AgentConfig; None: none)."""
    runtime = node_runtime(vars(config))
    return None if runtime is None else runtime.kind


def host_ipc_shared(exists: Callable[[str], bool] = os.path.isdir) -> bool:
    """Whether a container can share the node's IPC namespace (podman needs /dev/mqueue)."""
    return exists("/dev/mqueue")


def spec_entry(runtime: ContainerRuntime | None, request: ContainerRequest,
               job: ContainerJob) -> dict[str, Any]:
    """What a job's supervisor spec holds for its container: the argument vector, the
    variables the runtime needs besides the job's, and the sources to check as the
    user (ContainerError where this node cannot run it)."""
    if runtime is None:
        raise ContainerError("this node has no container runtime (the job asked for "
                             f"--container-image {request.image})")
    argv, extra = container_command(runtime, request, job)
    image = request.image
    return {"argv": argv, "env": extra, "cleanup": cleanup_command(runtime, job),
            "check_paths": mount_sources(request, job.work_dir)
            + ([job.home] if request.mount_home else [])
            + ([posixpath.normpath(posixpath.join(job.work_dir, image))]
               if image[0] in "/." else [])}


def job_container(order: Any, settings: Mapping[str, Any],
                  inventory: Mapping[str, Mapping[str, Any]] | None,
                  env: Mapping[str, str]) -> dict[str, Any] | None:
    """The spec entry of a launch order's container (None: the job has none); the
    script is where the launcher writes it (``state_dir``/jobs/ID/script)."""
    request: ContainerRequest | None = order.container
    if request is None:
        return None
    try:
        home = pwd.getpwuid(order.uid).pw_dir
    except KeyError:
        home = env.get("HOME", "/")
    state_dir = str(settings.get("state_dir", "/var/lib/gpusched/agent"))
    minors = [(inventory or {}).get(u, {}).get("minor") for u in order.gpu_uuids]
    job = ContainerJob(
        uid=order.uid, home=home, work_dir=order.work_dir,
        script=os.path.join(state_dir, "jobs", str(order.job_id), "script"),
        args=tuple(order.args), env=env, gpu_uuids=tuple(order.gpu_uuids),
        gpu_devices=gpu_device_paths(minors) if order.gpu_uuids else (),
        name=f"gpusched-{order.job_id}-{order.run}", host_ipc=host_ipc_shared())
    return spec_entry(node_runtime(settings), request, job)
