"""Every operation of the controller's OpenAPI document (``GET /v1/openapi.json``),
fuzzed with schemathesis against a live controller, as each kind of caller: an
ordinary user, an administrator (a member of ``[controller] admin_group``, not root)
and a node's agent (root, on the Unix socket).

Each example is sent as that user's own process. What must hold for every one: no 5xx;
a refusal is a JSON error (``{"error": {"code", "message"}}``); a refused POST changes
nothing stored (the tables' rows are the same before and after it); and, at the end, no
traceback in the controller's or the agent's log.

The default run is bounded (GPUSCHED_API_FUZZ_EXAMPLES examples per operation, caller
kind and mode: schema-conforming and schema-violating; default 2, seeded); set it
higher (and GPUSCHED_API_FUZZ_SEED to vary the seed) for a long run.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode

from gpusched.controller.api import Api
from gpusched.controller.openapi import build_document
from tests.api_fuzz.callers import (
    FUZZ_ADMIN_GROUP,
    SocketCaller,
    admin_user,
    snapshot,
)
from tests.e2e.cluster import Cluster
from tests.pg import ScratchPostgres
from tests.security.conftest import ensure_user

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("GPUSCHED_API_FUZZ_EXAMPLES", "2"))
SEED = os.environ.get("GPUSCHED_API_FUZZ_SEED")
KINDS = ("user", "admin", "agent")
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
NODE = "node01"
NAMES = ("partition", "account", "qos", "nodelist", "exclude", "dependency", "array",
         "gpu_types", "begin_time")
# The operations, from the document the router gives offline (the live one must match).
DOCUMENT = build_document(Api(None, None, lambda: True).router())  # type: ignore[arg-type]
OPERATIONS = [(method.upper(), path) for path, ops in DOCUMENT["paths"].items()
              for method in ops]
RAN: Counter[tuple[str, str]] = Counter()
STATUSES: Counter[int] = Counter()


@dataclass
class World:
    cluster: Cluster
    url: str
    callers: dict[str, SocketCaller]
    document: dict[str, Any]
    schema: Any
    jobs: dict[str, list[int]] = field(default_factory=dict)


@pytest.fixture(scope="module")
def world(postgres: ScratchPostgres) -> Iterator[World]:
    """A controller and one agent whose node is drained (nothing the fuzz submits
    starts, so the tables change only by requests), a user's and root's pending jobs,
    and one caller process per kind."""
    url = postgres.fresh_database()
    user, admin = ensure_user("gpusched-test"), admin_user()
    cluster = Cluster(url, controller_toml=f'admin_group = "{FUZZ_ADMIN_GROUP}"',
                      auth_toml="[scheduler]\nallocation_grace = 86400\n")
    cluster.config.write_text(cluster.config.read_text().replace(
        'name = "gpu"\ndefault = true\n', f'name = "gpu"\ndefault = true\nnodes = ["{NODE}"]\n'))
    callers: dict[str, SocketCaller] = {}
    try:
        cluster.up()
        callers = {"user": SocketCaller("user", cluster.socket, user.uid, user.gid),
                   "admin": SocketCaller("admin", cluster.socket, admin.uid, admin.gid),
                   "agent": SocketCaller("agent", cluster.socket, 0, 0)}
        callers["admin"].call_json("POST", f"/v1/nodes/{NODE}/drain", {"reason": "fuzz"})
        job = {"script": "#!/bin/sh\ntrue\n", "work_dir": str(cluster.work), "gpus": 1}
        jobs = {kind: [callers[kind].call_json("POST", "/v1/jobs", job)["job_id"]
                       for _ in range(2)] for kind in ("user", "agent")}
        document = callers["user"].call_json("GET", "/v1/openapi.json")
        schema = schemathesis.openapi.from_dict(document)
        yield World(cluster, url, callers, document, schema, jobs)
    finally:
        for caller in callers.values():
            caller.close()
        cluster.close()


def _target(path: str, case: Any, real: bool, world: World) -> str:
    """The request target of ``case``; ``real``: path parameters that name what exists
    (a job, its node) instead of the generated ones, to reach past the lookups."""
    params = dict(case.path_parameters or {})
    if real:
        mine = world.jobs["user"][0]
        for name in params:
            params[name] = {"job_id": str(mine), "step_id": "0", "command_id": "1",
                            "node": NODE}.get(name, params[name])
    text = path
    for name, value in params.items():  # schemathesis gives them percent-encoded
        text = text.replace("{" + name + "}", quote(str(value), safe="%!$&'()*+,;=:@~"))
    query = dict(case.query or {})
    if path == "/agent/v1/work":  # a long poll: waiting is its answer, not a fault
        try:
            if not math.isfinite(float(query.get("wait", 0))) or float(query["wait"]) > 0.2:
                query["wait"] = "0"
        except (KeyError, TypeError, ValueError):
            pass
    if query:
        text += "?" + urlencode(query, doseq=True)
    return text


def _body(case: Any, real: bool, world: World) -> bytes | None:
    body = getattr(case, "body", None)
    if body is None or type(body).__name__ == "NotSet":
        return None
    if isinstance(body, bytes):  # not JSON at all: a negative example
        return body
    if real and isinstance(body, dict) and case.path in ("/v1/jobs", "/v1/jobs/test"):
        # past the checks the schema cannot state, to the database's
        # (and names of nothing that exists, which a random one would be)
        body = {**body, "script": "#!/bin/sh\ntrue\n", "work_dir": str(world.cluster.work),
                **{k: None for k in NAMES if k in body}}
    try:
        return json.dumps(body).encode()
    except (TypeError, ValueError):
        return None


def _check(world: World, kind: str, method: str, path: str, case: Any, real: bool) -> None:
    caller = world.callers[kind]
    target = _target(path, case, real, world)
    body = _body(case, real, world)
    before = snapshot(world.url) if method == "POST" else None
    answer = caller.call(method, target, body)
    RAN[(f"{method} {path}", kind)] += 1
    STATUSES[answer.status] += 1
    shown = f"{kind}: {method} {target[:300]} {(body or b'')[:300]!r}"
    assert answer.status < 500, f"{shown} -> {answer.status} {answer.body[:500]!r}"
    if answer.status >= 400:
        error = answer.json()["error"]
        assert isinstance(error["code"], str) and isinstance(error["message"], str), shown
        assert "\n" not in error["message"], shown
        if before is not None:
            after = snapshot(world.url)
            changed = [t for t in before if before[t] != after[t]]
            assert not changed, f"{shown} refused ({answer.status}) yet changed {changed}"


@pytest.mark.parametrize(("method", "path"), OPERATIONS,
                         ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_operation(world: World, method: str, path: str) -> None:
    """Schema-conforming and schema-violating examples of one operation, as each kind
    of caller."""
    assert world.document == DOCUMENT
    operation = world.schema[path][method]
    seed = int(SEED) if SEED else random.Random(f"{method} {path}").randrange(2**32)
    for kind in KINDS:
        for mode in MODES:
            try:
                strategy = operation.as_strategy(generation_mode=mode)
            except Exception as exc:  # nothing in the operation to violate
                if mode is GenerationMode.NEGATIVE:
                    continue
                raise AssertionError(f"{method} {path}: {exc}") from exc

            @settings(max_examples=EXAMPLES, deadline=None, database=None,
                      derandomize=False, phases=[Phase.generate], print_blob=False,
                      suppress_health_check=list(HealthCheck))
            @given(case=strategy, real=st.booleans())
            def run(case: Any, real: bool) -> None:
                _check(world, kind, method, path, case, real)

            run._hypothesis_internal_use_seed = seed  # type: ignore[attr-defined]
            try:
                run()
            except Unsatisfiable:  # nothing of the operation can be violated (a path
                if mode is not GenerationMode.NEGATIVE:  # parameter is any string)
                    raise


def test_the_snapshot_sees_a_write(world: World) -> None:
    """The check of refused requests can fail: a write the same callers make is seen."""
    before = snapshot(world.url)
    world.callers["user"].call_json("POST", "/v1/jobs", {
        "script": "#!/bin/sh\ntrue\n", "work_dir": str(world.cluster.work), "hold": True})
    after = snapshot(world.url)
    assert "jobs" in {t for t in before if before[t] != after[t]}


def test_every_route_is_in_the_document() -> None:
    """The document has an operation per route the router serves."""
    routes = Api(None, None, lambda: True).router()  # type: ignore[arg-type]
    assert len(OPERATIONS) == len(routes._routes)


def test_no_traceback_in_any_log(world: World) -> None:
    """After all the fuzz: neither daemon logged a traceback; what ran, per operation."""
    logs = {p.name: p.read_text(errors="replace") for p in world.cluster.root.glob("*.log")}
    for name, text in logs.items():
        assert "Traceback" not in text, f"{name}:\n{text[-6000:]}"
    total = sum(RAN.values())
    print(f"\napi fuzz: {len({op for op, _ in RAN})} operations x {len(KINDS)} callers, "
          f"{total} examples sent; answers {dict(sorted(STATUSES.items()))}")
