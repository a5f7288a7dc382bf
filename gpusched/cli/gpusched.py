"""``gpusched``: run the daemons, migrate the database, start a local cluster."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from gpusched.cli.auth import auth_app, authd
from gpusched.cli.common import new_app, run_cli
from gpusched.core.terminal import terminal_safe

app = new_app("gpusched: a batch scheduler for GPU clusters.")
db_app = new_app("Database schema management.")
app.add_typer(db_app, name="db")
admin_app = new_app("Cluster administration: partitions, accounts, QOS.")
app.add_typer(admin_app, name="admin")
app.add_typer(auth_app, name="auth")

ConfigOption = Annotated[
    Optional[Path],
    typer.Option("--config", "-c", help="Configuration file (default: $GPUSCHED_CONFIG or "
                 "/etc/gpusched/gpusched.toml)."),
]


JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _load(path: Path | None):  # type: ignore[no-untyped-def]
    from gpusched.config import load_config
    from gpusched.paths import default_config_path

    return load_config(path or default_config_path())


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    for noisy in ("apscheduler", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@app.command()
def controller(config: ConfigOption = None,
               verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    """Run the controller: the API and (when leader) the scheduling loop.

    Examples: gpusched controller --config /etc/gpusched/gpusched.toml; (as a service)
    systemctl start gpusched-controller
    """
    from gpusched.controller.main import Controller

    cfg = _load(config)
    _logging(verbose)
    Controller(cfg).serve_forever()


agent_app = new_app("The node agent.")
app.add_typer(agent_app, name="agent")
app.command("authd")(authd)


@agent_app.callback(invoke_without_command=True)
def agent(ctx: typer.Context, config: ConfigOption = None,
          verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False) -> None:
    """Run the node agent: register GPUs, launch and supervise jobs.

    'gpusched agent inventory' prints what it would register.
    """
    if ctx.invoked_subcommand is not None:
        ctx.obj = config
        return
    from gpusched.agent.main import Agent

    cfg = _load(config)
    _logging(verbose)
    node_agent = Agent(cfg, cfg.controller.socket)
    node_agent.install_signal_handlers()
    node_agent.run()


@agent_app.command("inventory")
def agent_inventory(ctx: typer.Context, config: ConfigOption = None,
                    as_json: JsonOption = False) -> None:
    """The GPUs, MIG slices and links this node's agent would register (like slurmd -G).

    GPUs come from NVML, or from the static inventory in the configuration (see
    [agent.gpus] source). The JSON shape is in docs/admin.md, "Node inventory".

    Examples: gpusched agent inventory; gpusched agent inventory --json
    """
    from gpusched.agent.inventory import node_inventory
    from gpusched.cli.output import print_table

    body = node_inventory(_load(config or ctx.obj).agent)
    if as_json:
        _print_json(body)
        return
    typer.echo(terminal_safe(
        f"node {body['node']}: {len(body['gpus'])} GPUs and MIG slices from {body['source']}"
        + (f" (driver {body['driver']})" if body["driver"] else "")
        + f", {body['cpus']} CPUs, {body['memory_mb']} MiB"))
    rows = [[str(g["index"]), g["uuid"], g["type"], g["mig_profile"] or "",
             "" if g["parent"] is None else str(g["parent"]), str(g["memory_mb"]),
             g["pci_bus_id"], g["name"]] for g in body["gpus"]]
    print_table(["INDEX", "UUID", "TYPE", "MIG", "PARENT", "MEMORY_MB", "PCI_BUS_ID", "NAME"],
                rows, right_aligned=frozenset({0, 5}), shrinkable=frozenset({7}))
    for link in body["links"]:
        typer.echo(terminal_safe(f"link {link['a']}-{link['b']}: {link['kind']}"
                                 + (f" x{link['nvlinks']}" if link["nvlinks"] else "")))


@db_app.command("upgrade")
def db_upgrade(
    config: ConfigOption = None,
    database_url: Annotated[Optional[str], typer.Option(help="Overrides the config's URL.")] = None,
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
) -> None:
    """Migrate the database schema (Alembic) up to REVISION.

    Examples: gpusched db upgrade; gpusched db upgrade --config /etc/gpusched/gpusched.toml
    """
    from gpusched.db.migrate import current, upgrade

    url = database_url or _load(config).database_url
    upgrade(url, revision)
    typer.echo(f"database at revision {current(url)}")


@db_app.command("current")
def db_current(
    config: ConfigOption = None,
    database_url: Annotated[Optional[str], typer.Option(help="Overrides the config's URL.")] = None,
) -> None:
    """Print the database's schema revision.

    Example: gpusched db current
    """
    from gpusched.db.migrate import current

    typer.echo(current(database_url or _load(config).database_url) or "none (run 'gpusched db upgrade')")


@app.command()
def up(
    gpus: Annotated[int, typer.Option(min=0, max=64, help="Demo GPUs for each agent when no NVML GPU is present.")] = 4,
    nodes: Annotated[int, typer.Option(min=1, max=64, help="Agents to run, each a node of its own (node1, node2, ...).")] = 1,
    database_url: Annotated[Optional[str], typer.Option(help="Use this PostgreSQL instead of an embedded one.")] = None,
    foreground: Annotated[bool, typer.Option("--foreground", help="Stay attached; Ctrl-C stops the cluster.")] = False,
    demo: Annotated[bool, typer.Option("--demo", help="Made-up demo GPUs even where NVML finds real ones.")] = False,
) -> None:
    """Start a complete local cluster (PostgreSQL, controller, agents) and return when ready.

    The agent uses this host's GPUs when NVML finds some, else --gpus demo GPUs.

    Examples: gpusched up; gpusched up && gpusched demo; gpusched up --demo --nodes 4 --gpus 4
    """
    import signal
    import threading

    from gpusched import local

    stop = threading.Event()
    if foreground:
        # A flag, not a blocked mask: the daemons started below must not inherit a mask,
        # and a Ctrl-C during start-up still ends in an orderly 'down'.
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
    cluster = local.up(gpus, database_url, typer.echo, nodes, demo)
    typer.echo(f"gpusched is up: state in {cluster.state_dir}, logs in {cluster.logs}")
    typer.echo("Submit a first job:  gsubmit --gpus 1 --wrap 'echo $CUDA_VISIBLE_DEVICES'")
    typer.echo("Watch the queue:     gqueue        Stop everything:  gpusched down")
    if foreground:
        typer.echo("Staying attached; Ctrl-C stops the cluster.")
        while not stop.wait(1.0):
            pass
        local.down(typer.echo)


@admin_app.command("apply")
def admin_apply(
    files: Annotated[list[Path], typer.Argument(help="partitions.toml, accounts.toml, ...")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the difference; change nothing.")] = False,
) -> None:
    """Validate admin files as a whole, then store them in one transaction.

    Examples: gpusched admin apply --dry-run etc/partitions.toml etc/accounts.toml;
    gpusched admin apply etc/partitions.toml etc/accounts.toml etc/qos.toml
    """
    import json

    from gpusched.adminconfig import parse_admin_config
    from gpusched.client import ApiClient
    from gpusched.config import read_toml

    loaded = [(str(path), read_toml(path)) for path in files]
    parse_admin_config(loaded)  # every error is reported here, before anything is sent
    body = {"files": [{"source": source, "data": data} for source, data in loaded],
            "dry_run": dry_run}
    with ApiClient() as client:
        # TOML dates are not JSON: send them as text; validation already refused them.
        answer = client.request("POST", "/v1/admin/apply", json.loads(json.dumps(body, default=str)))
    changes = answer["changes"]
    for line in changes:
        typer.echo(terminal_safe(line))
    if not changes:
        typer.echo("no changes")
    elif dry_run:
        typer.echo(f"dry run: {len(changes)} change(s) not applied")
    else:
        typer.echo(f"applied {len(changes)} change(s)")




@app.command()
def prio(
    jobs: Annotated[Optional[list[int]], typer.Argument(help="Job ids (default: all pending).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Pending jobs' priority and its factors, highest first (like sprio).

    Examples: gpusched prio; gpusched prio 17 18 --json
    """
    from gpusched.cli.output import print_table
    from gpusched.client import ApiClient

    query = f"?ids={','.join(map(str, jobs))}" if jobs else ""
    with ApiClient() as client:
        answer = client.request("GET", f"/v1/priority{query}")
    if as_json:
        _print_json(answer)
        return
    rows = [[str(j["job_id"]), j["user"], j["account"] or "", f"{j['priority']:.4f}",
             f"{j['age']:.3f}", f"{j['fairshare']:.3f}", f"{j['job_size']:.3f}",
             f"{j['partition']:.3f}", f"{j['qos']:.3f}"] for j in answer["jobs"]]
    print_table(["JOBID", "USER", "ACCOUNT", "PRIORITY", "AGE", "FAIRSHARE", "JOBSIZE",
                 "PARTITION", "QOS"], rows, right_aligned=frozenset({0, 3, 4, 5, 6, 7, 8}),
                shrinkable=frozenset({1, 2}))


