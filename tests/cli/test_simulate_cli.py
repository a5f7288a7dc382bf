"""``gpusched simulate`` as a user runs it: figures on stdout, notes on stderr, and one
clear error (exit 2) for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpusched.sim.metrics import KEYS
from tests.cli.test_cli_errors import one_error_line, run

DATA = Path(__file__).resolve().parents[1] / "data"
TRACE = str(DATA / "sim_backfill_1x4.swf")


def test_json_has_exactly_the_figures(tmp_path: Path) -> None:
    result = run(tmp_path, "gpusched", "simulate", "--trace", TRACE, "--nodes", "1",
                 "--gpus-per-node", "4", "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert list(figures) == list(KEYS)
    assert figures["jobs"] == 5 and figures["avg_wait_s"] == 11.0
    assert "5 jobs to replay" in result.stderr and "1 nodes x 4 GPUs" in result.stderr


def test_compare_gives_one_object_per_policy_and_a_plot(tmp_path: Path) -> None:
    plot = tmp_path / "waits.png"
    result = run(tmp_path, "gpusched", "simulate", "--trace", TRACE, "--nodes", "1",
                 "--gpus-per-node", "4", "--compare", "none,easy,conservative", "--json",
                 "--plot", str(plot))
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert list(figures["policies"]) == ["fcfs/none", "fcfs/easy", "fcfs/conservative"]
    waits = {name: f["avg_wait_s"] for name, f in figures["policies"].items()}
    # Waits of jobs 1-5 (tests/unit/test_simulate.py): none 0, 0, 40, 49, 44;
    # EASY 0, 0, 40, 15, 0; conservative 0, 0, 40, 7, 44.
    assert waits == {"fcfs/none": pytest.approx(133 / 5), "fcfs/easy": 11.0,
                     "fcfs/conservative": pytest.approx(91 / 5)}
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_and_cluster_from_the_swf_header(tmp_path: Path) -> None:
    result = run(tmp_path, "gpusched", "simulate", "--trace", TRACE, "--gpus-per-node", "2",
                 "--backfill", "conservative")
    assert result.returncode == 0, result.stderr
    assert "2 nodes x 2 GPUs = 4 GPUs" in result.stderr  # MaxProcs: 4
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["METRIC", "FCFS/CONSERVATIVE"]
    assert lines[1].split() == ["jobs", "5"]


@pytest.mark.parametrize("args,words", [
    (["--nodes", "0"], "invalid --nodes 0"),
    (["--limit", "0"], "invalid --limit 0"),
    (["--skip", "-1"], "invalid --skip -1"),
    (["--format", "csv"], "invalid --format 'csv'"),
    (["--backfill", "greedy"], "unknown backfill 'greedy'"),
    (["--policy", "lifo"], "unknown policy 'lifo'"),
    (["--compare", "easy,easy"], "named twice"),
    (["--compare", "easy,fast"], "'fast' is neither"),
    (["--plot", "out.jpg"], "a .png path is expected"),
    (["--plot", "nowhere/out.png"], "does not exist"),
    (["--cluster", "c.toml", "--nodes", "2"], "not both"),
    (["--skip", "5"], "no jobs to replay"),
])
def test_bad_options_exit_2_with_one_line(tmp_path: Path, args: list[str], words: str) -> None:
    (tmp_path / "c.toml").write_text('[[node]]\nnames = "n1"\ngpus = 4\n')
    result = run(tmp_path, "gpusched", "simulate", "--trace", TRACE, *args)
    assert result.returncode == 2
    assert words in one_error_line(result, "gpusched")


def test_bad_trace_and_cluster_files(tmp_path: Path) -> None:
    (tmp_path / "short.swf").write_text("1 0 -1 10 1\n")
    bad = run(tmp_path, "gpusched", "simulate", "--trace", "short.swf", "--nodes", "1")
    assert bad.returncode == 2
    assert "short.swf:1: expected 18 SWF fields, found 5" in one_error_line(bad, "gpusched")
    missing = run(tmp_path, "gpusched", "simulate", "--trace", "absent.swf", "--nodes", "1")
    assert missing.returncode == 2
    assert "absent.swf: cannot open" in one_error_line(missing, "gpusched")
    (tmp_path / "c.toml").write_text('[[node]]\nnames = "n1"\ngpus = "four"\n')
    cluster = run(tmp_path, "gpusched", "simulate", "--trace", TRACE, "--cluster", "c.toml")
    assert cluster.returncode == 2
    assert "node[0].gpus: expected a number of GPUs" in one_error_line(cluster, "gpusched")
    (tmp_path / "headless.swf").write_text("1 0 -1 10 1 -1 -1 1 10 -1 1 1 1 -1 -1 -1 -1 -1\n")
    size = run(tmp_path, "gpusched", "simulate", "--trace", "headless.swf")
    assert size.returncode == 2
    assert "give --nodes N" in one_error_line(size, "gpusched")
