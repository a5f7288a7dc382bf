"""The parts of a submission (``POST /v1/jobs``) that take more than one field or a
parser of their own, each read from the request's body and checked, for
``gpusched.messages.jobs.JobRequest``."""

from __future__ import annotations

import re
import signal
from datetime import datetime

from gpusched.core import bounds, outputs
from gpusched.core.arrays import ArrayError, parse_array
from gpusched.core.dependency import (
    Dependency,
    DependencyError,
    parse_dependency,
)
from gpusched.core.features import ConstraintError, check_request, parse_constraint
from gpusched.core.licenses import (
    MAX_LICENSES_TEXT,
    LicenseError,
    Licenses,
    parse_licenses,
)
from gpusched.core.mail import (
    MAX_MAIL_USER,
    MailError,
    check_mail_user,
    parse_mail_types,
)
from gpusched.core.shapes import ShapeError, parse_kinds
from gpusched.core.signals import DEFAULT_WARN_SECONDS, MAX_WARN_SECONDS, WarnSignal
from gpusched.errors import UsageError
from gpusched.messages.containers import ContainerRequest
from gpusched.messages.fields import (
    Body,
    bounded,
    flag,
    integer,
    one_of,
    optional_integer,
    path,
    shown,
    string_map,
    strings,
    text,
    typed,
    words,
)

MAX_ARRAY_TEXT = 10_000  # characters of an --array value
MAX_GPU_TYPES = 64  # acceptable GPU types or MIG profiles of one job
MAX_SUBMIT_KEY = 64  # characters of a submission's key
_SUBMIT_KEY = re.compile(r"[!-~]{1,%d}" % MAX_SUBMIT_KEY)  # printable ASCII, no space
BEGIN_EXPECTED = "an ISO 8601 time with a zone, such as 2026-12-24T18:30:00+00:00"
SHARE_MODES = ("mps", "shard")  # --gres=mps:N, --gres=shard:N
MAX_SHARE = 10_000  # units of one GPU a job may ask for (a partition offers at most as many)
MAX_GPU_MEM_MB = 16 * 1024 * 1024  # --gpu-mem: 16 TiB


def request_text(body: Body) -> tuple[str, list[str], dict[str, str]]:
    """The script, its arguments and the environment, within their bounds."""
    script = typed(body, "script", str, None, "the batch script text")
    if script is None or not script.startswith("#!"):
        raise UsageError("This does not look like a batch script: the first line must start "
                         "with #! followed by the path to an interpreter")
    args, env = strings(body, "args"), string_map(body, "environment")
    return (bounded(bounds.check_script, script), bounded(bounds.check_args, args),
            bounded(bounds.check_environment, env))


def output_pattern(body: Body, key: str) -> str | None:
    """An output file pattern (``%j`` and friends), within its bounds."""
    pattern = path(body, key, "a file name pattern")
    if pattern is not None:
        problem = outputs.output_pattern_error(pattern)
        if problem is not None:
            raise UsageError(f"{key}: {problem}")
    return pattern


def submit_key(value: object) -> str | None:
    """A submission's key: 1 to 64 printable ASCII characters, no space; or None."""
    if value is None:
        return None
    if not isinstance(value, str) or not _SUBMIT_KEY.fullmatch(value):
        raise UsageError(f"submit_key: expected 1 to {MAX_SUBMIT_KEY} printable ASCII "
                         f"characters (no space), got {shown(value)}")
    return value


def array(value: str | None) -> str | None:
    """An ``--array`` value that parses, as it was sent."""
    if value is None:
        return None
    if len(value) > MAX_ARRAY_TEXT:
        raise UsageError(f"array: {len(value)} characters, more than the {MAX_ARRAY_TEXT} "
                         "allowed")
    try:
        parse_array(value)
    except ArrayError as exc:
        raise UsageError(str(exc)) from None
    return value


