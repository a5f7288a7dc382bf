"""The leader-only scheduling loop: passes run while this controller holds leadership
(db/leadership.py)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from gpusched import stages
from gpusched.controller.events import Events
from gpusched.core.model import Plan, Policy, Snapshot
from gpusched.core.plan import plan
from gpusched.db import mig_changes
from gpusched.db.admincache import AdminCache
from gpusched.db.leadership import Leadership, NotLeader
from gpusched.db.notify import notify_in
from gpusched.db.pending_rows import PendingRows
from gpusched.db.schedule import apply_plan, load_snapshot

log = logging.getLogger(__name__)
STANDBY_RETRY = 1.0
LEADERSHIP_CHECK = 1.0  # seconds between looks at whether we still lead, when idle
BACKSTOP_PASS = 30.0  # seconds after which a leader runs a pass even if never woken
# Passes woken back to back keep a gap between them as long as the last pass (at least
# COALESCE_SECONDS, at most MAX_COALESCE_SECONDS): the events of the gap gather into the
# next pass, a burst of job ends or submits costs a pass or two rather than one each, and
# passes take at most about half of the leader's time, API requests keeping the rest. A
# wake-up after a quiet spell of that long runs its pass at once: on an idle cluster a
# job starts as soon as it is submitted, or as soon as a job ending frees its GPUs.
COALESCE_SECONDS = 0.01
MAX_COALESCE_SECONDS = 1.0


@dataclass
class PassStats:
    """What this controller's passes did, for logs and ``/v1/ping``."""

    passes: int = 0
    last_pending: int = 0
    last_started: int = 0
    last_seconds: float = 0.0
    max_seconds: float = 0.0
    total_started: int = 0


class SchedulerLoop:
    """Runs passes when woken (submit, cancel, job end) and on the periodic backstop."""

    def __init__(self, sessions: sessionmaker[Session], events: Events, dsn: str,
                 policy: Policy | None = None, pass_budget: float | None = None,
                 admin_max_age: float = 60.0) -> None:
        self.sessions = sessions
        # The admin-configured tables, kept between passes until a change is heard.
        self.admin_cache = AdminCache(events.admin_generation, admin_max_age)
        # The pending queue, kept between passes and read again where rows changed.
        self.pending_rows = PendingRows()
        self.pass_budget = pass_budget  # seconds a pass may plan for; None: no limit
        self.events = events
        self.policy = policy or Policy()
        self.resume_after: int | None = None  # where the last pass stopped examining, if early
        self.leadership = Leadership(dsn)
        self.stats = PassStats()
        # Told of each pass applied: seconds, snapshot, plan, when it ended (metrics).
        self.observer: Callable[[float, Snapshot, Plan, float], None] | None = None
        self._woken_at: float | None = None  # when the wake-up of the coming pass came
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    @property
    def is_leader(self) -> bool:
        """True while this controller holds the scheduling lock."""
        return self.leadership.is_held

    def start(self) -> None:
        """Start the loop thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop and release leadership."""
        self._stop.set()
        self.events.wake_scheduler()
        self._thread.join(timeout=10)
        self.leadership.release()

    def _run(self) -> None:
        last_pass = last_end = 0.0
        while not self._stop.is_set():
            if not self.leadership.is_held:
                if not self.leadership.try_acquire():
                    self._stop.wait(STANDBY_RETRY)
                    continue
                self.resume_after = None
                self.admin_cache.drop()  # a standby's copy may be from long ago
                self.pending_rows.drop()
                self.events.wake_scheduler()  # a new leader schedules at once
            # Wait in short steps: leadership lost meanwhile (the keeper saw it) is taken
            # back, or left to a standby, within a second.
            woken = self.events.scheduler.wait(timeout=LEADERSHIP_CHECK)
            if not woken and time.monotonic() - last_pass < BACKSTOP_PASS:
                continue
            self._woken_at = time.time()
            if woken:
                gap = max(COALESCE_SECONDS, min(self.stats.last_seconds, MAX_COALESCE_SECONDS))
                rest = gap - (time.monotonic() - last_end)
                if rest > 0:
                    self._stop.wait(rest)
            self.events.scheduler.clear()
            if self._stop.is_set() or not self.leadership.held():
                continue
            last_pass = time.monotonic()
            try:
                self.run_pass()
            except NotLeader as exc:
                log.warning("pass refused: %s; stepping down", exc)
                self.leadership.release()
            except DBAPIError as exc:
                if not exc.connection_invalidated and self.leadership.held():
                    log.exception("scheduling pass failed; the next one starts over")
                else:  # the database is gone, or our lock with it: let a standby lead
                    log.warning("scheduling pass lost the database (%s); stepping down",
                                exc.orig)
                    self.leadership.release()
                self._stop.wait(0.5)
            except Exception:
                log.exception("scheduling pass failed; the next one starts over")
                self._stop.wait(0.5)
            last_end = time.monotonic()

    def run_pass(self) -> set[str]:
        """One pass: snapshot, plan, apply in one transaction (refused with NotLeader
        unless this controller's epoch is still the current one), then wake agents."""
        epoch = self.leadership.epoch
        if epoch is None:
            raise NotLeader("this controller is not the leader")
        started, began_at = time.monotonic(), time.time()
        try:
            with self.sessions() as session, session.begin():
                snapshot, node_ids = load_snapshot(session, self.policy.preempt_grace,
                                                  self.admin_cache, self.pending_rows)
                began, budget = time.monotonic(), self.pass_budget
                decided = plan(snapshot, time.time(), self.policy, self.resume_after,
                               (lambda: (time.monotonic() - began) / budget) if budget
                               else None)
                self.resume_after = decided.resume_after
                woken = apply_plan(session, snapshot, decided, node_ids, epoch)
                tables = self.admin_cache.last  # as load_snapshot read them
                dynamic = tables.dynamic_mig if tables is not None else None
                if dynamic:  # MIG layout changes the waiting jobs call for
                    woken |= mig_changes.after_pass(session, snapshot, decided, node_ids,
                                                    dynamic, epoch, time.time())
                notify_in(session, *(f"node:{name}" for name in sorted(woken)))
        except BaseException:
            self.pending_rows.drop()  # after a failed pass, the next reads the whole queue
            raise
        for name in woken:
            self.events.wake_node(name)
        if stages.on():
            stages.stamp("pass", [s.job_id for s in decided.starts], woken=self._woken_at,
                         began=began_at, pending=len(snapshot.pending))
        elapsed = time.monotonic() - started
        self.stats.passes += 1
        self.stats.last_pending = len(snapshot.pending)
        self.stats.last_started = len(decided.starts)
        self.stats.last_seconds = elapsed
        self.stats.max_seconds = max(self.stats.max_seconds, elapsed)
        self.stats.total_started += len(decided.starts)
        if self.observer is not None:
            self.observer(elapsed, snapshot, decided, time.time())
        if decided.starts:
            log.info("pass %d: %d pending (%d read), %d started in %.1f ms",
                     self.stats.passes, len(snapshot.pending), self.pending_rows.last_read,
                     len(decided.starts), elapsed * 1000)
        return woken
