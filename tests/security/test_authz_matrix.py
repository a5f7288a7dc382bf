"""The authorisation matrix: every operation of the API against every kind of caller,
over the Unix socket and over TCP with each method's credentials (key, munge), each cell
one test (tests/security/authz_world.py says who the callers are). Both methods have
the same answers: one table for TCP. The tables below are docs/security.md's "Authorisation
matrix" section, word for word: ``python -m tests.security.test_authz_matrix`` prints
it, and a test holds the two equal. Another test holds that every route the controller
serves has its row.

A cell is an answer: ``200``/``201`` (done), ``200p`` (done, the job shown without its
script, arguments and environment), ``401`` (``auth``: no credential), ``403``
(``forbidden``), ``400`` (``invalid``). A refused request changes nothing stored.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gpusched.controller.api import Api
from gpusched.controller.events import Events
from gpusched.db.jobcontrol import suspend_job
from gpusched.db.jobs import Identity
from gpusched.db.models import AdvanceReservationRow, NodeCommand
from gpusched.db.reservations import create_reservation
from gpusched.messages.reservations import ReservationRequest
from tests.pg import ScratchPostgres
from tests.security.authz_world import (
    BACKENDS,
    CALLERS,
    NODE,
    OTHER_NODE,
    World,
    serving,
)
from tests.security.conftest import ensure_user

# The answers on the Unix socket and over TCP (either method), by column: anonymous,
# user, owner, admin, the agent of this node, the agent of another node.
ANYONE = ("200 200 200 200 200 200", "401 200 200 200 200 200")
JOB_READ = ("200p 200p 200 200 200 200", "401 200p 200 200 200 200")
OWNER = ("403 403 200 200 200 200", "401 403 200 200 200 200")
OWNER_MAKES = ("403 403 201 403 201 201", "401 403 201 403 201 201")
ADMIN = ("403 403 403 200 200 200", "401 403 403 200 200 200")
AGENT = ("403 403 403 403 200 200", "401 403 403 403 200 403")
SUBMIT = ("201 201 201 201 201 201", "401 201 201 201 201 201")
ADMIN_MAKES = ("403 403 403 201 201 201", "401 403 403 201 201 201")
# An advance reservation far ahead, of node01 (named as the node: the path's {name}).
RESERVATION = {"name": "$resv", "start": "2099-01-01T00:00:00+00:00", "duration": 60,
               "nodes": [NODE], "users": ["root"], "flags": ["OVERLAP", "IGNORE_JOBS"]}

ENDED = {"node": NODE, "outcome": "completed", "exit_code": 0, "run": 0}


@dataclass(frozen=True)
class Row:
    """One operation: its route (and the case, where a route has rules of its own for
    some requests), what it acts on (made fresh for each cell: a pending, held or
    running job of the owner, a running allocation, a running job's step), the
    request's query and body (``"$job"`` stands for the job's id), and the answers."""

    route: str
    target: str
    answers: tuple[str, str]  # the Unix socket's, TCP's (key or munge credentials)
    body: Any = None
    query: str = ""
    case: str = ""

    @property
    def name(self) -> str:
        return f"{self.route} ({self.case})" if self.case else self.route

    def expected(self, backend: str, caller: str) -> str:
        return self.answers[TABLE_OF[backend]].split()[CALLERS.index(caller)]


TABLE_OF = {"unix": 0, "key": 1, "munge": 1}  # each back-end's answers in Row.answers
TITLES = ("Over the Unix socket", "Over TCP (cluster mode, key or munge credentials)")
SUBMISSION = {"script": "#!/bin/sh\ntrue\n", "work_dir": "/tmp", "hold": True}
MATRIX = (
    Row("GET /v1/ping", "-", ANYONE),
    Row("GET /v1/openapi.json", "-", ANYONE),
    Row("POST /v1/jobs", "-", SUBMIT, SUBMISSION),
    Row("POST /v1/jobs", "-", ("400 400 400 400 400 400", "401 400 400 400 400 400"),
        {**SUBMISSION, "uid": 0}, case="naming a uid"),
    Row("POST /v1/jobs", "keyed", ("201 201 200 201 201 201", "401 201 200 201 201 201"),
        {**SUBMISSION, "submit_key": "$key"}, case="the owner's submit_key again"),
    Row("POST /v1/jobs/test", "-", ANYONE, SUBMISSION),
    Row("GET /v1/jobs", "pending", ANYONE),
    Row("GET /v1/jobs/{job_id}", "pending", JOB_READ),
    Row("GET /v1/jobs/{job_id}/explain", "pending", JOB_READ),
    Row("POST /v1/jobs/{job_id}/cancel", "pending", OWNER, {}),
    Row("POST /v1/jobs/{job_id}/hold", "pending", OWNER, {}),
    Row("POST /v1/jobs/{job_id}/signal", "running", OWNER, {"signal": 10}),
    Row("POST /v1/jobs/{job_id}/release", "held", OWNER, {}),
    Row("POST /v1/jobs/{job_id}/release", "admin-held", ADMIN, {},
        case="an administrator's hold"),
    Row("POST /v1/jobs/{job_id}/requeue", "running", OWNER, {}),
    Row("POST /v1/jobs/{job_id}/update", "pending", OWNER, {"time_limit": 1800},
        case="a shorter time limit"),
    Row("POST /v1/jobs/{job_id}/update", "pending", ADMIN, {"time_limit": 7200},
        case="a longer time limit"),
    Row("POST /v1/jobs/{job_id}/update", "pending", ADMIN, {"priority": 10},
        case="its priority"),
    Row("POST /v1/jobs/{job_id}/update", "pending", OWNER, {"name": "renamed", "nodes": 1},
        case="its name and nodes"),
    Row("POST /v1/jobs/{job_id}/suspend", "running", ADMIN, {}),
    Row("POST /v1/jobs/{job_id}/resume", "suspended", ADMIN, {}),
    Row("POST /v1/jobs/{job_id}/top", "pending", OWNER, {}),
    Row("POST /v1/jobs/{job_id}/steps", "running", OWNER_MAKES,
        {"argv": ["true"], "work_dir": "/tmp",
         "io": {"host": "127.0.0.1", "port": 45_000, "token": "0f" * 32}}),
    Row("GET /v1/jobs/{job_id}/steps", "step", ANYONE),
    Row("GET /v1/jobs/{job_id}/steps/{step_id}", "step", ANYONE),
    Row("POST /v1/jobs/{job_id}/steps/{step_id}/cancel", "step", OWNER, {}),
    Row("POST /v1/jobs/{job_id}/heartbeat", "allocation", OWNER, {}),
    Row("POST /v1/jobs/{job_id}/complete", "allocation", OWNER, {"exit_code": 0}),
    Row("GET /v1/nodes", "-", ANYONE),
    Row("GET /v1/partitions", "-", ANYONE),
    Row("GET /v1/licenses", "-", ANYONE),
    Row("GET /v1/reservations", "-", ANYONE),
    Row("GET /v1/reservations/{name}", "reservation", ANYONE),
    Row("POST /v1/reservations", "new-reservation", ADMIN_MAKES, RESERVATION),
    Row("PATCH /v1/reservations/{name}", "reservation", ADMIN, {"duration": 120}),
    Row("DELETE /v1/reservations/{name}", "reservation", ADMIN, {}),
    Row("GET /v1/accounting", "-", ANYONE),
    Row("GET /v1/accounting/report", "-", ANYONE, query="start=0&end=4102444800"),
    Row("GET /v1/balance", "-", ANYONE),
    Row("GET /v1/balance", "-", ("403 403 403 400 400 400", "401 403 403 400 400 400"),
        query="account=authz", case="an account not the caller's (none such)"),
    Row("GET /v1/priority", "pending", ANYONE),
    Row("GET /v1/share", "-", ANYONE),
    Row("GET /v1/diag", "-", ANYONE),
    Row("POST /v1/admin/apply", "-", ADMIN,
        {"files": [{"source": "authz.toml", "data": {}}], "dry_run": True}),
    Row("POST /v1/gpus/drain", "-", ADMIN, {"node": "node02", "index": 3, "reason": "authz"}),
    Row("POST /v1/gpus/resume", "-", ADMIN, {"node": "node02", "index": 3}),
    Row("POST /v1/nodes/{name}/drain", "-", ADMIN, {"reason": "authz"}),
    Row("POST /v1/nodes/{name}/resume", "-", ADMIN, {}),
    Row("POST /agent/v1/register", "-", AGENT,
        {"node": NODE, "uid": 0, "gpus": [{"index": i, "uuid": f"{NODE}-gpu{i}"}
                                          for i in range(4)]}),
    Row("GET /agent/v1/work", "-", AGENT, query=f"node={NODE}&wait=0"),
    Row("POST /agent/v1/commands/done", "-", AGENT, {"node": NODE, "seqs": [1]}),
    Row("POST /agent/v1/commands/{command_id}/done", "-", AGENT, {"node": NODE}),
    Row("POST /agent/v1/jobs/ended", "running", AGENT,
        {"node": NODE, "ends": [{"job_id": "$job", **ENDED}]}),
    Row("POST /agent/v1/jobs/{job_id}/ended", "running", AGENT, ENDED),
    Row("POST /agent/v1/jobs/{job_id}/steps/{step_id}/ended", "step", AGENT,
        {"node": NODE, "outcome": "completed", "exit_code": 0}),
    Row("POST /agent/v1/health", "-", AGENT, {"node": NODE, "faults": []}),
    Row("POST /agent/v1/nodes/{node}/health", "-", AGENT, {"node": NODE, "ok": True}),
    Row("POST /agent/v1/samples", "-", AGENT, {"node": NODE, "gpus": []}),
)
ROWS = {row.name: row for row in MATRIX}

CELLS = [(backend, row.name, caller) for backend in BACKENDS for row in MATRIX
         for caller in CALLERS]
COLUMNS = ("anonymous", "user", "owner", "admin", "agent of this node",
           "agent of another node")
ERROR_CODES = {400: "invalid", 401: "auth", 403: "forbidden", 404: "not_found", 409: "conflict"}
DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
BEGIN = "<!-- authorisation matrix: tests/security/test_authz_matrix.py writes it -->"
END = "<!-- end of the authorisation matrix -->"


def render() -> str:
    """The two tables of docs/security.md, from MATRIX."""
    parts = []
    for table, title in enumerate(TITLES):
        lines = [f"#### {title}", "",
                 "| operation | " + " | ".join(COLUMNS) + " |",
                 "|---" * (len(COLUMNS) + 1) + "|"]
        for row in MATRIX:
            cells = row.answers[table].split()
            case = f" ({row.case})" if row.case else ""
            lines.append(f"| `{row.route}`{case} | " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def _fill(value: Any, made: dict[str, Any]) -> Any:
    """``value`` with ``"$job"`` and ``"$key"`` replaced by what was made for the cell."""
    if isinstance(value, str) and value.startswith("$"):
        return made[value[1:]]
    if isinstance(value, dict):
        return {k: _fill(v, made) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, made) for v in value]
    return value


def _prepare(world: World, target: str) -> dict[str, Any]:
    """The job (and step, or submission key) a cell's request acts on, made for it."""
    if target == "pending":
        return {"job": world.job()}
    if target == "held":
        return {"job": world.job(hold=True)}
    if target == "admin-held":
        return {"job": world.job(hold=True, by_admin=True)}
    if target == "keyed":
        key = os.urandom(16).hex()
        return {"job": world.job(submit_key=key), "key": key}
    if target == "running":
        return {"job": world.running()}
    if target == "suspended":
        job_id = world.running()
        with world.sessions() as s, s.begin():
            suspend_job(s, job_id, Identity(0, 0), True)
        return {"job": job_id}
    if target == "allocation":
        return {"job": world.running(interactive=True)}
    if target == "step":
        job_id, step_id = world.stepping()
        return {"job": job_id, "step": step_id}
    if target in ("reservation", "new-reservation"):
        name = NODE if target == "reservation" else "r" + os.urandom(6).hex()
        if target == "reservation":
            with world.sessions() as s, s.begin():
                if s.get(AdvanceReservationRow, NODE) is None:
                    create_reservation(s, ReservationRequest.parse({**RESERVATION,
                                                                   "name": NODE}))
        return {"job": None, "resv": name}
    return {"job": None}


