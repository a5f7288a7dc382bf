"""Trace readers: SWF lines and Philly and Alibaba CSV rows, right, nearly right and
wrong: each file reads as a trace of sane jobs or is refused with a TraceError of one
line; nothing raises anything else."""

from __future__ import annotations

import csv
import gzip
import io
import math
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from gpusched.sim.traces import TraceError, read_alibaba, read_philly, read_swf
from tests.fuzz.fuzzing import TEXT, fuzz, long_number, noisy_text, one_line

number = st.one_of(st.integers(-5, 10**6).map(str), st.floats().map(repr),
                   st.sampled_from(["-1", "0", "inf", "-inf", "nan", "1e400", "1_0", "\u0663",
                                    "", "x", " 7 "]), long_number())
swf_line = st.one_of(
    st.lists(number, min_size=17, max_size=19).map(" ".join),
    st.sampled_from(["; MaxProcs: 128", ";", "; Note", "", "   "]),
    noisy_text("0123456789 .-;:eE\t", 20))
csv_cell = number | st.sampled_from(["2017-10-03 12:00:00", "2017-02-30 00:00:00", "gpu",
                                     "A100", "vc1", "", "9" * 140_000]) | st.text(TEXT, max_size=8)

PHILLY = ["timestamp", "duration", "num_gpus", "cluster"]
ALIBABA = ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time",
           "deletion_time", "scheduled_time", "qos"]
NODES = ["sn", "cpu_milli", "memory_mib", "gpu", "model"]


def rows(columns: list[str]) -> st.SearchStrategy[str]:
    """A CSV file: a header of these columns (now and then one short, reordered or
    with a stray one) and rows of any length."""
    header = st.permutations(columns) | st.lists(st.sampled_from(columns + ["x", "a\nb"]),
                                                 max_size=len(columns) + 1)
    body = st.lists(st.lists(csv_cell, max_size=len(columns) + 2), max_size=6)

    def text(head: list[str], lines: list[list[str]]) -> str:
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(head)
        writer.writerows(lines)
        return out.getvalue()

    return st.builds(text, header, body) | noisy_text('",\n0123456789abc-:', 20)


def refused_or_sane(read, path: Path) -> None:  # type: ignore[no-untyped-def]
    try:
        trace = read(path)
    except TraceError as err:
        one_line(err)
        return
    for job in trace.jobs:
        assert math.isfinite(job.submit) and math.isfinite(job.run_time) and job.run_time >= 0
        assert job.time_limit >= 1 and job.gpus >= 1, job
    assert [j.submit for j in trace.jobs] == sorted(j.submit for j in trace.jobs)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    return path


@fuzz(400)
@given(st.lists(swf_line, max_size=8).map("\n".join))
def test_swf_lines(tmp_path: Path, text: str) -> None:
    refused_or_sane(read_swf, write(tmp_path, "fuzz.swf", text))


@fuzz(300)
@given(rows(PHILLY))
def test_philly_rows(tmp_path: Path, text: str) -> None:
    refused_or_sane(read_philly, write(tmp_path, "philly.csv", text))


@fuzz(300)
@given(rows(ALIBABA), rows(NODES))
def test_alibaba_rows(tmp_path: Path, pods: str, nodes: str) -> None:
    node_list = write(tmp_path, "node_list.csv", nodes)
    refused_or_sane(lambda path: read_alibaba(path, node_list),
                    write(tmp_path, "pods.csv", pods))


GOOD_SWF = "".join(f"{i} {i * 10} 0 100 4 -1 -1 4 200 -1 1 {i % 3} 1 -1 1 -1 -1 -1\n"
                   for i in range(1, 40)).encode()


@fuzz(100)
@given(st.sampled_from(["swf", "philly"]),
       st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), min_size=1, max_size=4),
       st.integers(0, 400))
def test_damaged_gzip_files(tmp_path: Path, kind: str, flips: list[tuple[int, int]],
                            cut: int) -> None:
    """A gzip'd trace with bytes changed or its end cut off: read, or refused."""
    text = GOOD_SWF if kind == "swf" else (
        "timestamp,duration,num_gpus,cluster\n" + "2017-10-03 12:00:00,60,1,vc\n" * 40).encode()
    data = bytearray(gzip.compress(text))
    for at, byte in flips:
        data[at % len(data)] = byte
    path = tmp_path / f"damaged.{kind}.gz"
    path.write_bytes(bytes(data[:len(data) - cut]))
    refused_or_sane(read_swf if kind == "swf" else read_philly, path)


pod = st.tuples(st.just("pod"), st.sampled_from(["1000", "500", "0", "1500.5"]),
                st.sampled_from(["100", "0", "1e3"]),
                st.sampled_from(["1", "2", "8", "0", "0.5", "1.0", "-1"]),
                st.sampled_from(["0", "500", "1000", "999", "0.5", "-1", "1001"]),
                *[st.sampled_from(["0", "10", "100", "", "5.5", "-3"])] * 3)


@fuzz(300)
@given(st.lists(pod, min_size=1, max_size=5))
def test_alibaba_pods_nearly_right(tmp_path: Path, pods: list[tuple[str, ...]]) -> None:
    """Pods whose every cell is a number, right or nearly: each is a job of whole GPUs
    or of thousandths of one, skipped, or refused."""
    text = ",".join(ALIBABA[:8]) + "\n" + "".join(",".join(p) + "\n" for p in pods)
    node_list = write(tmp_path, "node_list.csv", ",".join(NODES) + "\nn1,64000,512000,8,A100\n")
    try:
        trace = read_alibaba(write(tmp_path, "pods.csv", text), node_list)
    except TraceError as err:
        one_line(err)
        return
    for job in trace.jobs:
        assert job.gpus >= 1 and 0 <= job.gpu_milli < 1000, job
        assert job.gpu_milli == 0 or job.gpus == 1, job
