"""``gcontrol create|update|delete|show reservation`` and ``ginfo -T``: advance
reservations with scontrol's KEY=VALUE settings and sinfo -T's table.

Settings: ReservationName=, StartTime= (now, now+N[units], YYYY-MM-DD[THH:MM[:SS]],
HH:MM[:SS]), EndTime=, Duration= (minutes, [D-]HH:MM[:SS], UNLIMITED), Nodes= (a host
list, or ALL), NodeCnt=, TRES=gres/gpu=N (or GPUs=N), PartitionName=, Users=, Accounts=
(names, or -names: all but them; on update also Users+= and Users-=), Flags= (MAINT,
IGNORE_JOBS, DAILY, WEEKLY, FLEX, OVERLAP; on update also Flags+= and Flags-=).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Optional

import typer

from gpusched.cli.common import new_app
from gpusched.core.hostlist import HostlistError, expand_hostlist
from gpusched.core.terminal import terminal_safe
from gpusched.core.timefmt import (
    TimeFormatError,
    format_duration,
    parse_begin,
    parse_time_limit,
)
from gpusched.errors import UsageError

NAME_KEYS = ("reservationname", "reservation", "resvname")
_KEYS = {
    "starttime": "start", "endtime": "end", "duration": "duration", "nodes": "nodes",
    "nodelist": "nodes", "nodecnt": "node_count", "nodecount": "node_count",
    "tres": "gpus", "gpus": "gpus", "partitionname": "partition", "partition": "partition",
    "users": "users", "accounts": "accounts", "flags": "flags",
}
_LISTS = ("users", "accounts", "flags")
KNOWN = ("ReservationName, StartTime, EndTime, Duration, Nodes, NodeCnt, TRES=gres/gpu=N, "
         "PartitionName, Users, Accounts, Flags")
_YEAR = 365 * 86_400


def _shown(text: str) -> str:
    return text if len(text) <= 60 else text[:60] + "..."


def _when(key: str, value: str) -> str:
    try:
        return parse_begin(value, datetime.now().astimezone()).isoformat()
    except TimeFormatError as exc:
        raise UsageError(str(exc).replace("--begin", key)) from None


def _count(key: str, value: str) -> int:
    if not value.isascii() or not value.isdigit() or len(value) > 9 or int(value) < 1:
        raise UsageError(f"invalid {key} {_shown(value)!r}: expected a count of 1 or more")
    return int(value)


def _gpus(key: str, value: str) -> int:
    if key.lower() == "tres":
        kind, sep, count = value.replace(":", "=").partition("=")
        if kind.lower() != "gres/gpu" or not sep:
            raise UsageError(f"invalid TRES {_shown(value)!r}: expected gres/gpu=N "
                             "(only GPUs are reserved by count here)")
        value = count
    return _count(key, value)


def _duration(value: str) -> int:
    if value.strip().upper() in ("UNLIMITED", "INFINITE"):
        return _YEAR
    try:
        seconds = parse_time_limit(value)
    except TimeFormatError as exc:
        raise UsageError(str(exc).replace("invalid time", "invalid Duration")) from None
    if seconds is None or seconds < 1:
        raise UsageError(f"invalid Duration {_shown(value)!r}: expected minutes, "
                         "[D-]HH:MM[:SS] or UNLIMITED")
    return seconds


def _nodes(value: str) -> list[str]:
    if value.strip().upper() == "ALL":
        return ["ALL"]
    try:
        names = expand_hostlist(value)
    except HostlistError as exc:
        raise UsageError(f"invalid Nodes {_shown(value)!r}: {exc}") from None
    if not names:
        raise UsageError("invalid Nodes '': expected a host list such as gpu[01-04]")
    return names


def _value(name: str, key: str, value: str) -> Any:
    if name in ("start", "end"):
        return _when(key, value)
    if name == "duration":
        return _duration(value)
    if name == "nodes":
        return _nodes(value)
    if name == "node_count":
        return _count(key, value)
    if name == "gpus":
        return _gpus(key, value)
    if name in _LISTS:
        listed = [v.strip() for v in value.split(",") if v.strip()]
        return [v.upper() for v in listed] if name == "flags" else listed
    return value


def parse_settings(settings: Sequence[str], current: dict[str, Any] | None = None
                   ) -> dict[str, Any]:
    """scontrol's KEY=VALUE settings as the API's body (a key given twice: the last
    wins). ``current``: the reservation being updated, for ``Users+=`` and the like."""
    body: dict[str, Any] = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        key = key.strip()
        change = key[-1:] if key[-1:] in "+-" and key[-1:] else ""
        bare = key[:-1] if change else key
        if bare.lower() in NAME_KEYS and not change:
            body["name"] = value.strip()
            continue
        name = _KEYS.get(bare.lower())
        if not sep or name is None or not value.strip() or (change and name not in _LISTS):
            raise UsageError(f"invalid setting {_shown(setting)!r}: expected {KNOWN} with a "
                             "value")
        given = _value(name, bare, value.strip())
        if change:
            if current is None:
                raise UsageError(f"invalid setting {_shown(setting)!r}: {bare}{change}= only "
                                 "changes an existing reservation")
            had = list(body.get(name, current.get(name) or []))
            given = (had + [v for v in given if v not in had] if change == "+"
                     else [v for v in had if v not in given])
        body[name] = given
    return body


def name_argv(args: list[str]) -> list[str]:
    """scontrol's ``create|update|delete ReservationName=x ...`` (and ``show
    ReservationName=x``) as ``VERB reservation ...``."""
    if len(args) >= 2 and args[0] in ("create", "update", "delete", "show"):
        key = args[1].partition("=")[0].strip().lower()
        if key in NAME_KEYS and "=" in args[1]:
            return [args[0], "reservation", *args[1:]]
    if len(args) >= 2 and args[0] in ("create", "update", "delete", "show") \
            and args[1].lower() in ("res", "reservations", "reservation"):
        return [args[0], "reservation", *args[2:]]  # scontrol takes these abbreviations
    return args


def _request(method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    from gpusched.client import ApiClient

    with ApiClient() as client:
        return client.request(method, path, body)


def _name_of(settings: list[str], given: str | None) -> tuple[str, list[str]]:
    """The reservation named by the argument or a ReservationName= setting."""
    rest = []
    name = given
    for setting in settings:
        key, sep, value = setting.partition("=")
        if sep and key.strip().lower() in NAME_KEYS:
            name = value.strip()
        else:
            rest.append(setting)
    if not name:
        raise UsageError("name the reservation: ReservationName=NAME")
    if "/" in name or "?" in name or len(name) > 64:
        raise UsageError(f"invalid reservation name {_shown(name)!r}")
    return name, rest


def _times(resv: dict[str, Any]) -> tuple[str, str]:
    def local(text: str) -> str:
        return datetime.fromisoformat(text).astimezone().strftime("%Y-%m-%dT%H:%M:%S")
    return local(resv["start"]), local(resv["end"])


def show_lines(resv: dict[str, Any]) -> list[str]:
    """A reservation as scontrol show reservation prints it."""
    start, end = _times(resv)
    gpus = resv.get("gpus") or {}
    tres = (f"gres/gpu={sum(gpus.values())}" if gpus else "(null)")
    lines = [
        f"ReservationName={resv['name']} StartTime={start} EndTime={end} "
        f"Duration={format_duration(resv['duration'])}",
        f"   Nodes={resv['node_list']} NodeCnt={resv['node_count']} "
        f"Flags={','.join(resv['flags']) or '(null)'}",
        f"   TRES={tres} Users={','.join(resv['users']) or '(null)'} "
        f"Accounts={','.join(resv['accounts']) or '(null)'} State={resv['state']}",
    ]
    if gpus:
        lines.append("   GPUs=" + ",".join(f"{n}:{c}" for n, c in gpus.items()))
    return [terminal_safe(line) for line in lines]


def table_lines(found: list[dict[str, Any]]) -> list[str]:
    """sinfo -T's table: name, state, start, end, duration, nodes."""
    rows = [("RESV_NAME", "STATE", "START_TIME", "END_TIME", "DURATION", "NODELIST")]
    for resv in found:
        start, end = _times(resv)
        rows.append((resv["name"], resv["state"], start, end,
                     format_duration(resv["duration"]), resv["node_list"]))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return [terminal_safe("  ".join(c.rjust(w) if i == 0 else c.ljust(w)
                                    for i, (c, w) in enumerate(zip(r[:5], widths)))
                          + "  " + r[5]) for r in rows]


