"""The OpenAPI 3.1 document (``GET /v1/openapi.json``) is read off the router and the
typed messages' parsers: every route is in it, each message's fields carry the bounds
its parser checks, and anyone may read it on the socket."""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest

from gpusched.controller.api import Api
from gpusched.controller.http import UnixHttpServer
from gpusched.controller.openapi import build_document, routes_of
from gpusched.core import bounds
from gpusched.messages.agent import END_FIELDS, GRES_FLAGS, OUTCOMES
from gpusched.messages.jobs import SUBMIT_FIELDS, UPDATE_FIELDS
from gpusched.messages.steprequest import REQUEST_FIELDS
from tests.api_fuzz.callers import SocketCaller

NOBODY = 65534


def _router() -> Any:
    return Api(None, None, lambda: True).router()  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return build_document(_router())


def _component(doc: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    name = ref["$ref"].rsplit("/", 1)[1]
    return doc["components"]["schemas"][name]


def _body(doc: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    schema = doc["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    return _component(doc, schema) if "$ref" in schema else schema


def test_every_route_has_one_operation(doc: dict[str, Any]) -> None:
    routes = routes_of(_router())
    ops = [(m.lower(), p) for p, byp in doc["paths"].items() for m in byp]
    assert sorted(ops) == sorted((m.lower(), p) for m, p, _ in routes)
    assert ("get", "/v1/openapi.json") in ops and ("post", "/v1/jobs") in ops
    ids = [op["operationId"] for byp in doc["paths"].values() for op in byp.values()]
    assert len(ids) == len(set(ids))
    params = doc["paths"]["/v1/jobs/{job_id}/steps/{step_id}/cancel"]["post"]["parameters"]
    assert [p["name"] for p in params if p["in"] == "path"] == ["job_id", "step_id"]


def test_the_submission_is_the_job_request_with_its_bounds(doc: dict[str, Any]) -> None:
    schema = _body(doc, "post", "/v1/jobs")
    assert set(schema["properties"]) == SUBMIT_FIELDS
    assert schema["additionalProperties"] is False
    assert {"script", "work_dir"} <= set(schema["required"])
    props = schema["properties"]
    assert (props["gpus"]["minimum"], props["gpus"]["maximum"]) == (0, bounds.MAX_GPUS)
    assert props["nodes"]["minimum"] == 1 and props["umask"]["maximum"] == 0o777
    assert props["name"]["maxLength"] == bounds.MAX_NAME
    assert props["nodelist"]["maxItems"] == bounds.MAX_LIST
    assert props["gres_flags"]["anyOf"][0]["enum"] == sorted(GRES_FLAGS)
    assert set(props["time_limit"]["type"]) == {"integer", "string", "null"}
    warn = props["warn_signal"]
    assert set(warn["properties"]) == {"signal", "seconds", "batch_only"}
    assert warn["properties"]["signal"]["type"] == ["integer", "null"]
    assert doc["paths"]["/v1/jobs"]["post"]["x-gpusched-callers"] == ["anyone"]
    assert set(doc["paths"]["/v1/jobs"]["post"]["responses"]) >= {"200", "201", "4XX"}


def test_other_messages(doc: dict[str, Any]) -> None:
    update = _body(doc, "post", "/v1/jobs/{job_id}/update")
    assert set(update["properties"]) == UPDATE_FIELDS and update["additionalProperties"] is False
    end = _body(doc, "post", "/agent/v1/jobs/{job_id}/ended")
    assert set(end["properties"]) == END_FIELDS
    assert end["properties"]["outcome"]["enum"] == sorted(OUTCOMES)
    assert {"node", "outcome"} <= set(end["required"])
    assert end["properties"]["exit_code"]["maximum"] == 255
    step = _body(doc, "post", "/v1/jobs/{job_id}/steps")
    assert set(step["properties"]) == REQUEST_FIELDS
    assert {"argv", "work_dir", "io"} <= set(step["required"])
    io = step["properties"]["io"]  # checked in place (check_io), not by StepIO.parse
    assert io["properties"]["port"] == {"type": "integer", "minimum": 1, "maximum": 65535,
                                        "description": "a TCP port"}
    assert set(io["required"]) == {"host", "port"}
    cancel = _body(doc, "post", "/v1/jobs/{job_id}/steps/{step_id}/cancel")
    assert set(cancel["properties"]) == {"bad_exit", "signal"} and not cancel[
        "additionalProperties"]
    complete = _body(doc, "post", "/v1/jobs/{job_id}/complete")
    assert complete["required"] == ["exit_code"]
    health = _body(doc, "post", "/agent/v1/nodes/{node}/health")
    assert set(health["properties"]) == {"node", "ok", "reason"}
    for name in ("LaunchOrder", "NodeCommand", "StepLaunch", "ShareGrant", "StepTask"):
        assert doc["components"]["schemas"][name]["properties"], name
    launch = doc["components"]["schemas"]["LaunchOrder"]["properties"]
    assert "$ref" in launch["share"]["anyOf"][0]
    register = _body(doc, "post", "/agent/v1/register")
    assert "$ref" in register["properties"]["health"]["anyOf"][0]


def test_who_may_call_and_the_query(doc: dict[str, Any]) -> None:
    paths = doc["paths"]
    assert paths["/v1/admin/apply"]["post"]["x-gpusched-callers"] == ["admin"]
    assert paths["/v1/nodes/{name}/drain"]["post"]["x-gpusched-callers"] == ["admin"]
    assert paths["/agent/v1/register"]["post"]["x-gpusched-callers"] == ["agent"]
    assert paths["/agent/v1/jobs/{job_id}/steps/{step_id}/ended"]["post"][
        "x-gpusched-callers"] == ["agent"]
    assert paths["/v1/nodes"]["get"]["x-gpusched-callers"] == ["anyone"]
    names = {p["name"] for p in paths["/v1/jobs"]["get"]["parameters"]}
    assert {"state", "all", "ids", "fields"} <= names
    names = {p["name"] for p in paths["/v1/accounting/report"]["get"]["parameters"]}
    assert names == {"start", "end"}
    names = {p["name"] for p in paths["/agent/v1/work"]["get"]["parameters"]}
    assert names == {"node", "wait", "done"}


def test_the_schemas_are_json_schema_2020_12(doc: dict[str, Any]) -> None:
    assert doc["openapi"].startswith("3.1")
    draft = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    schemas = list(doc["components"]["schemas"].values())
    for byp in doc["paths"].values():
        for op in byp.values():
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                schemas.append(body["schema"])
    for schema in schemas:
        jsonschema_rs.meta.validate({**draft, **schema})
    with pytest.raises(jsonschema_rs.ValidationError):  # the check can fail
        jsonschema_rs.meta.validate({**draft, "type": "no-such-type"})
    json.dumps(doc, allow_nan=False)


@pytest.fixture
def served() -> Iterator[Path]:
    """The router on a Unix socket in this process (the document reads no database)."""
    path = Path(tempfile.mkdtemp(prefix="gpusched-openapi-")) / "c.sock"
    path.parent.chmod(0o755)
    server = UnixHttpServer(path, _router())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        server.shutdown()
        server.server_close()
        path.parent.rmdir()


def test_anyone_may_read_it_on_the_socket(served: Path, doc: dict[str, Any]) -> None:
    nobody = SocketCaller("nobody", served, NOBODY, NOBODY)
    try:
        answer = nobody.call("GET", "/v1/openapi.json")
        again = nobody.call("GET", "/v1/openapi.json")
    finally:
        nobody.close()
    assert answer.status == 200 and json.loads(answer.body) == doc
    assert again.body == answer.body
