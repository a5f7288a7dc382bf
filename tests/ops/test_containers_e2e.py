"""Container jobs end to end on a real local cluster (controller, agent, PostgreSQL) with
Podman: a tiny image is built here (a static busybox imported as a root filesystem: no
registry is reachable), and a job runs its script in it with pyxis's options from the
command line and from directives; a mount whose source cannot be read fails the job
with the reason in its output; a node without a runtime makes the submission refused
with one line and nothing stored."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import BIN, Cluster, wait_for
from tests.pg import ScratchPostgres

IMAGE = "localhost/gpusched-test-busybox:1"
MARK = "gpusched test image"
BUSYBOX = "/bin/busybox"
# Podman options tried in turn until one runs the image on this host: its defaults, then
# runc with the limits this process has (crun refuses hosts with hybrid cgroups, and a
# container's default limits may exceed what an unprivileged sandbox allows).
PODMAN_SETUPS: tuple[tuple[list[str], list[str]], ...] = (
    ([], []),
    (["--runtime=runc"], ["--ulimit=nofile=1024:1024", "--ulimit=nproc=1024:1024"]),
)


def _podman() -> str:
    found = shutil.which("podman")
    assert found, "podman is not installed (run-tests installs it: apt-get install podman crun)"
    assert os.path.exists(BUSYBOX), "busybox is not installed (apt-get install busybox-static)"
    return found


def _build_image(podman: str, user: str | None = None, env: dict[str, str] | None = None
                 ) -> None:
    """A root filesystem of one static busybox and its applets, imported as IMAGE (into
    ``user``'s own storage, with ``env``, when given)."""
    with tempfile.TemporaryDirectory() as root:
        os.chmod(root, 0o755)
        tar_path = Path(root) / "rootfs.tar"
        with tarfile.open(tar_path, "w") as tar:
            for name in ("bin", "etc", "tmp", "data"):
                info = tarfile.TarInfo(name)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
                tar.addfile(info)
            tar.add(BUSYBOX, "bin/busybox")
            for applet in ("sh", "cat", "echo", "ls", "pwd", "touch", "id", "sleep", "env",
                           "true", "grep"):
                info = tarfile.TarInfo(f"bin/{applet}")
                info.type, info.linkname = tarfile.SYMTYPE, "busybox"
                tar.addfile(info)
            release = f'NAME="{MARK}"\n'.encode()
            info = tarfile.TarInfo("etc/os-release")
            info.size = len(release)
            with tempfile.TemporaryFile() as f:
                f.write(release)
                f.seek(0)
                tar.addfile(info, f)
        os.chmod(tar_path, 0o644)
        subprocess.run([podman, "import", "--change", "WORKDIR=/tmp", str(tar_path), IMAGE],
                       check=True, capture_output=True, timeout=120, user=user, env=env,
                       cwd=root)


def _working_setup(podman: str) -> tuple[list[str], list[str]]:
    """The first of PODMAN_SETUPS that runs the image here."""
    tried = []
    for runtime_args, run_args in PODMAN_SETUPS:
        result = subprocess.run(
            [podman, *runtime_args, "run", "--rm", "--network=host", *run_args, IMAGE,
             "/bin/true"], capture_output=True, text=True, timeout=120)
        if result.returncode == 0:
            return runtime_args, run_args
        tried.append(result.stderr.strip()[-300:])
    raise AssertionError(f"podman cannot run a container on this host: {tried}")


def _agent_toml(runtime: str, runtime_args: list[str], run_args: list[str]) -> str:
    return (f'container_runtime = "{runtime}"\n[agent.container]\n'
            f"runtime_args = {json.dumps(runtime_args)}\nrun_args = {json.dumps(run_args)}\n")


@pytest.fixture(scope="module")
def cluster(postgres: ScratchPostgres) -> Iterator[Cluster]:
    podman = _podman()
    before = _image_ids(podman)
    _build_image(podman)
    runtime_args, run_args = _working_setup(podman)
    c = Cluster(postgres.fresh_database(), gpus=2,
                agent_toml=_agent_toml("podman", runtime_args, run_args))
    c.container_setup = (runtime_args, run_args)  # type: ignore[attr-defined]
    try:
        yield c.up()
    finally:
        c.close()
        # Every image these tests made (a newer import or load leaves the older untagged).
        made = sorted(_image_ids(podman) - before)
        subprocess.run([podman, "rmi", "-f", *made], capture_output=True, timeout=120)


def _image_ids(podman: str) -> set[str]:
    listed = subprocess.run([podman, "images", "-a", "-q", "--no-trunc"], capture_output=True,
                            text=True, timeout=120)
    return set(listed.stdout.split())


def _output(cluster: Cluster, job_id: int) -> str:
    path = cluster.work / f"gpusched-{job_id}.out"
    return path.read_text() if path.exists() else ""


def test_a_job_runs_in_its_image_with_mounts_workdir_and_variables(cluster: Cluster) -> None:
    data = cluster.root / "data"
    data.mkdir()
    (data / "in.txt").write_text("from the node\n")
    env = {**cluster.env, "FOO": "bar-42"}
    result = subprocess.run(
        [str(BIN / "gsubmit"), "--parsable", "-G", "1",
         f"--container-image={IMAGE}", f"--container-mounts={data}:/mnt/in:ro,tmpfs:/scratch",
         "--container-workdir=/mnt/in", "--wrap",
         "cat /etc/os-release; pwd; cat in.txt; echo FOO=$FOO; echo CVD=$CUDA_VISIBLE_DEVICES;"
         " echo NVD=$NVIDIA_VISIBLE_DEVICES;"
         " touch /made 2>/dev/null && echo root-writable || echo root-read-only;"
         " touch /scratch/x && echo scratch-writable; id -u"],
        capture_output=True, text=True, env=env, cwd=cluster.work, timeout=60)
    assert result.returncode == 0, result.stderr
    job_id = int(result.stdout)
    done = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=90)
    out = _output(cluster, job_id)
    assert done["state"] == "COMPLETED", (done, out, cluster.logs())
    lines = out.splitlines()
    assert f'NAME="{MARK}"' in lines  # the image's file, not the node's
    assert "/mnt/in" in lines and "from the node" in lines
    assert "FOO=bar-42" in lines  # the job's variables reach the container
    assert f"CVD={','.join(done['gpu_uuids'])}" in lines and done["gpu_uuids"]
    assert f"NVD={','.join(done['gpu_uuids'])}" in lines
    assert "root-read-only" in lines and "scratch-writable" in lines
    assert lines[-1] == "0"  # root's job is root inside
    assert done["container"]["image"] == IMAGE
    assert done["container"]["mounts"] == [f"{data}:/mnt/in:ro", "tmpfs:/scratch"]
    shown = cluster.run("gcontrol", "show", "job", str(job_id))
    assert shown.returncode == 0 and "Container=" in shown.stdout, shown
    node = cluster.run("gcontrol", "show", "node", cluster.node)
    assert "ContainerRuntime=podman" in node.stdout, node


