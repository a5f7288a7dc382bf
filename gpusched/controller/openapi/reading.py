"""Reading a request's shape off the code that checks it (for the OpenAPI document,
gpusched.controller.openapi): the source of a route's handler and of the functions it
hands the request to (in ``gpusched``), walked with ``ast``.

The field readers of ``gpusched.messages.fields`` name each field and carry its bounds
in their arguments (``integer(body, "gpus", 0, 0, bounds.MAX_GPUS, ...)``), which are
evaluated in their module; ``X.parse(body)`` of a typed message makes the body (or a
part of it) that message's schema, read the same way from ``X.parse``;
``refuse_unknown`` and ``set(body) - FIELDS`` close an object to its listed fields; a
field read by a parser of its own (``parse_time_limit(body.get("time_limit"))``) takes
the type its dataclass field declares. Where a check is not a field reader's (a script
must start with ``#!``), the schema is looser than the parser, never stricter.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import inspect
import textwrap
import types
import typing
from typing import Any

from gpusched.controller.openapi.schemas import READERS, hint_schema, reader_schema

__all__ = ["Components", "Slot", "Walker", "hints_of", "message_schema", "plain_function"]

_MAX_DEPTH = 4  # calls followed from a handler


class Slot:
    """What the code reads at one place of a request body: an object's fields, a list's
    items, a typed message, or one value's schema."""

    def __init__(self) -> None:
        self.props: dict[str, Slot] = {}
        self.required: set[str] = set()
        self.closed = False
        self.ref: type | None = None
        self.items: Slot | None = None
        self.schema: dict[str, Any] = {}

    def prop(self, key: str) -> Slot:
        return self.props.setdefault(key, Slot())

    def item(self) -> Slot:
        if self.items is None:
            self.items = Slot()
        return self.items

    def to_schema(self, components: Components, hints: dict[str, Any] | None = None,
                  nullable: bool = False) -> dict[str, Any]:
        """This slot as a JSON Schema (``hints``: the dataclass fields that type the
        fields no reader typed)."""
        if self.ref is not None:
            ref = {"$ref": components.ref(self.ref)}
            return {"anyOf": [ref, {"type": "null"}]} if nullable else ref
        if self.props or self.closed:
            schema: dict[str, Any] = {"type": ["object", "null"] if nullable else "object",
                                      "properties": {}}
            for key in sorted(self.props):
                slot = self.props[key]
                sub = slot.to_schema(components, None, key not in self.required)
                if not sub and hints and key in hints:
                    sub = hint_schema(hints[key])
                schema["properties"][key] = sub
            if self.required:
                schema["required"] = sorted(self.required)
            if self.closed:
                schema["additionalProperties"] = False
            return schema
        if self.items is not None:
            schema = dict(self.schema) or {"type": ["array", "null"] if nullable else "array"}
            schema["items"] = self.items.to_schema(components)
            return schema
        return dict(self.schema)


class Components:
    """The typed messages the document names (``components.schemas``)."""

    def __init__(self) -> None:
        self.schemas: dict[str, dict[str, Any]] = {}

    def ref(self, cls: type) -> str:
        name = cls.__name__
        if name not in self.schemas:
            self.schemas[name] = {}  # a message that holds itself stops here
            self.schemas[name] = message_schema(cls, self)
        return f"#/components/schemas/{name}"


def message_schema(cls: type, components: Components) -> dict[str, Any]:
    """A typed message's schema, read off its ``parse``."""
    root = Slot()
    walker = Walker(components)
    walker.follow(plain_function(cls.__dict__["parse"]), {1: root}, 0)
    if root.ref is cls:  # parse hands the body to a check that names the class
        root.ref = None
    hints = hints_of(cls)
    if dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            if f.name in root.props and f.default is dataclasses.MISSING \
                    and f.default_factory is dataclasses.MISSING:
                root.required.add(f.name)
    schema = root.to_schema(components, hints)
    doc = inspect.getdoc(cls)
    if doc:
        schema["description"] = doc
    return schema


