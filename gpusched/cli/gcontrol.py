"""gcontrol: show and change jobs, nodes and GPUs, like scontrol."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Annotated, Any, Optional

import typer

from gpusched.cli.common import new_app, run_cli
from gpusched.cli.jobcontrol import (
    job_refs,
    one_job,
    post_each,
    resume_argv,
    update_argv,
    update_body,
)
from gpusched.cli.reservations import name_argv, register
from gpusched.core.terminal import terminal_safe
from gpusched.errors import NotFound, UsageError

PROG = "gcontrol"

app = new_app("Show and change gpusched jobs, nodes and GPUs, like scontrol.")
JobIds = Annotated[list[str], typer.Argument(
    metavar="JOB...", show_default=False,
    help="Job ids: 17, an array task 12_3, or lists such as 17,18.")]
GpuTarget = Annotated[str, typer.Argument(
    metavar="NODE:INDEX", help="A GPU (or MIG slice) by node and index, as 'gpusched agent "
    "inventory' and 'ginfo -N' show it.")]
Reason = Annotated[Optional[str], typer.Option("--reason", help="Why (required to drain).")]


@app.command()
def hold(job_ids: JobIds) -> int:
    """Keep pending jobs from starting (an administrator's hold needs an administrator to release).

    Examples: gcontrol hold 17; gcontrol hold 17 18 19; gcontrol hold 12_3
    """
    return post_each(PROG, job_refs(job_ids), "hold")


@app.command()
def release(job_ids: JobIds) -> int:
    """Let held jobs start again.

    Example: gcontrol release 17 18
    """
    return post_each(PROG, job_refs(job_ids), "release")


@app.command()
def requeue(job_ids: JobIds) -> int:
    """Stop running jobs (or take ended batch jobs) and put them back in the queue,
    keeping their submit time.

    Example: gcontrol requeue 17
    """
    return post_each(PROG, job_refs(job_ids), "requeue")


@app.command()
def requeuehold(job_ids: JobIds) -> int:
    """Put running or ended jobs back in the queue as requeue does, held until 'gcontrol
    release' (scontrol requeuehold; State=SpecialExit is refused).

    Example: gcontrol requeuehold 17
    """
    from gpusched.cli.cancelling import post_refs

    if any(word.lower().startswith("state=") for word in job_ids):
        raise UsageError("State=SpecialExit: not supported: there is no SPECIAL_EXIT state here")
    return post_refs(PROG, [ref.text() for ref in job_refs(job_ids)], "requeue", {"hold": True})


@app.command()
def suspend(job_ids: JobIds) -> int:
    """Stop running jobs, every process on every node, keeping their GPUs (administrators;
    their time limit and run time stop counting).

    Examples: gcontrol suspend 17; gcontrol suspend 12_3
    """
    return post_each(PROG, job_refs(job_ids), "suspend")


@app.command()
def top(job_ids: JobIds) -> int:
    """Move your pending jobs ahead of your other pending jobs of the same partition,
    account and QOS, the first named first (other users' jobs keep their places).

    Examples: gcontrol top 17; gcontrol top 19,18
    """
    # Each job sent goes ahead of those sent before it: the first named is sent last.
    return post_each(PROG, list(reversed(job_refs(job_ids))), "top")


update_app = new_app("Change a job, like scontrol update.")
app.add_typer(update_app, name="update")


@update_app.command("job")
def update_job(job: Annotated[str, typer.Argument(metavar="JOB")],
               settings: Annotated[list[str], typer.Argument(
                   metavar="KEY=VALUE...", help="TimeLimit=, Partition=, QOS=, NumNodes=, "
                   "Gres=gpu:N, Dependency=, JobName=, Nice=, Priority=")]
               ) -> None:
    """Change a job, as scontrol update does. Of a pending job its owner may change
    Partition, QOS, NumNodes (MinNodes), Gres=gpu:N (GPUs per node; also TresPerNode=
    gres/gpu:N), Dependency (empty: none), JobName and a positive Nice (Nice alone: 100)
    and lower TimeLimit; of a running job lower TimeLimit and JobName. An administrator
    may also raise TimeLimit, give a negative Nice and set Priority (a number that
    replaces the computed one; Priority=none goes back to it).

    Examples: gcontrol update job 17 TimeLimit=2:00:00; gcontrol update JobId=18
    Partition=big NumNodes=2 Gres=gpu:4; gcontrol update job 12_3 Dependency=afterok:11
    """
    ref = one_job(job)
    body = update_body(settings)
    answer = _request("POST", f"/v1/jobs/{ref.text()}/update", body)
    fixed = answer.get("admin_priority")
    limit = answer["time_limit"]
    _echo(f"job {ref.text()}: partition {answer['partition']}, QOS {answer['qos'] or '-'}, "
          f"time limit {limit if limit is not None else 'UNLIMITED'} s, "
          f"{answer['nodes']} node(s), {answer['gpus']} GPU(s), name {answer['name']}"
          + (f", dependency {answer['dependency']}" if answer.get("dependency") else "")
          + (f", priority {fixed:g}" if fixed is not None else ""))


@update_app.command("node")
def update_node(nodes: Annotated[str, typer.Argument(metavar="NODES")],
                settings: Annotated[list[str], typer.Argument(
                    metavar="KEY=VALUE...", help="State=DRAIN Reason=TEXT, or State=RESUME")]
                ) -> int:
    """Drain nodes (State=DRAIN Reason=TEXT) or return them to service (State=RESUME,
    IDLE or UNDRAIN), as scontrol update NodeName=... does (administrators only).

    Examples: gcontrol update node node[01-04] State=DRAIN Reason='bad fan';
    gcontrol update NodeName=node01 State=RESUME
    """
    from gpusched.cli.nodecontrol import node_changes
    from gpusched.cli.output import print_error
    from gpusched.errors import GpuschedError, Unavailable

    worst = 0
    for path, body in node_changes(nodes, settings):  # each node; failures reported
        try:
            answer = _request("POST", path, body)
        except Unavailable:
            raise
        except GpuschedError as err:
            print_error(PROG, err.message)
            worst = max(worst, err.exit_code)
            continue
        _echo(f"node {answer['node']} " + (f"drained: {answer['reason']}" if body
                                           else f"is {answer['state']}"))
    return worst


def _echo(line: str) -> None:
    """Print a line that holds stored values, escaped (see gpusched.core.terminal)."""
    typer.echo(terminal_safe(line))


# -- show ------------------------------------------------------------------------------

show_app = new_app("Show a job, node, partition or GPU as KEY=VALUE lines, like scontrol show.")
app.add_typer(show_app, name="show")
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead.")]


def _print(record: dict[str, Any], as_json: bool) -> None:
    """KEY=VALUE pairs, a few to a line, lines after the first indented (scontrol's
    layout), every pair escaped; or JSON (whose escapes keep it exact)."""
    if as_json:
        typer.echo(json.dumps(record, indent=2))
        return
    line = ""
    first = True
    for key, value in record.items():
        pair = terminal_safe(f"{_key(key)}={_value(value)}")
        if line and len(line) + 1 + len(pair) > 78:
            typer.echo(line)
            line, first = "", False
        line = (line + " " if line else ("" if first else "   ")) + pair
    if line:
        typer.echo(line)


def _key(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _value(value: Any) -> str:
    if value is None:
        return "(null)"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "(null)"
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items()) or "(null)"
    return str(value)


def _request(method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    from gpusched.client import ApiClient

    with ApiClient() as client:
        return client.request(method, path, body)


@show_app.command("job")
def show_job(job: Annotated[str, typer.Argument(metavar="JOB")], as_json: AsJson = False) -> None:
    """One job: state, reason, resources, times, GPUs, utilisation.

    Examples: gcontrol show job 17; gcontrol show job 12_3; gcontrol show job 17 --json
    """
    record = _request("GET", f"/v1/jobs/{one_job(job).text()}")
    for private in ("script", "environment", "args"):
        record.pop(private, None)
    _print(record, as_json)


@show_app.command("node")
def show_node(name: Annotated[Optional[str], typer.Argument(metavar="[NODE]")] = None,
              as_json: AsJson = False) -> None:
    """One node (or every node) with each GPU's health, sample and job.

    Examples: gcontrol show node; gcontrol show node node01 --json
    """
    nodes = _request("GET", "/v1/nodes")["nodes"]
    chosen = [n for n in nodes if name is None or n["name"] == name]
    if not chosen:
        raise NotFound(f"node {name} not found")
    for node in chosen:
        gpus = node.pop("gpus")
        _print(node, as_json)
        for gpu in gpus:
            _print({"gpu": gpu["index"], **{k: v for k, v in gpu.items() if k != "index"}}, as_json)


@show_app.command("partition")
def show_partition(name: Annotated[Optional[str], typer.Argument(metavar="[PARTITION]")] = None,
                   as_json: AsJson = False) -> None:
    """One partition (or every partition) with its nodes and limits.

    Examples: gcontrol show partition; gcontrol show partition gpu
    """
    parts = _request("GET", "/v1/partitions")["partitions"]
    chosen = [p for p in parts if name is None or p["name"] == name]
    if not chosen:
        raise NotFound(f"partition {name} not found")
    for part in chosen:
        _print(part, as_json)


@show_app.command("licenses")
def show_licenses(name: Annotated[Optional[str], typer.Argument(metavar="[LICENSE]")] = None,
                  as_json: AsJson = False) -> None:
    """Each license of the cluster (or one): total, used by running jobs, free.

    Examples: gcontrol show licenses; gcontrol show licenses matlab --json
    """
    found = _request("GET", "/v1/licenses")["licenses"]
    chosen = [lic for lic in found if name is None or lic["name"] == name]
    if name is not None and not chosen:
        raise NotFound(f"license {name} not found")
    if not found and not as_json:
        typer.echo("No licenses are configured.")
    for lic in chosen:
        _print({"license_name": lic["name"], "total": lic["total"], "used": lic["used"],
                "free": lic["free"]}, as_json)


@show_app.command("gpu")
def show_gpu(target: GpuTarget, as_json: AsJson = False) -> None:
    """One GPU or MIG slice: type, health and why, last sample, the job on it.

    Examples: gcontrol show gpu node01:3; gcontrol show gpu node01:101 --json
    """
    node_name, index = _gpu_target(target)
    for node in _request("GET", "/v1/nodes")["nodes"]:
        if node["name"] == node_name:
            for gpu in node["gpus"]:
                if gpu["index"] == index:
                    _print({"node": node_name, **gpu}, as_json)
                    return
    raise NotFound(f"node {node_name} has no GPU with index {index}")


# -- drain and resume (administrators) ----------------------------------------------

drain_app = new_app("Take a node or GPU out of service (administrators only).")
app.add_typer(drain_app, name="drain")
resume_app = new_app("Resume suspended jobs (gcontrol resume 17), or return a node or GPU "
                     "to service (administrators only).")
app.add_typer(resume_app, name="resume")


@resume_app.command("job")
def resume_job(job_ids: JobIds) -> int:
    """Let suspended jobs run again (administrators); 'gcontrol resume 17' says the same.

    Examples: gcontrol resume 17; gcontrol resume job 12_3
    """
    return post_each(PROG, job_refs(job_ids), "resume")


def _gpu_target(target: str) -> tuple[str, int]:
    node, sep, index = target.rpartition(":")
    if not sep or not node or not (index.isascii() and index.isdigit()):
        raise UsageError(f"invalid GPU {target!r}: expected NODE:INDEX, such as node01:3")
    return node, int(index)


def _need_reason(reason: str | None) -> str:
    if reason is None or not reason.strip():
        raise UsageError("drain needs --reason TEXT (why it is out of service)")
    return reason


@drain_app.command("node")
def drain_node(name: Annotated[str, typer.Argument(metavar="NODE")], reason: Reason = None) -> None:
    """No new jobs on the node; running ones go on. Example: gcontrol drain node gpu07 --reason 'bad fan'"""
    answer = _request("POST", f"/v1/nodes/{name}/drain", {"reason": _need_reason(reason)})
    _echo(f"node {answer['node']} drained: {answer['reason']}")


@resume_app.command("node")
def resume_node(name: Annotated[str, typer.Argument(metavar="NODE")]) -> None:
    """Let a drained node take jobs again.

    Example: gcontrol resume node node01
    """
    answer = _request("POST", f"/v1/nodes/{name}/resume")
    _echo(f"node {answer['node']} is {answer['state']}")


@drain_app.command("gpu")
def drain_gpu(target: GpuTarget, reason: Reason = None) -> None:
    """Take a GPU (with its MIG slices) or one slice out of service; a job on it goes on.

    Example: gcontrol drain gpu node01:3 --reason 'ECC errors rising'
    """
    node, index = _gpu_target(target)
    answer = _request("POST", "/v1/gpus/drain",
                      {"node": node, "index": index, "reason": _need_reason(reason)})
    _echo(f"GPU {node}:{index} ({answer['uuid']}) drained")


@resume_app.command("gpu")
def resume_gpu(target: GpuTarget) -> None:
    """Return a drained GPU, or one the health checks took out, to service.

    Example: gcontrol resume gpu node01:3
    """
    node, index = _gpu_target(target)
    answer = _request("POST", "/v1/gpus/resume", {"node": node, "index": index})
    _echo(f"GPU {node}:{index} ({answer['uuid']}) is back in service")


register(app, update_app, show_app)  # create|update|delete|show reservation


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gcontrol`` console script. scontrol's own forms are taken
    too: ``update JobId=17 KEY=VALUE...``, ``update NodeName=NODES KEY=VALUE...`` and
    ``resume 17`` (a job, not a node); scontrol's options and commands with no meaning
    here are refused naming them (gpusched.cli.slurmflags)."""
    import sys

    from gpusched.cli.nodecontrol import node_update_argv
    from gpusched.cli.output import print_error
    from gpusched.cli.slurmflags import check_argv, check_command

    try:
        checked = check_argv(PROG, list(sys.argv[1:] if argv is None else argv))
        if checked is not None:
            check_command(PROG, checked)
    except UsageError as err:
        print_error(PROG, err.message)
        return err.exit_code
    if checked is None:
        return 0
    return run_cli(app, PROG, resume_argv(update_argv(node_update_argv(name_argv(checked)))))