def test_directives_exit_code_and_a_writable_container(cluster: Cluster) -> None:
    script = cluster.work / "in-container.sh"
    script.write_text(f"#!/bin/sh\n#SBATCH --container-image={IMAGE}\n"
                      "#SBATCH --container-writable\n"
                      "touch /made && echo root-writable\necho args=$*\nexit 7\n")
    job_id = cluster.submit(str(script), "one", "two")
    done = cluster.wait_state(job_id, "FAILED", "COMPLETED", timeout=90)
    out = _output(cluster, job_id)
    assert done["state"] == "FAILED" and done["exit_code"] == 7, (done, out)
    assert "root-writable" in out.splitlines() and "args=one two" in out.splitlines()
    assert done["container"]["writable"] is True


def test_a_mount_the_user_cannot_read_fails_the_job(cluster: Cluster) -> None:
    missing = cluster.root / "no-such-dir"
    job_id = cluster.submit(f"--container-image={IMAGE}", f"--container-mounts={missing}:/x",
                            "--wrap", "echo never")
    done = cluster.wait_state(job_id, "FAILED", "COMPLETED", timeout=60)
    assert done["state"] == "FAILED"
    out = wait_for(lambda: _output(cluster, job_id), what="the job's output")
    assert f"--container-mounts: {missing}: not found or not readable" in out
    assert "never" not in out


