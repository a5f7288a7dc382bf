"""gqueue's, ginfo's and gacct's Slurm formats, pure: -S sorting against a simple
reference, -O widths, -r's array expansion, %E's dependency states, sinfo's filters and
sacct's field names."""

from __future__ import annotations

import functools
from datetime import datetime, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpusched.cli import acctformat, infoformat
from gpusched.cli.ginfo import NodeSummary
from gpusched.cli.queueformat import (
    Field,
    parse_long_format,
    parse_sort,
    render_format,
    sort_jobs,
)
from gpusched.cli.queueviews import dependency_items, dependency_state, expand_arrays
from gpusched.core.arrays import task_count
from gpusched.errors import UsageError

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)

jobs_strategy = st.lists(st.fixed_dictionaries({
    "job_id": st.integers(1, 50), "name": st.sampled_from(["a", "b", "B", "c10", "c9"]),
    "time_limit": st.one_of(st.none(), st.integers(60, 10**6)),
    "state": st.sampled_from(["PENDING", "RUNNING", "COMPLETED"]),
    "nodes": st.integers(1, 12), "partition": st.sampled_from(["gpu", "debug"]),
}), max_size=12)
keys_strategy = st.lists(st.tuples(st.sampled_from("ijlDtP"), st.booleans()), min_size=1,
                         max_size=3)


def reference_value(code: str, job: dict[str, Any]) -> Any:
    return {"i": (job["job_id"], -1), "j": job["name"],
            "l": job["time_limit"] if job["time_limit"] is not None else float("inf"),
            "D": job["nodes"], "t": {"PENDING": "PD", "RUNNING": "R", "COMPLETED": "CD"}[
                job["state"]], "P": job["partition"]}[code]


def reference_sort(jobs: list[dict[str, Any]], keys: list[tuple[str, bool]]) -> list[Any]:
    def compare(a: dict[str, Any], b: dict[str, Any]) -> int:
        for code, descending in keys:
            x, y = reference_value(code, a), reference_value(code, b)
            if x != y:
                return (1 if x > y else -1) * (-1 if descending else 1)
        return 0
    return sorted(jobs, key=functools.cmp_to_key(compare))


@settings(max_examples=150, deadline=None)
@given(jobs=jobs_strategy, keys=keys_strategy)
def test_sort_matches_a_key_by_key_reference(jobs: list[dict[str, Any]],
                                             keys: list[tuple[str, bool]]) -> None:
    text = ",".join(("-" if down else "+") + code for code, down in keys)
    assert parse_sort(text) == keys
    assert sort_jobs(jobs, keys, NOW) == reference_sort(jobs, keys)


def test_sort_and_format_refusals_name_the_code() -> None:
    with pytest.raises(UsageError, match=r"--sort: %g is not supported"):
        parse_sort("i,g")
    with pytest.raises(UsageError, match="invalid --sort key 'ij'"):
        parse_sort("ij")
    with pytest.raises(UsageError, match="no field 'Bogus'"):
        parse_long_format("JobID,Bogus")


def test_reservation_and_features_codes() -> None:
    from gpusched.cli.queueformat import parse_format

    fields = parse_format("%v|%f")
    assert render_format(fields, {"reservation": "maint", "constraint": "a100&nvlink"}, NOW) \
        == "maint|a100&nvlink"
    assert render_format(parse_long_format("Reservation:6"), {}, NOW) == "(null)"
    fields = parse_long_format("Nice:4,MinTime:8,Deadline:5")
    assert render_format(fields, {"nice": 5, "time_min": 1800, "deadline": None}, NOW) \
        == "5    30:00    N/A"


def test_slurm_only_states_select_nothing_in_listings_only() -> None:
    from gpusched.cli.listing import parse_states

    assert parse_states("cg,R,stopped") == ["COMPLETING", "RUNNING", "STOPPED"]
    with pytest.raises(UsageError, match="unknown job state 'CG'"):
        parse_states("CG", "--state", ("PENDING", "RUNNING"), "only pending and running")


def test_cpus_are_per_node_and_in_all() -> None:
    from gpusched.cli.queueformat import parse_format

    job = {"cpus": 4, "nodes": 2}  # a job's cpus are per node
    assert render_format(parse_format("%C %c"), job, NOW) == "8 4"
    row = ({**job, "elapsed_s": 10.0}, None)
    assert [acctformat.FIELDS[k][1](row) for k in ("alloccpus", "cputimeraw")] == ["8", "80"]


def test_long_format_widths_and_suffix() -> None:
    fields = parse_long_format("JobID:.6,Name:4|,State")
    assert fields[:2] == [Field("A", 6, True), Field("", None, False, " ")]
    job = {"job_id": 12, "name": "training", "state": "RUNNING"}
    assert render_format(fields, job, NOW) == "    12 trai|RUNNING"