def hints_of(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # a name only TYPE_CHECKING imports: no hints, no fallback types
        return {}


def plain_function(obj: Any) -> types.FunctionType | None:
    """The plain function behind a method, classmethod or bound method."""
    obj = getattr(obj, "__func__", obj)
    return obj if isinstance(obj, types.FunctionType) else None


_TREES: dict[types.FunctionType, ast.FunctionDef | None] = {}


def _tree(func: types.FunctionType) -> ast.FunctionDef | None:
    if func not in _TREES:
        _TREES[func] = _parse_tree(func)
    return _TREES[func]


def _parse_tree(func: types.FunctionType) -> ast.FunctionDef | None:
    try:
        source = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError):
        return None
    node = ast.parse(source).body[0]
    return node if isinstance(node, ast.FunctionDef) else None


_REQUEST, _QUERY = object(), object()  # what a name holds besides a body part


@dataclasses.dataclass(frozen=True)
class Const:
    """A constant a caller passed to a parameter (a field's name, a bound)."""

    value: Any
_NOT_CONSTANT = object()


class Walker:
    """Reads one handler (and what it calls) for the request's body fields, query
    parameters, who may call it and the statuses it answers."""

    def __init__(self, components: Components) -> None:
        self.components = components
        self.query: set[str] = set()
        self.callers: set[str] = set()
        self.statuses: set[int] = set()
        self.seen: set[tuple[Any, ...]] = set()
        self.root_slot = Slot()  # the request's body

    def follow(self, func: types.FunctionType | None, bound: dict[int | str, Any],
               depth: int, owner: object = None, top: bool = False) -> None:
        """Walk ``func`` with its parameters (by position or name) bound to body slots,
        the request or its query."""
        if func is None or depth > _MAX_DEPTH or not func.__module__.startswith("gpusched"):
            return
        key = (func, tuple(sorted((str(k), repr(v) if isinstance(v, Const) else id(v))
                                  for k, v in bound.items())))
        if key in self.seen:
            return
        self.seen.add(key)
        tree = _tree(func)
        if tree is None:
            return
        params = [a.arg for a in (*tree.args.posonlyargs, *tree.args.args)]
        scope: dict[str, Any] = {}
        for where, value in bound.items():
            name = params[where] if isinstance(where, int) and where < len(params) else where
            if isinstance(name, str):
                scope[name] = value
        _Visit(self, func, scope, depth, owner, top).run(tree)

    def handler(self, handler: Any) -> Slot:
        """Walk a route's handler; returns its body's slot."""
        func = plain_function(handler)
        owner = getattr(handler, "__self__", None)
        self.follow(func, {1 if owner is not None else 0: _REQUEST}, 0, owner, top=True)
        return self.root_slot


