"""Trace readers against samples of the real traces in ``tests/data`` (see its README).

The expected values below were worked out by hand from the sample lines; each comment
quotes or points at the line it comes from.
"""

from __future__ import annotations

import gzip
import shutil
from collections import Counter
from pathlib import Path

import pytest

from gpusched.errors import UsageError
from gpusched.sim.traces import (
    Trace,
    TraceError,
    TraceJob,
    guess_format,
    read_alibaba,
    read_philly,
    read_swf,
    read_trace,
)

DATA = Path(__file__).resolve().parents[1] / "data"
HPC2N = DATA / "HPC2N-2002-2.2-cln.sample.swf"
SDSC = DATA / "SDSC-SP2-1998-4.2-cln.sample.swf"
PHILLY = DATA / "philly_pollux.sample.csv"
PODS = DATA / "alibaba_openb_pod_list_default.sample.csv"
NODES = DATA / "alibaba_openb_node_list_gpu_node.sample.csv"

CANCELLED = "no run time (cancelled before it started)"
NO_PROCS = "no processor count"
CPU_ONLY = "no GPU (CPU-only pod)"
NO_TIMES = "no start or end time"


def _job(trace: Trace, job_id: int) -> TraceJob:
    found = [j for j in trace.jobs if j.job_id == job_id]
    assert len(found) == 1, f"job {job_id}: {len(found)} matches"
    return found[0]


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines(keepends=True)


def _same(a: Trace, b: Trace) -> None:
    """Everything but the source name."""
    assert a.jobs == b.jobs
    assert a.skipped == b.skipped
    assert a.header == b.header
    assert a.nodes == b.nodes
    assert a.estimated == b.estimated


# -- the samples themselves ------------------------------------------------------------

def test_samples_are_small_and_named_for_their_format() -> None:
    for path, fmt in ((HPC2N, "swf"), (SDSC, "swf"), (PHILLY, "philly"), (PODS, "alibaba")):
        assert path.stat().st_size < 20_000
        assert guess_format(path) == fmt
    assert guess_format(Path("x/trace.swf.gz")) == "swf"
    assert guess_format(Path("x/Philly_jobs.csv.gz")) == "philly"
    assert guess_format(Path("x/openb_pod_list.csv")) == "alibaba"


# -- SWF: HPC2N --------------------------------------------------------------------------

def test_hpc2n_counts_and_header() -> None:
    trace = read_trace(HPC2N)
    # 31 header lines and 40 job lines (jobs 11..80 with gaps), each with a run time
    # (field 4 >= 0), a requested processor count (field 8) and a requested time (field 9).
    job_lines = [ln for ln in _lines(HPC2N) if ln.strip() and not ln.startswith(";")]
    assert len(job_lines) == 40
    assert len(trace.jobs) == 40
    assert trace.skipped == Counter()
    assert trace.estimated == 0
    assert trace.nodes == []
    assert trace.source == str(HPC2N)
    assert trace.header["MaxProcs"] == "240"
    assert trace.header["MaxNodes"] == "240"
    assert trace.header["MaxRecords"] == "202871"
    assert trace.header["UnixStartTime"] == "1027839845"
    assert trace.header["TimeZoneString"] == "Europe/Stockholm"
    assert trace.header["Acknowledge"] == "Ake Sandgren"
    # "; EndTime:   Mon Jan 16 20:31:24 CET 2006": only the first colon splits.
    assert trace.header["EndTime"] == "Mon Jan 16 20:31:24 CET 2006"
    # Two "; Note:" lines; the first one is kept.
    assert trace.header["Note"] == "uses MAUI scheduler"
    # ";       The filters used to produce it were" has no key.
    assert not any("filters" in k for k in trace.header)


def test_hpc2n_job_fields() -> None:
    trace = read_swf(HPC2N)
    # "   11   342072     32  43306   32  43307    -1   32  43200    -1  1   4   1 ..."
    # ran 43306 s, longer than the 43200 s it asked for.
    assert _job(trace, 11) == TraceJob(11, 342072.0, 43306.0, 43200, 32, user="u4", group="g1")
    # "   12   342343      5    553   40 552.21    -1   40  43200    -1  1   4   1 ..."
    assert _job(trace, 12) == TraceJob(12, 342343.0, 553.0, 43200, 40, user="u4", group="g1")
    # "   64   384415  54517  31030   30  31030    -1   30  37980    -1  1   1   1 ..."
    assert _job(trace, 64) == TraceJob(64, 384415.0, 31030.0, 37980, 30, user="u1", group="g1")
    # "   80   386303  89231   1715   20   1715    -1   20   2280    -1  1   1   1 ..."
    last = trace.jobs[-1]
    assert (last.job_id, last.submit, last.run_time, last.time_limit, last.gpus) == (
        80, 386303.0, 1715.0, 2280, 20)
    assert trace.jobs[0].job_id == 11
    assert (last.cpus, last.mem_mb) == (0, 0)