def test_a_cancel_ends_the_whole_container(cluster: Cluster) -> None:
    """A container deaf to SIGTERM is gone after a cancel, and the runtime keeps no
    container of the run (root's podman runs it outside the job's cgroup)."""
    job_id = cluster.submit(f"--container-image={IMAGE}", "--wrap",
                            'trap "" TERM; echo started; sleep 7654321')
    cluster.wait_state(job_id, "RUNNING")
    wait_for(lambda: _sleepers("7654321"), what="the container's sleep")
    assert cluster.run("gcancel", str(job_id)).returncode == 0
    cluster.wait_state(job_id, "CANCELLED", timeout=30)
    wait_for(lambda: not _sleepers("7654321"), timeout=30, what="no process left",
             seen=lambda: _sleepers("7654321"))
    kept = subprocess.run([_podman(), "ps", "-a", "--format", "{{.Names}}"],
                          capture_output=True, text=True, timeout=60)
    assert f"gpusched-{job_id}-0" not in kept.stdout.split(), kept


def test_bad_options_are_refused_at_submit(cluster: Cluster) -> None:
    before = len(cluster.jobs())
    for args, words in (((f"--container-image={IMAGE}", "--container-mounts=/a:rel"),
                         "mount target must be"),
                        (("--container-image=--privileged",), "--container-image: expected"),
                        ((f"--container-image={IMAGE}", "--container-env=A=1"),
                         "--container-env: invalid format"),
                        ((f"--container-image={IMAGE}", "--container-save=/x.sqsh"),
                         "--container-save: not supported"),
                        (("--container-workdir=/w",), "needs --container-image"),
                        ((f"--container-image={IMAGE}", "--container-name=kept"),
                         "--container-name: needs enroot")):
        refused = cluster.run("gsubmit", *args, "--wrap", "true")
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(lines) == 1 and words in lines[0], refused
    assert len(cluster.jobs()) == before


def test_a_node_without_a_runtime_refuses_container_jobs(cluster: Cluster) -> None:
    runtime_args, run_args = cluster.container_setup  # type: ignore[attr-defined]
    config = cluster.config.read_text()
    cluster.kill("agent")
    cluster.config.write_text(config.replace(_agent_toml("podman", runtime_args, run_args),
                                             'container_runtime = "none"\n'))
    try:
        cluster.start("agent")
        wait_for(lambda: _runtime_gone(cluster), what="the node registered without a runtime")
        before = len(cluster.jobs())
        refused = cluster.run("gsubmit", f"--container-image={IMAGE}", "--wrap", "true")
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(lines) == 1, refused
        assert ("no node of partition gpu can run containers (no container runtime on "
                f"{cluster.node})") in lines[0]
        assert len(cluster.jobs()) == before
        plain = cluster.submit("--wrap", "true")  # other jobs are not affected
        assert cluster.wait_state(plain, "COMPLETED", timeout=30)["state"] == "COMPLETED"
    finally:
        cluster.kill("agent")
        cluster.config.write_text(config)
        cluster.start("agent")
        wait_for(lambda: not _runtime_gone(cluster), what="the node registered with podman")


def _runtime_gone(cluster: Cluster) -> bool:
    return cluster.api("GET", "/v1/nodes")["nodes"][0]["container_runtime"] is None