class _Visit(ast.NodeVisitor):
    """One function's walk, in source order: names bound to body slots as assigned."""

    def __init__(self, walker: Walker, func: types.FunctionType, scope: dict[str, Any],
                 depth: int, owner: object, top: bool) -> None:
        self.w, self.func, self.scope = walker, func, scope
        self.globals = func.__globals__
        self.depth, self.owner, self.top = depth, owner, top
        self.conditional = 0

    def run(self, tree: ast.FunctionDef) -> None:
        self.locals = {a.arg for a in ast.walk(tree.args) if isinstance(a, ast.arg)} | {
            n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Store)}
        for stmt in tree.body:
            self.visit(stmt)

    # -- what an expression is ----------------------------------------------------
    def constant(self, node: ast.expr) -> Any:
        """The value of an expression of constants, module names and parameters a
        caller passed constants to; _NOT_CONSTANT."""
        names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        consts = {k: v.value for k, v in self.scope.items() if isinstance(v, Const)}
        if (names & (set(self.scope) | self.locals)) - set(consts) \
                or any(isinstance(n, ast.Call) for n in ast.walk(node)):
            return _NOT_CONSTANT
        try:
            return eval(compile(ast.Expression(node), "<openapi>", "eval"),
                        {**self.globals, **consts})
        except Exception:
            return _NOT_CONSTANT

    def key(self, node: ast.expr) -> str | None:
        """A field's name: a string constant, or a parameter given one."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            bound = self.scope.get(node.id)
            if isinstance(bound, Const) and isinstance(bound.value, str):
                return bound.value
        return None

    def resolve(self, node: ast.expr) -> Any:
        """What a called name or attribute is: a function, a class, a module; None."""
        if isinstance(node, ast.Name):
            return self.globals.get(node.id, getattr(builtins, node.id, None))
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "self" \
                    and self.owner is not None:
                return getattr(self.owner, node.attr, None)
            base = self.resolve(node.value)
            return getattr(base, node.attr, None) if base is not None else None
        return None

    def slot(self, node: ast.expr | None) -> Any:
        """The body slot, the request or the query an expression stands for; None."""
        if node is None:
            return None
        if isinstance(node, ast.Name):
            value = self.scope.get(node.id)
            return None if isinstance(value, Const) else value
        if isinstance(node, ast.Attribute):
            base = self.slot(node.value)
            if base is _REQUEST and node.attr == "body":
                return self.w.root_slot
            if base is _REQUEST and node.attr == "query":
                return _QUERY
            return None
        if isinstance(node, ast.Subscript):
            base, key = self.slot(node.value), self.key(node.slice)
            if key is not None:
                if isinstance(base, Slot):
                    return base.prop(key)
                if base is _QUERY:
                    self.w.query.add(key)
            return None
        if isinstance(node, ast.IfExp):
            return self.slot(node.body) or self.slot(node.orelse)
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values, strict=True):
                if k is None and isinstance(self.slot(v), Slot):
                    return self.slot(v)
            return None
        if isinstance(node, ast.DictComp):  # {k: v for k, v in body.items() if ...}
            source = node.generators[0].iter
            if isinstance(source, ast.Call) and isinstance(source.func, ast.Attribute) \
                    and source.func.attr == "items":
                found = self.slot(source.func.value)
                return found if isinstance(found, Slot) else None
            return None
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "get" and node.args:
                base, key = self.slot(func.value), self.key(node.args[0])
                if key is not None:
                    if isinstance(base, Slot):
                        return base.prop(key)
                    if base is _QUERY:
                        self.w.query.add(key)
                return None
            name = func.id if isinstance(func, ast.Name) else None
            if name == "as_object" and node.args:
                return self.slot(node.args[0])
            base = self.slot(node.args[0]) if node.args else None
            if name == "typed" and len(node.args) > 2 and isinstance(base, Slot):
                key = self.key(node.args[1])
                if key is not None:
                    return base.prop(key)
        return None

    # -- statements and calls -------------------------------------------------------
    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        value = self.slot(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name):
                if value is not None:
                    self.scope[target.id] = value
                else:
                    self.scope.pop(target.id, None)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self.conditional += 1
        self.generic_visit(node)
        self.conditional -= 1

    def visit_Return(self, node: ast.Return) -> None:
        value = node.value
        if self.top and isinstance(value, ast.Tuple) and value.elts \
                and isinstance(value.elts[0], ast.Constant) \
                and isinstance(value.elts[0].value, int):
            self.w.statuses.add(value.elts[0].value)
        self.generic_visit(node)

    def _comprehension(self, node: ast.expr, generators: list[ast.comprehension]) -> None:
        for gen in generators:
            source = self.slot(gen.iter)
            if isinstance(source, Slot) and isinstance(gen.target, ast.Name):
                self.scope[gen.target.id] = source.item()
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        source = self.slot(node.iter)
        if isinstance(source, Slot) and isinstance(node.target, ast.Name):
            self.scope[node.target.id] = source.item()
        elif isinstance(node.iter, ast.Tuple | ast.List) and len(node.iter.elts) <= 32:
            # for key, column in (("user", ...), ...): the body once per element
            names = node.target.elts if isinstance(node.target, ast.Tuple) else [node.target]
            for elt in node.iter.elts:
                values = elt.elts if isinstance(elt, ast.Tuple) else [elt]
                for name, value in zip(names, values, strict=False):
                    if isinstance(name, ast.Name) and isinstance(value, ast.Constant):
                        self.scope[name.id] = Const(value.value)
                for stmt in node.body:
                    self.visit(stmt)
            return
        self.generic_visit(node)

    def visit_GeneratorExp(self, node: ast.GeneratorExp) -> None:
        self._comprehension(node, node.generators)

    def visit_ListComp(self, node: ast.ListComp) -> None:
        self._comprehension(node, node.generators)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        left = node.left
        if isinstance(node.op, ast.Sub) and isinstance(left, ast.Call) \
                and isinstance(left.func, ast.Name) and left.func.id == "set" and left.args:
            target = self.slot(left.args[0])
            known = self.constant(node.right)
            if isinstance(target, Slot) and isinstance(known, (set, frozenset)):
                self._close(target, known)
        self.generic_visit(node)

    def _close(self, target: Slot, known: Any) -> None:
        target.closed = True
        for key in known:
            target.prop(key)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        self.generic_visit(node)
        self.slot(node)  # body["key"], query["key"]: a field read

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "get":
            self.slot(node)  # body.get("key"), query.get("key"): a field read
        if isinstance(func, ast.Attribute) and func.attr in ("require_admin",):
            self.w.callers.add("admin")
        elif isinstance(func, ast.Attribute) and func.attr in ("require_node", "require_agent"):
            self.w.callers.add("agent")
        name = func.id if isinstance(func, ast.Name) else None
        first = self.slot(node.args[0]) if node.args else None
        if name in READERS and isinstance(first, Slot) and len(node.args) > 1:
            self._reader(name, node)
            return
        if name == "refuse_unknown" and isinstance(first, Slot) and len(node.args) > 1:
            known = self.constant(node.args[1])
            if isinstance(known, (set, frozenset, tuple, list)):
                self._close(first, known)
            return
        target = self.resolve(func)
        args = [self.slot(a) for a in node.args]
        kwargs = {k.arg: self.slot(k.value) for k in node.keywords if k.arg}
        if isinstance(func, ast.Attribute) and func.attr == "parse" \
                and isinstance(target, types.MethodType) and isinstance(target.__self__, type):
            if args and isinstance(args[0], Slot):
                args[0].ref = target.__self__
            return
        if any(a is not None for a in (*args, *kwargs.values())):
            bound: dict[int | str, Any] = {}
            offset = 1 if isinstance(target, types.MethodType) else 0
            for i, (a, arg) in enumerate(zip(args, node.args, strict=True)):
                if a is None and isinstance(arg, ast.Constant):
                    a = Const(arg.value)
                if a is not None:
                    bound[i + offset] = a
            bound.update({k: v for k, v in kwargs.items() if v is not None})
            owner = getattr(target, "__self__", None)
            self.w.follow(plain_function(target), bound, self.depth + 1, owner)
            if _QUERY in args:  # epoch_param(query, "start")
                for a in node.args:
                    if isinstance(a, ast.Constant) and isinstance(a.value, str):
                        self.w.query.add(a.value)

    def _reader(self, name: str, node: ast.Call) -> None:
        target = self.slot(node.args[0])
        key = self.key(node.args[1])
        if key is None or not isinstance(target, Slot):
            return
        values = [self.constant(a) for a in node.args[2:]]
        if name == "integer":  # (default, low, high, expected)
            values = values[1:]
        found = reader_schema(name, [... if v is _NOT_CONSTANT else v for v in values])
        if found is None:
            return
        schema, required = found
        if name == "one_of" and self.conditional:
            required = False
            schema = {"anyOf": [schema, {"type": "null"}]}
        expected = values[-1] if values and isinstance(values[-1], str) else None
        if expected and name not in ("one_of", "flag"):
            schema["description"] = expected
        slot = target.prop(key)
        if slot.ref is None and not slot.props:
            slot.schema = schema
        if required:
            target.required.add(key)