def test_swf_jobs_sorted_by_submit_then_id(tmp_path: Path) -> None:
    lines = _lines(HPC2N)
    header = [ln for ln in lines if ln.startswith(";")]
    jobs = [ln for ln in lines if not ln.startswith(";")]
    shuffled = tmp_path / "shuffled.swf"
    shuffled.write_text("".join(header + jobs[::-1]), encoding="utf-8")
    trace = read_swf(shuffled)
    _same(trace, read_swf(HPC2N))
    submits = [j.submit for j in trace.jobs]
    assert submits == sorted(submits)
    # Jobs 75 and 76 share submit 386302, jobs 78, 79 and 80 share 386303.
    assert [j.job_id for j in trace.jobs][-6:] == [75, 76, 77, 78, 79, 80]


# -- SWF: SDSC-SP2 (cancelled jobs, no requested time) -----------------------------------

def test_sdsc_counts_and_header() -> None:
    trace = read_trace(SDSC)
    # 42 job lines (jobs 11-40 and 51222-51233). Field 4 is -1 for jobs 19, 51226 and
    # 51227: skipped. Job 51228 has field 9 = -1 and a run time: estimated.
    job_lines = [ln for ln in _lines(SDSC) if ln.strip() and not ln.startswith(";")]
    assert len(job_lines) == 42
    assert trace.skipped == Counter({CANCELLED: 3})
    assert len(trace.jobs) == 39
    assert {19, 51226, 51227}.isdisjoint(j.job_id for j in trace.jobs)
    assert trace.estimated == 1
    assert trace.header["MaxProcs"] == "128"
    assert trace.header["MaxNodes"] == "128"
    assert trace.header["MaxRecords"] == "59715"
    assert trace.header["Acknowledge"] == "Victor Hazlewood"
    assert trace.header["Copyright"] == "JOBLOG Repository Data Usage Agreement:"
    submits = [j.submit for j in trace.jobs]
    assert submits == sorted(submits)


def test_sdsc_job_without_requested_time_gets_run_time_as_limit() -> None:
    trace = read_swf(SDSC)
    # "51228 32425497  44942     27    1     -1    -1    1     -1    -1  5 178   1 ..."
    assert _job(trace, 51228) == TraceJob(51228, 32425497.0, 27.0, 27, 1,
                                          user="u178", group="g1")


def test_sdsc_job_fields() -> None:
    trace = read_swf(SDSC)
    # "   14   571164  21568  64832   32  44134    -1   32  64800    -1  5   6   6 ..."
    assert _job(trace, 14) == TraceJob(14, 571164.0, 64832.0, 64800, 32, user="u6", group="g6")
    # "   24   584165  16591   3634   24   3504    -1   24   3600    -1  5 133  50 ..."
    # run time over the requested time is kept as it is.
    job = _job(trace, 24)
    assert (job.run_time, job.time_limit, job.gpus, job.user, job.group) == (
        3634.0, 3600, 24, "u133", "g50")
    # "51224 32420147  48735    676  128 331.19    -1  128   7200    -1  1 148  73 ..."
    assert _job(trace, 51224) == TraceJob(51224, 32420147.0, 676.0, 7200, 128,
                                          user="u148", group="g73")
    # "51233 32441744     19   3632   16   3572    -1   16   3600    -1  5 149  45 ..."
    assert trace.jobs[-1] == TraceJob(51233, 32441744.0, 3632.0, 3600, 16,
                                      user="u149", group="g45")


