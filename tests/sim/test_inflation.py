"""The FGD allocation experiment (gpusched.sim.inflation) on a tiny cluster: trace files
are read as the openb ones are, fractions are placed, nothing is over-committed, and a
seed gives the same run every time."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from gpusched.core.fragmentation import POLICIES, Task, Workload
from gpusched.sim.inflation import arrivals, inflate, read_cluster, read_tasks, spread

NODES = """sn,cpu_milli,memory_mib,gpu,model
n0,32000,131072,2,T4
n1,16000,65536,2,P100
n2,64000,262144,4,V100M16
n3,96000,393216,8,G2
"""

PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p0,4000,8192,1,500,,LS,Running,0,10,0
p1,2000,4096,1,250,,LS,Running,0,10,0
p2,6000,16384,1,1000,,LS,Running,0,10,0
p3,12000,32768,2,1000,,BE,Running,0,10,0
p4,1000,2048,0,0,,BE,Running,0,10,0
p5,3000,6144,1,700,,LS,Running,0,10,0
p6,8000,24576,1,300,T4,LS,Running,0,10,0
"""


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv.gz"
    nodes.write_bytes(gzip.compress(NODES.encode()))
    pods = tmp_path / "pods.csv"
    pods.write_text(PODS)
    return nodes, pods


def test_reads_the_openb_columns(files: tuple[Path, Path]) -> None:
    cluster = read_cluster(files[0])
    assert cluster.names == ("n0", "n1", "n2", "n3")
    assert cluster.nodes[0].gpus == (1000, 1000) and cluster.nodes[0].gpu_type == "T4"
    assert cluster.gpu_milli == 16_000
    tasks = read_tasks(files[1])
    assert tasks[0] == Task(4000, 8192, 1, 500, "")
    assert tasks[3] == Task(12000, 32768, 2, 1000, "")
    assert tasks[4] == Task(1000, 2048, 0, 0, "")
    assert tasks[6].gpu_type == "T4"


def test_bad_rows_are_refused_with_the_line(tmp_path: Path) -> None:
    bad = tmp_path / "pods.csv"
    bad.write_text(PODS.replace("p2,6000,16384,1,1000", "p2,6000,16384,1,1500"))
    with pytest.raises(ValueError, match=r"pods.csv:4"):
        read_tasks(bad)
    bad_nodes = tmp_path / "nodes.csv"
    bad_nodes.write_text(NODES.replace("n1,16000", "n1,-5"))
    with pytest.raises(ValueError, match=r"nodes.csv:3: column 'cpu_milli'"):
        read_cluster(bad_nodes)


def test_shuffle_arrivals_give_every_task_once_then_draws(files: tuple[Path, Path]) -> None:
    tasks = read_tasks(files[1])
    stream = arrivals(tasks, 3)
    first = [next(stream) for _ in range(len(tasks))]
    assert sorted(first) == sorted(tasks)
    assert all(next(stream) in tasks for _ in range(50))
    with pytest.raises(ValueError):
        next(arrivals(tasks, 3, "sorted"))


@pytest.mark.parametrize("policy", POLICIES)
def test_small_run_places_fractions_and_never_over_commits(files: tuple[Path, Path],
                                                           policy: str) -> None:
    cluster = read_cluster(files[0])
    tasks = read_tasks(files[1])
    run = inflate(cluster, tasks, policy, seed=5, until_pct=130)
    assert run.arrivals > len(tasks)
    assert run.failures > 0 and run.first_failure_pct is not None
    assert run.at_100_pct is not None and len(run.curve) == 130
    # What the nodes hold is what the run counts, and never more than there is.
    free = sum(sum(n.gpus) for n in run.final)
    assert cluster.gpu_milli - free == run.allocated <= cluster.gpu_milli
    assert all(0 <= g <= 1000 for n in run.final for g in n.gpus)
    assert all(n.cpu_milli >= 0 and n.mem_mib >= 0 for n in run.final)
    assert all(0 <= pct <= 100 for pct in run.curve)
    assert run.curve == sorted(run.curve)  # tasks never leave
    # Fractions were placed: some GPU is shared (partly used).
    assert any(0 < g < 1000 for n in run.final for g in n.gpus)
    assert run.first_failure_pct <= 100 * run.allocated / cluster.gpu_milli


@pytest.mark.parametrize("policy", POLICIES)
def test_typed_tasks_land_on_their_gpu_type_only(files: tuple[Path, Path], policy: str) -> None:
    cluster = read_cluster(files[0])
    t4_only = [task for task in read_tasks(files[1]) if task.gpu_type == "T4"]
    run = inflate(cluster, t4_only, policy, seed=2, until_pct=100)
    assert run.final[1:] == cluster.nodes[1:]  # only n0 (T4) was used
    assert run.allocated == 1200  # four 0.3 shares: its 32 cores hold four 8-core tasks


@pytest.mark.parametrize("policy", POLICIES)
def test_a_seed_gives_the_same_run(files: tuple[Path, Path], policy: str) -> None:
    cluster = read_cluster(files[0])
    tasks = read_tasks(files[1])
    wl = Workload.of(tasks)
    runs = [inflate(cluster, tasks, policy, seed=s, workload=wl, until_pct=120)
            for s in (11, 11, 12)]
    assert runs[0] == runs[1]
    assert runs[0].curve != runs[2].curve or runs[0].final != runs[2].final


def test_fgd_beats_random_here(files: tuple[Path, Path]) -> None:
    cluster = read_cluster(files[0])
    tasks = read_tasks(files[1])
    got = {p: spread(inflate(cluster, tasks, p, seed=s, until_pct=100).at_100_pct
                     for s in range(20)) for p in ("fgd", "random")}
    assert got["fgd"].mean >= got["random"].mean
    assert got["fgd"].n == 20


def test_refuses_empty_inputs(files: tuple[Path, Path]) -> None:
    cluster = read_cluster(files[0])
    with pytest.raises(ValueError):
        inflate(cluster, [], "fgd", 1)
    with pytest.raises(ValueError):
        inflate(cluster, read_tasks(files[1]), "worstfit", 1)