def test_a_user_s_job_runs_rootless_as_that_user(cluster: Cluster) -> None:
    """A job of a user other than root runs its runtime as that user (rootless podman,
    its storage under the job's HOME): remapped to root inside, files it makes in a
    mount are the user's on the node, and a mount of a directory the user cannot read
    fails the job before its runtime starts."""
    user = "cloudsdk" if _uid_of("cloudsdk") is not None else "nobody"
    uid = _uid_of(user)
    assert uid is not None and uid != 0
    home, runtime_dir, out = (cluster.root / f"{name}-{uid}" for name in ("home", "xdg", "out"))
    for path in (home, runtime_dir, out):
        path.mkdir(mode=0o700)
        os.chown(path, uid, uid)
    env = {**cluster.env, "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime_dir)}
    podman = _podman()
    _build_image(podman, user, env)
    # Submitted as the user through the API (this venv is not theirs to run).
    def submit(script: str, mounts: list[str]) -> int:
        answer = cluster.api_as(uid, uid, "POST", "/v1/jobs", {
            "script": f"#!/bin/sh\n{script}\n", "work_dir": str(cluster.work),
            "environment": {"HOME": str(home), "XDG_RUNTIME_DIR": str(runtime_dir),
                            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            "container": {"image": IMAGE, "remap_root": True, "mounts": mounts}})
        assert "job_id" in answer, answer
        return int(answer["job_id"])

    try:
        job_id = submit("id -u; touch /out/made-inside && echo made; cat /etc/os-release;"
                        " cat /proc/self/cgroup", [f"{out}:/out"])
        done = cluster.wait_state(job_id, "COMPLETED", "FAILED", timeout=120)
        text = _output(cluster, job_id)
        assert done["state"] == "COMPLETED" and done["user"] == user, (done, text)
        lines = text.splitlines()
        assert lines[0] == "0" and "made" in lines and f'NAME="{MARK}"' in lines, text
        assert (out / "made-inside").stat().st_uid == uid  # no privilege on the node
        # Still confined: the container's processes are in the job's cgroup.
        memory = next(line for line in lines if ":memory:" in line)
        assert memory.endswith(f"/job-{job_id}-0"), text
        secret = cluster.root / "secret"
        secret.mkdir(mode=0o700)  # root's alone
        refused = submit("ls /s", [f"{secret}:/s"])
        failed = cluster.wait_state(refused, "FAILED", "COMPLETED", timeout=60)
        assert failed["state"] == "FAILED"
        assert (f"--container-mounts: {secret}: not found or not readable by the job's user"
                in wait_for(lambda: _output(cluster, refused), what="output"))
        # A cancel ends every process of the container, one deaf to SIGTERM included.
        stubborn = submit('trap "" TERM; echo started; sleep 1234567', [])
        cluster.wait_state(stubborn, "RUNNING")
        wait_for(lambda: "started" in _output(cluster, stubborn), what="the job started")
        wait_for(lambda: _sleepers("1234567"), what="the container's sleep")
        cancelled = cluster.run("gcancel", str(stubborn))
        assert cancelled.returncode == 0, cancelled.stderr
        cluster.wait_state(stubborn, "CANCELLED", timeout=30)
        wait_for(lambda: not _sleepers("1234567"), timeout=30, what="no process left",
                 seen=lambda: _sleepers("1234567"))
    finally:
        subprocess.run([podman, "system", "reset", "-f"], capture_output=True, user=user,
                       env=env, timeout=120)


def _uid_of(user: str) -> int | None:
    import pwd

    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def test_an_array_of_an_image_archive(cluster: Cluster) -> None:
    """Each task of an array runs in the container, here of an image archive (``podman
    save``) named by a path relative to the working directory."""
    podman = _podman()
    runtime_args, _ = cluster.container_setup  # type: ignore[attr-defined]
    saved = subprocess.run([podman, *runtime_args, "save", "-o", str(cluster.work / "img.tar"),
                            IMAGE], capture_output=True, text=True, timeout=120)
    assert saved.returncode == 0, saved.stderr
    script = cluster.work / "array.sh"
    script.write_text("#!/bin/sh\n#SBATCH --array=0-1\n#SBATCH --container-image=./img.tar\n"
                      "grep NAME /etc/os-release; echo task=$SLURM_ARRAY_TASK_ID\n")
    array = cluster.submit(str(script))

    def tasks() -> list[dict[str, object]]:
        return [j for j in cluster.jobs() if j.get("array_job_id") == array
                and j["state"] not in ("PENDING", "RUNNING")]

    ended = wait_for(lambda: len(tasks()) == 2 and tasks(), timeout=120, what="both tasks")
    for task in ended:
        text = (cluster.work / f"gpusched-{task['job_id']}.out").read_text()
        assert task["state"] == "COMPLETED", (task, text)
        assert f'NAME="{MARK}"' in text and f"task={task['array_task_id']}" in text, text
        assert task["container"]["image"] == "./img.tar"


def _sleepers(mark: str) -> list[int]:
    """The processes of this host whose command line is ``sleep MARK``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[:2] == [b"sleep", mark.encode()]:
                found.append(int(entry))
    return found
