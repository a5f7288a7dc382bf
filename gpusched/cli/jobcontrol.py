"""gcontrol's job control: job references (``17``, ``12_3``), one request per job, the
``KEY=VALUE`` settings of ``gcontrol update job``, and scontrol's own command forms."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpusched.cli.cancelling import describe_failure
from gpusched.cli.output import print_error
from gpusched.client import ApiClient
from gpusched.core.jobcontrol import JobRef, JobRefError, parse_job_ref, parse_job_refs
from gpusched.errors import GpuschedError, Unavailable, UsageError

# The keys of gcontrol update job (scontrol's names, any case), as the API names them.
UPDATE_KEYS = {"timelimit": "time_limit", "partition": "partition", "qos": "qos",
               "priority": "priority", "jobname": "name", "name": "name",
               "dependency": "dependency", "numnodes": "nodes", "minnodes": "nodes",
               "gres": "gpus_per_node", "trespernode": "gpus_per_node", "nice": "nice",
               "features": "constraint", "constraint": "constraint",
               "reservationname": "reservation", "reservation": "reservation"}
KNOWN = ("TimeLimit=, Partition=, QOS=, NumNodes= (MinNodes=), Gres=gpu:N (TresPerNode="
         "gres/gpu:N), Dependency=, JobName=, Nice=, Priority=, Features=, ReservationName=")
CLEARED = ("dependency", "constraint", "reservation")  # an empty value: none any more
NICE_ALONE = 100  # scontrol's Nice with no value


def job_refs(texts: Sequence[str]) -> list[JobRef]:
    """Job ids and array task ids (``17``, ``12_3``, ``17,18``); a usage error names a
    bad one."""
    try:
        return parse_job_refs(texts)
    except JobRefError as exc:
        raise UsageError(str(exc)) from None


def one_job(text: str) -> JobRef:
    """One job id or array task id."""
    try:
        return parse_job_ref(text)
    except JobRefError as exc:
        raise UsageError(str(exc)) from None


def post_each(prog: str, refs: Sequence[JobRef], action: str) -> int:
    """POST /v1/jobs/{ref}/ACTION for each; report failures and go on; the worst exit
    code."""
    worst = 0
    with ApiClient() as client:
        for ref in refs:
            try:
                client.request("POST", f"/v1/jobs/{ref.text()}/{action}", None)
            except Unavailable:
                raise  # the next ones would fail the same way; one line is enough
            except GpuschedError as err:
                print_error(prog, describe_failure(ref.text(), err.message))
                worst = max(worst, err.exit_code)
    return worst


def update_argv(args: list[str]) -> list[str]:
    """scontrol's ``update JobId=17 KEY=VALUE...`` (or ``Job=17``) as ``update job 17
    KEY=VALUE...``."""
    if len(args) >= 2 and args[0] == "update":
        key, sep, value = args[1].partition("=")
        if sep and key.lower() in ("jobid", "job"):
            return ["update", "job", value, *args[2:]]
    return args


def resume_argv(args: list[str]) -> list[str]:
    """scontrol's ``resume 17`` (jobs, not a node or GPU) as ``resume job 17``."""
    if len(args) >= 2 and args[0] == "resume" and args[1] not in ("node", "gpu", "job") \
            and not args[1].startswith("-") and args[1][:1].isdigit():
        return ["resume", "job", *args[1:]]
    return args


def update_body(settings: Sequence[str]) -> dict[str, Any]:
    """The update's KEY=VALUE settings as the API takes them (a key given twice: the
    last wins, as in scontrol)."""
    if not settings:
        raise UsageError(f"nothing to change: give some of {KNOWN}")
    body: dict[str, Any] = {}
    for setting in settings:
        if setting.strip().lower() == "nice":
            body["nice"] = NICE_ALONE
            continue
        key, sep, value = setting.partition("=")
        name = UPDATE_KEYS.get(key.strip().lower())
        if not sep or name is None or (not value.strip() and name not in CLEARED):
            shown = setting if len(setting) <= 60 else setting[:60] + "..."
            raise UsageError(f"invalid setting {shown!r}: expected {KNOWN} with a value")
        body[name] = _value(name, key.strip(), value.strip())
    return body


def _value(name: str, key: str, value: str) -> Any:
    """One setting's value, checked."""
    if name == "time_limit":
        from gpusched.core.timefmt import TimeFormatError, parse_time_limit
        try:
            seconds = parse_time_limit(value)
        except TimeFormatError as exc:
            raise UsageError(f"TimeLimit: {exc}") from None
        return "UNLIMITED" if seconds is None else seconds
    if name == "priority":
        return _priority(value)
    if name == "nodes":
        return _nodes(key, value)
    if name == "gpus_per_node":
        return _gpus(key, value)
    if name == "nice":
        digits = value.removeprefix("-").removeprefix("+")
        return (-1 if value.startswith("-") else 1) * _count(key, digits, 2_147_483_645)
    if name in ("constraint", "reservation"):
        return value or None
    return value


def _count(key: str, text: str, high: int) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > len(str(high)) \
            or int(text) > high:
        raise UsageError(f"invalid {key}={text!r}: expected a whole number up to {high}")
    return int(text)


def _nodes(key: str, value: str) -> int:
    """NumNodes=N, or N-N (a range of more than one count is not taken)."""
    low, dash, high = value.partition("-")
    count = _count(key, low, 65_536)
    if count < 1 or (dash and _count(key, high, 65_536) != count):
        raise UsageError(f"invalid {key}={value!r}: expected one number of nodes of at "
                         "least 1 (a job runs on a fixed number of nodes)")
    return count


def _gpus(key: str, value: str) -> int:
    """Gres=gpu:N or TresPerNode=gres/gpu:N: GPUs on each node (the type stays)."""
    text = value.removeprefix("gres/") if key.lower() == "trespernode" else value
    parts = text.split(":")
    if parts[0] != "gpu" or len(parts) != 2:
        raise UsageError(f"invalid {key}={value!r}: expected gpu:N, GPUs on each node "
                         "(the GPU type cannot change)")
    return _count(key, parts[1], 65_536)


def _priority(text: str) -> float | None:
    """Priority=N (a number >= 0) or Priority=none."""
    word = text.strip()
    if word.lower() == "none":
        return None
    try:
        value = float(word)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise UsageError(f"invalid Priority={word!r}: expected a number of 0 or more, or none")
    return value
