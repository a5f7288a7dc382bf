"""The API's contract: an OpenAPI 3.1 document (``GET /v1/openapi.json``) built at run
time from the router's routes and the code that checks each request (reading.py), so
that it is never written a second time and cannot drift from what the controller does.

Why read the code rather than declare the fields: the typed messages'
``parse`` methods and the routes already state every field, its type and its bounds
once, in calls to the field readers; a declaration beside them would be a second
statement of the same, free to disagree. The document is built once per router (at the
first request) and kept.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

import gpusched
from gpusched.controller.http import Request, Router
from gpusched.controller.openapi.reading import (
    Components,
    Walker,
    hints_of,
    plain_function,
)

__all__ = ["OpenApi", "build_document", "routes_of"]

OPENAPI_VERSION = "3.1.0"

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["code", "message"],
    "properties": {"code": {"enum": ["invalid", "auth", "forbidden", "not_found", "conflict",
                                      "limit", "unavailable", "internal"]},
                   "message": {"type": "string"}}}}}
_CALLERS = {"admin": "administrators only (root, the controller's user, [controller] "
                     "admin_group)",
            "agent": "the node's agent only (root or the controller's user on the socket; "
                     "a node credential for that node over TCP)"}


def routes_of(router: Router) -> list[tuple[str, str, Any]]:
    """(method, path template, handler) of every route, in the router's order."""
    out = []
    for method, regex, handler in router._routes:  # the router's own table
        template = regex.pattern.removeprefix("^").removesuffix("$")
        template = template.replace("(?P<", "{").replace(">[^/]+)", "}")
        out.append((method, template, handler))
    return out


def _operation(method: str, template: str, handler: Any,
               components: Components) -> dict[str, Any]:
    walker = Walker(components)
    root = walker.handler(handler)
    func = plain_function(handler)
    doc = inspect.getdoc(func) or ""
    owner = type(getattr(handler, "__self__", None) or handler).__name__
    op: dict[str, Any] = {
        "operationId": f"{owner}.{getattr(func, '__name__', 'handler')}",
        "summary": doc.split("\n\n")[0].replace("\n", " ")[:200] if doc else template,
        "x-gpusched-callers": sorted(walker.callers) or ["anyone"],
    }
    if doc:
        op["description"] = doc + "".join(f"\n\nCallers: {_CALLERS[c]}."
                                          for c in sorted(walker.callers))
    params = [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
              for n in _path_names(template)]
    params += [{"name": n, "in": "query", "required": False, "schema": {"type": "string"}}
               for n in sorted(walker.query)]
    if params:
        op["parameters"] = params
    if method in ("POST", "PUT", "PATCH"):
        schema = root.to_schema(components, hints_of(root.ref) if root.ref else None)
        op["requestBody"] = {"required": False, "content": {
            "application/json": {"schema": schema or {"type": "object"}}}}
    ok = sorted(walker.statuses) or [200]
    op["responses"] = {str(s): {"description": "done", "content": {"application/json": {
        "schema": {"type": "object"}}}} for s in ok if s < 400}
    op["responses"]["4XX"] = {"description": "refused; nothing was changed",
                              "content": {"application/json": {"schema": _ERROR}}}
    op["responses"]["503"] = {"description": "the controller cannot serve it now",
                              "content": {"application/json": {"schema": _ERROR}}}
    return op


def _messages() -> list[type]:
    """Every typed message (a class with ``parse``) of gpusched.messages: the agents'
    orders and commands travel in answers, and are described with the requests."""
    import gpusched.messages as package
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == module.__name__ \
                    and isinstance(value.__dict__.get("parse"), classmethod):
                found.append(value)
    return found


def _path_names(template: str) -> list[str]:
    return [part[1:-1] for part in template.split("/") if part.startswith("{")]


def build_document(router: Router) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route ``router`` serves."""
    components = Components()
    for cls in _messages():
        components.ref(cls)
    paths: dict[str, dict[str, Any]] = {}
    for method, template, handler in routes_of(router):
        paths.setdefault(template, {})[method.lower()] = _operation(
            method, template, handler, components)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": "gpusched controller", "version": gpusched.__version__,
                 "description": "The controller's HTTP/JSON API (docs/api.md). On the Unix "
                                "socket the caller is who the kernel says; over TCP each "
                                "request carries a credential (Authorization)."},
        "paths": paths,
        "components": {"schemas": dict(sorted(components.schemas.items())),
                       "securitySchemes": {"credential": {
                           "type": "apiKey", "in": "header", "name": "Authorization",
                           "description": "GPUSCHED-KEY <token> or GPUSCHED-MUNGE <credential>"
                                          "; over TCP only (the Unix socket takes none)"}}},
    }


class OpenApi:
    """``GET /v1/openapi.json``: the document of the router it is added to, built at
    its first request and kept (the routes do not change while the controller runs)."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.document: dict[str, Any] | None = None

    def serve(self, request: Request) -> tuple[int, dict[str, Any]]:
        """The API's OpenAPI 3.1 description; anyone may read it."""
        if self.document is None:
            self.document = build_document(self.router)
        return 200, self.document
