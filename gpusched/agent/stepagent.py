"""What the agent does about job steps: start a node's part of a step from a ``step``
command (confined like the job on this node), cancel or signal it from ``step_cancel``,
move its deadline when a ``limit`` changes the job's time limit, end a job's steps
when the job ends, and report each part's end to the controller
(``POST /agent/v1/jobs/{job}/steps/{step}/ended``)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpusched.agent.confine import Confinement, LaunchRefused
from gpusched.agent.settings import AgentConfig
from gpusched.agent.steps import StepDone, StepRunner
from gpusched.agent.stepspec import step_cgroup_spec, step_spec
from gpusched.client import ApiClient
from gpusched.errors import Conflict, GpuschedError, NotFound, UsageError
from gpusched.messages.agent import LimitJob
from gpusched.messages.steps import StepLaunch

log = logging.getLogger(__name__)
MAX_BACKOFF = 2.0


class NodeSteps:
    """The steps of one node: started, ended and reported."""

    def __init__(self, config: AgentConfig, confinement: Confinement, jobs_dir: Path) -> None:
        self.config = config
        self.node = config.node_name
        self.confinement = confinement
        self.jobs_dir = jobs_dir
        self.runner = StepRunner(config.state_dir / "steps", self.node)

    def adopt(self) -> None:
        """Watch the steps that outlived an agent restart, and get ready for new ones."""
        self.runner.warm()
        adopted = self.runner.adopt()
        if adopted:
            log.info("re-adopted running steps %s",
                     ", ".join(f"{j}.{s}" for j, s in adopted))

    def launch(self, launch: StepLaunch, gpus: Mapping[str, Mapping[str, Any]],
               held_cpus: set[int]) -> None:
        """Start this node's part of a step; a part that cannot be confined still starts
        its supervisor, which tells gsrun why and reports ``launch_failed``."""
        refusal = cgroup = None
        try:
            cgroup = step_cgroup_spec(self.confinement, launch, gpus,
                                      self._batch_cpus(launch.job_id), held_cpus)
        except LaunchRefused as exc:
            refusal = f"the agent on {self.node} cannot confine the step: {exc.message}"
        spec = step_spec(launch, self.config.kill_grace, self.config.min_job_uid, cgroup,
                         refusal)
        if self.runner.start(launch, spec):
            log.info("started step %d.%d (tasks %s) for %s", launch.job_id, launch.step_id,
                     ",".join(str(t.task_id) for t in launch.tasks), launch.user)

    def _batch_cpus(self, job_id: int) -> list[int] | None:
        """The CPUs of the job's batch run, where it runs on this node and has some."""
        try:
            spec = json.loads((self.jobs_dir / str(job_id) / "spec.json").read_text())
        except (OSError, ValueError):
            return None
        cgroup = spec.get("cgroup") if isinstance(spec, dict) else None
        cpus = cgroup.get("cpus") if isinstance(cgroup, dict) else None
        if isinstance(cpus, list) and all(isinstance(c, int) for c in cpus):
            return cpus
        return None

    def cancel(self, job_id: int, step_id: int, signum: int | None) -> None:
        done = self.runner.cancel(job_id, step_id, signum)
        log.info("step %d.%d: %s %s", job_id, step_id,
                 "cancel" if signum is None else f"signal {signum}",
                 "sent" if done else "not running here")

    def new_limit(self, job_id: int, run: int, limit: LimitJob) -> None:
        """The job's time limit changed: its running steps of ``run`` here get the new
        deadline (a limit without one, from an older controller, leaves them be)."""
        given, deadline = limit.step_deadline()
        told = self.runner.set_deadline(job_id, run, deadline) if given else []
        if told:
            log.info("job %d: steps %s here now end at %s", job_id, ", ".join(map(str, told)),
                     "no deadline" if deadline is None else f"{deadline:.0f}")

    def end_job(self, job_id: int, run: int | None = None) -> None:
        """The job has ended: end its steps here."""
        ended = self.runner.end_job(job_id, run)
        if ended:
            log.info("job %d ended: ending its steps %s here", job_id,
                     ", ".join(map(str, ended)))

    def report_loop(self, client: ApiClient, stop: threading.Event) -> None:
        """Report each step part's end as it comes, until ``stop``."""
        backoff = 0.05
        while not stop.is_set():
            try:
                for done in self.runner.wait_ended(timeout=0.5):
                    self._report(client, done)
                backoff = 0.05
            except GpuschedError as exc:
                log.warning("cannot report step ends yet: %s", exc)
                stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)

    def _report(self, client: ApiClient, done: StepDone) -> None:
        path = f"/agent/v1/jobs/{done.job_id}/steps/{done.step_id}/ended"
        try:
            client.request("POST", path, done.end.to_json())
        except (NotFound, UsageError, Conflict) as exc:
            # The controller will never take it (the job or step is gone): drop it.
            log.warning("step %d.%d: end not taken: %s", done.job_id, done.step_id, exc)
        self.runner.mark_reported(done.job_id, done.step_id)
        log.info("step %d.%d ended here: %s", done.job_id, done.step_id, done.end.outcome)

    def close(self) -> None:
        self.runner.close()
