"""What ``gqueue`` does with its parsed options, kept free of typer: the typer command
(gpusched.cli.gqueue) and the quick path of its common command lines
(gpusched.cli.console) both end here."""

from __future__ import annotations

import sys
import time

from gpusched.cli.listing import (
    START_FIELDS,
    TABLE_FIELDS,
    format_fields,
    jobs_path,
    parse_format,
    parse_states,
    show,
)
from gpusched.errors import UsageError


def run_gqueue(*, as_json: bool, user: str | None, states: str | None, show_all: bool,
               noheader: bool, start: bool, explain: int | None, me: bool,
               partition: str | None, job_list: str | None, account: str | None,
               name: str | None, fmt: str | None, iterate: int | None) -> None:
    """List the queue as gqueue's options say (the parameters are its typer ones)."""
    if explain is not None:
        from gpusched.client import ApiClient

        with ApiClient() as client:
            answer = client.request("GET", f"/v1/jobs/{explain}/explain")
        import json

        from gpusched.cli.explaintext import explain_lines

        print(json.dumps(answer, indent=2) if as_json else "\n".join(explain_lines(answer)))
        return
    if me:
        from gpusched.cli.output import only_me

        user = only_me(user)
    fields = parse_format(fmt) if fmt is not None else None
    ids = job_ids(job_list) if job_list is not None else None
    wanted = None if as_json else (
        format_fields(fields) if fields is not None else START_FIELDS if start else TABLE_FIELDS)
    path = jobs_path(user=user, states=["PENDING"] if start else parse_states(states),
                     show_all=show_all, ids=ids, partition=partition, account=account,
                     name=name, fields=wanted)
    while True:
        show(path, as_json, start, noheader, fields)
        if iterate is None:
            return
        sys.stdout.flush()
        time.sleep(iterate)
        print()


def job_ids(text: str) -> list[int]:
    """The ids of ``--jobs``: positive integers, comma separated."""
    ids = []
    for word in (w.strip() for w in text.split(",") if w.strip()):
        if not (word.isascii() and word.isdigit() and len(word) <= 18) or int(word) <= 0:
            raise UsageError(f"invalid --jobs {word[:32]!r}: a job id is a positive integer")
        ids.append(int(word))
    if not ids:
        raise UsageError("--jobs: give at least one job id")
    return ids
