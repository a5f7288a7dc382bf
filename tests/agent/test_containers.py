"""Containers, the pure parts: pyxis's option forms checked (gpusched.messages.containers)
and each runtime's argument vector (gpusched.agent.containers), with a property that no
value a user sends can reach a runtime as an option of its own."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.agent.containers import (
    IMAGE_OWNED,
    SCRIPT_IN_CONTAINER,
    ContainerError,
    ContainerJob,
    ContainerRuntime,
    container_command,
    detect_runtime,
    gpu_device_paths,
    mount_sources,
    node_runtime,
    spec_entry,
)
from gpusched.agent.jobspec import build_spec
from gpusched.config import load_config
from gpusched.errors import ConfigError, UsageError
from gpusched.messages import JobRequest, LaunchOrder
from gpusched.messages.containers import (
    ContainerRequest,
    Mount,
    check_container_name,
    check_image,
    check_workdir,
    parse_env_names,
    parse_mounts,
)

PODMAN = ContainerRuntime("podman", "/usr/bin/podman", ("--runtime=runc",),
                          ("--ulimit=nofile=64:64",))
JOB = ContainerJob(uid=1000, home="/home/ann", work_dir="/home/ann/run", script="/s/jobs/7/script",
                   args=("a", "-b"), env={"FOO": "1", "PATH": "/x", "HOME": "/home/ann",
                                          "BAD-NAME": "2", "CUDA_VISIBLE_DEVICES": "GPU-1"},
                   gpu_uuids=("GPU-1",), gpu_devices=("/dev/nvidia0", "/dev/nvidiactl"),
                   name="gpusched-7-0")


def test_pyxis_mount_forms() -> None:
    assert parse_mounts("/data:/d:ro+rprivate,./out,/scratch:/s") == (
        Mount("/data", "/d", ("ro", "rprivate")), Mount("./out", "/out"),
        Mount("/scratch", "/s"))
    assert parse_mounts("tmpfs:/t") == (Mount("tmpfs", "/t"),)
    assert parse_mounts("/a:./rel/x")[0].target == "/rel/x"  # from the container's root
    assert parse_mounts("/a:../../etc")[0].target == "/etc"  # never above it
    for bad, words in (("", "invalid format"), ("/a::ro", "invalid format"),
                       ("/a:/b:ro:x", "invalid format"), ("data:/d", "mount source"),
                       ("/a:b", "mount target"), ("/a:/b:ro+exec", "unknown mount flag"),
                       ("/a:/b:ro+rw", "both ro and rw"), ("umount:/x", "'umount'"),
                       ("/a\n:/b", "printable path"), (",".join(["/a"] * 65), "at most 64")):
        with pytest.raises(UsageError, match=words):
            parse_mounts(bad)


def test_image_workdir_env_and_name_checks() -> None:
    assert check_image("nvcr.io#nvidia/pytorch:24.01-py3") == "nvcr.io#nvidia/pytorch:24.01-py3"
    assert check_image("/images/pt.sqsh") == "/images/pt.sqsh"
    for bad in ("", "-v", "--privileged", "ubuntu latest", "a,b", "x" * 513, "/a:b", "ub\tu"):
        with pytest.raises(UsageError, match="--container-image"):
            check_image(bad)
    assert check_workdir("../") == "/" and check_workdir("w/x") == "/w/x"
    assert check_workdir("/usr/local/bin") == "/usr/local/bin"
    assert parse_env_names("A,B_2,A") == ("A", "B_2")
    for bad in ("", "A,", "1A", "A-B", "A=1", "-e"):
        with pytest.raises(UsageError, match="--container-env"):
            parse_env_names(bad)
    assert check_container_name("pt-2.1_a") == "pt-2.1_a"
    for bad in ("", "-x", "a b", "x" * 65):
        with pytest.raises(UsageError, match="--container-name"):
            check_container_name(bad)
    with pytest.raises(UsageError, match="NAME:FLAG"):
        check_container_name("pt:exec")


def test_request_round_trip_and_refusals() -> None:
    body = {"image": "ubuntu:22.04", "mounts": ["/d:/d:ro", "tmpfs:/t"], "workdir": "/w",
            "env": ["A"], "name": None, "mount_home": True, "remap_root": False,
            "writable": None, "entrypoint": None}
    request = ContainerRequest.parse(body)
    assert ContainerRequest.parse(request.to_json()) == request
    assert request.to_json() == body
    for bad, words in (({"image": 3}, "container.image"), ({"image": "u", "x": 1}, "unknown"),
                       ({"image": "u", "writable": "yes"}, "container.writable"),
                       ({"image": "u", "mounts": "/a"}, "container.mounts"),
                       ({"image": "u", "mounts": ["/a"] * 65}, "at most 64")):
        with pytest.raises(UsageError, match=words):
            ContainerRequest.parse(bad)
    job = JobRequest.parse({"script": "#!/bin/sh\n", "work_dir": "/tmp", "container": body})
    assert job.container == request and JobRequest.parse(job.to_json()) == job
    with pytest.raises(UsageError, match="interactive allocation"):
        JobRequest.parse({"work_dir": "/tmp", "interactive": True, "container": body})


def test_launch_order_carries_the_container() -> None:
    order = LaunchOrder(job_id=7, node="n1", name="j", user="ann", uid=1000, gid=1000,
                        script="#!/bin/sh\n", work_dir="/tmp",
                        container=ContainerRequest("ubuntu", (Mount("/d", "/d"),)))
    assert LaunchOrder.parse(order.to_json()) == order
    plain = LaunchOrder(job_id=7, node="n1", name="j", user="ann", uid=1000, gid=1000,
                        script="#!/bin/sh\n", work_dir="/tmp")
    assert "container" not in plain.to_json()


def test_podman_command() -> None:
    request = ContainerRequest("nvcr.io#nvidia/pytorch:24.01", (Mount("/data", "/d", ("ro",)),
                                                              Mount("./out", "/out"),
                                                              Mount("tmpfs", "/t")),
                               workdir="/w", env=("PATH",), mount_home=True)
    argv, extra = container_command(PODMAN, request, JOB)
    assert extra == {"NVIDIA_VISIBLE_DEVICES": "GPU-1"}
    assert argv[:3] == ["/usr/bin/podman", "--runtime=runc", "run"]
    assert argv[-4:] == [f"--entrypoint={SCRIPT_IN_CONTAINER}", "nvcr.io/nvidia/pytorch:24.01",
                         "a", "-b"]
    for option in ("--rm", "--network=host", "--read-only", "--userns=keep-id", "--workdir=/w",
                   f"--volume=/s/jobs/7/script:{SCRIPT_IN_CONTAINER}:ro",
                   "--volume=/home/ann:/home/ann", "--volume=/data:/d:ro",
                   "--volume=/home/ann/run/out:/out", "--mount=type=tmpfs,destination=/t",
                   "--device=/dev/nvidia0", "--device=/dev/nvidiactl", "--name=gpusched-7-0",
                   "--ulimit=nofile=64:64"):
        assert option in argv, option
    envs = [a for a in argv if a.startswith("--env=")]
    # The image keeps its own PATH and HOME unless --container-env names them; a name no
    # shell could set never reaches the runtime; no value is ever on the command line.
    assert envs == ["--env=CUDA_VISIBLE_DEVICES", "--env=FOO", "--env=NVIDIA_VISIBLE_DEVICES",
                    "--env=PATH"]


def test_podman_switches_and_images() -> None:
    root = ContainerJob(uid=0, home="/root", work_dir="/w", script="/s")
    argv, _ = container_command(PODMAN, ContainerRequest(
        "ubuntu", writable=True, entrypoint=True, remap_root=True), root)
    assert "--read-only" not in argv and "--userns=keep-id" not in argv
    assert argv[-2:] == ["ubuntu", SCRIPT_IN_CONTAINER]  # the image's entrypoint runs it
    remapped, _ = container_command(PODMAN, ContainerRequest(
        "ubuntu", remap_root=True, mount_home=True), JOB)
    assert "--userns=keep-id" not in remapped and "--volume=/home/ann:/root" in remapped
    cdi = ContainerRuntime("podman", "podman", gpus="cdi")
    assert "--device=nvidia.com/gpu=GPU-1" in container_command(cdi, ContainerRequest("u"), JOB)[0]
    assert not [a for a in container_command(PODMAN, ContainerRequest("u"), root)[0]
                if a.startswith("--device")]
    assert container_command(PODMAN, ContainerRequest("u"), root)[1] == {
        "NVIDIA_VISIBLE_DEVICES": "void"}
    with pytest.raises(ContainerError, match="squashfs image needs enroot"):
        container_command(PODMAN, ContainerRequest("/i/pt.sqsh"), JOB)
    assert container_command(PODMAN, ContainerRequest("/i/pt.tar"), JOB)[0][-3] == \
        "docker-archive:/i/pt.tar"
    assert container_command(PODMAN, ContainerRequest("./pt.oci.tar"), JOB)[0][-3] == \
        "oci-archive:./pt.oci.tar"


def test_apptainer_and_enroot_commands() -> None:
    app = ContainerRuntime("apptainer", "/usr/bin/apptainer")
    request = ContainerRequest("ubuntu:22.04", (Mount("/d", "/d", ("ro", "rprivate")),),
                               workdir="/w", env=("FOO",), remap_root=True, writable=True)
    argv, extra = container_command(app, request, JOB)
    assert argv[:2] == ["/usr/bin/apptainer", "exec"] and "--no-home" in argv
    assert {"--fakeroot", "--writable-tmpfs", "--pwd=/w", "--bind=/d:/d:ro", "--nv"} <= set(argv)
    assert argv[-4:] == ["docker://ubuntu:22.04", SCRIPT_IN_CONTAINER, "a", "-b"]
    assert extra == {"APPTAINERENV_FOO": "1"}
    with pytest.raises(ContainerError, match="tmpfs"):
        container_command(app, ContainerRequest("u", (Mount("tmpfs", "/t"),)), JOB)
    enroot = ContainerRuntime("enroot", "/usr/bin/enroot")
    argv, extra = container_command(enroot, ContainerRequest(
        "/i/pt.sqsh", (Mount("/d", "/d", ("ro",)),), remap_root=True), JOB)
    assert argv[:3] == ["/usr/bin/enroot", "start", "--root"]
    assert "--mount=/d:/d:x-create=auto,ro" in argv and argv[-4] == "/i/pt.sqsh"
    assert extra == {"ENROOT_MOUNT_HOME": "n", "NVIDIA_VISIBLE_DEVICES": "GPU-1"}
    named, _ = container_command(enroot, ContainerRequest("ubuntu", name="pt"), JOB)
    assert named[-4] == "pt"
    for bad, words in ((ContainerRequest("ubuntu"), "enroot import"),
                       (ContainerRequest("/i.sqsh", workdir="/w"), "--container-workdir")):
        with pytest.raises(ContainerError, match=words):
            container_command(enroot, bad, JOB)


def test_detection_devices_and_spec_entry() -> None:
    found = {"podman": "/usr/bin/podman", "apptainer": "/usr/bin/apptainer"}
    assert detect_runtime(None, None, found.get) == "apptainer"  # enroot first, then apptainer
    assert detect_runtime(None, None, {}.get) is None
    assert detect_runtime("none", None, found.get) is None
    assert detect_runtime("podman", None, {}.get) == "podman"
    assert detect_runtime(None, "/opt/bin/enroot", {}.get) == "enroot"
    present = {"/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"}
    assert gpu_device_paths([1, None, 3], present.__contains__) == (
        "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm")
    request = ContainerRequest("u", (Mount("./in", "/in"), Mount("tmpfs", "/t")), mount_home=True)
    assert mount_sources(request, "/w") == ["/w/in"]
    entry = spec_entry(PODMAN, request, JOB)
    assert entry["check_paths"] == ["/home/ann/run/in", "/home/ann"]
    assert entry["cleanup"] == ["/usr/bin/podman", "--runtime=runc", "rm", "--force",
                                "--time=0", "--ignore", "gpusched-7-0"]
    assert spec_entry(ContainerRuntime("apptainer", "apptainer"), ContainerRequest("u"),
                      JOB)["cleanup"] is None
    archive = spec_entry(PODMAN, ContainerRequest("./img.tar"), JOB)
    assert archive["check_paths"] == ["/home/ann/run/img.tar"]  # read as the user, first
    with pytest.raises(ContainerError, match="no container runtime"):
        spec_entry(None, request, JOB)
    odd = ContainerJob(uid=1000, home="/h:x", work_dir="/w,1", script="/s")
    for bad in (ContainerRequest("u", (Mount("./in", "/in"),)),
                ContainerRequest("u", mount_home=True)):
        with pytest.raises(ContainerError, match="a path with ',' or ':' cannot be mounted"):
            spec_entry(PODMAN, bad, odd)


_path = st.text(st.characters(codec="utf-8", exclude_characters="\0"), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(image=_path, mounts=st.lists(_path, max_size=4), workdir=_path,
       env=st.lists(_path, max_size=4), name=_path)
def test_no_user_value_becomes_a_runtime_option(image: str, mounts: list[str], workdir: str,
                                                 env: list[str], name: str) -> None:
    """Whatever the fields hold, a request either fails its checks or gives argument
    vectors in which every user value sits inside an option of ours (``--x=value``) or
    after the image: nothing of the user's starts an argument with ``-`` before it."""
    raw = {"image": image, "mounts": mounts, "workdir": workdir, "env": env, "name": name}
    try:
        request = ContainerRequest.parse(raw)
    except UsageError:
        return
    for runtime in (PODMAN, ContainerRuntime("apptainer", "apptainer"),
                    ContainerRuntime("enroot", "enroot")):
        try:
            argv, _ = container_command(runtime, request, JOB)
        except ContainerError:
            continue
        image_at = len(argv) - len(JOB.args) - (2 if runtime.kind != "podman" else 1)
        ours = argv[:image_at]
        assert all(a.startswith("-") for a in ours[ours.index(
            {"podman": "run", "apptainer": "exec", "enroot": "start"}[runtime.kind]) + 1:])
        assert not argv[image_at].startswith("-")
        assert all("\n" not in a and "\0" not in a for a in argv)


