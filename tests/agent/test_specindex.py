"""The agent's memory of its job directories' specs: reused only while spec.json is the
file it was read from."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gpusched.agent.jobfiles import write_json_atomic
from gpusched.agent.specindex import SpecIndex


def _spec(run: int, cpus: list[object] | None = None) -> dict[str, object]:
    return {"run": run, "cgroup": None if cpus is None else {"cpus": cpus}}


def _write(jobs: Path, job_id: int, spec: dict[str, object]) -> None:
    (jobs / str(job_id)).mkdir(exist_ok=True)
    write_json_atomic(str(jobs / str(job_id) / "spec.json"), spec, durable=False)


def test_the_run_and_cpus_follow_the_spec_on_disk(tmp_path: Path) -> None:
    index = SpecIndex(tmp_path)
    assert index.run_of(7) is None and index.cpus_of(7) == frozenset()
    _write(tmp_path, 7, _spec(2, [0, 3, True, "x"]))
    index.remember(7, _spec(2, [0, 3, True, "x"]))
    assert index.run_of(7) == 2
    assert index.cpus_of(7) == {0, 3}  # only whole CPU numbers count
    # Written anew behind its back (another agent, an earlier run's leftovers): read again.
    _write(tmp_path, 7, _spec(3, [5]))
    assert index.run_of(7) == 3 and index.cpus_of(7) == {5}
    shutil.rmtree(tmp_path / "7")
    assert index.run_of(7) is None and index.cpus_of(7) == frozenset()


def test_a_spec_never_remembered_is_read_from_disk(tmp_path: Path) -> None:
    _write(tmp_path, 9, {"env": {"GPUSCHED_RESTART_COUNT": "4"}})  # a spec without run
    index = SpecIndex(tmp_path)
    assert index.run_of(9) == 4
    (tmp_path / "9" / "spec.json").write_text("not json")
    assert index.run_of(9) is None
    (tmp_path / "9" / "spec.json").write_text(json.dumps(_spec(1)))
    assert index.run_of(9) == 1
