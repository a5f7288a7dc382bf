"""gcontrol's reservation settings (scontrol's KEY=VALUE forms, += and -= on update), its
argument forms, the show and ginfo -T layouts, and the API's reservation message: each
value within its bounds, a bad one refused with one line naming it."""

from __future__ import annotations

from datetime import datetime

import pytest

from gpusched.cli.reservations import name_argv, parse_settings, show_lines, table_lines
from gpusched.errors import UsageError
from gpusched.messages.reservations import ReservationRequest

RESV = {"name": "maint", "state": "INACTIVE", "start": "2026-12-01T08:00:00+00:00",
        "end": "2026-12-01T12:00:00+00:00", "duration": 4 * 3600,
        "nodes": ["gpu01", "gpu02"], "node_list": "gpu[01-02]", "node_count": 2,
        "gpus": {"gpu01": 2}, "whole_nodes": False, "users": ["root"], "accounts": [],
        "flags": ["IGNORE_JOBS", "MAINT"]}


def test_settings_become_the_api_body() -> None:
    body = parse_settings(["ReservationName=maint", "StartTime=2026-12-01T08:00",
                           "Duration=4:00:00", "Nodes=gpu[01-02]", "TRES=gres/gpu=2",
                           "users=root,ada", "Flags=maint,ignore_jobs", "NodeCnt=2",
                           "PartitionName=gpu", "Accounts=-guests"])
    start = datetime.fromisoformat(body.pop("start"))
    assert (start.year, start.month, start.day, start.hour) == (2026, 12, 1, 8)
    assert body == {"name": "maint", "duration": 14_400, "nodes": ["gpu01", "gpu02"],
                    "gpus": 2, "users": ["root", "ada"], "flags": ["MAINT", "IGNORE_JOBS"],
                    "node_count": 2, "partition": "gpu", "accounts": ["-guests"]}
    assert parse_settings(["Duration=90"]) == {"duration": 5400}  # minutes, as Slurm
    assert parse_settings(["Duration=UNLIMITED"])["duration"] == 365 * 86400
    assert parse_settings(["GPUs=3", "Nodes=ALL"]) == {"gpus": 3, "nodes": ["ALL"]}
    assert parse_settings(["Duration=1", "Duration=2"]) == {"duration": 120}  # last wins


def test_updates_add_and_remove_names() -> None:
    current = {"users": ["root", "ada"], "flags": ["DAILY"]}
    assert parse_settings(["Users+=bob,ada", "Flags-=daily", "Flags+=maint"], current) == {
        "users": ["root", "ada", "bob"], "flags": ["MAINT"]}
    assert parse_settings(["Users-=root"], current) == {"users": ["ada"]}


@pytest.mark.parametrize("settings, words", [
    (["Bogus=1"], "invalid setting 'Bogus=1'"),
    (["Nodes="], "invalid setting 'Nodes='"),
    (["Duration=0"], "must be positive"),
    (["Duration=x"], "invalid Duration"),
    (["StartTime=tomorrow-ish"], "invalid StartTime"),
    (["EndTime=now+99999999999999999999days"], "too far"),
    (["Nodes=n[1-100000000]"], "more than 100000"),
    (["TRES=cpu=4"], "gres/gpu=N"),
    (["NodeCnt=0"], "count of 1 or more"),
    (["Users+=bob"], "only changes an existing"),
    (["Duration+=5"], "invalid setting"),
])
def test_bad_settings_are_one_line(settings: list[str], words: str) -> None:
    with pytest.raises(UsageError, match=words.replace("(", r"\(")):
        parse_settings(settings)


