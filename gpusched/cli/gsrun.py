"""gsrun: run a command as a step of the job it runs in, as srun does in a batch script.

gsrun listens on its I/O socket, asks the controller for the step
(``POST /v1/jobs/{job}/steps``), then serves the nodes that connect: their tasks'
output goes to its own streams, its stdin to task 0, the signals it gets
(INT, TERM, HUP, QUIT) to every task. It exits with the worst task's status
(gpusched.cli.stepoutput). A step that does not fit beside the job's running steps yet
is asked for again until it does or the job ends.

Started often and inside jobs, its start is part of every step's launch: no typer, no
rich (see tests/cli/test_cli_imports.py), and none of typing, dataclasses, enum, re,
socket, selectors, signal, hmac or json (tests/cli/test_gsrun_imports.py): it uses the
C modules _socket and _signal under socket.py and signal.py.
"""

from __future__ import annotations

import _socket
import os
import sys
import time

from gpusched.cli.gsrunargs import (
    MAX_TASKS_PER_STEP,
    USAGE,
    GsrunArgs,
    export_environment,
    parse_args,
)
from gpusched.cli.output import print_error
from gpusched.cli.stepio_server import ServeOptions, StepIOServer, StepPlan, StepState
from gpusched.cli.stepoutput import ExitTally, OutputSink
from gpusched.core import bounds
from gpusched.errors import GpuschedError, NotFound, StepBusy, UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal as _signal  # the same functions and numbers, typed
    from collections.abc import Callable, Mapping
    from typing import Any, NoReturn
else:
    import _signal

PROG = "gsrun"
JOB_VARIABLES = ("SLURM_JOB_ID", "GPUSCHED_JOB_ID")
FORWARDED = (_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP, _signal.SIGQUIT)
# A step that does not fit yet is asked for again after BUSY_FIRST_PAUSE seconds, the
# pause doubling up to BUSY_MAX_PAUSE. Most such waits are short: a step started right
# after another finds it held until its nodes' reports of its end are recorded, a few
# tens of milliseconds after its tasks ended. gsrun says that it waits only once the
# wait has lasted BUSY_QUIET seconds.
BUSY_FIRST_PAUSE = 0.01
BUSY_MAX_PAUSE = 2.0
BUSY_QUIET = 0.5
POLL_TIMEOUT = 5.0  # seconds for an answer about the step's state
CANCEL_TIMEOUT = 10.0


def entry() -> NoReturn:
    """The ``gsrun`` console script."""
    code = main(sys.argv[1:])
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 1
    os._exit(code)


def main(argv: list[str], environ: Mapping[str, str] | None = None) -> int:
    """Run ``gsrun ARGV``; the exit code."""
    env = dict(os.environ if environ is None else environ)
    try:
        args = parse_args(argv)
        if args.help:
            sys.stdout.write(USAGE)
            return 0
        job_id = args.jobid if args.jobid is not None else job_from(env)
        if job_id is None:  # as srun: an allocation of its own first
            from gpusched.cli.gsrunalloc import run_in_new_allocation

            return run_in_new_allocation(args, env, run_step)
        if args.allocation:
            from gpusched.cli.gsrunalloc import refuse_allocation_options

            raise UsageError(str(refuse_allocation_options(args)))
        return run_step(args, job_id, env)
    except GpuschedError as err:
        print_error(PROG, err.message)
        return err.exit_code
    except KeyboardInterrupt:
        print_error(PROG, "aborted")
        return 1


def job_from(env: Mapping[str, str]) -> int | None:
    """The job gsrun runs in, from its environment (None: not in a job)."""
    for name in JOB_VARIABLES:
        text = env.get(name)
        if text is None or text == "":
            continue
        if not (text.isascii() and text.isdigit()) or len(text) > 19 \
                or not 1 <= int(text) <= bounds.MAX_JOB_ID:
            raise UsageError(f"{name}: expected a job id, got {text!r:.40}")
        return int(text)
    return None


def _ntasks(args: GsrunArgs, env: Mapping[str, str]) -> int | None:
    """-n, else, with no other shape given and no --pty, ``SLURM_NTASKS`` as srun takes
    it (what the job or allocation asked for: ``gsubmit -n 4``, ``galloc -n 4``)."""
    if args.ntasks is not None or args.nodes is not None or args.ntasks_per_node is not None \
            or args.pty:
        return args.ntasks
    text = env.get("SLURM_NTASKS")
    if text is None or text == "":
        return None
    if not (text.isascii() and text.isdigit()) or len(text) > 6 \
            or not 1 <= int(text) <= MAX_TASKS_PER_STEP:
        raise UsageError(f"SLURM_NTASKS: expected 1 to {MAX_TASKS_PER_STEP} tasks, "
                         f"got {text!r:.40}")
    return int(text)