def test_swf_processor_count_falls_back_to_allocated(tmp_path: Path) -> None:
    # Real lines: a CTC job (field 8 = -1, 4 allocated), the KTH job with neither count,
    # a Lublin-style line with no requested time and no requested processors, a KTH job
    # that asked for 7 and got 8, and a SDSC-BLUE job with field 5 = -1 that asked for 8.
    path = tmp_path / "mixed.swf"
    path.write_text(
        "; MaxProcs: 338\n"
        "15395 17172337      0    589    8     -1    -1    7   3000    -1  1  17 122  -1 -1 -1 -1 -1\n"
        "   54   449417      0     63   -1     -1    -1    8   7200    -1  5  96  -1  -1  0 -1 -1 -1\n"
        "  742   602518      2     38    4     -1    -1   -1     -1    -1  0  86  -1 225  1 -1 -1 -1\n"
        "27313 27845375    480      1   -1     -1    -1   -1    600    -1  1  48 225  -1 -1 -1 -1 -1\n"
        "    1        0      0   4183   16     -1    -1   -1     -1    -1 -1  -1  -1  -1 -1 -1 -1 -1\n",
        encoding="utf-8")
    trace = read_swf(path)
    assert trace.skipped == Counter({NO_PROCS: 1})
    assert trace.estimated == 2
    assert trace.jobs == [
        TraceJob(1, 0.0, 4183.0, 4183, 16, user="u-unknown", group="g-unknown"),
        TraceJob(54, 449417.0, 63.0, 7200, 8, user="u96", group="g-unknown"),
        TraceJob(742, 602518.0, 38.0, 38, 4, user="u86", group="g-unknown"),
        TraceJob(15395, 17172337.0, 589.0, 3000, 7, user="u17", group="g122"),
    ]


def test_swf_zero_run_time_without_limit_gets_one_second(tmp_path: Path) -> None:
    path = tmp_path / "zero.swf"
    path.write_text("5 10 0 0 2 -1 -1 2 -1 -1 1 3 4 -1 -1 -1 -1 -1\n", encoding="utf-8")
    trace = read_swf(path)
    assert trace.jobs == [TraceJob(5, 10.0, 0.0, 1, 2, user="u3", group="g4")]
    assert trace.estimated == 1


# -- Philly --------------------------------------------------------------------------------

def test_philly_counts_and_relative_sorted_submits() -> None:
    trace = read_trace(PHILLY)
    # 32 rows, each with num_gpus >= 1: 30 one-GPU rows, an 8-GPU row and a 4-GPU row.
    assert len(trace.jobs) == 32
    assert trace.skipped == Counter()
    assert trace.estimated == 32  # Philly has no time limits
    assert Counter(j.gpus for j in trace.jobs) == Counter({1: 30, 8: 1, 4: 1})
    # 11cb48, 6214e9, 6c71a0, ee9e8c, 103959
    assert trace.header["VirtualClusters"] == "5"
    submits = [j.submit for j in trace.jobs]
    assert submits == sorted(submits)
    assert submits[0] == 0.0
    # The earliest row is data row 3: "2017-09-29 07:58:32,860662.0,1,860662.0,6c71a0"
    assert trace.jobs[0] == TraceJob(3, 0.0, 860662.0, 860662, 1, user="6c71a0",
                                     group="6c71a0")
    # Next come the two rows appended from further down the source, in time order:
    # data row 32: "2017-10-06 23:27:26,197281.0,4,789124.0,103959", 7 days 15:28:54 later;
    # data row 31: "2017-10-07 01:11:39,193256.0,8,1546048.0,ee9e8c", 7 days 17:13:07 later.
    assert trace.jobs[1] == TraceJob(32, 660534.0, 197281.0, 197281, 4, user="103959",
                                     group="103959")
    assert trace.jobs[2] == TraceJob(31, 666787.0, 193256.0, 193256, 8, user="ee9e8c",
                                     group="ee9e8c")
    # data row 1 is the latest: "2017-10-09 07:01:55,66.0,1,66.0,11cb48",
    # 9 days 23:03:23 after the earliest.
    assert trace.jobs[-1] == TraceJob(1, 860603.0, 66.0, 66, 1, user="11cb48",
                                      group="11cb48")
    # data row 12: "2017-10-09 04:44:14,7944.0,1,7944.0,6214e9", 9 days 20:45:42 later.
    job = _job(trace, 12)
    assert (job.submit, job.run_time, job.time_limit) == (852342.0, 7944.0, 7944)


def test_philly_rows_in_sample_are_unsorted() -> None:
    # The reader's sorting is only exercised if the file itself is out of order.
    stamps = [ln.split(",")[0] for ln in _lines(PHILLY)[1:]]
    assert stamps != sorted(stamps)