@pytest.fixture(scope="module")
def world(postgres: ScratchPostgres) -> Iterator[World]:
    """One controller for the module, every back-end, on a fresh database."""
    if os.geteuid() != 0:
        pytest.fail("the authorisation matrix runs as root (it takes other users' uids)")
    owner, user = ensure_user("gpusched-test"), ensure_user("gpusched-test2")
    with serving(postgres.fresh_database(), owner, user) as made:
        yield made


@pytest.mark.parametrize(("backend", "name", "caller"), CELLS,
                         ids=[f"{b}|{n}|{c}" for b, n, c in CELLS])
def test_cell(world: World, backend: str, name: str, caller: str) -> None:
    row = ROWS[name]
    route, expected = row.route, row.expected(backend, caller)
    made = _prepare(world, row.target)
    job_id = made["job"]
    method, pattern = route.split(" ", 1)
    path = pattern.format(job_id=job_id, step_id=made.get("step"), name=NODE, node=NODE,
                          command_id=1)
    target = f"{path}?{row.query}" if row.query else path
    before = world.stored(job_id)
    status, answer = world.call(backend, caller, method, target, _fill(row.body, made))
    assert str(status) == expected.rstrip("p"), (expected, status, answer)
    if status >= 400:
        assert answer["error"]["code"] == ERROR_CODES[status], answer
        assert world.stored(job_id) == before, "a refused request changed what is stored"
    elif row.target == "keyed":  # the owner's submission again, or a new job of one's own
        assert (answer["job_id"] == job_id) == (status == 200) == answer.get("existing", False)
    elif route.startswith("GET /v1/jobs/{job_id}") and "steps" not in route:
        shown = answer["job"] if route.endswith("/explain") else answer
        assert shown["job_id"] == job_id
        assert ("script" in shown, "environment" in shown) == (
            (not expected.endswith("p"),) * 2), shown


