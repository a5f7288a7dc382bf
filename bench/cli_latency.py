"""Wall time of the user commands on a local cluster with a long queue, and where each
command's time goes; prints ``name: value`` lines.

    .venv/bin/python bench/cli_latency.py [--queue 1000] [--trials 11] [--bin DIR]

A controller and a 4-GPU agent on a scratch PostgreSQL, with the default
``schedule_interval`` (5 s). One job holds all 4 GPUs, and ``queue`` one-GPU jobs wait
behind it (reason Resources), so every scheduling pass plans the whole queue. The queue is
filled by submitting one job through the API and copying its row in SQL (submitting
10,000 jobs one by one takes minutes and measures nothing here).

Whole commands (medians, output to a pipe):

- ``gsubmit_wrap_ms``: ``gsubmit --wrap true`` (a job without GPUs: it runs);
- ``gqueue_ms``: a plain ``gqueue`` listing the whole queue;
- ``gqueue_json_ms``: ``gqueue --json``;
- ``gcancel_ms``: ``gcancel ID`` of one queued job;
- ``python_bare_ms`` / ``python_site_ms``: ``python -I -S -c pass`` and ``python -c pass``
  of the same interpreter, the floor under any command (the second pays for site and the
  ``.pth`` files of the environment: an editable install's import finder shows there);
- ``pass_ms``: the controller's last scheduling pass over that queue.

Where each command's time goes (``CMD`` one of gsubmit, gqueue, gqueue_json; medians):

- ``CMD_import_ms``: all its imports, by ``python -X importtime`` (which adds a little of
  its own), split into ``CMD_import_site_ms`` (site and the ``.pth`` files),
  ``CMD_import_framework_ms`` (typer, click, rich, pydantic), ``CMD_import_gpusched_ms``
  (the package's own modules) and ``CMD_import_stdlib_ms`` (the rest);
- ``CMD_parse_ms``: parsing the arguments as the entry point does (the quick parser of
  gpusched.cli.quickparse), in-process, after the imports (a bare ``gqueue`` parses
  nothing); ``CMD_typer_parse_ms``: building the typer command and parsing with it, what
  a command line the quick parser declines costs on top of importing typer;
- ``gqueue_request_ms`` / ``gqueue_json_request_ms``: the API call alone (connect, send,
  read the whole answer and decode it), in-process: mostly what the controller costs.

Each command starts 0.3 s after the last one ended, as typed commands would (``--gap``
sets it; the bare interpreter is timed with the same gap, so that ``python_bare_ms`` is
the floor under the same conditions: on a virtual machine that hands idle memory back to
its host, a process started after a pause pays for faulting its pages in again). The package
is byte-compiled first, as an installed one is (an editable checkout run with
PYTHONDONTWRITEBYTECODE would otherwise compile every module on every command).
``--bin DIR`` runs the commands of another environment (say, a virtual environment with
the wheel installed) against the same cluster.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from starts import start_times  # noqa: E402

from tests.e2e.cluster import BIN, Cluster, scratch_cluster  # noqa: E402

GAP = 0.3
RUNS = 5  # of each in-process breakdown
FRAMEWORK = ("typer", "click", "rich", "pydantic", "pydantic_core", "annotated_types",
             "shellingham", "typing_extensions")
# The commands broken down: their arguments, and the parse each one's entry point does.
COMMANDS = {
    "gsubmit": ("gsubmit", ["--wrap", "true"]),
    "gqueue": ("gqueue", []),
    "gqueue_json": ("gqueue", ["--json"]),
}
PARSE = """
import sys, time
from gpusched.cli import optiontables
from gpusched.cli.quickparse import quick_parse
began = time.perf_counter()
quick_parse(optiontables.{table}, {argv!r})
print((time.perf_counter() - began) * 1000)
"""
TYPER_PARSE = """
import sys, time
from gpusched.cli import {module}
from gpusched.cli.common import use_light_coercion
from typer.main import get_command
began = time.perf_counter()
command = get_command({module}.app)
use_light_coercion(command)
command.make_context({prog!r}, {argv!r})
print((time.perf_counter() - began) * 1000)
"""
REQUEST = """
import sys, time
from gpusched.client import ApiClient
from gpusched.cli.listing import TABLE_FIELDS, jobs_path
path = jobs_path(user=None, states=None, show_all=False, fields={fields})
with ApiClient() as client:
    began = time.perf_counter()
    client.request("GET", path)
