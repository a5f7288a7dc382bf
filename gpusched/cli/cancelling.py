"""Acting on jobs by id, one request each (gcancel, gcontrol hold/release/requeue):
what the common ``gcancel ID...`` needs, without the command-line framework."""

from __future__ import annotations

import sys

from gpusched.cli.output import print_error
from gpusched.client import ApiClient
from gpusched.errors import GpuschedError, Unavailable, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any


def post_for_each(prog: str, targets: Sequence[tuple[int, str | None]], action: str,
                  body: dict[str, Any] | None = None, *, quiet: bool = False,
                  verbose: bool = False) -> int:
    """POST /v1/jobs/{id}/ACTION with ``body`` for each (job, tasks) (adding ``{"tasks":
    ...}`` for array tasks); report failures and go on; the worst exit code. Ids are parsed
    (and checked) before the first request is sent. ``quiet`` (scancel -Q): a job that
    cannot be acted on (ended, unknown, not yours) is neither reported nor counted, only
    a request refused as invalid; ``verbose``: each request said on stderr first."""
    worst = 0
    with ApiClient() as client:
        for job_id, tasks in targets:
            label = f"{job_id}_{tasks}" if tasks is not None else str(job_id)
            if verbose:
                print(f"{prog}: {action} job {label}", file=sys.stderr)
            try:
                sent = {**(body or {}), **({"tasks": tasks} if tasks is not None else {})}
                client.request("POST", f"/v1/jobs/{job_id}/{action}", sent or None)
            except Unavailable:
                raise  # the next ids would fail the same way; one line is enough
            except GpuschedError as err:
                if quiet and err.exit_code == 1:
                    continue
                print_error(prog, describe_failure(label, err.message))
                worst = max(worst, err.exit_code)
    return worst


def post_refs(prog: str, refs: Sequence[str], action: str, body: dict[str, Any]) -> int:
    """POST /v1/jobs/{ref}/ACTION with ``body`` for each job reference (``17``,
    ``12_3``); report failures and go on; the worst exit code."""
    worst = 0
    with ApiClient() as client:
        for ref in refs:
            try:
                client.request("POST", f"/v1/jobs/{ref}/{action}", body)
            except Unavailable:
                raise
            except GpuschedError as err:
                print_error(prog, describe_failure(ref, err.message))
                worst = max(worst, err.exit_code)
    return worst


def parse_job_ids(texts: Sequence[str]) -> list[int]:
    """Job ids as positive integers, duplicates dropped; any bad one is a usage error."""
    ids: list[int] = []
    for text in texts:
        stripped = text.strip()
        # isascii(): str.isdigit() also accepts digits like "²" that int() refuses.
        if not (stripped.isascii() and stripped.isdigit()) or int(stripped) <= 0:
            raise UsageError(f"invalid job id {text!r}: a job id is a positive integer")
        if int(stripped) not in ids:
            ids.append(int(stripped))
    return ids


def describe_failure(job_id: int | str, message: str) -> str:
    """The controller's message, naming the job unless the message already does."""
    label = str(job_id)
    at = message.find(label)
    while at >= 0:  # the id as a word of its own (not the 7 of 77)
        before, after = message[at - 1:at], message[at + len(label):at + len(label) + 1]
        if not _word(before) and not _word(after):
            return message
        at = message.find(label, at + 1)
    return f"job {job_id}: {message}"


def _word(char: str) -> bool:
    return char.isalnum() or char == "_"