@pytest.mark.parametrize("backend", ("key", "munge"))
def test_another_nodes_agent_naming_itself_changes_nothing_here(
        world: World, backend: str) -> None:
    """Over TCP node02's agent may speak only for node02 (the 403s above); naming
    node02, it reaches nothing of node01: a run, a step, a command or a GPU there."""
    job_id, step_id = world.stepping()
    with world.sessions() as s:
        ours = sorted(s.scalars(select(NodeCommand.id).where(NodeCommand.job_id == job_id)))
    before = world.stored(job_id), world.commands(job_id)
    assert ours, "the running job and its step have their node's commands"

    def as_other(path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        return world.call(backend, "other agent", "POST", path, {**body, "node": OTHER_NODE})

    assert as_other(f"/agent/v1/jobs/{job_id}/ended", ENDED) == (
        200, {"ok": True, "changed": False, "stale": True})
    assert as_other("/agent/v1/jobs/ended", {"ends": [
        {"job_id": job_id, **ENDED, "node": OTHER_NODE}]})[1]["ended"] == [
        {"job_id": job_id, "changed": False, "stale": True}]
    assert as_other(f"/agent/v1/jobs/{job_id}/steps/{step_id}/ended",
                    {"outcome": "completed", "exit_code": 0}) == (
        200, {"ok": True, "changed": False, "stale": True})
    assert as_other("/agent/v1/commands/done", {"seqs": ours}) == (
        200, {"ok": True, "changed": []})
    assert as_other(f"/agent/v1/commands/{ours[0]}/done", {}) == (
        200, {"ok": True, "changed": False})
    status, answer = as_other("/agent/v1/health", {"faults": [
        {"uuid": f"{NODE}-gpu0", "reason": "forged"}]})
    assert (status, answer["error"]["message"]) == (
        400, f"faults: {NODE}-gpu0 is not a GPU of node {OTHER_NODE}")
    assert as_other("/agent/v1/samples", {"gpus": [
        {"uuid": f"{NODE}-gpu0", "util": 0, "mem_used_mb": 0, "temperature": 0,
         "power_mw": 0}]}) == (200, {"ok": True, "idle": []})
    assert (world.stored(job_id), world.commands(job_id)) == before


def test_every_route_has_its_row() -> None:
    router = Api(None, Events(), lambda: True).router()  # type: ignore[arg-type]
    served = {f"{method} " + re.sub(r"\(\?P<(\w+)>\[\^/\]\+\)", r"{\1}",
                                    regex.pattern.strip("^$"))
              for method, regex, _ in router._routes}
    listed = {row.route for row in MATRIX}
    assert served == listed, (served - listed, listed - served)


def test_the_documented_matrix_is_this_one() -> None:
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"{DOC} has no authorisation matrix"
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert shown == render(), "write it with: python -m tests.security.test_authz_matrix"


if __name__ == "__main__":
    sys.stdout.write(f"{BEGIN}\n\n{render()}\n\n{END}\n")