@given(first=st.integers(0, 50), count=st.integers(1, 30), step=st.integers(1, 4))
def test_array_expansion_gives_each_pending_task(first: int, count: int, step: int) -> None:
    last = first + (count - 1) * step
    tasks = f"{first}-{last}:{step}" if count > 1 else str(first)
    folded = {"job_id": 7, "array_job_id": 7, "array_task_id": None, "array_tasks": tasks,
              "display_id": f"7_[{tasks}]", "state": "PENDING"}
    running = {"job_id": 9, "array_job_id": 7, "array_task_id": 99, "display_id": "7_99"}
    out = expand_arrays([folded, running])
    assert len(out) == task_count(tasks) + 1 == count + 1
    assert [j["array_task_id"] for j in out[:-1]] == list(range(first, last + 1, step))
    assert all(j["display_id"] == f"7_{j['array_task_id']}" for j in out)


@pytest.mark.parametrize(("kind", "states", "expected"), [
    ("afterok", ["COMPLETED"], "satisfied"), ("afterok", ["FAILED"], "failed"),
    ("afterok", ["RUNNING"], "unfulfilled"), ("afterok", ["COMPLETED", "PENDING"], "unfulfilled"),
    ("afternotok", ["FAILED"], "satisfied"), ("afternotok", ["COMPLETED"], "failed"),
    ("afterany", ["CANCELLED"], "satisfied"), ("afterany", ["RUNNING"], "unfulfilled"),
    ("after", ["RUNNING"], "satisfied"), ("after", ["PENDING"], "unfulfilled"),
    ("aftercorr", ["COMPLETED", "FAILED"], "satisfied"), ("afterok", [None], "failed"),
    ("afterany", [None], "satisfied"), ("singleton", [], "unfulfilled"),
])
def test_dependency_states(kind: str, states: list[str | None], expected: str) -> None:
    targets = [None if s is None else {"state": s} for s in states]
    assert dependency_state(kind, targets) == expected


def test_dependency_items_split_clauses_and_targets() -> None:
    assert dependency_items("afterok:12:13_2,afterany:14+5?singleton") == [
        ("afterok:12:13_2", "afterok", ["12", "13_2"]), ("afterany:14+5", "afterany", ["14+5"]),
        ("singleton", "singleton", [])]


def _node(name: str, state: str) -> NodeSummary:
    return NodeSummary(name, state, idle=4, types={"a100": 4})


def test_sinfo_rows_filters_and_format() -> None:
    nodes = {n.name: n for n in (_node("n1", "idle"), _node("n2", "mixed"), _node("n3", "down"))}
    part = {"name": "gpu", "state": "UP", "default": True, "nodes": ["n1", "n2", "n3"],
            "max_time": 3600, "default_time": None}
    rows = infoformat.info_rows([part], nodes, False, "c")
    pieces = infoformat.parse_format("%P %t %D %F %G %N")
    assert [infoformat.render(pieces, r) for r in rows] == [
        "gpu* down 1 0/0/1/1 gpu:a100:4 n3", "gpu* idle 1 0/1/0/1 gpu:a100:4 n1",
        "gpu* mix 1 1/0/0/1 gpu:a100:4 n2"]
    summary = infoformat.summary_rows([part], nodes, "c")
    assert infoformat.render(infoformat.parse_format(infoformat.SUMMARY_FORMAT), summary[0]) \
        .split() == ["gpu*", "up", "1:00:00", "1/1/1/3", "n[1-3]"]
    states = infoformat.parse_node_states("mix,DRAIN")
    assert states == {"mixed", "drained"}
    kept = [n.name for n in nodes.values() if infoformat.keep_node(n, None, states, False, False)]
    assert kept == ["n2"]
    assert [n.name for n in nodes.values() if infoformat.keep_node(n, None, None, False, True)] \
        == ["n1", "n2"]
    with pytest.raises(UsageError, match="%C is not supported"):
        infoformat.parse_format("%P %C")
    nodes["n1"].cpus, nodes["n2"].cpus, nodes["n3"].cpus = 64, 64, 32
    nodes["n1"].memory_mb = nodes["n2"].memory_mb = nodes["n3"].memory_mb = 512000
    whole = infoformat.summary_rows([part], nodes, "c")[0]
    assert infoformat.render(infoformat.parse_long_format("CPUs:4,Memory:7"), whole) \
        == "32+  512000"


