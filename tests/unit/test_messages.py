"""The typed messages that cross a process boundary (gpusched.messages): what parses comes
back the same through to_json and JSON; anything else, however hostile, is one
UsageError and never another exception; each bound holds at its edge."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.core import bounds
from gpusched.core.dependency import Dependency
from gpusched.core.signals import WarnSignal
from gpusched.errors import UsageError
from gpusched.messages import (
    MAX_ERROR_TEXT,
    OUTCOMES,
    UNLIMITED,
    JobEnd,
    JobRequest,
    JobUpdate,
    LaunchOrder,
    LimitJob,
    NodeCommand,
    NodeHealth,
    SignalJob,
    error_text,
    launch_job_of,
)
from gpusched.messages.agent import MAX_EPOCH, MAX_ERROR_INPUT
from gpusched.messages.fields import MAX_UID
from gpusched.messages.jobs import MAX_GPU_MEM_MB, MAX_SHARE

Message = JobRequest | JobUpdate | LaunchOrder | JobEnd | NodeCommand | NodeHealth
PARSERS: dict[str, Callable[[object], Message]] = {
    "JobRequest": JobRequest.parse, "JobUpdate": JobUpdate.parse,
    "LaunchOrder": LaunchOrder.parse, "JobEnd": JobEnd.parse, "NodeCommand": NodeCommand.parse,
    "NodeHealth": NodeHealth.parse,
}

# ------------------------------------------------------------ strategies

HOSTILE = st.sampled_from(["\x1b]8;;http://x\x07", "a\x1b[31mb", "\u202egnp.exe", "\x00",
                           "tab\there", "\x9b", "\u2028", "\ud800", "x\udcff", "", " ",
                           "9" * 30, "-1", "UNLIMITED", "a" * 5000, "%99999999999j"])
NUMBERS = (st.integers() | st.integers(-2**70, 2**70) | st.just(2**64) | st.just(-1)
           | st.floats(allow_nan=True, allow_infinity=True) | st.just(10**400))
SCALARS = st.none() | st.booleans() | NUMBERS | st.text(max_size=20) | HOSTILE
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=10) | HOSTILE, inner, max_size=4),
    max_leaves=10)
PRINTABLE = st.text(st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl",
                                                        "Zp", "Zs")), min_size=1, max_size=30)
WORD = st.from_regex(r"\A[a-z][a-z0-9-]{0,11}\Z")
ARG = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
              max_size=20)
ENV = st.dictionaries(
    st.text(st.characters(blacklist_characters="=\x00", blacklist_categories=("Cs",)),
            min_size=1, max_size=10), ARG, max_size=4)
ZONES = st.integers(-23 * 60, 23 * 60).map(lambda m: timezone(timedelta(minutes=m)))
UUID = st.uuids().map(lambda u: f"GPU-{u}")


def _maybe(draw: st.DrawFn, body: dict[str, Any], key: str,
           strategy: st.SearchStrategy[Any]) -> None:
    if draw(st.booleans()):
        body[key] = draw(strategy)


@st.composite
def job_requests(draw: st.DrawFn) -> dict[str, Any]:
    """A submission that must parse."""
    body: dict[str, Any] = {"script": "#!/bin/sh\n" + draw(ARG),
                            "work_dir": "/tmp/" + draw(WORD)}
    nodelist = draw(st.lists(WORD, unique=True, max_size=3))
    nodes = len(nodelist) or draw(st.integers(1, 4))
    if nodelist:
        body["nodelist"] = nodelist
    elif draw(st.booleans()):
        body["nodes"] = nodes
    gpus = nodes * draw(st.integers(0, 8))
    body["gpus"] = gpus
    if gpus:
        _maybe(draw, body, "gpu_types",
               st.lists(st.sampled_from(["a100", "H100-80gb", " l4 ", "1g.10gb", "a100|h100"]),
                        max_size=3))
    exclude = draw(st.lists(WORD, unique=True, max_size=2))
    if exclude and not set(exclude) & set(nodelist):
        body["exclude"] = exclude
    _maybe(draw, body, "args", st.lists(ARG, max_size=4))
    _maybe(draw, body, "environment", ENV)
    _maybe(draw, body, "name", PRINTABLE)
    _maybe(draw, body, "cpus", st.integers(0, bounds.MAX_CPUS))
    _maybe(draw, body, "mem_mb", st.integers(0, bounds.MAX_MEM_MB))
    _maybe(draw, body, "warn_signal", st.fixed_dictionaries(
        {"signal": st.integers(1, signal.NSIG - 1)},
        optional={"seconds": st.integers(0, 65535), "batch_only": st.booleans()}))
    _maybe(draw, body, "time_limit", st.integers(1, bounds.MAX_TIME_LIMIT)
           | st.just(UNLIMITED) | st.none())
    _maybe(draw, body, "partition", WORD | st.lists(WORD, min_size=2, max_size=3).map(",".join))
    _maybe(draw, body, "account", WORD)
    _maybe(draw, body, "qos", WORD)
    _maybe(draw, body, "hold", st.booleans())
    _maybe(draw, body, "exclusive", st.booleans())
    _maybe(draw, body, "requeue", st.booleans() | st.none())
    _maybe(draw, body, "begin_time", st.datetimes(timezones=ZONES).map(datetime.isoformat))
    _maybe(draw, body, "dependency", st.sampled_from(
        ["afterok:12:13,singleton", " afterany:0012:12 , afternotok:7", "singleton", ""]))
    _maybe(draw, body, "array", st.sampled_from(["0-99", "1,3,5-9%4", "0-30:10", " 4 "]))
    _maybe(draw, body, "output", st.sampled_from(["out-%j.txt", "/tmp/%x-%A_%a.log", "%5j.out"]))
    _maybe(draw, body, "error", st.sampled_from(["err-%j.txt", None]))
    _maybe(draw, body, "umask", st.integers(0, 0o777))
    _maybe(draw, body, "gres_flags", st.sampled_from(["enforce-binding", "disable-binding",
                                                      None]))
    if nodes == 1 and gpus <= 1 and not body.get("exclusive"):  # a share: one GPU, one node
        if draw(st.booleans()):
            body["share_mode"] = draw(st.sampled_from(["mps", "shard"]))
            body["share"] = draw(st.integers(1, MAX_SHARE))
        _maybe(draw, body, "gpu_mem_mb", st.integers(1, MAX_GPU_MEM_MB) | st.none())
    return body


@st.composite
def job_updates(draw: st.DrawFn) -> dict[str, Any]:
    """A change that must parse."""
    choices = {"time_limit": st.integers(1, bounds.MAX_TIME_LIMIT) | st.just(UNLIMITED),
               "partition": WORD | st.none(), "qos": WORD | st.none(),
               "priority": st.floats(0, 1e9) | st.integers(0, 2**40) | st.none()}
    keys = draw(st.sets(st.sampled_from(sorted(choices)), min_size=1))
    return {key: draw(choices[key]) for key in keys}


@st.composite
def launch_orders(draw: st.DrawFn, job_id: int | None = None, run: int | None = None,
                  node: str | None = None) -> dict[str, Any]:
    """A launch order that must parse."""
    body: dict[str, Any] = {
        "job_id": draw(st.integers(1, bounds.MAX_JOB_ID)) if job_id is None else job_id,
        "node": draw(WORD) if node is None else node, "name": draw(PRINTABLE),
        "user": draw(WORD), "uid": draw(st.integers(0, MAX_UID)),
        "gid": draw(st.integers(0, MAX_UID)), "script": "#!/bin/sh\n" + draw(ARG),
        "work_dir": "/srv/" + draw(WORD)}
    if run is not None:
        body["restarts"] = run
    else:
        _maybe(draw, body, "restarts", st.integers(0, bounds.MAX_INT32))
    _maybe(draw, body, "args", st.lists(ARG, max_size=4))
    _maybe(draw, body, "environment", ENV)
    _maybe(draw, body, "output", st.sampled_from(["out-%j.txt", "wide-%99999999999j.out", None]))
    _maybe(draw, body, "error", st.sampled_from(["/abs/%u.err", None]))
    _maybe(draw, body, "umask", st.integers(0, 0o777) | st.none())
    _maybe(draw, body, "time_limit", st.integers(0, bounds.MAX_TIME_LIMIT) | st.none())
    _maybe(draw, body, "warn_signal", st.integers(1, signal.NSIG - 1) | st.none())
    _maybe(draw, body, "warn_seconds", st.integers(0, 65535) | st.none())
    _maybe(draw, body, "warn_batch_only", st.booleans())
    _maybe(draw, body, "gpu_uuids", st.lists(UUID, max_size=4))
    _maybe(draw, body, "node_names", st.lists(WORD, max_size=3) | st.none())
    _maybe(draw, body, "array_job_id", st.integers(1, bounds.MAX_JOB_ID) | st.none())
    _maybe(draw, body, "array_task_id", st.integers(0, 999_999) | st.none())
    _maybe(draw, body, "array_spec", st.sampled_from(["0-30:10", "1,3,5-9", "7", None]))
    _maybe(draw, body, "cpus", st.integers(0, bounds.MAX_CPUS))
    _maybe(draw, body, "mem_mb", st.integers(0, bounds.MAX_MEM_MB))
    _maybe(draw, body, "gres_flags", st.sampled_from(["enforce-binding", "disable-binding",
                                                      None]))
    return body


@st.composite
def job_ends(draw: st.DrawFn) -> dict[str, Any]:
    """An end report that must parse."""
    body: dict[str, Any] = {"node": draw(WORD), "outcome": draw(st.sampled_from(OUTCOMES))}
    _maybe(draw, body, "exit_code", st.integers(0, 255) | st.none())
    _maybe(draw, body, "signal", st.integers(1, signal.NSIG - 1) | st.none())
    _maybe(draw, body, "end_time", st.floats(0, MAX_EPOCH) | st.integers(0, MAX_EPOCH)
           | st.none())
    _maybe(draw, body, "error", st.text(max_size=2 * MAX_ERROR_TEXT) | HOSTILE | st.none())
    _maybe(draw, body, "run", st.integers(0, bounds.MAX_INT32) | st.none())
    _maybe(draw, body, "max_rss_bytes", st.integers(0, 2**63 - 1) | st.none())
    _maybe(draw, body, "cpu_usec", st.integers(0, 2**63 - 1) | st.none())
    _maybe(draw, body, "epilog_error", st.text(max_size=50) | HOSTILE | st.none())
    return body


@st.composite
def health_reports(draw: st.DrawFn) -> dict[str, Any]:
    """A node health report that must parse."""
    body: dict[str, Any] = {"node": draw(WORD), "ok": draw(st.booleans())}
    _maybe(draw, body, "reason", PRINTABLE | st.none())
    return body


@st.composite
def node_commands(draw: st.DrawFn) -> dict[str, Any]:
    """A node command that must parse."""
    kind = draw(st.sampled_from(["launch", "cancel", "signal", "limit", "kill"]))
    body: dict[str, Any] = {"kind": kind, "node": draw(WORD),
                            "job_id": draw(st.integers(1, bounds.MAX_JOB_ID)),
                            "run": draw(st.integers(0, bounds.MAX_INT32)),
                            "seq": draw(st.integers(1, bounds.MAX_JOB_ID))}
    if kind == "launch":
        body["payload"] = draw(launch_orders(body["job_id"], body["run"], body["node"]))
    elif kind == "signal":
        body["payload"] = {"signal": draw(st.integers(1, signal.NSIG - 1))}
    elif kind == "limit":
        body["payload"] = {"time_limit": draw(st.integers(0, bounds.MAX_TIME_LIMIT) | st.none())}
        _maybe(draw, body["payload"], "deadline", st.floats(0, MAX_EPOCH) | st.none())
    else:
        _maybe(draw, body, "payload", st.just({}) | st.none())
    return body


VALID: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "JobRequest": job_requests(), "JobUpdate": job_updates(), "LaunchOrder": launch_orders(),
    "JobEnd": job_ends(), "NodeCommand": node_commands(), "NodeHealth": health_reports(),
}


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A valid message of some kind with fields replaced, added or dropped at random."""
    name = draw(st.sampled_from(sorted(VALID)))
    body = draw(VALID[name])
    for _ in range(draw(st.integers(1, 3))):
        key = draw((st.sampled_from(sorted(body)) if body else st.nothing())
                   | st.text(max_size=8))
        if draw(st.integers(0, 4)) == 0:
            body.pop(key, None)
        else:
            body[key] = draw(JSON_VALUES)
    return name, body


