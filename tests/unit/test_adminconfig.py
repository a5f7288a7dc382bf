"""Admin configuration files: whole-set validation with errors naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpusched.adminconfig import load_admin_config
from gpusched.errors import ConfigError

ETC = Path(__file__).resolve().parents[2] / "etc"


def write(tmp_path: Path, text: str, name: str = "admin.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_examples_load_together() -> None:
    config = load_admin_config([ETC / "partitions.toml", ETC / "accounts.toml"])
    assert config.partitions is not None and config.accounts is not None
    gpu, debug = config.partitions
    assert gpu.nodes == tuple(f"gpu{i:02d}" for i in range(1, 17))
    assert (gpu.default, gpu.max_time, gpu.default_time, gpu.max_gpus_per_job) == (
        True, 2 * 86400, 4 * 3600, 8)
    assert debug.allow_accounts == ("physics", "bio") and debug.priority_tier == 2
    assert [(a.name, a.parent, a.shares) for a in config.accounts] == [
        ("physics", "root", 60), ("theory", "physics", 1), ("experiment", "physics", 1),
        ("bio", "root", 40)]
    assert config.users is not None and config.users[1].shares == 2
    assert config.qos is not None and config.qos[0].preempt == ("scavenger",)
    assert config.billing == {"h100-80gb": 2.0, "a100-80gb": 1.5, "l4": 0.5}


def test_a_file_with_only_partitions_leaves_the_other_kinds_alone() -> None:
    config = load_admin_config([ETC / "partitions.toml"])
    assert config.partitions is not None
    assert (config.accounts, config.users, config.qos, config.billing) == (None, None, None, None)


@pytest.mark.parametrize(("text", "needle"), [
    ('[[partition]]\nname = "p"\nnodes = "gpu[1-"\n', "partition[0].nodes"),
    ('[[partition]]\nname = "p"\nstate = "sleepy"\n', "partition[0].state"),
    ('[[partition]]\nname = "p"\nmax_time = "1:00"\ndefault_time = "2:00"\n', "default_time"),
    ('[[partition]]\nname = "p"\nmax_gpus_per_job = -1\n', "max_gpus_per_job"),
    ('[[partition]]\nname = "p"\ncolour = "red"\n', "partition[0].colour: unknown key"),
    ('[[partition]]\nname = "p"\n[[partition]]\nname = "p"\n', "declared twice"),
    ('[[partition]]\nname="a"\ndefault=true\n[[partition]]\nname="b"\ndefault=true\n', "at most one"),
    ('[[account]]\nname = "a"\nparent = "ghost"\n', "parent 'ghost' is not declared"),
    ('[[account]]\nname = "a"\nparent = "b"\n[[account]]\nname = "b"\nparent = "a"\n', "cycle"),
    ('[[account]]\nname = "root"\n', "implicit"),
    ('[[account]]\nname = "a"\nshares = -3\n', "account[0].shares"),
    ('[[account]]\nname = "a"\n[[user]]\nname = "u"\naccounts = ["b"]\n', "account 'b' is not declared"),
    ('[[account]]\nname = "a"\n[[user]]\nname = "u"\naccounts = []\n', "user[0].accounts"),
    ('[[account]]\nname = "a"\n[[user]]\nname="u"\naccounts=["a"]\ndefault_account="z"\n', "default_account"),
    ('[[user]]\nname = "u"\naccounts = ["a"]\n', "need the [[account]] tables"),
    ('[[qos]]\nname = "q"\npreempt = ["q"]\n', "not another declared QOS"),
    ('[[qos]]\nname = "q"\nmax_wall = "forever"\n', "qos[0].max_wall"),
    ('[billing]\n"H100" = 2.0\n', "billing.H100"),
    ('[billing]\nl4 = 0\n', "billing.l4"),
    ('[[account]]\nname = "a"\n[[partition]]\nname = "p"\nallow_accounts = ["b"]\n', "account 'b'"),
    ('partition = 3\n', "expected an array of tables"),
    ('[cluster]\nname = "x"\n', "cluster: unknown key"),
])
def test_invalid_files_name_the_problem(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        load_admin_config([path])
    assert needle in str(raised.value) and str(path) in str(raised.value)


def test_errors_across_files_are_found_before_anything_is_used(tmp_path: Path) -> None:
    accounts = write(tmp_path, '[[account]]\nname = "a"\n', "accounts.toml")
    partitions = write(tmp_path, '[[partition]]\nname = "p"\ndeny_accounts = ["zzz"]\n', "p.toml")
    with pytest.raises(ConfigError, match="account 'zzz' is not declared"):
        load_admin_config([accounts, partitions])
    with pytest.raises(ConfigError, match="no admin configuration files"):
        load_admin_config([])