def test_sacct_fields_and_runs() -> None:
    record = {"job_id": 5, "array_job_id": None, "array_task_id": None, "name": "x",
              "state": "COMPLETED", "exit_code": 0, "signal": None, "elapsed_s": 3725.0,
              "submit_time": "2026-11-28T10:00:00+00:00", "start_time": "2026-11-28T10:00:30+00:00",
              "end_time": "2026-11-28T11:02:35+00:00", "cpus": 4, "time_limit": 7200,
              "alloc": [{"node": "n2"}, {"node": "n1"}], "max_rss_bytes": 3 << 20,
              "runs": [{"start": "2026-11-28T09:00:00+00:00", "end": "2026-11-28T09:10:00+00:00",
                        "node_names": ["n3"], "gpus": 2},
                       {"start": "2026-11-28T10:00:30+00:00", "end": None,
                        "node_names": ["n1", "n2"], "gpus": 2}], "steps": []}
    fields = acctformat.parse_format("JobID,Elapsed,ElapsedRaw,NodeList,CPUTimeRAW,"
                                     "TimelimitRaw,MaxRSS,Planned")
    rows = acctformat.rows_of([record], False, True, {})
    headers, cells = acctformat.render_rows(fields, rows)
    assert headers[:3] == ["JobID", "Elapsed", "ElapsedRaw"]
    assert cells[0][:4] == ["5", "10:00", "600", "n3"]
    assert cells[1] == ["5", "1:02:05", "3725", "n[1-2]", str(3725 * 4), "120", "3M", "0:30"]
    assert acctformat.max_rss({"max_rss_bytes": 3 << 20, "max_rss_raw": True}) == "3072K"
    with pytest.raises(UsageError, match="NAME%WIDTH"):
        acctformat.parse_format("JobID%x")
    assert acctformat.in_range("2-4", "--nnodes") == (2, 4)
    with pytest.raises(UsageError, match="--ncpus"):
        acctformat.in_range("4-2", "--ncpus")


def test_sacct_units_and_truncate() -> None:
    assert acctformat.max_rss({"max_rss_bytes": 3 << 30, "max_rss_unit": "M"}) == "3072.00M"
    assert acctformat.max_rss({"max_rss_bytes": 3 << 29, "max_rss_unit": "G"}) == "1.50G"
    assert acctformat.max_rss({"max_rss_bytes": None, "max_rss_unit": "G"}) == ""
    record = {"start_time": "2026-11-28T08:00:00+00:00", "end_time": "2026-11-28T12:00:00+00:00",
              "elapsed_s": 14400.0}
    window = (datetime(2026, 11, 28, 9, tzinfo=timezone.utc),
              datetime(2026, 11, 28, 10, 30, tzinfo=timezone.utc))
    cut = acctformat.truncate(record, *window)
    assert (cut["start_time"], cut["end_time"], cut["elapsed_s"]) == (
        "2026-11-28T09:00:00+00:00", "2026-11-28T10:30:00+00:00", 5400.0)
    assert acctformat.truncate(record, None, None) == record
    assert acctformat.truncate({"start_time": None}, *window) == {"start_time": None}


def test_sinfo_exact_splits_nodes_by_their_gpus() -> None:
    from gpusched.cli.ginfo import partition_rows

    nodes = {"n1": _node("n1", "idle"), "n2": _node("n2", "idle"),
             "n3": NodeSummary("n3", "idle", idle=8, types={"h100": 8})}
    part = {"name": "gpu", "state": "UP", "default": False, "nodes": ["n1", "n2", "n3"],
            "max_time": None, "default_time": None}
    assert [r["nodelist"] for r in partition_rows([part], nodes)] == ["n[1-3]"]
    assert [r["nodelist"] for r in partition_rows([part], nodes, exact=True)] == ["n[1-2]", "n3"]
    pieces = infoformat.parse_format("%N %G")
    assert [infoformat.render(pieces, r) for r in infoformat.info_rows(
        [part], nodes, False, "", exact=True)] == ["n[1-2] gpu:a100:4", "n3 gpu:h100:8"]


def test_time_format_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpusched.cli.queueformat import parse_format

    job = {"submit_time": "2026-11-28T10:05:00+00:00"}
    monkeypatch.setenv("TZ", "UTC")
    import time

    time.tzset()
    monkeypatch.delenv("GPUSCHED_TIME_FORMAT", raising=False)
    monkeypatch.setenv("SLURM_TIME_FORMAT", "%d/%m %H:%M")
    assert render_format(parse_format("%V"), job, NOW) == "28/11 10:05"
    monkeypatch.setenv("GPUSCHED_TIME_FORMAT", "standard")  # ours wins: the default
    assert render_format(parse_format("%V"), job, NOW) == "2026-11-28T10:05:00"
    monkeypatch.setenv("GPUSCHED_TIME_FORMAT", "%H:%M")
    assert acctformat.FIELDS["submit"][1]((job, None)) == "10:05"
    monkeypatch.delenv("TZ")
    time.tzset()


def test_uids_are_read_as_user_names() -> None:
    import pwd

    from gpusched.cli.slurmflags import user_names

    root = pwd.getpwuid(0).pw_name
    assert user_names("0,alice2, 4294967290") == f"{root},alice2,4294967290"
    assert user_names("99999999999") == "99999999999"  # past a uid: left as written
