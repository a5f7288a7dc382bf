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
    gpu, debug, inference = config.partitions
    assert (gpu.sharing, gpu.shares, inference.sharing, inference.shares) == (
        None, None, "mps", 100)
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
    ('[[partition]]\nname = "p"\nsharing = "mig"\n',
     'partition[0].sharing: expected one of "exclusive", "mps", "shard", got \'mig\''),
    ('[[partition]]\nname = "p"\nsharing = 1\n', "partition[0].sharing: expected one of"),
    ('[[partition]]\nname = "p"\nshares = 8\n',
     'partition[0].shares: expected it left out with sharing = "exclusive"'),
    ('[[partition]]\nname = "p"\nsharing = "exclusive"\nshares = 8\n',
     'partition[0].shares: expected it left out'),
    ('[[partition]]\nname = "p"\nsharing = "mps"\nshares = 0\n',
     "partition[0].shares: expected a number of units per GPU from 1 to 10000, got 0"),
    ('[[partition]]\nname = "p"\nsharing = "shard"\nshares = 10001\n',
     "partition[0].shares: expected a number of units per GPU from 1 to 10000, got 10001"),
    ('[[partition]]\nname = "p"\nsharing = "mps"\nshares = true\n', "partition[0].shares"),
    ('[[partition]]\nname = "a"\nnodes = "n[1-4]"\nsharing = "mps"\n'
     '[[partition]]\nname = "b"\nnodes = "n[4-6]"\nsharing = "shard"\n',
     "partitions 'a' (sharing mps, shares 100) and 'b' (sharing shard, shares 4) would share "
     "the GPUs of node n4 differently"),
    ('[[partition]]\nname = "a"\nnodes = "n1"\nsharing = "mps"\n'
     '[[partition]]\nname = "b"\nsharing = "mps"\nshares = 50\n',
     "partitions 'a' (sharing mps, shares 100) and 'b' (sharing mps, shares 50) would share "
     "the GPUs of node n1 differently"),
    ('[[partition]]\nname = "a"\nsharing = "shard"\n[[partition]]\nname = "b"\n'
     'sharing = "mps"\n', "would share the GPUs of every node differently"),
])
def test_invalid_files_name_the_problem(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        load_admin_config([path])
    assert needle in str(raised.value) and str(path) in str(raised.value)


def test_sharing_defaults_and_partitions_that_may_overlap(tmp_path: Path) -> None:
    """mps offers 100 units by default, shard 4; exclusive is stored as None. Partitions
    may share a node's GPUs when they share them the same way, or one is exclusive."""
    config = load_admin_config([write(tmp_path, """
[[partition]]
name = "whole"
[[partition]]
name = "mps"
nodes = "n[1-2]"
sharing = "MPS"
[[partition]]
name = "mps-too"
nodes = ["n2", "n3"]
sharing = "mps"
shares = 100
[[partition]]
name = "shard"
nodes = "n9"
sharing = "shard"
[[partition]]
name = "fine"
nodes = "n8"
sharing = "shard"
shares = 16
""")])
    assert config.partitions is not None
    assert [(p.name, p.sharing, p.shares) for p in config.partitions] == [
        ("whole", None, None), ("mps", "mps", 100), ("mps-too", "mps", 100),
        ("shard", "shard", 4), ("fine", "shard", 16)]


def test_errors_across_files_are_found_before_anything_is_used(tmp_path: Path) -> None:
    accounts = write(tmp_path, '[[account]]\nname = "a"\n', "accounts.toml")
    partitions = write(tmp_path, '[[partition]]\nname = "p"\ndeny_accounts = ["zzz"]\n', "p.toml")
    with pytest.raises(ConfigError, match="account 'zzz' is not declared"):
        load_admin_config([accounts, partitions])
    with pytest.raises(ConfigError, match="no admin configuration files"):
        load_admin_config([])