def _through_json(message: Message) -> Any:
    return json.loads(json.dumps(message.to_json()))


# ------------------------------------------------------------ properties


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(sorted(VALID)).flatmap(
    lambda name: st.tuples(st.just(name), VALID[name])))
def test_every_valid_message_parses_and_round_trips(case: tuple[str, dict[str, Any]]) -> None:
    name, body = case
    message = PARSERS[name](body)
    again = PARSERS[name](_through_json(message))
    assert again == message
    assert again.to_json() == message.to_json()


@settings(max_examples=1500, deadline=None)
@given(case=mutated())
def test_a_mutated_message_parses_or_is_one_usage_error(case: tuple[str, dict[str, Any]]) -> None:
    name, body = case
    try:
        message = PARSERS[name](body)
    except UsageError as exc:
        assert exc.message and "\n" not in exc.message[:200]
        return
    assert PARSERS[name](_through_json(message)) == message


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(sorted(PARSERS)), raw=JSON_VALUES)
def test_any_json_value_parses_or_is_one_usage_error(name: str, raw: object) -> None:
    try:
        message = PARSERS[name](raw)
    except UsageError as exc:
        assert exc.message
        return
    assert type(message).__name__ == name


# ------------------------------------------------------------ JobRequest

BASE = {"script": "#!/bin/sh\ntrue\n", "work_dir": "/tmp"}