def test_philly_zero_gpu_rows_skipped_and_fractional_durations_rounded_up(
        tmp_path: Path) -> None:
    path = tmp_path / "philly_small.csv"
    path.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                    "2017-10-09 07:01:55,66.5,1,66.5,11cb48\n"
                    "2017-10-09 07:00:00,10.0,0,0.0,11cb48\n"
                    "2017-10-09 07:01:50,3.0,2,6.0,\n", encoding="utf-8")
    trace = read_philly(path)
    assert trace.skipped == Counter({"no GPUs": 1})
    assert trace.jobs == [TraceJob(3, 0.0, 3.0, 3, 2, user="vc", group="vc"),
                          TraceJob(1, 5.0, 66.5, 67, 1, user="11cb48", group="11cb48")]


# -- Alibaba -------------------------------------------------------------------------------

def test_alibaba_counts() -> None:
    trace = read_trace(PODS)
    # 42 pods. num_gpu = 0: pod-0005, pod-0016, pod-0060. gpu_milli < 1000: pod-0001,
    # -0003, -0011, -0018..-0022, -0025, -0027, -0029, -0032, -0038, -0039 (14).
    # pod-0061 is Pending with no scheduled_time. The other 24 are whole-GPU pods; the
    # 14 fractional ones ask for their share of one GPU.
    assert trace.skipped == Counter({CPU_ONLY: 3, NO_TIMES: 1})
    assert len(trace.jobs) == 38
    assert len(trace.jobs) + sum(trace.skipped.values()) == len(_lines(PODS)) - 1
    assert trace.estimated == 38
    assert Counter(j.gpus for j in trace.jobs) == Counter({1: 37, 8: 1})
    assert sum(1 for j in trace.jobs if j.gpu_milli) == 14
    assert all(0 < j.gpu_milli < 1000 and j.gpus == 1 for j in trace.jobs if j.gpu_milli)
    submits = [j.submit for j in trace.jobs]
    assert submits == sorted(submits)


def test_alibaba_job_fields() -> None:
    trace = read_alibaba(PODS)
    # data row 1: "openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0"
    assert trace.jobs[0] == TraceJob(1, 0.0, 12537496.0, 12537496, 1, user="pod",
                                     group="LS", cpus=12, mem_mb=16384)
    # data row 18: "openb-pod-0017,88000,327680,8,1000,,Burstable,Succeeded,
    #               9437497,10769854,9437497": runs 10769854 - 9437497 s.
    assert _job(trace, 18) == TraceJob(18, 9437497.0, 1332357.0, 1332357, 8, user="pod",
                                       group="Burstable", cpus=88, mem_mb=327680)
    # data row 11: "openb-pod-0010,16000,49152,1,1000,,LS,Running,5182092,10004145,5182096":
    # submitted at creation, runs from scheduled_time to deletion_time.
    job = _job(trace, 11)
    assert (job.submit, job.run_time, job.cpus) == (5182092.0, 10004145.0 - 5182096.0, 16)
    # data row 34: "openb-pod-0033,3152,5600,1,1000,,BE,Failed,9965463,9965645,9965463":
    # 3152 milli-CPUs round up to 4 CPUs.
    assert _job(trace, 34) == TraceJob(34, 9965463.0, 182.0, 182, 1, user="pod",
                                       group="BE", cpus=4, mem_mb=5600)
    skipped_rows = {6, 17, 41, 42}
    assert skipped_rows.isdisjoint(j.job_id for j in trace.jobs)
    # data row 2: "openb-pod-0001,...,1,<1000,...": a fraction of one GPU.
    assert _job(trace, 2).gpu_milli > 0


def test_alibaba_node_list_found_beside_pod_list() -> None:
    trace = read_alibaba(PODS)
    # 16 nodes: P100 x1 (2 GPUs), G3 x1 (8), V100M32 x2 (8), V100M16 x1 (4), G2 x9 (8),
    # T4 x1 (4), T4 x1 (2).
    assert len(trace.nodes) == 16
    assert sum(n[1] for n in trace.nodes) == 2 + 8 + 16 + 4 + 72 + 4 + 2
    assert trace.nodes[0] == ("openb-node-0021", 2, "p100", 64, 262144)
    assert trace.nodes[1] == ("openb-node-0022", 8, "g3", 128, 786432)
    assert trace.nodes[-1] == ("openb-node-0036", 2, "t4", 104, 524288)
    assert Counter(n[2] for n in trace.nodes) == Counter(
        {"g2": 9, "v100m32": 2, "t4": 2, "p100": 1, "g3": 1, "v100m16": 1})
    assert read_trace(PODS, nodes=NODES).nodes == trace.nodes


