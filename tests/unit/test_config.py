"""The typed config loader: the example file, defaults, and one test per class of bad input.

Every error must name the file, the key and what was expected, so each bad-input test
checks all three parts of the message, not only the exception type.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from gpusched import paths
from gpusched.config import (
    AgentConfig,
    Config,
    ControllerConfig,
    PartitionConfig,
    StaticGpu,
    demo_gpus,
    load_config,
)
from gpusched.core.model import Policy
from gpusched.errors import ConfigError, UsageError

EXAMPLE = Path(__file__).resolve().parents[2] / "etc" / "gpusched.toml"

GOOD_GPU = 'uuid = "GPU-5a1f3c8e-2d47-4b9a-8e61-0c3f7d92ab14"'


def write(tmp_path: Path, text: str, name: str = "gpusched.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load_error(path: Path) -> str:
    """Load ``path`` expecting a ConfigError; return its message."""
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value)


# --- the example file -------------------------------------------------------------------


def test_example_loads_with_the_values_written_in_it() -> None:
    config = load_config(EXAMPLE)

    assert config.source == str(EXAMPLE)
    assert config.database_url == "postgresql+psycopg://gpusched@/gpusched?host=/run/postgresql"
    assert config.controller == ControllerConfig(
        socket=Path("/run/gpusched/controller.sock"),
        socket_mode=0o666,
        schedule_interval=5.0,
        node_timeout=60.0,
        admin_group="hpcadmin",
    )
    assert config.agent == AgentConfig(
        node_name="gpu01",
        address="10.0.0.11",
        state_dir=Path("/var/lib/gpusched/agent"),
        poll_wait=20.0,
        kill_grace=30.0,
        gpu_source="static",
        static_gpus=(
            StaticGpu(0, "GPU-5a1f3c8e-2d47-4b9a-8e61-0c3f7d92ab14", "NVIDIA A100-SXM4-80GB",
                      81920, "00000000:07:00.0", "a100-80gb", minor=0,
                      numa_node=0),
            StaticGpu(1, "GPU-c83e0b6d-91f2-4e05-a7d8-6b24f1e9c530", "NVIDIA A100-SXM4-80GB",
                      81920, "00000000:0F:00.0", "a100-80gb", minor=1,
                      numa_node=0),
        ),
        block="rack1",
        static_links=((0, 1, "NVLINK", 12),),
        min_job_uid=1,
        controller_user="gpusched",
        container_runtime="enroot",
    )
    assert config.partitions == (
        PartitionConfig("gpu", ("*",), default=True, max_time=2 * 86400, default_time=3600),
        PartitionConfig("debug", ("gpu01",), default=False, max_time=1800, default_time=600),
    )
    assert config.default_partition().name == "gpu"


def test_example_uses_the_system_paths_the_daemons_and_units_expect() -> None:
    config = load_config(EXAMPLE)
    assert config.controller.socket == paths.SYSTEM_SOCKET
    assert config.agent.state_dir.is_relative_to(paths.SYSTEM_STATE_DIR)


def test_example_sets_every_field_of_the_config_objects() -> None:
    """Adding a field to config.py without documenting it in the example fails here."""
    raw = tomllib.loads(EXAMPLE.read_text())
    # fields living in [agent.gpus]
    agent_keys = {"gpu_source": "gpus", "static_gpus": "gpus", "static_links": "gpus",
                  "rediscover_interval": "gpus", "ignore_xids": "health",
                  "max_temperature": "health", "health_interval": "health",
                  "cgroups": "cgroups", "cgroup_root": "cgroups", "allow_swap": "cgroups",
                  "prolog_timeout": "prolog", "epilog_timeout": "epilog",
                  "health_check_interval": "health_check",
                  "health_check_timeout": "health_check", "container_program": "container",
                  "container_runtime_args": "container", "container_run_args": "container",
                  "container_gpus": "container"}

    assert {f.name for f in dataclasses.fields(ControllerConfig)} <= set(raw["controller"])
    assert {agent_keys.get(f.name, f.name) for f in dataclasses.fields(AgentConfig)} <= set(raw["agent"])
    assert "source" in raw["agent"]["gpus"]
    assert {"enforce", "allow_swap"} <= set(raw["agent"]["cgroups"])
    assert "# root = " in EXAMPLE.read_text()
    for key, program in (("prolog", "prolog"), ("epilog", "epilog"),
                         ("health_check", "healthcheck")):
        assert "timeout" in raw["agent"][key]
        assert f'# program = "/etc/gpusched/{program}"' in EXAMPLE.read_text()
    for gpu in raw["agent"]["gpus"]["static"]:
        # documented; the example has no MIG slices
        slice_only = {"mig_profile", "parent", "gi_id", "ci_id"}
        assert {f.name for f in dataclasses.fields(StaticGpu)} - slice_only == set(gpu)
    for part in raw["partitions"]:
        assert {f.name for f in dataclasses.fields(PartitionConfig)} == set(part)
    assert "url" in raw["database"]
    # `count` cannot be set next to the static inventory; it must still be documented.
    assert "# count = " in EXAMPLE.read_text()


# --- defaults ---------------------------------------------------------------------------


def test_no_file_gives_the_defaults() -> None:
    config = load_config(None)

    assert config == Config()
    assert config.source == "<defaults>"
    assert config.controller.socket == paths.SYSTEM_SOCKET
    assert config.controller.socket_mode == 0o666
    assert config.agent.poll_wait == 20.0
    assert config.agent.static_gpus == ()
    assert [p.name for p in config.partitions] == ["gpu"]
    assert config.default_partition().max_time is None


def test_empty_file_gives_the_defaults_but_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "")
    config = load_config(path)
    assert dataclasses.replace(config, source="<defaults>") == Config()
    assert config.source == str(path)


# --- bad input: one test per class, each checking file, key and expectation ------------


def test_unknown_key(tmp_path: Path) -> None:
    path = write(tmp_path, "[agent]\npoll_interval = 5\n")
    message = load_error(path)
    assert str(path) in message
    assert "agent.poll_interval" in message
    assert "unknown key" in message


def test_unknown_top_level_table(tmp_path: Path) -> None:
    path = write(tmp_path, "[scheduler]\nbf_window = 3\n")
    message = load_error(path)
    assert str(path) in message and "scheduler" in message and "unknown key" in message


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ('[controller]\nschedule_interval = "5s"\n', "controller.schedule_interval", "positive number of seconds"),
        ("[controller]\nsocket_mode = \"0666\"\n", "controller.socket_mode", "integer file mode"),
        ("[agent]\npoll_wait = true\n", "agent.poll_wait", "positive number of seconds"),
        ("[[partitions]]\nname = \"gpu\"\ndefault = \"yes\"\n", "partitions[0].default", "true or false"),
        ("[[partitions]]\nname = \"gpu\"\nnodes = \"gpu01\"\n", "partitions[0].nodes", "list of node names"),
        ("[database]\nurl = 5\n", "database.url", "SQLAlchemy URL"),
        ("agent = 3\n", "agent", "a table"),
        ("[controller]\nmax_submit_jobs_per_user = -1\n", "controller.max_submit_jobs_per_user",
         "a number of jobs"),
        ("[controller]\nmax_submit_jobs_per_user = 1.5\n", "controller.max_submit_jobs_per_user",
         "a number of jobs"),
        ("[agent]\nmin_job_uid = -1\n", "agent.min_job_uid", "a uid from 0"),
        ("[agent]\nmin_job_uid = true\n", "agent.min_job_uid", "a uid from 0"),
        ("[agent]\nmin_job_uid = 4294967295\n", "agent.min_job_uid", "a uid from 0"),
        ("[agent]\ncontroller_user = \"\"\n", "agent.controller_user", "a user name or uid"),
        ("[agent]\ncontroller_user = -3\n", "agent.controller_user", "a user name or uid"),
        ("[agent]\naddress = 10\n", "agent.address", "a host name or IP address"),
        ("[agent]\naddress = \"\"\n", "agent.address", "a host name or IP address"),
        ("[agent]\naddress = \"a b\"\n", "agent.address", "a host name or IP address"),
    ],
)
def test_wrong_type(tmp_path: Path, text: str, key: str, expected: str) -> None:
    path = write(tmp_path, text)
    message = load_error(path)
    assert str(path) in message
    assert f"{key}:" in message
    assert expected in message


@pytest.mark.parametrize("value", ["-1", "0", "-0.5"])
def test_poll_wait_must_be_positive(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, f"[agent]\npoll_wait = {value}\n")
    message = load_error(path)
    assert str(path) in message
    assert "agent.poll_wait" in message
    assert "expected a positive number of seconds" in message


@pytest.mark.parametrize("value", ["2 days", "1:2:3:4", "0", "-1", ""])
def test_bad_time_string_in_max_time(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, f'[[partitions]]\nname = "gpu"\nmax_time = "{value}"\n')
    message = load_error(path)
    assert str(path) in message
    assert "partitions[0].max_time" in message
    assert "expected a time such as '1-00:00:00' or 'UNLIMITED'" in message


def test_default_time_above_max_time(tmp_path: Path) -> None:
    path = write(tmp_path, '[[partitions]]\nname = "gpu"\nmax_time = "1:00:00"\ndefault_time = "2:00:00"\n')
    message = load_error(path)
    assert str(path) in message and "partitions[0].default_time" in message and "at most max_time" in message


def test_duplicate_partition_names(tmp_path: Path) -> None:
    path = write(tmp_path, '[[partitions]]\nname = "gpu"\n[[partitions]]\nname = "gpu"\n')
    message = load_error(path)
    assert str(path) in message
    assert "partitions:" in message
    assert "names must be distinct" in message and "'gpu'" in message


def test_two_default_partitions(tmp_path: Path) -> None:
    path = write(tmp_path, '[[partitions]]\nname = "a"\ndefault = true\n'
                           '[[partitions]]\nname = "b"\ndefault = true\n')
    message = load_error(path)
    assert str(path) in message
    assert "partitions:" in message
    assert "at most one may have default = true" in message


def test_partitions_must_be_an_array_of_tables(tmp_path: Path) -> None:
    path = write(tmp_path, '[partitions]\nname = "gpu"\n')
    message = load_error(path)
    assert str(path) in message and "partitions" in message and "[[partitions]]" in message


@pytest.mark.parametrize("bad_uuid", ["5a1f3c8e-2d47-4b9a-8e61-0c3f7d92ab14", "gpu0", ""])
def test_static_gpu_with_a_bad_uuid(tmp_path: Path, bad_uuid: str) -> None:
    path = write(tmp_path, f'[[agent.gpus.static]]\nindex = 0\nuuid = "{bad_uuid}"\n')
    message = load_error(path)
    assert str(path) in message
    assert "agent.gpus.static[0].uuid" in message
    assert "expected a GPU UUID" in message


def test_static_gpu_without_a_uuid(tmp_path: Path) -> None:
    path = write(tmp_path, '[[agent.gpus.static]]\nindex = 0\nname = "NVIDIA A100"\n')
    message = load_error(path)
    assert str(path) in message and "agent.gpus.static[0].uuid" in message and "GPU UUID" in message


def test_static_gpus_with_the_same_uuid(tmp_path: Path) -> None:
    path = write(tmp_path, f"[[agent.gpus.static]]\nindex = 0\n{GOOD_GPU}\n"
                           f"[[agent.gpus.static]]\nindex = 1\n{GOOD_GPU}\n")
    message = load_error(path)
    assert str(path) in message and "agent.gpus.static" in message and "distinct" in message


def test_count_together_with_static(tmp_path: Path) -> None:
    path = write(tmp_path, f"[agent.gpus]\ncount = 2\n[[agent.gpus.static]]\nindex = 0\n{GOOD_GPU}\n")
    message = load_error(path)
    assert str(path) in message
    assert "agent.gpus.count" in message and "agent.gpus.static" in message
    assert "give one, not both" in message


def test_gpu_sources(tmp_path: Path) -> None:
    for source in ("auto", "nvml", "static"):
        path = write(tmp_path, f'[agent.gpus]\nsource = "{source}"\nrediscover_interval = 5\n')
        config = load_config(path).agent
        assert (config.gpu_source, config.rediscover_interval) == (source, 5.0)
    assert load_config(None).agent.gpu_source == "auto"
    path = write(tmp_path, '[agent.gpus]\nsource = "dcgm"\n')
    message = load_error(path)
    assert str(path) in message and "agent.gpus.source" in message
    assert "one of 'auto', 'nvml', 'static'" in message


def test_invalid_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "[agent\npoll_wait = 1\n")
    message = load_error(path)
    assert str(path) in message
    assert "not valid TOML" in message
    assert "line 1" in message  # tomllib's position, so the admin can find the mistake


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.toml"
    message = load_error(path)
    assert str(path) in message
    assert "no such configuration file" in message


def test_config_error_is_a_usage_error_so_clis_exit_2(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        load_config(tmp_path / "absent.toml")
    assert info.value.exit_code == 2


# --- demo inventory ---------------------------------------------------------------------


def test_count_gives_the_demo_inventory_of_the_node(tmp_path: Path) -> None:
    path = write(tmp_path, '[agent]\nnode_name = "node07"\n[agent.gpus]\ncount = 3\n')
    assert load_config(path).agent.static_gpus == demo_gpus("node07", 3)


def test_demo_gpus_are_stable_per_node_and_differ_between_nodes() -> None:
    first = demo_gpus("node01", 4)
    again = demo_gpus("node01", 4)
    other = demo_gpus("node02", 4)

    assert first == again
    assert [g.index for g in first] == [0, 1, 2, 3]
    assert len({g.uuid for g in first}) == 4
    assert all(g.uuid.startswith("GPU-") for g in first)
    assert not {g.uuid for g in first} & {g.uuid for g in other}
    # A larger inventory extends a smaller one: adding demo GPUs keeps the old UUIDs.
    assert demo_gpus("node01", 2) == first[:2]


def test_demo_gpu_uuids_load_back_as_a_static_inventory(tmp_path: Path) -> None:
    """The demo UUIDs are valid in a static inventory (a demo node can be written out)."""
    gpu = demo_gpus("node01", 1)[0]
    path = write(tmp_path, f'[[agent.gpus.static]]\nindex = 0\nuuid = "{gpu.uuid}"\n')
    assert load_config(path).agent.static_gpus[0].uuid == gpu.uuid


# --- stricter checks: finite numbers, real UUIDs, unreadable files -----------------------


def test_unknown_key_message_says_which_keys_are_expected(tmp_path: Path) -> None:
    message = load_error(write(tmp_path, "[agent]\npoll_interval = 5\n"))
    assert "poll_wait" in message  # the valid keys of [agent]


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_poll_wait_must_be_finite(tmp_path: Path, value: str) -> None:
    message = load_error(write(tmp_path, f"[agent]\npoll_wait = {value}\n"))
    assert "agent.poll_wait" in message


def test_kill_grace_must_not_be_negative(tmp_path: Path) -> None:
    message = load_error(write(tmp_path, "[agent]\nkill_grace = -5\n"))
    assert "agent.kill_grace" in message


@pytest.mark.parametrize("bad_uuid", ["GPU-", "GPU-not-a-uuid"])
def test_static_gpu_uuid_must_be_a_uuid_after_its_prefix(tmp_path: Path, bad_uuid: str) -> None:
    message = load_error(write(tmp_path, f'[[agent.gpus.static]]\nuuid = "{bad_uuid}"\n'))
    assert "agent.gpus.static[0].uuid" in message


def test_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "gpusched.toml"
    path.write_bytes(b"[agent]\nnode_name = \"\xff\"\n")
    assert str(path) in load_error(path)


def test_directory_instead_of_a_file_is_a_config_error(tmp_path: Path) -> None:
    assert str(tmp_path) in load_error(tmp_path)


def test_unlimited_default_time_under_a_finite_max_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, '[[partitions]]\nname = "p"\nmax_time = "1:00:00"\n'
                           'default_time = "UNLIMITED"\n')
    assert "partitions[0].default_time" in load_error(path)


@pytest.mark.parametrize(("key", "value"), [("socket", '"relative.sock"'), ("state_dir", '""')])
def test_paths_must_be_absolute(tmp_path: Path, key: str, value: str) -> None:
    table = "controller" if key == "socket" else "agent"
    assert f"{table}.{key}" in load_error(write(tmp_path, f"[{table}]\n{key} = {value}\n"))


def test_node_timeout_must_exceed_the_agent_poll(tmp_path: Path) -> None:
    path = write(tmp_path, "[controller]\nnode_timeout = 10\n[agent]\npoll_wait = 20\n")
    assert "controller.node_timeout" in load_error(path)


def test_demo_inventory_pci_ids_stay_valid_for_large_counts() -> None:
    ids = [g.pci_bus_id for g in demo_gpus("big", 300)]
    assert len(set(ids)) == 300
    assert all(len(i.split(":")[1]) == 2 for i in ids)


def test_scheduler_section_becomes_the_policy(tmp_path: Path) -> None:
    path = write(tmp_path, '[scheduler]\nfairshare = "classic"\nhalf_life = "1-00:00:00"\n'
                           '[scheduler.weights]\nage = 0\nqos = 5\nmax_age = "2-00:00:00"\n')
    scheduler = load_config(path).scheduler
    policy = scheduler.policy()
    assert (policy.fairshare, scheduler.half_life) == ("classic", 86400.0)
    assert (policy.weights.age, policy.weights.qos, policy.weights.max_age) == (0.0, 5.0, 172800.0)
    assert policy.weights.fairshare == 10000.0  # untouched default


@pytest.mark.parametrize(("text", "key"), [
    ('[scheduler]\nfairshare = "lottery"\n', "scheduler.fairshare"),
    ('[scheduler.weights]\nage = -1\n', "scheduler.weights.age"),
    ('[scheduler.weights]\nspeed = 1\n', "scheduler.weights.speed"),
    ('[scheduler]\nhalf_life = "soon"\n', "scheduler.half_life"),
])
def test_bad_scheduler_settings(tmp_path: Path, text: str, key: str) -> None:
    assert key in load_error(write(tmp_path, text))


def test_backfill_settings(tmp_path: Path) -> None:
    path = write(tmp_path, '[scheduler]\nbackfill = "conservative"\nreservations = 3\n'
                           'backfill_max_jobs = 0\n')
    policy = load_config(path).scheduler.policy()
    assert (policy.backfill, policy.reservations, policy.backfill_max_jobs) == (
        "conservative", 3, None)
    assert policy.reservation_depth == 3
    default = load_config(write(tmp_path, "")).scheduler.policy()
    assert (default.backfill, default.reservation_depth, default.backfill_max_jobs) == (
        "easy", 1, 5000)


@pytest.mark.parametrize(("text", "key"), [
    ('backfill = "aggressive"', "backfill"), ("reservations = -1", "reservations"),
    ('backfill_max_jobs = "lots"', "backfill_max_jobs"),
])
def test_bad_backfill_settings(tmp_path: Path, text: str, key: str) -> None:
    message = load_error(write(tmp_path, f"[scheduler]\n{text}\n"))
    assert f"scheduler.{key}" in message


def test_preemption_settings(tmp_path: Path) -> None:
    policy = load_config(write(tmp_path, '[scheduler]\npreempt_mode = "cancel"\npreempt_grace = 5\n')
                         ).scheduler.policy()
    assert (policy.preempt_mode, policy.preempt_grace) == ("cancel", 5.0)
    message = load_error(write(tmp_path, '[scheduler]\npreempt_mode = "kill"\n'))
    assert "scheduler.preempt_mode" in message and "'requeue', 'cancel' or 'off'" in message


def test_static_mig_slices_and_links(tmp_path: Path) -> None:
    text = ('[agent.gpus]\n[[agent.gpus.static]]\nindex = 0\nuuid = "GPU-11111111-1111-1111-1111-111111111111"\n'
            '[[agent.gpus.static]]\nindex = 1\nuuid = "MIG-22222222-2222-2222-2222-222222222222"\n'
            'mig_profile = "1g.10gb"\nparent = 0\n'
            '[[agent.gpus.links]]\ngpus = [1, 0]\nkind = "PCIE_SWITCH"\n')
    agent = load_config(write(tmp_path, text)).agent
    assert (agent.static_gpus[1].mig_profile, agent.static_gpus[1].parent) == ("1g.10gb", 0)
    assert agent.static_links == ((0, 1, "PCIE_SWITCH", 0),)
    for bad, words in (
            ('parent = 0', "static[1].mig_profile: expected both mig_profile and parent"),
            ('mig_profile = "big"\nparent = 0', "static[1].mig_profile: expected a MIG profile"),
            ('mig_profile = "1g.10gb"\nparent = 7', "static: expected MIG slices whose parent")):
        broken = text.replace('mig_profile = "1g.10gb"\nparent = 0', bad)
        assert f"agent.gpus.{words}" in load_error(write(tmp_path, broken))
    message = load_error(write(tmp_path, text.replace('kind = "PCIE_SWITCH"', 'kind = "WIFI"')))
    assert "agent.gpus.links[0].kind" in message


def test_pass_budget(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "[scheduler]\npass_budget = 0.5\n")).scheduler.pass_budget == 0.5
    assert load_config(write(tmp_path, "")).scheduler.pass_budget == 2.0
    assert "scheduler.pass_budget" in load_error(write(tmp_path, "[scheduler]\npass_budget = -1\n"))


def test_a_submit_limit_of_zero_means_none(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "[controller]\nmax_submit_jobs_per_user = 0\n")
                       ).controller.max_submit_jobs_per_user is None
    assert load_config(None).controller.max_submit_jobs_per_user == 10_000


def test_confinement_and_site_programs_are_read_and_checked(tmp_path: Path) -> None:
    body = """