@app.command()
def share(as_json: JsonOption = False) -> None:
    """The fair-share tree: shares, usage and each user's factor (like sshare).

    Examples: gpusched share; gpusched share --json
    """
    from gpusched.cli.output import print_table
    from gpusched.client import ApiClient

    with ApiClient() as client:
        answer = client.request("GET", "/v1/share")
    if as_json:
        _print_json(answer)
        return
    rows = [[" " * r["depth"] + (r["account"] if r["user"] is None else ""), r["user"] or "",
             str(r["shares"]), f"{r['norm_shares']:.4f}", f"{r['raw_usage']:.0f}",
             f"{r['effective_usage']:.4f}",
             "" if r["fairshare"] is None else f"{r['fairshare']:.4f}"] for r in answer["rows"]]
    print_table(["ACCOUNT", "USER", "SHARES", "NORMSHARES", "RAWUSAGE", "EFFECTVUSAGE",
                 "FAIRSHARE"], rows, right_aligned=frozenset({2, 3, 4, 5, 6}),
                shrinkable=frozenset({0, 1}))


@app.command("diag")
def diag_command(as_json: JsonOption = False) -> None:
    """The controller's own figures, like sdiag: passes and their durations, backfill
    depth, starts by kind, API requests per route, agents' heartbeats, database pool.

    Examples: gpusched diag; gpusched diag --json
    """
    from gpusched.cli.diag import diag

    diag(as_json)