def print_reservations(as_json: bool = False) -> None:
    """ginfo -T: every reservation that is not over, as a table (or JSON)."""
    found = _request("GET", "/v1/reservations")["reservations"]
    if as_json:
        typer.echo(json.dumps({"reservations": found}, indent=2))
        return
    if not found:
        typer.echo("No reservations in the system")
        return
    for line in table_lines(found):
        typer.echo(line)


Settings = Annotated[list[str], typer.Argument(metavar="KEY=VALUE...", show_default=False,
                                               help=KNOWN)]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead.")]


def register(app: typer.Typer, update_app: typer.Typer, show_app: typer.Typer) -> None:
    """Add the reservation commands to gcontrol."""
    create_app = new_app("Create an advance reservation (administrators), like scontrol create.")
    delete_app = new_app("Delete an advance reservation (administrators), like scontrol delete.")
    app.add_typer(create_app, name="create")
    app.add_typer(delete_app, name="delete")

    @create_app.command("reservation")
    def create_reservation(settings: Settings) -> None:
        """Reserve nodes (or GPUs) from a start for a duration, for users or accounts.

        Examples: gcontrol create reservation ReservationName=maint StartTime=now+1hour
        Duration=2:00:00 Nodes=ALL Users=root Flags=MAINT,IGNORE_JOBS; gcontrol create
        ReservationName=ml StartTime=2026-12-01T09:00 Duration=8:00:00 TRES=gres/gpu=8
        PartitionName=gpu Accounts=ml Flags=DAILY
        """
        body = parse_settings(settings)
        if "name" not in body:
            raise UsageError("name the reservation: ReservationName=NAME")
        made = _request("POST", "/v1/reservations", body)
        typer.echo(terminal_safe(f"Reservation created: {made['name']}"))

    @update_app.command("reservation")
    def update_reservation(settings: Settings) -> None:
        """Change a reservation's times, nodes, users, accounts or flags.

        Examples: gcontrol update ReservationName=maint Duration=3:00:00; gcontrol update
        reservation ReservationName=ml Users+=bob Flags-=DAILY
        """
        name, rest = _name_of(settings, None)
        if not rest:
            raise UsageError(f"nothing to change: give some of {KNOWN}")
        current = _request("GET", f"/v1/reservations/{name}")
        body = parse_settings(rest, current)
        _request("PATCH", f"/v1/reservations/{name}", body)
        typer.echo(terminal_safe(f"Reservation updated: {name}"))

    @delete_app.command("reservation")
    def delete_reservation(settings: Annotated[list[str], typer.Argument(
            metavar="NAME", help="The reservation, or ReservationName=NAME.")]) -> None:
        """Delete a reservation no pending or running job asks for.

        Examples: gcontrol delete reservation maint; gcontrol delete ReservationName=maint
        """
        given = settings[0] if settings and "=" not in settings[0] else None
        name, rest = _name_of(settings[1:] if given else settings, given)
        if rest:
            raise UsageError(f"unexpected {_shown(rest[0])!r}: delete takes only the name")
        _request("DELETE", f"/v1/reservations/{name}")
        typer.echo(terminal_safe(f"Reservation deleted: {name}"))

    @show_app.command("reservation")
    def show_reservation(name: Annotated[Optional[str], typer.Argument(
            metavar="[NAME]")] = None, as_json: AsJson = False) -> None:
        """One reservation (or every one that is not over), as scontrol shows it.

        Examples: gcontrol show reservation; gcontrol show reservation maint --json
        """
        if name is not None and "=" in name:
            name = _name_of([name], None)[0]
        found = ([_request("GET", f"/v1/reservations/{name}")] if name is not None
                 else _request("GET", "/v1/reservations")["reservations"])
        if as_json:
            typer.echo(json.dumps(found if name is None else found[0], indent=2))
            return
        if not found:
            typer.echo("No reservations in the system")
        for resv in found:
            for line in show_lines(resv):
                typer.echo(line)
