"""TOML configurations: the example files of etc/ with random values put in their known
keys (and keys added or dropped), and random documents, written as TOML files and
loaded as the daemons and ``gpusched admin apply`` load them: each is a configuration,
or a ConfigError of one line; nothing raises anything else."""

from __future__ import annotations

import re
import tomllib
from datetime import date, datetime, time
from pathlib import Path
from typing import Any

from hypothesis import event, given
from hypothesis import strategies as st

from gpusched.adminconfig import load_admin_config
from gpusched.config import load_config
from gpusched.errors import ConfigError
from tests.fuzz.fuzzing import TEXT, fuzz, long_number, noisy_text, one_line

NAME = re.compile(r"[A-Za-z0-9_.-]+")
ETC = Path(__file__).resolve().parents[2] / "etc"
EXAMPLES = {name: tomllib.loads((ETC / name).read_text())
            for name in ("gpusched.toml", "partitions.toml", "accounts.toml")}

# Strings the parsers read as names, times, host lists, paths and addresses, right and wrong.
WORDS = ["gpu", "gpu\n", "a b", "", "*", "gpu[01-04]", "gpu[1-", "a[" + "9" * 5000 + "]",
         "UNLIMITED", "1-00:00:00", "10:00", "0", "9" * 5000, "/abs/path", "rel/path",
         "127.0.0.1:7000", "[::1]:7000", "unix:/run/x.sock", "host:99999", "mps", "shard",
         "exclusive", "fgd", "requeue", "munge", "key", "none", "UP", "drain", "normal",
         "postgresql+psycopg://u@/db", "\x1b[31m", "\u2028", "h100-80gb", "H100"]


class Raw:
    """A value written into the TOML text as it is: literals no Python value renders,
    such as integers past int()'s 4300 digits."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Raw({self.text[:20]!r})"


RAW = ["9" * 5000, "-" + "9" * 4400, "0x" + "f" * 4000, "0b" + "1" * 20000, "1e99999",
       "-inf", "nan", "2147483648", "9223372036854775807", "99999999999999999999", "0o777"]
scalar = st.one_of(st.sampled_from(RAW).map(Raw),
    st.booleans(), st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, 1, -1, 0o777, 70000]),
    st.floats(), st.sampled_from(WORDS), st.text(TEXT, max_size=12), long_number(),
    st.datetimes(), st.dates(), st.times())
toml_value = st.recursive(scalar, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.sampled_from(["name", "x", "nodes", "a\nb"])
                                            | st.text(TEXT, max_size=4), inner, max_size=3),
                          max_leaves=6)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into a parsed document (list items by index)."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, inner in value.items():
            found += paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += paths(inner, (*prefix, index))
    return found


@st.composite
def mutated(draw: st.DrawFn, base: dict[str, Any]) -> dict[str, Any]:
    """``base`` with a few of its values replaced, keys dropped or keys added."""
    document = tomllib.loads(render(base))  # a deep copy
    for _ in range(draw(st.integers(1, 4))):
        if not document:
            break
        path = draw(st.sampled_from(paths(document)))
        parent = document
        for step in path[:-1]:
            parent = parent[step]
        action = draw(st.integers(0, 5))
        if action == 0 and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == 1 and isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "Name", "name ", "x\ny"]))] = draw(scalar)
        else:
            parent[path[-1]] = draw(st.sampled_from(WORDS) | toml_value)
    return document


def _string(text: str) -> str:
    escaped = "".join(f"\\u{ord(c):04x}" if ord(c) < 0x20 or c == "\x7f"
                      else "\\" + c if c in '"\\' else c for c in text)
    return f'"{escaped}"'


def render(value: Any) -> str:
    """A document as TOML text, every table inline (``name = {...}``)."""
    def item(v: Any) -> str:
        if isinstance(v, Raw):
            return v.text
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return _string(v)
        if isinstance(v, (datetime, date, time)):
            return v.isoformat()
        if isinstance(v, list):
            return "[" + ", ".join(item(i) for i in v) + "]"
        return "{" + ", ".join(f"{_string(k)} = {item(i)}" for k, i in v.items()) + "}"

    return "".join(f"{_string(key)} = {item(inner)}\n" for key, inner in value.items())


def load(tmp_path: Path, name: str, text: str) -> str:
    """Load ``text`` as the file ``name``: "loaded", or "refused" with one line."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    try:
        if name == "gpusched.toml":
            config = load_config(path)
            names = [p.name for p in config.partitions] + [config.agent.node_name]
            names += [n for p in config.partitions for n in p.nodes if n != "*"]
        else:
            admin = load_admin_config([path])
            names = [item.name for kind in (admin.partitions, admin.accounts, admin.users,
                                            admin.qos) for item in kind or ()]
            names += [n for p in admin.partitions or () for n in p.nodes if n != "*"]
    except ConfigError as err:
        one_line(err)
        return "refused"
    # What is taken is a name a message, a log line or a host list can show as it is.
    assert all(NAME.fullmatch(n) for n in names), names
    return "loaded"


def test_the_examples_render_and_load(tmp_path: Path) -> None:
    load_config((ETC / "gpusched.toml"))
    for name, document in EXAMPLES.items():
        assert tomllib.loads(render(document)) == document
        assert load(tmp_path, name, render(document)) == "loaded"


@fuzz(300)
@given(st.sampled_from(sorted(EXAMPLES)).flatmap(
    lambda name: st.tuples(st.just(name), mutated(EXAMPLES[name]))))
def test_known_keys_with_random_values(tmp_path: Path, case: tuple[str, dict[str, Any]]) -> None:
    name, document = case
    event(load(tmp_path, name, render(document)))


@fuzz(150)
@given(st.sampled_from(sorted(EXAMPLES)),
       st.dictionaries(st.sampled_from(["controller", "scheduler", "agent", "auth", "partitions",
                                        "partition", "account", "user", "qos", "billing",
                                        "database", "controllers"]) | st.text(TEXT, max_size=4),
                       toml_value, max_size=4))
def test_random_documents(tmp_path: Path, name: str, document: dict[str, Any]) -> None:
    event(load(tmp_path, name, render(document)))


@fuzz(150)
@given(st.sampled_from(sorted(EXAMPLES)), noisy_text('[]=."#\n abc0129-{},', 20))
def test_random_text(tmp_path: Path, name: str, text: str) -> None:
    event(load(tmp_path, name, text))


def test_an_integer_past_any_float(tmp_path: Path) -> None:
    assert load(tmp_path, "partitions.toml", "[billing]\na100 = " + "9" * 400 + "\n") == "refused"