def _print_json(value: object) -> None:
    import json

    typer.echo(json.dumps(value, indent=2))


@app.command("balance")
def balance_command(
    account: Annotated[Optional[str], typer.Option(
        "--account", "-A", help="Only the budgets covering this account's jobs.")] = None,
    as_json: JsonOption = False,
) -> None:
    """GPU-hour budgets: the budget, what its period used, what running jobs may still
    use, and what is left (GPU-hours). A user sees the budgets covering their own jobs;
    an administrator every budget, or --account's.

    Examples: gpusched balance; gpusched balance -A physics --json
    """
    from gpusched.cli.balance import balance

    balance(account, as_json)


DEMO_SCRIPT = """#!/bin/sh
echo "job $GPUSCHED_JOB_ID on $GPUSCHED_JOB_NODELIST"
echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"
"""


@app.command()
def demo(
    gpus: Annotated[Optional[int], typer.Option(
        min=1, max=64, show_default=False,
        help="GPUs for the demo job (default 2, or 1 where no node has 2).")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the job.")] = 60.0,
) -> None:
    """Submit a demo GPU job to the running cluster, wait for it and show its output.

    Example: gpusched up && gpusched demo
    """
    import os
    import time

    from gpusched.client import ApiClient
    from gpusched.errors import Unavailable

    with ApiClient() as client:
        if gpus is None:  # a host with one real GPU (gpusched up uses it) runs it too
            nodes = client.request("GET", "/v1/nodes")["nodes"]
            most = max((sum(g["parent"] is None for g in n["gpus"]) for n in nodes), default=0)
            gpus = 2 if most >= 2 else 1
        job_id = client.request("POST", "/v1/jobs", {
            "script": DEMO_SCRIPT, "name": "demo", "gpus": gpus, "work_dir": os.getcwd(),
            "environment": dict(os.environ), "output": "gpusched-demo-%j.out",
        })["job_id"]
        typer.echo(f"Submitted batch job {job_id}")
        deadline = time.monotonic() + timeout
        while (job := client.request("GET", f"/v1/jobs/{job_id}"))["state"] in ("PENDING", "RUNNING"):
            if time.monotonic() > deadline:
                raise Unavailable(f"demo job {job_id} still {job['state']} after {timeout:.0f}s")
            time.sleep(0.1)
    output = Path(os.getcwd()) / f"gpusched-demo-{job_id}.out"
    typer.echo(f"job {job_id} {job['state']} on {job['node']} with GPUs {','.join(job['gpu_uuids'])}")
    typer.echo(f"--- {output}")
    typer.echo(output.read_text(), nl=False)


@app.command()
def down() -> None:
    """Stop the local cluster's daemons; running jobs keep running and are re-adopted by 'up'.

    Example: gpusched down
    """
    from gpusched import local

    local.down(typer.echo)


@app.command()
def completion(shell: Annotated[str, typer.Argument(metavar="SHELL", help="bash, zsh or fish")]
               ) -> None:
    """Print shell completion for every gpusched command (gsubmit, gqueue, gcancel,
    ginfo, gacct, gcontrol, gpusched).

    Examples: eval "$(gpusched completion bash)" in ~/.bashrc;
    gpusched completion fish > ~/.config/fish/completions/gpusched.fish
    """
    from gpusched.cli.common import completion_scripts

    typer.echo(completion_scripts(shell), nl=False)


def _register_simulate() -> None:
    from gpusched.cli.simulate import EXAMPLES, simulate

    app.command("simulate", epilog=EXAMPLES)(simulate)


_register_simulate()


def main() -> None:
    """Console-script entry point."""
    sys.exit(run_cli(app, "gpusched"))


if __name__ == "__main__":
    main()