[agent.cgroups]
enforce = "required"
root = "/sys/fs/cgroup/site"
allow_swap = true
[agent.prolog]
program = "/etc/gpusched/prolog"
timeout = 5
[agent.epilog]
program = "/etc/gpusched/epilog"
[agent.health_check]
program = "/usr/sbin/nhc"
interval = 30
timeout = 10
"""
    path = tmp_path / "c.toml"
    path.write_text(body)
    agent = load_config(path).agent
    assert (agent.cgroups, agent.cgroup_root, agent.allow_swap) == (
        "required", Path("/sys/fs/cgroup/site"), True)
    assert (agent.prolog, agent.prolog_timeout) == (Path("/etc/gpusched/prolog"), 5.0)
    assert (agent.epilog, agent.epilog_timeout) == (Path("/etc/gpusched/epilog"), 60.0)
    assert (agent.health_check, agent.health_check_interval, agent.health_check_timeout) == (
        Path("/usr/sbin/nhc"), 30.0, 10.0)
    assert load_config(None).agent.cgroups == "auto" and load_config(None).agent.prolog is None
    for bad, message in (
            ('[agent.cgroups]\nenforce = "yes"', "enforce"),
            ('[agent.cgroups]\nroot = "relative"', "root"),
            ('[agent.prolog]\nprogram = "prolog"', "program"),
            ('[agent.prolog]\ntimeout = 0', "timeout"),
            ('[agent.health_check]\ninterval = -1', "interval"),
            ('[agent.epilog]\nprogam = "/x"', "progam")):
        path.write_text(bad)
        with pytest.raises(ConfigError) as caught:
            load_config(path)
        assert message in str(caught.value)


def test_packing_and_mps_users_become_the_policy(tmp_path: Path) -> None:
    assert (Policy().packing, Policy().mps_multi_user) == ("bestfit", False)
    policy = load_config(write(tmp_path, '[scheduler]\npacking = "fgd"\n'
                                         'mps_multi_user = true\n')).scheduler.policy()
    assert (policy.packing, policy.mps_multi_user) == ("fgd", True)
    message = load_error(write(tmp_path, '[scheduler]\npacking = "tight"\n'))
    assert "scheduler.packing" in message and "'bestfit' or 'fgd'" in message
    message = load_error(write(tmp_path, '[scheduler]\nmps_multi_user = "yes"\n'))
    assert "scheduler.mps_multi_user" in message
