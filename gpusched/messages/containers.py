"""A job's container (pyxis's ``--container-*`` options): the image, bind mounts, working
directory, environment names and switches, each checked once against its bounds.

The same checks serve gsubmit (which reads the options' text) and the controller (which
reads the submission's ``container`` object). Everything here is data: what a node runs
for it is ``gpusched.agent.containers``'s part. Paths and names are held to characters
that can never be read as another option or a second list item by a runtime (no ``,``
or ``:`` in a path, no leading ``-`` anywhere), and a mount's source is checked again,
as the job's user, on the node (gpusched.agent.jobexec).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any

from gpusched.core.bounds import PATH_MAX
from gpusched.errors import UsageError
from gpusched.messages.fields import as_object, shown

RUNTIMES = ("podman", "enroot", "apptainer")  # what a node may run containers with
MAX_IMAGE = 512  # characters of an image reference or path
MAX_MOUNTS = 64  # bind mounts of one job
MAX_ENV_NAMES = 256  # names given to --container-env
MAX_ENV_NAME = 128  # characters of one of them
MAX_CONTAINER_NAME = 64  # characters of --container-name
# Mount flags a runtime takes for a bind mount (pyxis joins them with "+").
MOUNT_FLAGS = frozenset({"ro", "rw", "bind", "rbind", "private", "rprivate", "slave",
                         "rslave", "shared", "rshared", "nosuid", "nodev", "noexec"})
# pyxis's [USER@][REGISTRY#]IMAGE[:TAG] (also @sha256:... digests): no space, no comma,
# never a leading "-".
_IMAGE_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@#+-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTAINER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# The options gsubmit has for pyxis's that are not offered, and why (refused naming them).
NOT_SUPPORTED = {
    "container_save": "--container-save: not supported: a container's changes are not "
                      "saved to an image (use --container-writable for changes while "
                      "the job runs)",
}
SWITCHES = ("mount_home", "remap_root", "writable", "entrypoint")
FIELDS = frozenset({"image", "mounts", "workdir", "env", "name", *SWITCHES})


@dataclass(frozen=True)
class Mount:
    """One bind mount: ``source`` on the node (absolute, relative to the job's working
    directory, or ``tmpfs``), ``target`` in the container (absolute), its flags."""

    source: str
    target: str
    flags: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        """As pyxis writes it: ``SRC:DST[:FLAG+FLAG]``."""
        return f"{self.source}:{self.target}" + (f":{'+'.join(self.flags)}" if self.flags else "")


@dataclass(frozen=True)
class ContainerRequest:
    """What a job asks of its container; a switch left None takes the runtime's default
    (pyxis: the enroot configuration's), as pyxis does."""

    image: str
    mounts: tuple[Mount, ...] = ()
    workdir: str | None = None  # absolute, in the container; None: the image's own
    env: tuple[str, ...] = ()  # variables whose job value wins over the image's
    name: str | None = None  # a named container kept between jobs (enroot)
    mount_home: bool | None = None
    remap_root: bool | None = None
    writable: bool | None = None
    entrypoint: bool | None = None

    @classmethod
    def parse(cls, raw: object) -> ContainerRequest:
        """The submission's ``container`` object; the first fault is a UsageError."""
        body = as_object(raw, "container")
        unknown = sorted(set(body) - FIELDS)
        if unknown:
            raise UsageError(f"container: unknown field {shown(unknown[0])}")
        image = body.get("image")
        if not isinstance(image, str):
            raise UsageError("container.image: expected an image reference or path")
        mounts = body.get("mounts") or []
        env = body.get("env") or []
        if not isinstance(mounts, list) or not all(isinstance(m, str) for m in mounts):
            raise UsageError("container.mounts: expected a list of SRC:DST[:FLAGS] strings")
        if not isinstance(env, list) or not all(isinstance(e, str) for e in env):
            raise UsageError("container.env: expected a list of variable names")
        if len(mounts) > MAX_MOUNTS:
            raise UsageError(f"container.mounts: at most {MAX_MOUNTS} mounts, got {len(mounts)}")
        switches: dict[str, bool | None] = {}
        for key in SWITCHES:
            value = body.get(key)
            if value is not None and not isinstance(value, bool):
                raise UsageError(f"container.{key}: expected true, false or null")
            switches[key] = value
        workdir, name = body.get("workdir"), body.get("name")
        for key, value in (("workdir", workdir), ("name", name)):
            if value is not None and not isinstance(value, str):
                raise UsageError(f"container.{key}: expected a string or null")
        return cls(
            image=check_image(image),
            mounts=tuple(parse_mount(m) for m in mounts),
            workdir=None if workdir is None else check_workdir(workdir),
            env=parse_env_names(",".join(env)) if env else (),
            name=None if name is None else check_container_name(name),
            **switches)

    def to_json(self) -> dict[str, Any]:
        """The ``container`` object of a submission (and of a launch order)."""
        return {"image": self.image, "mounts": [m.text for m in self.mounts],
                "workdir": self.workdir, "env": list(self.env), "name": self.name,
                **{key: getattr(self, key) for key in SWITCHES}}


def check_image(text: str) -> str:
    """``--container-image``: an image reference (``[USER@][REGISTRY#]IMAGE[:TAG]``) or
    a path (starting ``/`` or ``.``) to an image file on the node."""
    expected = (f"--container-image: expected [USER@][REGISTRY#]IMAGE[:TAG] or a path to "
                f"an image file, at most {MAX_IMAGE} characters")
    if not text or len(text) > MAX_IMAGE:
        raise UsageError(f"{expected}, got {shown(text[:80])}")
    if text[0] in "/.":
        _check_path(text, "--container-image")
    elif not _IMAGE_REF.fullmatch(text):
        raise UsageError(f"{expected}, got {shown(text[:80])}")
    return text


def parse_mounts(text: str) -> tuple[Mount, ...]:
    """``--container-mounts``: ``SRC[:DST[:FLAGS]]`` items separated by commas."""
    items = text.split(",")
    if len(items) > MAX_MOUNTS:
        raise UsageError(f"--container-mounts: at most {MAX_MOUNTS} mounts, got {len(items)}")
    return tuple(parse_mount(item) for item in items)


def parse_mount(item: str) -> Mount:
    """One mount, pyxis's way: DST defaults to SRC, flags are joined with ``+``; a
    source is a path (absolute, or relative to the job's working directory) or ``tmpfs``;
    a relative target is taken from the container's root."""
    parts = item.split(":")
    if not item or len(parts) > 3 or not all(parts[:2]):
        raise UsageError(f"--container-mounts: invalid format: {shown(item[:200])}: expected "
                         "SRC[:DST[:FLAGS]]")
    source = parts[0]
    target = parts[1] if len(parts) > 1 else source
    flags = tuple(f for f in parts[2].split("+")) if len(parts) > 2 and parts[2] else ()
    if source == "umount":
        raise UsageError("--container-mounts: the source 'umount' (enroot's x-detach) is "
                         "not supported")
    if source != "tmpfs":
        if source[0] not in "/.":
            raise UsageError(f"--container-mounts: mount source must be a relative path, an "
                             f"absolute path or \"tmpfs\", got {shown(source[:200])}")
        _check_path(source, "--container-mounts")
    if target[0] not in "/.":
        raise UsageError(f"--container-mounts: mount target must be a relative path or an "
                         f"absolute path, got {shown(target[:200])}")
    _check_path(target, "--container-mounts")
    bad = [f for f in flags if f not in MOUNT_FLAGS]
    if bad:
        raise UsageError(f"--container-mounts: unknown mount flag {shown(bad[0][:40])}: "
                         f"expected some of {'+'.join(sorted(MOUNT_FLAGS))}")
    if "ro" in flags and "rw" in flags:
        raise UsageError(f"--container-mounts: {shown(item[:200])}: both ro and rw")
    return Mount(source, _in_container(target), tuple(dict.fromkeys(flags)))


def check_workdir(text: str) -> str:
    """``--container-workdir``: a path in the container; a relative one is taken from its
    root and may not climb above it (``../`` is ``/``), as pyxis has it."""
    if not text:
        raise UsageError("--container-workdir: argument required")
    _check_path(text, "--container-workdir")
    return _in_container(text)


def parse_env_names(text: str) -> tuple[str, ...]:
    """``--container-env``: variable names separated by commas."""
    names = text.split(",")
    if len(names) > MAX_ENV_NAMES:
        raise UsageError(f"--container-env: at most {MAX_ENV_NAMES} names, got {len(names)}")
    for name in names:
        if not name or len(name) > MAX_ENV_NAME or not _ENV_NAME.fullmatch(name):
            raise UsageError(f"--container-env: invalid format: {shown(text[:200])}: expected "
                             f"variable names (letters, digits, _; at most {MAX_ENV_NAME} "
                             "characters each) separated by commas")
    return tuple(dict.fromkeys(names))


def check_container_name(text: str) -> str:
    """``--container-name``: letters, digits, ``_ . -``, at most MAX_CONTAINER_NAME
    characters (pyxis's ``NAME:FLAGS`` forms are refused)."""
    if ":" in text:
        raise UsageError("--container-name: the NAME:FLAG forms (auto, create, exec, "
                         "no_exec) are not supported: give a plain name")
    if not 0 < len(text) <= MAX_CONTAINER_NAME or not _CONTAINER_NAME.fullmatch(text):
        raise UsageError(f"--container-name: expected letters, digits, '_', '.' or '-' (not "
                         f"first), at most {MAX_CONTAINER_NAME} characters, got "
                         f"{shown(text[:80])}")
    return text


def _check_path(text: str, option: str) -> None:
    if len(text.encode("utf-8", "surrogatepass")) >= PATH_MAX or "\0" in text \
            or not text.isprintable() or "," in text or ":" in text:
        raise UsageError(f"{option}: expected a printable path shorter than {PATH_MAX} "
                         f"bytes, without ',' or ':', got {shown(text[:200])}")


def _in_container(path: str) -> str:
    """A path in the container, absolute and normal (``..`` never above its root)."""
    return posixpath.normpath(posixpath.join("/", path)).replace("//", "/")
