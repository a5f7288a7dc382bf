"""Licenses (-L): parsing and its bounds, the refusal at submit, the admin config's
[licenses] table, and the pass holding a job whose licenses are not free (reason
Licenses) without blocking anyone, backfill included; --explain says why."""

from __future__ import annotations

import pytest

from gpusched.adminconfig import parse_admin_config
from gpusched.core.explain import explain
from gpusched.core.licenses import (
    MAX_JOB_LICENSES,
    LicenseError,
    LicenseTracker,
    format_licenses,
    license_use,
    parse_licenses,
    refusal,
)
from gpusched.core.model import (
    GpuView,
    NodeState,
    NodeView,
    PartitionView,
    PendingJob,
    Policy,
    Reason,
    RunningJob,
    Snapshot,
)
from gpusched.core.plan import plan
from gpusched.errors import ConfigError, UsageError
from gpusched.messages import JobRequest

NOW = 1_000.0


def test_a_count_defaults_to_one_and_the_result_is_sorted() -> None:
    assert parse_licenses("matlab") == (("matlab", 1),)
    assert parse_licenses("matlab:3,ansys") == (("ansys", 1), ("matlab", 3))
    assert parse_licenses("fluent@server:2,") == (("fluent@server", 2),)  # trailing comma
    assert format_licenses(parse_licenses("b:2,a")) == "a:1,b:2"


@pytest.mark.parametrize("text, words", [
    ("matlab|ansys", "'|'"),
    ("", "expected name"),
    (",", "expected name"),
    ("matlab:0", "from 1 to"),
    ("matlab:-1", "from 1 to"),
    ("matlab:1000001", "from 1 to"),
    ("matlab:99999999999999999999", "from 1 to"),
    ("matlab:x", "from 1 to"),
    ("matlab:²", "from 1 to"),
    ("mat lab", "not a license name"),
    ("-x", "not a license name"),
    ("a" * 65, "not a license name"),
    ("matlab,matlab:2", "named twice"),
    (",".join(f"l{i}" for i in range(MAX_JOB_LICENSES + 1)), "more than 32"),
    ("x," * 3000, "longer than"),
])
def test_bad_values_are_refused_with_a_reason(text: str, words: str) -> None:
    with pytest.raises(LicenseError) as err:
        parse_licenses(text)
    assert words in err.value.message and "\n" not in err.value.message


def test_submit_message_takes_the_text_and_bounds_it() -> None:
    body = {"script": "#!/bin/sh\n", "work_dir": "/tmp"}
    assert JobRequest.parse(body).licenses == ()
    assert JobRequest.parse({**body, "licenses": "b:2,a"}).licenses == (("a", 1), ("b", 2))
    assert JobRequest.parse({**body, "licenses": "b:2,a"}).to_json()["licenses"] == "a:1,b:2"
    for bad, words in ((7, "expected licenses"), (["a"], "expected licenses"),
                       ("a|b", "'|'"), ("a:0", "from 1 to")):
        with pytest.raises(UsageError) as err:
            JobRequest.parse({**body, "licenses": bad})
        assert err.value.message.startswith("licenses: ") and words in err.value.message


def test_refusal_names_an_unknown_license_or_too_many() -> None:
    totals = {"matlab": 1, "ansys": 4}
    assert refusal(parse_licenses("matlab,ansys:4"), totals) is None
    unknown = refusal(parse_licenses("comsol"), totals)
    assert unknown is not None and "no license 'comsol'" in unknown and "ansys, matlab" in unknown
    many = refusal(parse_licenses("matlab:2"), totals)
    assert many is not None and "matlab:2" in many and "1 matlab license" in many


def test_admin_config_reads_a_licenses_table() -> None:
    config = parse_admin_config([("a.toml", {"licenses": {"matlab": 2, "ansys": 0}})])
    assert config.licenses == {"matlab": 2, "ansys": 0}
    assert parse_admin_config([("a.toml", {"billing": {}})]).licenses is None
    for bad in ({"matlab": -1}, {"matlab": "2"}, {"matlab": True}, {"mat lab": 1},
                {"matlab": 1_000_001}, {"matlab": 1.5}):
        with pytest.raises(ConfigError) as err:
            parse_admin_config([("a.toml", {"licenses": bad})])
        assert "a.toml" in err.value.message and "licenses" in err.value.message


def test_tracker_and_usage_count_running_jobs() -> None:
    running = [RunningJob(1, "a", (), licenses=(("matlab", 2),)),
               RunningJob(2, "a", (), licenses=(("ansys", 1), ("matlab", 1)))]
    tracker = LicenseTracker({"matlab": 4, "ansys": 1}, running)
    assert tracker.free("matlab") == 1 and tracker.free("ansys") == 0 and tracker.free("x") == 0
    assert tracker.fits((("matlab", 1),)) and not tracker.fits((("matlab", 2),))
    assert not tracker.fits((("ansys", 1),)) and not tracker.fits((("x", 1),))
    use = license_use({"matlab": 2, "ansys": 1}, running)
    assert [(u.name, u.total, u.used, u.free) for u in use] == [
        ("ansys", 1, 1, 0), ("matlab", 2, 3, 0)]  # a lowered total shows 0 free


def node(name: str, gpus: int) -> NodeView:
    return NodeView(name, NodeState.UP, tuple(GpuView(f"{name}-{i}", i) for i in range(gpus)))


def job(job_id: int, gpus: int = 1, licenses: str = "", **kw: object) -> PendingJob:
    return PendingJob(job_id, "gpu", gpus, 1000, float(job_id), time_limit=3600, user="u",
                      licenses=parse_licenses(licenses) if licenses else (), **kw)  # type: ignore[arg-type]