def node_choice(body: Body) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The nodes a job names (it runs on exactly those) and those it excludes."""
    nodelist = tuple(dict.fromkeys(words(body, "nodelist", bounds.MAX_LIST, "node names")))
    exclude = tuple(dict.fromkeys(words(body, "exclude", bounds.MAX_LIST, "node names")))
    both = sorted(set(nodelist) & set(exclude))
    if both:
        raise UsageError(f"node {both[0]} is both named (nodelist) and excluded")
    count = body.get("nodes")
    if nodelist and count is not None and count != len(nodelist):
        raise UsageError(f"nodes: the job names {len(nodelist)} node(s) in its nodelist, so it "
                         f"runs on {len(nodelist)}, not {shown(count)}")
    return nodelist, exclude


def warn_signal(body: Body) -> WarnSignal | None:
    """``warn_signal``: {"signal": N, "seconds": S, "batch_only": B}, or null."""
    warn = typed(body, "warn_signal", dict, None,
                 'an object {"signal", "seconds", "batch_only"}')
    if warn is None:
        return None
    unknown = sorted(str(k) for k in set(warn) - {"signal", "seconds", "batch_only"})
    if unknown:
        raise UsageError(f"warn_signal: unknown key {unknown[0]!r}")
    number = typed(warn, "signal", int, None, "a signal number")
    if number is None or not 1 <= number < signal.NSIG:
        raise UsageError("warn_signal.signal: expected a signal number from 1 to "
                         f"{signal.NSIG - 1}")
    seconds = typed(warn, "seconds", int, DEFAULT_WARN_SECONDS, "seconds before the time limit")
    if not 0 <= seconds <= MAX_WARN_SECONDS:
        raise UsageError(f"warn_signal.seconds: expected 0 to {MAX_WARN_SECONDS}, got {seconds}")
    return WarnSignal(number, seconds, flag(warn, "batch_only"))


def shape(body: Body, gpus: int, default_nodes: int) -> tuple[tuple[str, ...], int, int, int]:
    """GPU types, nodes, and CPUs and memory per node, validated."""
    types = typed(body, "gpu_types", list, [], "a list of GPU types or MIG profiles")
    if len(types) > MAX_GPU_TYPES or not all(
            isinstance(t, str) and len(t) <= bounds.MAX_WORD for t in types):
        raise UsageError(f"gpu_types: expected a list of at most {MAX_GPU_TYPES} GPU types or "
                         "MIG profiles")
    try:
        kinds = parse_kinds("|".join(types), "gpu_types", repr(types)) if types else ()
    except ShapeError as exc:
        raise UsageError(str(exc)) from None
    if len(kinds) > MAX_GPU_TYPES:  # a type may hold several: "a100|h100"
        raise UsageError(f"gpu_types: expected a list of at most {MAX_GPU_TYPES} GPU types or "
                         "MIG profiles")
    nodes = integer(body, "nodes", default_nodes, 1, bounds.MAX_NODES, "a number of nodes")
    cpus = integer(body, "cpus", 0, 0, bounds.MAX_CPUS, "CPUs per node")
    mem_mb = integer(body, "mem_mb", 0, 0, bounds.MAX_MEM_MB, "MiB of memory per node")
    if gpus % nodes:
        raise UsageError(f"gpus: {gpus} GPUs cannot be spread evenly over {nodes} nodes")
    if kinds and gpus == 0:
        raise UsageError("gpu_types: a GPU type needs a number of GPUs (--gpus TYPE:N)")
    return kinds, nodes, cpus, mem_mb


def share(body: Body, gpus: int, nodes: int,
           exclusive: bool) -> tuple[str | None, int | None, int | None]:
    """``share_mode`` and ``share`` (both or neither) and ``gpu_mem_mb``: a share of one GPU
    and the GPU memory a job needs. Either asks for one GPU on one node: not with more
    GPUs, more nodes or --exclusive."""
    mode = None if body.get("share_mode") is None else one_of(body, "share_mode", SHARE_MODES)
    share = optional_integer(body, "share", 1, MAX_SHARE, "units of one GPU")
    if (mode is None) != (share is None):
        raise UsageError("share_mode: give it with share (units of one GPU), or neither"
                         if share is not None else
                         f"share: a {mode} request needs share, the units of one GPU it asks for")
    memory = optional_integer(body, "gpu_mem_mb", 1, MAX_GPU_MEM_MB, "MB of GPU memory")
    if mode is None and memory is None:
        return None, None, None
    what = (f"a share of one GPU (share_mode {mode})" if mode is not None
            else "GPU memory (gpu_mem_mb)")
    if gpus > 1:
        raise UsageError(f"gpus: {what} is one GPU, not {gpus}")
    if nodes > 1:
        raise UsageError(f"nodes: {what} is on one node, not {nodes}")
    if exclusive:
        raise UsageError(f"exclusive: {what} cannot take whole nodes")
    return mode, share, memory


def whole_or_shared(exclusive: bool, share_mode: str | None, gpu_mem_mb: int | None) -> bool:
    """Whether a job takes whole nodes or a share of a GPU (by mode or by memory): its
    -C may then count no features (core.features.check_request)."""
    return exclusive or share_mode is not None or gpu_mem_mb is not None


def constraint(body: Body, nodes: int, whole_or_shared: bool) -> str | None:
    """``constraint``: sbatch's -C text, canonical (null or absent: none); counts may
    not name more nodes than the job has, nor go with --exclusive or a GPU share."""
    value = typed(body, "constraint", str, None, "node features such as \"a100&nvlink\"")
    if value is None:
        return None
    try:
        parsed = parse_constraint(value)
        check_request(parsed, nodes, whole_or_shared)
    except ConstraintError as err:
        raise UsageError(f"constraint: {err.message.removeprefix('--constraint: ')}") from None
    return parsed.text()


def licenses(body: Body) -> Licenses:
    """``licenses``: sbatch's -L text, ``name[:N][,name[:N]...]`` (null or absent: none)."""
    value = text(body, "licenses", MAX_LICENSES_TEXT, "licenses such as \"matlab:2,ansys\"")
    if value is None:
        return ()
    try:
        return parse_licenses(value)
    except LicenseError as err:
        raise UsageError(f"licenses: {err.message.removeprefix('--licenses: ')}") from None