def test_image_owned_names_are_plain() -> None:
    assert all(n.replace("_", "").isalnum() for n in IMAGE_OWNED)


def _agent_config(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "gpusched.toml"
    path.write_text(f"[agent]\n{text}\n")
    return load_config(path).agent


def test_agent_settings(tmp_path: Path) -> None:
    default = _agent_config(tmp_path, "")
    assert (default.container_runtime, default.container_gpus) == (None, "devices")
    config = _agent_config(tmp_path, 'container_runtime = "podman"\n[agent.container]\n'
                           'program = "/opt/podman"\nruntime_args = ["--runtime=runc"]\n'
                           'run_args = ["--ulimit=nofile=64:64"]\ngpus = "cdi"')
    runtime = node_runtime(vars(config))
    assert runtime == ContainerRuntime("podman", "/opt/podman", ("--runtime=runc",),
                                       ("--ulimit=nofile=64:64",), "cdi")
    assert node_runtime(vars(_agent_config(tmp_path, 'container_runtime = "none"'))) is None
    for text, key in (('container_runtime = "docker"', "agent.container_runtime"),
                      ('[agent.container]\nprogram = "podman"', "agent.container.program"),
                      ('[agent.container]\nrun_args = ["x"]', "agent.container.run_args"),
                      ('[agent.container]\ngpus = "all"', "agent.container.gpus"),
                      ('[agent.container]\nimage = "u"', "image")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            _agent_config(tmp_path, text)


def test_a_launch_order_s_spec_runs_its_runtime(tmp_path: Path) -> None:
    """build_spec: the job's container entry names the script where the launcher writes
    it and the job's GPUs' devices; a node without a runtime refuses the job."""
    order = LaunchOrder(job_id=42, run=1, node="n1", name="j", user="root", uid=0, gid=0,
                        script="#!/bin/sh\n", work_dir="/w", gpu_uuids=("GPU-a",),
                        environment={"FOO": "1"},
                        container=ContainerRequest("ubuntu", (Mount("./in", "/in"),)))
    site = {"state_dir": str(tmp_path), "container_runtime": "podman",
            "container_program": "/usr/bin/podman"}
    spec = build_spec(order, 1.0, "n1", 0, None, site, {"GPU-a": {"index": 0, "minor": 0}})
    entry = spec["container"]
    assert f"--volume={tmp_path}/jobs/42/script:{SCRIPT_IN_CONTAINER}:ro" in entry["argv"]
    assert "--name=gpusched-42-1" in entry["argv"] and "--env=FOO" in entry["argv"]
    assert entry["check_paths"] == ["/w/in"]
    plain = build_spec(dataclasses.replace(order, container=None), 1.0, "n1", 0, None, site)
    assert plain["container"] is None
    with pytest.raises(ContainerError, match="no container runtime"):
        build_spec(order, 1.0, "n1", 0, None, {**site, "container_runtime": "none"})


def test_a_registration_s_runtime_is_checked() -> None:
    from gpusched.db.containers import registered_runtime

    assert registered_runtime({}) is None
    assert registered_runtime({"container_runtime": None}) is None
    assert registered_runtime({"container_runtime": "enroot"}) == "enroot"
    for bad in ("docker", "", 3, ["podman"]):
        with pytest.raises(UsageError, match="container_runtime: expected one of"):
            registered_runtime({"container_runtime": bad})