def test_alibaba_without_node_list(tmp_path: Path) -> None:
    alone = tmp_path / PODS.name
    shutil.copy(PODS, alone)
    trace = read_alibaba(alone)
    assert trace.nodes == []
    assert trace.jobs == read_alibaba(PODS).jobs


def test_alibaba_given_node_list_skips_nodes_without_gpus(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                     "cpu-node,32000,65536,0,\n"
                     "gpu-node,96000,393216,8,\n", encoding="utf-8")
    trace = read_alibaba(PODS, nodes)
    assert trace.nodes == [("gpu-node", 8, "gpu", 96, 393216)]


# -- gzip ------------------------------------------------------------------------------------

@pytest.mark.parametrize("sample", [HPC2N, SDSC, PHILLY, PODS], ids=lambda p: p.name)
def test_gzip_reads_the_same(tmp_path: Path, sample: Path) -> None:
    gz = tmp_path / (sample.name + ".gz")
    gz.write_bytes(gzip.compress(sample.read_bytes()))
    if sample == PODS:
        (tmp_path / (NODES.name + ".gz")).write_bytes(gzip.compress(NODES.read_bytes()))
    assert guess_format(gz) == guess_format(sample)
    got, want = read_trace(gz), read_trace(sample)
    assert got.source == str(gz)
    assert got.jobs  # not trivially equal
    _same(got, want)


def test_gzip_detected_by_content_not_name(tmp_path: Path) -> None:
    disguised = tmp_path / "plain-looking.swf"
    disguised.write_bytes(gzip.compress(SDSC.read_bytes()))
    _same(read_swf(disguised), read_swf(SDSC))


# -- bad input -------------------------------------------------------------------------------

def _edit(src: Path, dst: Path, number: int, old: str, new: str) -> Path:
    """``src`` with ``old`` replaced by ``new`` on line ``number`` (1-based)."""
    lines = _lines(src)
    assert old in lines[number - 1]
    lines[number - 1] = lines[number - 1].replace(old, new, 1)
    dst.write_text("".join(lines), encoding="utf-8")
    return dst


def test_swf_short_line(tmp_path: Path) -> None:
    # Line 40 is job 19: "   19   347985     51 240074    8 240074    -1    8 432000    -1 -1
    #   5   1  -1 -1  1 -1 -1"; drop its last three fields.
    path = _edit(HPC2N, tmp_path / "short.swf", 40, "  1 -1 -1\n", "\n")
    with pytest.raises(TraceError) as info:
        read_swf(path)
    assert isinstance(info.value, UsageError)
    assert f"{path}:40:" in str(info.value)
    assert "found 15" in str(info.value)


def test_swf_non_number(tmp_path: Path) -> None:
    # Line 52 is job 14: "   14   571164  21568  64832 ..."
    path = _edit(SDSC, tmp_path / "bad.swf", 52, "64832", "64832s")
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert f"{path}:52:" in str(info.value)
    assert "'64832s'" in str(info.value)


@pytest.mark.parametrize(("field", "words"), [
    ("inf", "'inf' is not a number"), ("nan", "'nan' is not a number"),
    ("1e308", "numbers too large"),  # finite alone; with 1e308 beside it, not a count
])
def test_swf_numbers_that_are_no_counts_times_or_ids(tmp_path: Path, field: str,
                                                     words: str) -> None:
    path = tmp_path / "odd.swf"
    path.write_text(f"5 10 0 {field} 2 -1 -1 2 1e308 -1 1 3 4 -1 -1 -1 -1 -1\n",
                    encoding="utf-8")
    with pytest.raises(TraceError) as info:
        read_swf(path)
    assert f"{path}:1: " in str(info.value) and words in str(info.value)


def test_swf_negative_submit(tmp_path: Path) -> None:
    path = _edit(HPC2N, tmp_path / "neg.swf", 32, "342072", "-342072")
    with pytest.raises(TraceError, match=r":32: negative submit"):
        read_swf(path)


def test_swf_header_only(tmp_path: Path) -> None:
    path = tmp_path / "empty.swf"
    path.write_text("".join(ln for ln in _lines(HPC2N) if ln.startswith(";")),
                    encoding="utf-8")
    with pytest.raises(TraceError, match="no SWF job lines"):
        read_swf(path)