def test_a_request_takes_its_defaults_and_normal_forms() -> None:
    request = JobRequest.parse({
        **BASE, "nodelist": ["n1", "n2", "n1"], "gpus": 4, "gpu_types": [" A100|h100 "],
        "dependency": " afterok:0012:12:13 , singleton", "begin_time": "2026-12-24T18:30:00+01:00",
        "warn_signal": {"signal": 10}, "name": None, "hold": None, "array": "0-9%2"})
    assert (request.name, request.nodes, request.nodelist) == ("job", 2, ("n1", "n2"))
    assert request.gpu_types == ("a100", "h100")
    assert request.dependency == (Dependency("afterok", (12, 13)), Dependency("singleton"))
    assert request.dependency_text == "afterok:12:13,singleton"
    assert request.dependency_job_ids == {12, 13}
    assert request.begin_time == datetime(2026, 12, 24, 17, 30, tzinfo=UTC)
    assert request.warn_signal == WarnSignal(10, 60, False)
    assert request.array_spec is not None and request.array_spec.text() == "0-9%2"
    assert (request.hold, request.requeue, request.time_limit) == (False, None, None)


@pytest.mark.parametrize(("change", "message"), [
    ({"smuggled": 1}, "unknown field 'smuggled' in the submission"),
    ({"script": "echo hi"}, "does not look like a batch script"),
    ({"gpus": True}, "gpus: expected a whole number of GPUs, got True"),
    ({"gpus": bounds.MAX_GPUS + 1}, f"gpus: expected a whole number of GPUs from 0 to "
                                    f"{bounds.MAX_GPUS}"),
    ({"name": "x" * 201}, "name: expected at most 200 characters, got 201"),
    ({"name": "a\x1bb"}, "name: the character U+001B is not allowed"),
    ({"work_dir": "rel"}, "work_dir: expected an absolute directory path, got 'rel'"),
    ({"output": "%11j"}, "output:"),
    ({"umask": 0o1000}, "umask: expected a file mode creation mask from 0 to 511"),
    ({"array": "1," * 6000}, "array: 12000 characters, more than the 10000 allowed"),
    ({"nodelist": ["a"], "exclude": ["a"]}, "node a is both named (nodelist) and excluded"),
    ({"nodelist": ["a"], "nodes": 2}, "runs on 1, not 2"),
    ({"nodelist": ["a\u202e"]}, "nodelist: the character U+202E is not allowed"),
    ({"warn_signal": {"signal": signal.NSIG}}, "warn_signal.signal: expected a signal number"),
    ({"warn_signal": {"signal": 10, "when": 1}}, "warn_signal: unknown key 'when'"),
    ({"gpu_types": ["a100|h100"] * 33, "gpus": 1}, "gpu_types: expected a list of at most 64"),
    ({"gpu_types": ["a100"]}, "gpu_types: a GPU type needs a number of GPUs"),
    ({"gpus": 3, "nodes": 2}, "gpus: 3 GPUs cannot be spread evenly over 2 nodes"),
    ({"partition": "a,,b"}, "partition: an empty name in 'a,,b'"),
    ({"time_limit": 0}, f"time_limit: expected seconds from 1 to {bounds.MAX_TIME_LIMIT}"),
    ({"time_limit": "1:00"}, "time_limit: expected seconds or \"UNLIMITED\", got '1:00'"),
    ({"begin_time": "2026-12-24T18:30:00"}, "begin_time: expected an ISO 8601 time with a zone"),
    ({"dependency": "afterok:x"}, "invalid dependency 'afterok:x'"),
    ({"requeue": "yes"}, "requeue: expected true, false or null, got 'yes'"),
    ({"gres_flags": "enforce"}, "gres_flags: expected one of ['disable-binding', "
                                "'enforce-binding'], got 'enforce'"),
    ({"gres_flags": True}, "gres_flags: expected one of"),
])
def test_a_request_out_of_bounds_is_refused_with_its_field(change: dict[str, Any],
                                                           message: str) -> None:
    with pytest.raises(UsageError) as caught:
        JobRequest.parse({**BASE, **change})
    assert message in caught.value.message


