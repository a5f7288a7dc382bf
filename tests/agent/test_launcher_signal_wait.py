"""A signal for a job whose supervisor has not yet written supervisor.json (the job can
be running already) waits for it, within a bound, instead of being refused."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

from gpusched.agent.launcher import Launcher
from tests.agent.test_launcher import WaitFor, start, wait_end


def test_a_signal_waits_for_supervisor_json(launcher: Launcher, work_dir: Path,
                                            wait_for: WaitFor) -> None:
    got, ready = work_dir / "got", work_dir / "ready"
    start(launcher, work_dir, f"trap 'echo usr1 >> {got}' USR1\ntouch {ready}\n"
          "while true; do sleep 0.05; done")
    wait_for(ready.exists, "the job to set its trap")
    info = launcher.jobs_dir / "7" / "supervisor.json"
    wait_for(info.exists, "supervisor.json")
    hidden = info.with_name("supervisor.json.later")
    info.rename(hidden)  # as if the supervisor had not written it yet
    answers: list[bool] = []
    sender = threading.Thread(target=lambda: answers.append(
        launcher.signal(7, signal.SIGUSR1)))
    sender.start()
    sender.join(0.3)
    assert sender.is_alive() and not answers  # waiting, not refused
    hidden.rename(info)
    sender.join(10)
    assert answers == [True]
    wait_for(lambda: got.exists() and got.read_text() == "usr1\n", "the trap to run")
    assert launcher.cancel(7)
    assert wait_end(launcher, 7, wait_for).outcome == "cancelled"