@pytest.mark.parametrize(("sample", "column"), [
    (PHILLY, "duration"), (PHILLY, "cluster"), (PODS, "gpu_milli"), (PODS, "scheduled_time"),
], ids=lambda v: v.name if isinstance(v, Path) else v)
def test_csv_missing_column(tmp_path: Path, sample: Path, column: str) -> None:
    path = _edit(sample, tmp_path / sample.name, 1, column, "renamed")
    with pytest.raises(TraceError) as info:
        read_trace(path, nodes=NODES if sample == PODS else None)
    assert str(path) in str(info.value)
    assert f"missing column(s) {column}" in str(info.value)


def test_alibaba_node_list_missing_column(tmp_path: Path) -> None:
    nodes = _edit(NODES, tmp_path / NODES.name, 1, ",model", ",kind")
    with pytest.raises(TraceError) as info:
        read_alibaba(PODS, nodes)
    assert f"{nodes}: missing column(s) model" in str(info.value)


def test_csv_non_number(tmp_path: Path) -> None:
    # Line 3 is data row 2: "2017-10-09 06:13:03,2951.0,1,2951.0,6214e9"
    path = _edit(PHILLY, tmp_path / PHILLY.name, 3, "2951.0,1,", "2951.0,one,")
    with pytest.raises(TraceError) as info:
        read_philly(path)
    assert f"{path}:3: num_gpus 'one' is not a number" in str(info.value)
    # Line 2 of the pod list is openb-pod-0000.
    pods = _edit(PODS, tmp_path / PODS.name, 2, ",12537496,", ",soon,")
    with pytest.raises(TraceError) as info:
        read_alibaba(pods)
    assert f"{pods}:2: deletion_time 'soon' is not a number" in str(info.value)


def test_philly_bad_timestamp(tmp_path: Path) -> None:
    path = _edit(PHILLY, tmp_path / PHILLY.name, 5, "2017-10-09 06:13:36", "09/10/2017")
    with pytest.raises(TraceError) as info:
        read_philly(path)
    assert f"{path}:5: timestamp '09/10/2017'" in str(info.value)


@pytest.mark.parametrize("name", ["missing.swf", "missing.swf.gz", "philly_missing.csv",
                                  "alibaba_openb_pod_list_missing.csv"])
def test_missing_file(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    with pytest.raises(TraceError) as info:
        read_trace(path)
    assert str(path) in str(info.value)
    assert "cannot open" in str(info.value)


def test_unknown_format() -> None:
    with pytest.raises(TraceError, match="unknown trace format 'gwf'"):
        read_trace(HPC2N, "gwf")


def test_window() -> None:
    trace = read_swf(SDSC)
    part = trace.window(skip=2, limit=3)
    assert part.jobs == trace.jobs[2:5]
    assert (part.skipped, part.header, part.estimated) == (
        trace.skipped, trace.header, trace.estimated)
    assert trace.window(skip=37).jobs == trace.jobs[37:]


# -- headers, damaged files and line numbers ------------------------------------------------

def test_swf_header_continuation_line_is_not_a_key() -> None:
    # SDSC-SP2 header lines 18-19:
    # "; Information: http://joblog.npaci.edu/"
    # ";              http://www.cs.huji.ac.il/labs/parallel/workload/"
    header = read_swf(SDSC).header
    assert header["Information"] == "http://joblog.npaci.edu/"
    assert "http" not in header


def test_truncated_gzip_raises_trace_error(tmp_path: Path) -> None:
    data = gzip.compress(HPC2N.read_bytes())
    path = tmp_path / "truncated.swf.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match=str(path)):
        read_swf(path)


def test_csv_line_number_after_blank_line(tmp_path: Path) -> None:
    lines = _lines(PHILLY)
    lines.insert(3, "\n")  # a blank line 4; data row 5 moves to line 7
    lines[6] = lines[6].replace("2766.0", "x", 1)
    path = tmp_path / PHILLY.name
    path.write_text("".join(lines), encoding="utf-8")
    with pytest.raises(TraceError, match=r":7: duration 'x'"):
        read_philly(path)


def test_a_node_list_given_as_the_trace_is_named(tmp_path: Path) -> None:
    path = tmp_path / "alibaba_openb_node_list_gpu_node.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nn1,96000,786432,8,G2\n")
    with pytest.raises(TraceError, match="node list; give the pod list"):
        read_trace(path)