def test_a_request_is_a_json_object() -> None:
    for raw in ([], "x", None, {1: 2}):
        with pytest.raises(UsageError, match="the submission: expected a JSON object"):
            JobRequest.parse(raw)


# ------------------------------------------------------------ JobUpdate


def test_an_update_keeps_which_fields_were_given() -> None:
    update = JobUpdate.parse({"partition": None, "priority": 5})
    assert update.changes == {"partition", "priority"} and update.priority == 5.0
    assert update.to_json() == {"partition": None, "priority": 5.0}


@pytest.mark.parametrize(("body", "message"), [
    ({}, "update: expected some of constraint, dependency, gpus_per_node, name, nice, nodes, "
         "partition, priority, qos, reservation, time_limit"),
    ({"colour": 5}, "; unknown: colour"),
    ({"a\nb": 5}, "; unknown: 'a\\nb'"),
    ({"priority": -1}, "priority: expected a number of 0 or more, or null, got -1"),
    ({"priority": float("nan")}, "priority: expected a number of 0 or more"),
    ({"priority": 10**400}, "priority: expected a number of 0 or more"),
    ({"priority": True}, "priority: expected a number of 0 or more"),
    ({"time_limit": -5}, "time_limit: expected seconds from 1"),
    ({"partition": 5}, "partition: expected a partition name, got 5"),
    ({"qos": "x" * 257}, "qos: expected at most 256 characters"),
])
def test_an_update_out_of_bounds_is_refused(body: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        JobUpdate.parse(body)
    assert message in caught.value.message


# ------------------------------------------------------------ LaunchOrder

ORDER = {"job_id": 7, "node": "n1", "name": "train", "user": "alice", "uid": 1000,
         "gid": 1000, "script": "#!/bin/sh\n", "work_dir": "/home/alice"}


def test_an_order_reads_restarts_as_its_run_and_keeps_what_submit_would_refuse() -> None:
    order = LaunchOrder.parse({**ORDER, "restarts": 2, "output": "w-%99999999999999j.out"})
    assert (order.run, order.output, order.node_names, order.umask) == (
        2, "w-%99999999999999j.out", (), None)
    assert order.to_json()["restarts"] == 2 and "run" not in order.to_json()


@pytest.mark.parametrize(("change", "message"), [
    ({"job_id": 0}, "job_id: expected a job id from 1 to"),
    ({"job_id": None}, "job_id: expected a job id, got nothing"),
    ({"uid": -1}, "uid: expected a uid from 0 to 4294967294, got -1"),
    ({"uid": 2**32 - 1}, "uid: expected a uid from 0 to"),
    ({"gid": "0"}, "gid: expected a gid, got '0'"),
    ({"restarts": -1}, "restarts: expected a restart count from 0 to"),
    ({"name": "a\x1b[2Jb"}, "name: the character U+001B is not allowed"),
    ({"user": ""}, "user: expected 1 to 256 characters, got none"),
    ({"work_dir": "relative"}, "work_dir: expected an absolute directory path"),
    ({"script": None}, "script: expected the batch script text, got nothing"),
    ({"script": "#!/bin/sh\n\x00"}, "script: contains a NUL character"),
    ({"args": ["a\x00"]}, "args: an argument contains a NUL character"),
    ({"environment": {"A=B": "c"}}, "environment: 'A=B' is not a variable name"),
    ({"umask": 0o1000}, "umask: expected a file mode creation mask from 0 to 511"),
    ({"time_limit": -1}, "time_limit: expected seconds from 0 to"),
    ({"warn_signal": 0}, "warn_signal: expected a signal number from 1 to"),
    ({"gpu_uuids": ["GPU-1", 2]}, "gpu_uuids: expected a list of GPU UUIDs"),
    ({"node_names": ["n\u2028"]}, "node_names: the character U+2028 is not allowed"),
    ({"array_task_id": 1_000_000}, "array_task_id: expected an array task id from 0 to 999999"),
    ({"array_spec": "x-y"}, "array_spec: invalid array 'x-y'"),
    ({"array_spec": ""}, "array_spec: expected 1 to"),
    ({"extra": 1}, "unknown field 'extra' in the launch order"),
    ({"cpus": -1}, "cpus: expected CPUs on this node from 0 to"),
    ({"mem_mb": 2**31}, "mem_mb: expected MiB on this node from 0 to"),
    ({"gres_flags": "bind-harder"}, "gres_flags: expected one of ['disable-binding', "
                                    "'enforce-binding'], got 'bind-harder'"),
])
def test_an_order_out_of_bounds_is_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        LaunchOrder.parse({**ORDER, **change})
    assert message in caught.value.message


def test_the_job_of_an_order_that_does_not_parse_can_still_be_failed() -> None:
    assert launch_job_of({**ORDER, "uid": "root", "restarts": 3}) == (7, 3)
    assert launch_job_of({"job_id": 7, "restarts": "x"}) == (7, 0)
    assert launch_job_of({"job_id": True}) is None
    assert launch_job_of({"job_id": 0}) is None and launch_job_of([7]) is None


# ------------------------------------------------------------ JobEnd


def test_an_end_defaults_and_outcomes_match_the_database_states() -> None:
    from gpusched.db.agents import OUTCOME_STATES

    assert sorted(OUTCOME_STATES) == sorted(OUTCOMES)
    end = JobEnd.parse({"node": "n1", "outcome": "completed", "end_time": 5})
    assert (end.exit_code, end.signal, end.end_time, end.error) == (None, None, 5.0, None)
    assert end.run is None  # an agent older than node commands: the current run
    assert JobEnd.parse({"node": "n1", "outcome": "failed", "run": 3}).run == 3


@pytest.mark.parametrize(("change", "message"), [
    ({"outcome": "exploded"}, "outcome: expected one of ['cancelled', 'completed', 'failed', "
                              "'launch_failed', 'not_started', 'out_of_memory', "
                              "'prolog_failed', 'timeout'], got 'exploded'"),
    ({"max_rss_bytes": -1}, "max_rss_bytes: expected bytes from 0 to"),
    ({"max_rss_bytes": 1 << 63}, "max_rss_bytes: expected bytes from 0 to"),
    ({"cpu_usec": "5"}, "cpu_usec: expected microseconds"),
    ({"epilog_error": 7}, "epilog_error: expected an error message, got 7"),
    ({"node": None}, "node: expected the node name, got nothing"),
    ({"exit_code": 256}, "exit_code: expected an exit status from 0 to 255, got 256"),
    ({"signal": 0}, "signal: expected a signal number from 1 to"),
    ({"end_time": float("nan")}, "end_time: expected seconds since the epoch"),
    ({"end_time": float("inf")}, "end_time: expected seconds since the epoch"),
    ({"end_time": -1}, "end_time: expected seconds since the epoch"),
    ({"end_time": MAX_EPOCH + 1}, "end_time: expected seconds since the epoch"),
    ({"end_time": True}, "end_time: expected seconds since the epoch"),
    ({"error": "x" * (MAX_ERROR_INPUT + 1)}, f"error: expected at most {MAX_ERROR_INPUT} "
                                            "characters"),
    ({"error": 5}, "error: expected an error message, got 5"),
    ({"start_time": 1.0}, "unknown field 'start_time' in the job end"),
    ({"run": -1}, "run: expected a restart count from 0 to"),
    ({"run": "0"}, "run: expected a restart count"),
])
def test_an_end_out_of_bounds_is_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        JobEnd.parse({"node": "n1", "outcome": "failed", **change})
    assert message in caught.value.message


def test_an_error_is_cut_to_what_the_database_keeps() -> None:
    cut = error_text("\x00" + "é" * 5000 + "\ud800")
    assert cut is not None and len(cut) == MAX_ERROR_TEXT and cut.endswith("...")
    assert cut == "é" * (MAX_ERROR_TEXT - 3) + "..."
    assert error_text(cut) == cut and error_text(None) is None
    assert error_text("bad \ud800 byte\x00") == "bad ? byte"
    end = JobEnd.parse({"node": "n", "outcome": "failed", "error": "a\x00" + "b" * 60_000})
    assert end.error == "a" + "b" * (MAX_ERROR_TEXT - 4) + "..."


# ------------------------------------------------------------ NodeCommand


def test_each_kind_of_command_carries_its_payload() -> None:
    head = {"node": "n1", "job_id": 7, "run": 0, "seq": 3}
    launch = NodeCommand.parse({**head, "kind": "launch", "payload": ORDER})
    assert launch.payload == LaunchOrder.parse(ORDER)
    assert NodeCommand.parse({**head, "kind": "cancel"}).payload is None
    assert NodeCommand.parse({**head, "kind": "kill", "payload": {}}).payload is None
    assert NodeCommand.parse({**head, "kind": "signal", "payload": {"signal": 10}}
                             ).payload == SignalJob(10)
    assert NodeCommand.parse({**head, "kind": "limit", "payload": {"time_limit": None}}
                             ).payload == LimitJob(None)
    moved = NodeCommand.parse({**head, "kind": "limit",
                               "payload": {"time_limit": 60, "deadline": 2_000_000_000}})
    assert moved.payload == LimitJob(60, 2_000_000_000.0)
    assert moved.to_json()["payload"] == {"time_limit": 60, "deadline": 2_000_000_000.0}
    # Steps: a new deadline; none with no limit; left be by a limit that names none.
    assert LimitJob(60, 5.0).step_deadline() == (True, 5.0)
    assert LimitJob(None).step_deadline() == (True, None)
    assert LimitJob(60).step_deadline() == (False, None)


@pytest.mark.parametrize(("change", "message"), [
    ({"kind": "reboot"}, "kind: expected one of ['cancel', 'kill', 'launch', 'limit', "
                         "'notice', 'signal', 'step', 'step_cancel', 'suspend']"),
    ({"kind": "notice", "payload": {}}, "text: expected a line of text, got nothing"),
    ({"kind": "notice", "payload": {"text": "a\nb"}}, "text: "),
    ({"kind": "notice", "payload": {"text": "x" * 1001}}, "text: "),
    ({"kind": "notice", "payload": {"text": "hi", "path": "/etc/passwd"}},
     "unknown field 'path' in a notice command"),
    ({"kind": "kill", "payload": {"signal": 9}}, "unknown field 'signal' in a kill command"),
    ({"seq": 0}, "seq: expected a command number from 1 to"),
    ({"run": None}, "run: expected a restart count, got nothing"),
    ({"kind": "launch", "payload": {**ORDER, "job_id": 8}},
     "payload: the launch order is for job 8 run 0 on n1, not job 7 run 0 on n1"),
    ({"kind": "launch", "payload": {**ORDER, "node": "n2"}}, "on n2, not job 7 run 0 on n1"),
    ({"kind": "launch", "payload": {**ORDER, "uid": -1}}, "uid: expected a uid"),
    ({"kind": "cancel", "payload": {"signal": 9}}, "unknown field 'signal' in a cancel command"),
    ({"kind": "signal", "payload": {}}, "signal: expected a signal number, got nothing"),
    ({"kind": "signal", "payload": {"signal": 999}}, "signal: expected a signal number from 1"),
    ({"kind": "limit", "payload": {"time_limit": -1}}, "time_limit: expected seconds from 0"),
    ({"kind": "limit", "payload": [1]}, "payload: expected a JSON object, got [1]"),
    ({"kind": "limit", "payload": {"time_limit": 60, "deadline": -1}},
     "deadline: expected seconds since the epoch from 0 to"),
    ({"kind": "limit", "payload": {"time_limit": 60, "deadline": "soon"}},
     "deadline: expected seconds since the epoch"),
    ({"kind": "limit", "payload": {"time_limit": 60, "until": 5}},
     "unknown field 'until' in a limit command"),
])
def test_a_command_out_of_bounds_is_refused(change: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        NodeCommand.parse({"kind": "cancel", "node": "n1", "job_id": 7, "run": 0, "seq": 3,
                           **change})
    assert message in caught.value.message


# ------------------------------------------------------------ NodeHealth


def test_a_health_report_round_trips_and_is_bounded() -> None:
    report = NodeHealth.parse({"node": "n1", "ok": False, "reason": "disk full"})
    assert (report.node, report.ok, report.reason) == ("n1", False, "disk full")
    assert NodeHealth.parse(report.to_json()) == report
    for body, message in (
            ({"node": "n1"}, "ok: expected true or false, got nothing"),
            ({"node": "n1", "ok": 1}, "ok: expected true or false, got 1"),
            ({"node": "n1", "ok": True, "reason": "x" * 257}, "reason: expected at most 256 characters"),
            ({"node": "n1", "ok": True, "reason": "a\x1b[2Jb"}, "U+001B is not allowed"),
            ({"node": "n1", "ok": True, "why": "x"}, "unknown field 'why'")):
        with pytest.raises(UsageError) as caught:
            NodeHealth.parse(body)
        assert message in caught.value.message