def snapshot(jobs: list[PendingJob], totals: dict[str, int], gpus: int = 8,
             running: tuple[RunningJob, ...] = ()) -> Snapshot:
    return Snapshot((node("a", gpus),), (PartitionView("gpu", ("a",)),), tuple(jobs), running,
                    licenses=totals)


def decide(snap: Snapshot, policy: Policy = Policy()) -> tuple[list[int], dict[int, Reason]]:
    result = plan(snap, NOW, policy)
    return [s.job_id for s in result.starts], {p.job_id: p.reason for p in result.pending}


def test_one_license_runs_two_jobs_one_after_the_other() -> None:
    started, reasons = decide(snapshot([job(1, licenses="matlab"), job(2, licenses="matlab")],
                                       {"matlab": 1}))
    assert started == [1] and reasons == {2: Reason.LICENSES}
    # Once the first runs, the second still waits; once it ended, the second starts.
    running = (RunningJob(1, "a", ("a-0",), licenses=(("matlab", 1),)),)
    assert decide(snapshot([job(2, licenses="matlab")], {"matlab": 1}, running=running)) == (
        [], {2: Reason.LICENSES})
    assert decide(snapshot([job(2, licenses="matlab")], {"matlab": 1})) == ([2], {})


def test_a_job_held_for_licenses_blocks_nobody_and_gets_no_reservation() -> None:
    running = (RunningJob(9, "a", ("a-0",), end_time=NOW + 600, licenses=(("matlab", 1),)),)
    jobs = [job(1, licenses="matlab:2"), job(2, licenses="matlab:1"), job(3, gpus=2)]
    result = plan(snapshot(jobs, {"matlab": 2}, running=running), NOW, Policy())
    assert sorted(s.job_id for s in result.starts) == [2, 3]
    assert {p.job_id: p.reason for p in result.pending} == {1: Reason.LICENSES}
    assert not result.reservations and result.pending[0].expected_start is None


@pytest.mark.parametrize("backfill", ["easy", "conservative"])
def test_backfill_never_starts_a_job_whose_licenses_are_not_free(backfill: str) -> None:
    # Job 1 waits for GPUs (a reservation); jobs 2 and 3 fit its hole by GPUs, but only
    # one matlab is free: the second of them waits for it, whatever backfill allows.
    running = (RunningJob(9, "a", tuple(f"a-{i}" for i in range(6)), end_time=NOW + 7200),)
    jobs = [job(1, gpus=4), job(2, licenses="matlab"), job(3, licenses="matlab")]
    result = plan(snapshot(jobs, {"matlab": 1}, running=running), NOW, Policy(backfill=backfill))
    assert [s.job_id for s in result.starts] == [2]
    assert {p.job_id: p.reason for p in result.pending} == {1: Reason.RESOURCES,
                                                          3: Reason.LICENSES}
    assert [r.job_id for r in result.reservations] == [1]


@pytest.mark.parametrize("backfill", ["easy", "conservative"])
def test_a_reservation_keeps_its_licenses_from_backfill(backfill: str) -> None:
    # Job 1 has its matlab free but waits for GPUs: its reservation keeps the license,
    # so job 2, which fits by GPUs now, does not take it (it would still hold it when
    # job 1's GPUs come); job 3 asks for another license and is backfilled.
    running = (RunningJob(9, "a", tuple(f"a-{i}" for i in range(6)), end_time=NOW + 7200),)
    jobs = [job(1, gpus=4, licenses="matlab"), job(2, licenses="matlab"),
            job(3, licenses="ansys")]
    snap = snapshot(jobs, {"matlab": 1, "ansys": 1}, running=running)
    result = plan(snap, NOW, Policy(backfill=backfill))
    assert [s.job_id for s in result.starts] == [3]
    assert {p.job_id: p.reason for p in result.pending} == {1: Reason.RESOURCES,
                                                          2: Reason.LICENSES}
    assert [(r.job_id, r.start_time) for r in result.reservations] == [(1, NOW + 7200)]
    detail = next(b.detail for b in explain(snap, NOW, Policy(backfill=backfill), 2).blockers
                  if b.reason is Reason.LICENSES)
    assert "free now, but jobs ahead of it" in detail
    # Without backfill reservations (depth 0), nothing is kept: job 2 waits behind job 1
    # by priority instead.
    none = plan(snap, NOW, Policy(backfill="none"))
    assert {p.job_id: p.reason for p in none.pending} == {1: Reason.RESOURCES,
                                                        2: Reason.PRIORITY,
                                                        3: Reason.PRIORITY}


def test_array_tasks_each_take_the_licenses() -> None:
    array = job(1, licenses="ansys:2", array_job_id=1, array_tasks="0-4")
    result = plan(snapshot([array], {"ansys": 5}), NOW, Policy())
    assert [s.array_task_id for s in result.starts] == [0, 1]
    assert [p.reason for p in result.pending] == [Reason.LICENSES]


def test_a_license_no_longer_declared_holds_the_job() -> None:
    assert decide(snapshot([job(1, licenses="matlab")], {})) == ([], {1: Reason.LICENSES})
    assert decide(snapshot([job(1, licenses="matlab")], {"ansys": 1})) == (
        [], {1: Reason.LICENSES})


def test_explain_says_which_license_is_short() -> None:
    running = (RunningJob(9, "a", ("a-0",), licenses=(("matlab", 1),)),)
    snap = snapshot([job(1, licenses="matlab,ansys")], {"matlab": 1, "ansys": 3},
                    running=running)
    why = explain(snap, NOW, Policy(), 1)
    assert why.reason is Reason.LICENSES
    detail = next(b.detail for b in why.blockers if b.reason is Reason.LICENSES)
    assert "matlab:1 (0 of 1 free)" in detail and "ansys" not in detail
