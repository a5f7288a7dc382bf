"""What ``gqueue`` does with its parsed options, kept free of typer: the typer command
(gpusched.cli.gqueue) and the quick path of its common command lines
(gpusched.cli.console) both end here."""

from __future__ import annotations

import sys
import time

from gpusched.cli.listing import (
    START_FIELDS,
    TABLE_FIELDS,
    jobs_path,
    parse_states,
    show,
)
from gpusched.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# The input variables: parameter -> GQUEUE_NAME (else SQUEUE_NAME), as squeue reads its
# SQUEUE_* variables; the command line wins.
INPUT_VARIABLES = {
    "": "GQUEUE SQUEUE", "fmt": "FORMAT", "long_format": "FORMAT2", "sort": "SORT",
    "account": "ACCOUNT", "name": "NAMES", "partition": "PARTITION", "qos": "QOS",
    "states": "STATES", "user": "USERS", "licenses": "LICENSES",
}


def run_gqueue(*, as_json: bool, user: str | None, states: str | None, show_all: bool,
               noheader: bool, start: bool, explain: int | None, me: bool,
               partition: str | None, job_list: str | None, account: str | None,
               name: str | None, fmt: str | None, iterate: int | None,
               array: bool = False, clusters: str | None = None,
               long_format: str | None = None, licenses: str | None = None,
               long: bool = False, qos: str | None = None, sort: str | None = None,
               verbose: bool = False, nodelist: str | None = None,
               steps: bool = False, reservation: str | None = None) -> None:
    """List the queue as gqueue's options say (the parameters are its typer ones)."""
    if explain is not None:
        from gpusched.client import ApiClient

        with ApiClient() as client:
            answer = client.request("GET", f"/v1/jobs/{explain}/explain")
        import json

        from gpusched.cli.explaintext import explain_lines

        print(json.dumps(answer, indent=2) if as_json else "\n".join(explain_lines(answer)))
        return
    import os

    # The input variables are read only when some is set (a bare gqueue loads nothing
    # more for them).
    if any(key.startswith(("GQUEUE_", "SQUEUE_")) or key == "SLURM_CLUSTERS"
           for key in os.environ) or clusters is not None:
        from gpusched.cli.slurmflags import check_clusters, from_environment

        given = {"user": user, "states": states, "partition": partition, "account": account,
                 "name": name, "fmt": fmt, "long_format": long_format, "sort": sort,
                 "qos": qos, "licenses": licenses}
        if fmt is not None or long_format is not None or long or as_json or start:
            given["fmt"] = given["long_format"] = ""  # a format given: the variables' unread
        found = from_environment(given, INPUT_VARIABLES)
        user, states = found.get("user", user), found.get("states", states)
        partition, account = found.get("partition", partition), found.get("account", account)
        name, fmt = found.get("name", name), found.get("fmt", fmt)
        long_format, sort = found.get("long_format", long_format), found.get("sort", sort)
        qos, licenses = found.get("qos", qos), found.get("licenses", licenses)
        array = array or bool(_variable("ARRAY"))
        check_clusters(clusters if clusters is not None else _variable("CLUSTERS", "SLURM"))
    if user is not None and any(char.isdigit() for char in user):
        from gpusched.cli.slurmflags import user_names

        user = user_names(user)  # uids as names, as squeue -u takes them
    if me:
        from gpusched.cli.output import only_me

        user = only_me(user)
    ids = job_ids(job_list) if job_list is not None else None
    wanted_states = ["PENDING"] if start else parse_states(states)
    if steps:
        from gpusched.cli.queueviews import show_steps

        show_steps(jobs_path(user=user, states=["RUNNING"], show_all=False, ids=ids,
                             partition=partition, account=account, name=name),
                   noheader, verbose)
        return
    if sum(x is not None for x in (fmt, long_format)) + long > 1:
        raise UsageError("choose one of -o/--format, -O/--Format and -l/--long")
    if array or long_format is not None or long or qos or sort or nodelist or licenses \
            or verbose or reservation or (fmt is not None and any(
                code in fmt for code in ("E", "p", "Q"))):
        from gpusched.cli.queueviews import View, show_view

        view = View(as_json=as_json, start=start, noheader=noheader, fmt=fmt,
                    long_format=long_format, long=long, sort=sort, array=array, qos=qos,
                    nodelist=nodelist, licenses=licenses, verbose=verbose,
                    reservation=reservation)
        path_of = view.path_maker(user=user, states=wanted_states, show_all=show_all, ids=ids,
                                  partition=partition, account=account, name=name)
        _repeat(lambda: show_view(view, path_of), iterate)
        return
    fields: list[Any] | None = None  # queueformat.Field
    if fmt is not None:
        from gpusched.cli.queueformat import parse_format

        fields = parse_format(fmt)
    wanted = None
    if not as_json:
        from gpusched.cli import listing

        wanted = (listing.format_fields(fields) if fields is not None
                  else START_FIELDS if start else TABLE_FIELDS)
    path = jobs_path(user=user, states=wanted_states, show_all=show_all, ids=ids,
                     partition=partition, account=account, name=name, fields=wanted)
    _repeat(lambda: show(path, as_json, start, noheader, fields), iterate)


def _variable(suffix: str, slurm: str = "SQUEUE") -> str | None:
    """``GQUEUE_SUFFIX``, else ``SQUEUE_SUFFIX`` (``slurm``'s prefix), when set and not
    empty."""
    import os

    value = os.environ.get(f"GQUEUE_{suffix}") or os.environ.get(f"{slurm}_{suffix}")
    return value if value and value.strip() else None


def _repeat(once: Any, iterate: int | None) -> None:
    """Run ``once``, and with --iterate again every ``iterate`` seconds."""
    while True:
        once()
        if iterate is None:
            return
        sys.stdout.flush()
        time.sleep(iterate)
        print()


def job_ids(text: str) -> list[str]:
    """The ids of ``--jobs``, comma separated: job ids and array task ids (``12_3``)."""
    from gpusched.core.bounds import parse_job_ref

    ids = []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        if len(word) > 26 or parse_job_ref(word) is None:
            raise UsageError(f"invalid --jobs {word[:32]!r}: a job id is a positive integer, "
                             "an array task id such as 12_3")
        ids.append(word)
    if not ids:
        raise UsageError("--jobs: give at least one job id")
    return ids