def mail(body: Body) -> tuple[tuple[str, ...], str | None]:
    """``mail_type`` (a list of sbatch's type names) and ``mail_user`` (a user name or
    one mail address: nothing that could split or add a mail header)."""
    names = typed(body, "mail_type", list, [], "a list of mail types such as [\"END\", \"FAIL\"]")
    user = text(body, "mail_user", MAX_MAIL_USER, "a user name or a mail address")
    try:
        return parse_mail_types(names), None if user is None else check_mail_user(user)
    except MailError as exc:
        raise UsageError(str(exc)) from None


def check_partition_list(text: str | None) -> None:
    """A comma list of partitions (sbatch -p a,b) names no empty one."""
    if text is not None and "," in text and not all(n.strip() for n in text.split(",")):
        raise UsageError(f"partition: an empty name in {text!r}")


def begin_time(value: object) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise UsageError(f"begin_time: expected {BEGIN_EXPECTED}, got {shown(value)}")
    try:
        begin = datetime.fromisoformat(value) if len(value) <= 64 else None
    except ValueError:
        begin = None
    if begin is None or begin.tzinfo is None:
        raise UsageError(f"begin_time: expected {BEGIN_EXPECTED}, got {shown(value)}")
    return begin


def dependency(text: str | None) -> tuple[Dependency, ...]:
    """The clauses of a --dependency value; whether the jobs exist is the database's part."""
    if text is None or not text.strip():
        return ()
    try:
        return parse_dependency(text)
    except DependencyError as exc:
        raise UsageError(str(exc)) from None


def container(body: Body, interactive: bool) -> ContainerRequest | None:
    """``container``: the job's container (None: none); an allocation runs nothing in one."""
    if body.get("container") is None:
        return None
    if interactive:
        raise UsageError("container: an interactive allocation runs nothing in a container")
    return ContainerRequest.parse(body["container"])