def step_request(args: GsrunArgs, env: Mapping[str, str], io: dict[str, Any],
                 cwd: str | None = None) -> dict[str, Any]:
    """The StepRequest's JSON for ``args`` (checked as the controller checks it)."""
    from gpusched.messages.steprequest import check_request

    base = cwd if cwd is not None else _cwd()
    work_dir = os.path.normpath(os.path.join(base, args.chdir)) if args.chdir else base
    name = args.name or os.path.basename(args.command[0])[:bounds.MAX_NAME] or "step"
    environment = export_environment(args.export, dict(env))
    if args.pty and env.get("TERM"):
        environment.setdefault("TERM", env["TERM"])  # the terminal's kind, for its task
    body = {
        "argv": list(args.command), "name": name, "work_dir": work_dir, "io": io,
        "nodes": args.nodes, "ntasks": _ntasks(args, env),
        "ntasks_per_node": args.ntasks_per_node,
        "gpus_per_task": args.gpus_per_task, "cpus_per_task": args.cpus_per_task,
        "exact": args.exact, "overlap": args.overlap,
        "kill_on_bad_exit": args.kill_on_bad_exit, "pty": args.pty,
        "environment": environment,
        # srun's rule: with -o alone, stderr goes to the same file.
        "output": args.output, "error": args.error or args.output, "input": args.input,
    }
    return check_request(body)


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError as err:
        raise UsageError(f"the current directory is gone ({err.strerror}); give -D DIR") \
            from None


def run_step(args: GsrunArgs, job_id: int, env: Mapping[str, str]) -> int:
    """Create the step, serve its I/O until every task ended; the exit status."""
    from gpusched.client import ApiClient

    started = time.monotonic()
    say = _say
    client = ApiClient()
    server = StepIOServer(io_host(client))
    try:
        io = {"host": server.host, "port": server.port, "token": server.token}
        request = step_request(args, env, io)
        # Signals are caught from here on: one that comes while the step is being
        # created reaches its tasks once they run (a step is never left without gsrun),
        # or, while gsrun waits for room, ends gsrun before anything was created.
        with SignalForwarding((_signal.SIGWINCH,) if args.pty else ()) as signal_fd:
            created = create_step(client, job_id, request, say,
                                  wait=lambda pause: _signalled(signal_fd, pause))
            plan = StepPlan(job_id, created["step_id"], created["node_names"],
                            created["layout"])
            if args.verbose:
                say(f"gsrun: step {job_id}.{plan.step_id}: {created['ntasks']} tasks on "
                    f"{','.join(plan.node_names)}, MASTER_ADDR={created['master_addr']} "
                    f"MASTER_PORT={created['master_port']}, created in "
                    f"{(time.monotonic() - started) * 1000:.0f} ms")
            tally = ExitTally(plan.tasks, args.kill_on_bad_exit)
            # --pty: the terminal's bytes as they come, unlabelled.
            sink = OutputSink(sys.stdout.buffer, sys.stderr.buffer,
                              args.label and not args.pty, args.unbuffered or args.pty)
            sys.stdout.flush()
            terminal = _raw_terminal() if args.pty else None
            say = _say if terminal is None else _say_raw
            try:
                server.serve(plan, sink, tally, ServeOptions(
                    stdin_fd=_stdin_fd() if args.input is None else None,
                    signal_fd=signal_fd,
                    on_bad_exit=lambda task: kill_step(client, job_id, plan.step_id, task,
                                                       say),
                    poll=lambda: step_state(client, job_id, plan.step_id), say=say,
                    winsize=None if terminal is None else terminal.size))
            finally:
                if terminal is not None:
                    terminal.restore()
                say = _say
        if args.verbose:
            say(f"gsrun: step {job_id}.{plan.step_id} ended after "
                f"{(time.monotonic() - started) * 1000:.0f} ms")
        return tally.status()
    finally:
        server.close()
        client.close()


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _say_raw(line: str) -> None:
    """A line of gsrun's own while its terminal is raw (no newline translation)."""
    sys.stderr.write(line + "\r\n")
    sys.stderr.flush()


def _raw_terminal() -> Any:
    """gsrun's stdin, a terminal, now raw (a LocalTerminal); None when stdin is not a
    terminal (the task still gets one on its node)."""
    from gpusched.cli.stepterminal import LocalTerminal

    terminal = LocalTerminal.of_stdin()
    return terminal if terminal is not None and terminal.raw() else None