def test_scontrol_forms_reach_the_subcommands() -> None:
    assert name_argv(["create", "ReservationName=x", "Nodes=a"]) == [
        "create", "reservation", "ReservationName=x", "Nodes=a"]
    assert name_argv(["update", "reservationname=x", "Duration=5"])[:2] == [
        "update", "reservation"]
    assert name_argv(["delete", "ReservationName=x"])[:2] == ["delete", "reservation"]
    assert name_argv(["show", "res", "x"]) == ["show", "reservation", "x"]
    assert name_argv(["update", "JobId=17", "TimeLimit=5"]) == [
        "update", "JobId=17", "TimeLimit=5"]  # jobs are gcontrol's own forms


def test_show_and_table_layouts() -> None:
    lines = show_lines(RESV)
    assert lines[0].startswith("ReservationName=maint StartTime=")
    assert "Duration=4:00:00" in lines[0]
    assert lines[1].split() == ["Nodes=gpu[01-02]", "NodeCnt=2", "Flags=IGNORE_JOBS,MAINT"]
    assert "TRES=gres/gpu=2" in lines[2] and "Users=root" in lines[2]
    assert "State=INACTIVE" in lines[2] and lines[3].strip() == "GPUs=gpu01:2"
    table = table_lines([RESV, {**RESV, "name": "m\x1b[2J", "gpus": None}])
    assert table[0].split() == ["RESV_NAME", "STATE", "START_TIME", "END_TIME", "DURATION",
                                "NODELIST"]
    assert table[1].split()[0] == "maint" and table[1].endswith("gpu[01-02]")
    assert "\x1b" not in table[2]  # stored text is escaped for the terminal


@pytest.mark.parametrize("body, words", [
    ({"name": "x", "start": "2026-12-01T08:00:00"}, "with its zone"),
    ({"start": "tomorrow"}, "ISO 8601"),
    ({"start": 5}, "expected an ISO 8601"),
    ({"start": "2200-01-01T00:00:00+00:00"}, "1970 to 2100"),
    ({"end": "2026-12-01T08:00:00+00:00", "duration": 5}, "not both"),
    ({"duration": 0}, "1 or more"),
    ({"nodes": []}, "at least one node"),
    ({"nodes": ["a"] * 4097}, "more than 4096"),
    ({"gpus": True}, "GPU count"),
    ({"users": ["a", "-b"]}, "not both"),
    ({"flags": ["WEEKLY", "DAILY"]}, "cannot both"),
    ({"flags": ["FOO"]}, "unknown reservation flag"),
    ({"name": "a/b"}, "invalid reservation name"),
    ({"colour": "red"}, "unknown field"),
    ([], "expected a JSON object"),
])
def test_the_message_refuses_bad_fields(body: object, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        ReservationRequest.parse(body)


def test_the_message_round_trips() -> None:
    asked = ReservationRequest.parse({
        "name": "ml", "start": "2026-12-01T08:00:00+01:00", "duration": 3600,
        "gpus": 8, "partition": "gpu", "accounts": ["ml"], "flags": ["daily"]})
    assert asked.start == datetime.fromisoformat("2026-12-01T07:00:00+00:00").timestamp()
    assert asked.flags == frozenset({"DAILY"})
    assert ReservationRequest.parse(asked.to_json()) == asked


def test_galloc_and_gsrun_ask_for_the_reservation() -> None:
    from gpusched.cli import galloc
    from gpusched.cli.allocation import allocation_body
    from gpusched.cli.gsrunalloc import allocation_options, refuse_allocation_options
    from gpusched.cli.gsrunargs import parse_args

    options, command = galloc.parse_args(["--reservation", "team", "-G", "1", "true"])
    assert command == ["true"]
    assert allocation_body(options, "x", "/tmp", {})["reservation"] == "team"
    args = parse_args(["--reservation=team", "true"])
    assert allocation_body(allocation_options(args), "x", "/tmp", {})["reservation"] == "team"
    refusal = refuse_allocation_options(args)  # inside a job the allocation exists
    assert refusal is not None and "--reservation" in refusal
    plain = allocation_body(allocation_options(parse_args(["true"])), "x", "/tmp", {})
    assert plain["reservation"] is None
