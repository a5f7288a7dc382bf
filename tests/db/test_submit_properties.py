"""Property tests of submit validation against a real database: every submission that
passes is stored exactly as sent, and every one refused stores nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpusched.config import PartitionConfig
from gpusched.core import bounds
from gpusched.db.engine import make_engine, make_sessionmaker
from gpusched.db.job_views import get_job
from gpusched.db.jobs import Identity
from gpusched.db.models import Job, JobScript
from gpusched.db.partitions import sync_partitions
from gpusched.db.submit import submit_job
from gpusched.errors import UsageError

ALICE = Identity(1000, 1000, "alice")
HOSTILE_TEXT = st.sampled_from(["\x1b]8;;http://x\x07", "a\x1b[31mb", "\u202egnp.exe", "\x00",
                                "tab\there", "\x9b", "\u2028"])

# Per field: valid values, and values that must be refused.
GOOD: dict[str, st.SearchStrategy[Any]] = {
    "name": st.text(st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl",
                                                        "Zp", "Zs")), min_size=1, max_size=40),
    "args": st.lists(st.text(st.characters(blacklist_characters="\x00",
                                           blacklist_categories=("Cs",)), max_size=20),
                     max_size=4),
    "environment": st.dictionaries(
        st.text(st.characters(blacklist_characters="=\x00", blacklist_categories=("Cs",)),
                min_size=1, max_size=10),
        st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
                max_size=20), max_size=4),
    "gpus": st.integers(0, 64),
    "cpus": st.integers(0, bounds.MAX_CPUS),
    "mem_mb": st.integers(0, bounds.MAX_MEM_MB),
    "time_limit": st.integers(1, bounds.MAX_TIME_LIMIT),
    "output": st.sampled_from(["out-%j.txt", "/tmp/%x-%A_%a.log", "%5j.out"]),
    "umask": st.integers(0, 0o777),
    "dependency": st.none(),
}
BAD: dict[str, st.SearchStrategy[Any]] = {
    "name": HOSTILE_TEXT | st.just("x" * 201) | st.just(""),
    "args": st.just(["a\x00b"]) | st.just(["x"] * (bounds.MAX_ARGS + 1)) | st.just([1])
    | st.just(["\ud800"]),
    "environment": st.just({"A=B": "c"}) | st.just({"A": "\x00"}) | st.just({"A": 1})
    | st.just({"A": "x\udcff"}) | st.just({"\udc80": "x"}),
    "gpus": st.integers(max_value=-1) | st.integers(min_value=bounds.MAX_GPUS + 1) | st.just(True),
    "cpus": st.integers(max_value=-1) | st.integers(min_value=bounds.MAX_CPUS + 1),
    "mem_mb": st.integers(max_value=-1) | st.integers(min_value=bounds.MAX_MEM_MB + 1),
    "time_limit": st.integers(max_value=0) | st.integers(min_value=bounds.MAX_TIME_LIMIT + 1),
    "output": HOSTILE_TEXT.map(lambda t: f"/tmp/{t}") | st.just("/" + "a" * 4096)
    | st.sampled_from(["/tmp/%99999999999999999999j.out", "%999999999j", "%11A"]),
    "umask": st.integers(max_value=-1) | st.integers(min_value=0o1000) | st.just("022"),
    "dependency": st.just("afterok:" + "9" * 30) | st.just("afterok:999999999"),  # no such job
    "work_dir": st.just("relative/dir") | HOSTILE_TEXT.map(lambda t: f"/tmp/{t}"),
    "script": st.just("no shebang") | st.just("#!/bin/sh\n\x00") | st.just("#!/bin/sh\n\ud800"),
    "nodes": st.just(0) | st.integers(min_value=bounds.MAX_NODES + 1),
    "array": st.just("0-" + "9" * 20) | st.just("1," * 6000),
    "smuggled": st.just("an unknown field"),
    # A share no partition here offers (the one partition gives whole GPUs), or malformed.
    "share_mode": st.sampled_from(["mps", "shard", "mig", 1]),
    "share": st.integers(1, 10_000) | st.just(0) | st.just(10_001),
    "gpu_mem_mb": st.just(0) | st.integers(min_value=16 * 1024 * 1024 + 1) | st.just("20G")
    | st.just(-1),
}


@st.composite
def submissions(draw: st.DrawFn) -> tuple[dict[str, Any], bool]:
    """A body, and whether it must be refused."""
    body: dict[str, Any] = {"script": "#!/bin/sh\necho hi\n", "work_dir": "/tmp/work"}
    bad = draw(st.sets(st.sampled_from(sorted(BAD)), max_size=2))
    for field in sorted(GOOD):
        if field not in bad and draw(st.booleans()):
            value = draw(GOOD[field])
            if value is not None:
                body[field] = value
    for field in sorted(bad):
        body[field] = draw(BAD[field])
    return body, bool(bad)


@pytest.fixture(scope="module")
def sessions(postgres: Any) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(postgres.fresh_database(), pool_size=2)
    maker = make_sessionmaker(engine)
    with maker() as s, s.begin():
        sync_partitions(s, (PartitionConfig("gpu", default=True),))
    yield maker
    engine.dispose()


def _stored(sessions: sessionmaker[Session]) -> tuple[int, int]:
    with sessions() as s:
        return (s.scalar(select(func.count()).select_from(Job)) or 0,
                s.scalar(select(func.count()).select_from(JobScript)) or 0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(case=submissions())
def test_stored_jobs_round_trip_and_refused_ones_store_nothing(
        sessions: sessionmaker[Session], case: tuple[dict[str, Any], bool]) -> None:
    body, must_refuse = case
    before = _stored(sessions)
    try:
        with sessions() as s, s.begin():
            job_id = submit_job(s, dict(body), ALICE).id
    except UsageError as exc:
        assert must_refuse, f"refused a valid submission: {exc.message}"
        assert "\n" not in exc.message and len(exc.message) < 400
        assert _stored(sessions) == before
        return
    assert not must_refuse, f"stored a submission that should have been refused: {body!r}"
    with sessions() as s:
        job = get_job(s, job_id, ALICE)
        umask = s.scalar(select(Job.umask).where(Job.id == job_id))
    assert umask == body.get("umask")
    expected = {"name": "job", "args": [], "environment": {}, "gpus": 0, "cpus": 0, "mem_mb": 0,
                "output": None, "script": body["script"], "work_dir": body["work_dir"]}
    for field, default in expected.items():
        assert job[field] == body.get(field, default), field
    if "time_limit" in body:
        assert job["time_limit"] == body["time_limit"]