def _stdin_fd() -> int | None:
    try:
        os.fstat(0)
    except OSError:
        return None  # no stdin at all: task 0 gets an end of input at once
    return 0


def io_host(client: Any) -> str:
    """The address the step's nodes reach gsrun at: the local end of the route to the
    controller (127.0.0.1 when that is the local socket)."""
    if client.local:
        return "127.0.0.1"
    from gpusched.client.endpoints import parse_endpoint

    endpoint = parse_endpoint(client.controllers[0])
    try:
        family, _, _, _, address = _socket.getaddrinfo(
            endpoint.host, endpoint.port, 0, _socket.SOCK_DGRAM)[0]
        probe = _socket.socket(family, _socket.SOCK_DGRAM)
        try:
            probe.connect(address)  # a datagram socket sends nothing to connect
            return str(probe.getsockname()[0])
        finally:
            probe.close()
    except OSError as err:
        raise GpuschedError(f"cannot find this host's address towards the controller "
                            f"{endpoint}: {err.strerror or err}") from None


def _signalled(fd: int, pause: float) -> bool:
    """Wait ``pause`` seconds; True at once if a signal came (it is left unread)."""
    import select

    return bool(select.select([fd], [], [], pause)[0])


def create_step(client: Any, job_id: int, request: dict[str, Any],
                say: Callable[[str], None],
                wait: Callable[[float], bool] | None = None) -> dict[str, Any]:
    """POST the step; while it does not fit beside the job's running steps, ask again
    (after 10 ms, the pause doubling to 2 s) until it fits or the job ends, saying so
    once the wait has lasted half a second. ``wait`` pauses, and says whether gsrun was
    interrupted meanwhile (then it gives up). The answer, checked (StepCreated's
    fields)."""
    from gpusched.messages.steprequest import check_created

    pause, waited, began = BUSY_FIRST_PAUSE, False, time.monotonic()
    while True:
        try:
            answer = client.request("POST", f"/v1/jobs/{job_id}/steps", request)
            break
        except StepBusy:
            if not waited and time.monotonic() - began >= BUSY_QUIET:
                say("gsrun: step creation temporarily disabled, retrying")
                waited = True
            if wait is None:
                time.sleep(pause)
            elif wait(pause):
                raise GpuschedError("interrupted while waiting for the step to fit; "
                                    "nothing was started")
            pause = min(pause * 2, BUSY_MAX_PAUSE)
    try:
        created = check_created(answer)
    except UsageError as err:
        raise GpuschedError(f"bad answer from the gpusched controller: {err.message}") \
            from None
    if waited:
        say(f"gsrun: step created for job {job_id}, step {created['step_id']}")
    return created


def step_state(client: Any, job_id: int, step_id: int) -> StepState | None:
    """The step's state as the controller has it (None: no answer now)."""
    try:
        step = client.request("GET", f"/v1/jobs/{job_id}/steps/{step_id}",
                              timeout=POLL_TIMEOUT)
    except NotFound as err:
        return StepState("GONE", err.message)
    except GpuschedError:
        return None
    state, error = step.get("state"), step.get("error")
    if not isinstance(state, str):
        return None
    return StepState(state, error if isinstance(error, str) else None)


def kill_step(client: Any, job_id: int, step_id: int, task: int,
              say: Callable[[str], None]) -> None:
    """--kill-on-bad-exit: end the step because ``task`` ended badly."""
    say(f"gsrun: error: task {task} ended badly: terminating step {job_id}.{step_id} "
        "(--kill-on-bad-exit)")
    try:
        client.request("POST", f"/v1/jobs/{job_id}/steps/{step_id}/cancel",
                       {"bad_exit": True}, timeout=CANCEL_TIMEOUT)
    except GpuschedError as err:
        say(f"gsrun: error: could not end step {job_id}.{step_id}: {err.message}")


class SignalForwarding:
    """While inside: INT, TERM, HUP and QUIT do not end gsrun but reach the returned
    descriptor as one byte each (their numbers), for the tasks; so do the ``extra``
    signals (SIGWINCH for --pty)."""

    def __init__(self, extra: tuple[int, ...] = ()) -> None:
        self._signals = FORWARDED + extra

    def __enter__(self) -> int:
        self._reader, self._writer = _socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._old_fd = _signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._old = {sig: _signal.signal(sig, _noted) for sig in self._signals}
        return self._reader.fileno()

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            _signal.signal(sig, handler)
        _signal.set_wakeup_fd(self._old_fd)
        self._reader.close()
        self._writer.close()


def _noted(signum: int, frame: object) -> None:
    """The wakeup descriptor carries the signal; nothing more to do here."""
