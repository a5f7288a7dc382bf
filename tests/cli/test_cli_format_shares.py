"""gsubmit's share and GPU-memory options (--gres=mps:N, --gres=shard:N, --gpu-mem,
gpumem), in flags and directives, and how gqueue shows them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.cli import gsubmit, listing
from gpusched.errors import UsageError
from gpusched.messages import JobRequest
from tests.cli.test_cli_format import NOW, job, parse_submit


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in a scratch directory: scripts are named relative to it."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("argv", "share"), [
    (["--gres=mps:50"], (1, [], "mps", 50, None)),
    (["--gres", "shard:2"], (1, [], "shard", 2, None)),
    (["--gres=mps:50", "--gpu-mem=20G"], (1, [], "mps", 50, 20 * 1024)),
    (["--gres=gpu:a100:1,mps:25,gpumem:20g"], (1, ["a100"], "mps", 25, 20 * 1024)),
    (["-G", "1", "--gres=shard:3"], (1, [], "shard", 3, None)),
    (["--gpu-mem", "512M"], (1, [], None, None, 512)),
    (["--gres=gpumem:40960"], (1, [], None, None, 40960)),
    (["-G", "l4:1", "--gpu-mem", "1T"], (1, ["l4"], None, None, 1024 * 1024)),
    (["-G", "2"], (2, [], None, None, None)),
])
def test_share_and_gpu_memory_options(in_tmp: Path, argv: list[str],
                                      share: tuple[object, ...]) -> None:
    """A share or GPU memory is one GPU; the body carries them as POST /v1/jobs takes them."""
    body = gsubmit.submission_body(parse_submit([*argv, "--wrap", "true"]), work_dir="/w",
                                   environment={})
    assert (body["gpus"], body["gpu_types"], body.get("share_mode"), body.get("share"),
            body.get("gpu_mem_mb")) == share
    assert JobRequest.parse(body).to_json() | body == JobRequest.parse(body).to_json()


def test_share_directives_and_their_errors(in_tmp: Path) -> None:
    (in_tmp / "job.sh").write_text("#!/bin/sh\n#SBATCH --gres=mps:30\n#GSUB --gpu-mem=8G\ntrue\n")
    sub = parse_submit(["job.sh"])
    assert (sub.gpus, sub.share_mode, sub.share, sub.gpu_mem_mb) == (1, "mps", 30, 8192)
    assert parse_submit(["--gres=shard:4", "job.sh"]).share_mode == "shard"  # the line wins
    (in_tmp / "bad.sh").write_text("#!/bin/sh\n#SBATCH --gres=mps:20000\ntrue\n")
    with pytest.raises(UsageError, match=r"^line 2: #SBATCH: invalid --gres 'mps:20000': "
                                         r"mps:N takes N from 1 to 10000"):
        parse_submit(["bad.sh"])
    (in_tmp / "two.sh").write_text("#!/bin/sh\n#SBATCH --gpu-mem=4G -N 2\ntrue\n")
    with pytest.raises(UsageError, match="^--gpu-mem asks for one GPU with that memory on one "
                                         "node, not 2 nodes$"):
        parse_submit(["two.sh"])


def test_gqueue_shows_shares_and_gpu_memory_slurm_style() -> None:
    """%b as squeue's TRES_PER_NODE; the default table's GPUS column; whole GPUs as
    before."""
    from gpusched.cli.listing import parse_format, render_format

    b = parse_format("%b")
    cases = [
        (job(gpus=1, share_mode="mps", share=50), "gres/mps:50", "mps:50"),
        (job(gpus=1, share_mode="shard", share=2), "gres/shard:2", "shard:2"),
        (job(gpus=1, share_mode="mps", share=25, gpu_mem_mb=20480),
         "gres/mps:25,gres/gpumem:20G", "mps:25,gpumem:20G"),
        (job(gpus=1, gpu_mem_mb=20480), "gres/gpumem:20G", "gpumem:20G"),
        (job(gpus=1, gpu_mem_mb=1536, gpu_types=["a100"]), "gres/gpu:a100:1,gres/gpumem:1536M",
         "gpumem:1536M"),
        (job(gpus=1, gpu_mem_mb=2 * 1024 * 1024), "gres/gpumem:2T", "gpumem:2T"),
        (job(gpus=2, share_mode=None, share=None, gpu_mem_mb=None), "gres/gpu:2", "2"),
        (job(gpus=0), "N/A", "0"),
    ]
    for full, tres, cell in cases:
        assert render_format(b, full, NOW) == tres
        assert listing.job_row(full, NOW)[6] == cell