print((time.perf_counter() - began) * 1000)
"""


def timed(cluster: Cluster, *argv: str, bin_dir: Path = BIN) -> tuple[float, str]:
    time.sleep(GAP)
    began = time.perf_counter()
    result = subprocess.run([str(bin_dir / argv[0]), *argv[1:]], capture_output=True,
                            text=True, env=cluster.env, cwd=cluster.work, timeout=120)
    took = (time.perf_counter() - began) * 1000
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {result.stderr}")
    return took, result.stdout


def python_ms(python: str, *flags: str, trials: int) -> float:
    """Median wall time of ``python FLAGS -c pass``."""
    return statistics.median(start_times([python, *flags, "-c", "pass"], trials, GAP))


def import_split(stderr: str) -> dict[str, float]:
    """``-X importtime`` output summed by kind (self times, in ms)."""
    totals = dict.fromkeys(("site", "framework", "gpusched", "stdlib"), 0.0)
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, _, name = line[len("import time:"):].split("|")
        top = name.strip().split(".")[0]
        kind = ("framework" if top in FRAMEWORK else "gpusched" if top == "gpusched"
                else "stdlib")
        totals[kind] += int(self_us) / 1000
    return totals


def site_tree(stderr: str) -> float:
    """The cumulative time of the ``site`` import (the .pth files' finders included)."""
    for line in stderr.splitlines():
        if line.startswith("import time:") and line.rsplit("|", 1)[-1].strip() == "site":
            return int(line.split("|")[1]) / 1000
    return 0.0


def breakdown(cluster: Cluster, name: str, bin_dir: Path) -> dict[str, float]:
    """Import split, parse and (for gqueue) request time of one command, medians."""
    prog, argv = COMMANDS[name]
    python = str(bin_dir / "python")
    script = str(bin_dir / prog)
    samples: dict[str, list[float]] = {}
    for _ in range(RUNS):
        time.sleep(GAP)
        result = subprocess.run([python, "-X", "importtime", script, *argv],
                                capture_output=True, text=True, env=cluster.env,
                                cwd=cluster.work, timeout=120)
        if result.returncode != 0:
            raise SystemExit(f"{prog} {' '.join(argv)} failed: {result.stderr[-2000:]}")
        split = import_split(result.stderr)
        # The site tree's modules were counted as stdlib: count them once, as site.
        split["site"] = site_tree(result.stderr)
        split["stdlib"] = max(0.0, split["stdlib"] - split["site"])
        split["total"] = sum(split[k] for k in ("site", "framework", "gpusched", "stdlib"))
        for key, value in split.items():
            samples.setdefault(f"import_{key}", []).append(value)
        if argv:  # a bare gqueue parses nothing
            code = PARSE.format(table=prog.upper(), argv=argv)
            samples.setdefault("parse", []).append(child_ms(python, code, cluster))
            code = TYPER_PARSE.format(module=prog, prog=prog, argv=argv)
            samples.setdefault("typer_parse", []).append(child_ms(python, code, cluster))
        if prog == "gqueue":
            fields = "None" if "--json" in argv else "TABLE_FIELDS"
            samples.setdefault("request", []).append(
                child_ms(python, REQUEST.format(fields=fields), cluster))
    return {key: statistics.median(values) for key, values in samples.items()}


def child_ms(python: str, code: str, cluster: Cluster) -> float:
    """The number a measuring child process prints."""
    result = subprocess.run([python, "-c", code], capture_output=True, text=True,
                            env=cluster.env, cwd=cluster.work, timeout=120)
    if result.returncode != 0:
        raise SystemExit(f"measuring failed: {result.stderr[-2000:]}")
    return float(result.stdout.split()[-1])


def fill(cluster: Cluster, url: str, count: int) -> None:
    """One job holding every GPU, then ``count`` one-GPU jobs queued behind it."""
    cluster.submit("--gpus", "4", "--wrap", "sleep 100000")
    first = cluster.submit("--gpus", "1", "--job-name", "q", "--wrap", "true")
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True) as db:
        columns = ", ".join(name for (name,) in db.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'jobs' AND column_name NOT IN ('id', 'submit_key')"))
        db.execute(f"INSERT INTO jobs ({columns}) SELECT {columns} FROM jobs, "
                   f"generate_series(2, %s) WHERE id = %s", (count, first))
    cluster.api("POST", "/v1/jobs", {"script": "#!/bin/sh\ntrue\n", "name": "q", "gpus": 1,
                                     "work_dir": str(cluster.work), "environment": {}})


def main() -> None:
    global GAP
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queue", type=int, default=1_000)
    parser.add_argument("--trials", type=int, default=11)
    parser.add_argument("--bin", type=Path, default=BIN,
                        help="where the commands and their python are (default: this one's)")
    parser.add_argument("--gap", type=float, default=GAP,
                        help="seconds between one command's end and the next's start")
    args = parser.parse_args()
    GAP = args.gap
    bin_dir: Path = args.bin
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "gpusched")], check=True)
    python = str(bin_dir / "python")
    bare = python_ms(python, "-I", "-S", trials=args.trials)
    site = python_ms(python, trials=args.trials)
    with scratch_cluster(schedule_interval=5.0) as (cluster, url):
        fill(cluster, url, args.queue)
        time.sleep(2)  # the first passes over the new queue
        submits = [timed(cluster, "gsubmit", "--parsable", "--wrap", "true", bin_dir=bin_dir)[0]
                   for _ in range(args.trials)]
        queues = []
        for _ in range(args.trials):
            took, out = timed(cluster, "gqueue", bin_dir=bin_dir)
            queues.append(took)
        lines = out.count("\n") - 1
        dumps = []
        for _ in range(args.trials):
            took, out = timed(cluster, "gqueue", "--json", bin_dir=bin_dir)
            dumps.append(took)
        json_jobs = len(json.loads(out)["jobs"])
        parts = {name: breakdown(cluster, name, bin_dir) for name in COMMANDS}
        waiting = cluster.api("GET", "/v1/jobs?state=PENDING&fields=job_id")["rows"]
        cancels = [timed(cluster, "gcancel", str(job_id), bin_dir=bin_dir)[0]
                   for (job_id,) in waiting[:args.trials]]
        stats = cluster.api("GET", "/v1/ping")["scheduler"]
    print(f"queue_jobs: {args.queue + 1}")
    print(f"gqueue_lines: {lines}")
    print(f"gqueue_json_jobs: {json_jobs}")
    print(f"python_bare_ms: {bare:.1f}")
    print(f"python_site_ms: {site:.1f}")
    print(f"gsubmit_wrap_ms: {statistics.median(submits):.0f}")
    print(f"gqueue_ms: {statistics.median(queues):.0f}")
    print(f"gqueue_json_ms: {statistics.median(dumps):.0f}")
    print(f"gcancel_ms: {statistics.median(cancels):.0f}")
    for name, figures in parts.items():
        for key, value in figures.items():
            print(f"{name}_{key}_ms: {value:.1f}")
    print(f"pass_ms: {stats['last_seconds'] * 1000:.0f}")
    print(f"pass_pending: {stats['last_pending']}")


if __name__ == "__main__":
    main()
