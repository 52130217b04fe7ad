"""The pool: one process's job runner, put together from its roles.

* `producer.Producer` claims due jobs of the registered kinds for free slots:
  the only role that claims;
* `executor.Executor` runs each handler in a slot of its own (`slots.Slots`)
  and decides how the attempt ended;
* `completer.Completer` writes the outcomes of jobs that finish together in
  one transaction, which also makes the producer's next claim for the slots
  they free;
* `heartbeat.Heartbeat` renews leases, `watchdog.Watchdog` acts on handlers
  that will not end, `rescuer.Rescuer` takes back expired leases anywhere,
  `unhandled.UnhandledKinds` reports queued jobs no handler here runs;
* `unblocker.Unblocker` makes jobs that wait for others due once those
  ended (or cancels them), nudged by the completer, off its path;
* `scheduler.Scheduler` enqueues the job of each periodic kind's scheduled
  time, one across all processes (when the pool is given `enqueue`);
* `registration.Registration` keeps the process's entry in the registry of
  live processes (entered at start, renewed at the heartbeat's rhythm,
  removed at stop).

No role imports another: each is given the others' parts it uses, as
callbacks, here.

The pool supervises them: a role that dies unexpectedly, or a handler that
will not die, is logged at ERROR and `on_fatal` asks for the process to be
restarted gracefully (gunicorn then replaces the worker), since a pool
missing a part would hold its jobs' leases while doing nothing.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import gevent
from gevent.event import Event
from gevent.greenlet import Greenlet

from mealquest.db.driver import Store, Transaction
from mealquest.db.errors import StoreUnavailable
from mealquest.jobs.errors import PoolAlreadyStarted, PoolStopping
from mealquest.jobs.registry import Registry
from mealquest.jobs.runner import hub_monitor, metrics
from mealquest.jobs.runner.completer import Completer
from mealquest.jobs.runner.executor import Executor
from mealquest.jobs.runner.heartbeat import Heartbeat
from mealquest.jobs.runner.outcome import CANCELLED, failed
from mealquest.jobs.runner.producer import Producer
from mealquest.jobs.runner.registration import Registration
from mealquest.jobs.runner.rescuer import Rescuer
from mealquest.jobs.runner.running import STOPPING, Running
from mealquest.jobs.runner.scheduler import Enqueue, Scheduler, run_forever
from mealquest.jobs.runner.settings import PoolSettings
from mealquest.jobs.runner.slots import Slots
from mealquest.jobs.runner.unblocker import Unblocker
from mealquest.jobs.runner.unhandled import UnhandledKinds
from mealquest.jobs.runner.watchdog import Watchdog
from mealquest.model.jobs import (
    MESSAGE_INTERRUPTED,
    MESSAGE_TIMED_OUT,
    Recovered,
    Status,
    Transition,
)

logger = logging.getLogger(__name__)

OnFatal = Callable[[str], None]

# How long a stopping pool waits for a claim already in flight to hand out its jobs.
_CLAIMS_SETTLE_SECONDS = 10.0


@dataclass(frozen=True)
class StopReport:
    """What `Pool.stop` did: jobs that finished in time, and those it had to stop."""

    finished: int = 0
    requeued: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    cancelled: tuple[str, ...] = ()


class Pool:
    """One process's workers. `start` once; `stop` before the process ends, or
    its running jobs wait for their leases to expire to be rescued."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        settings: PoolSettings | None = None,
        *,
        owner: str | None = None,
        on_fatal: OnFatal | None = None,
        enqueue: Enqueue | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.settings = settings or PoolSettings()
        # A fresh random id per boot: pids and host names get reused, and a
        # reused owner would let a new process renew or finish a dead one's jobs.
        self.owner = owner or secrets.token_hex(16)
        self.on_fatal = on_fatal
        self.fatal_reason: str | None = None
        self.slots = Slots(self.settings.workers)
        # The completer first: the executor hands it each outcome to record.
        self.completer = Completer(
            store,
            self.slots,
            next_claim=lambda limit, finishing: self.producer.next_claim(limit, finishing),
            hand_out=lambda jobs, claimed_at: self.producer.hand_out(jobs, claimed_at),
            claim_lost=lambda owner: self.producer.claim_lost(owner),
            wake=self.wake,
            ended=lambda job_ids: self.unblocker.nudge(job_ids),
        )
        self.attempt_metrics = metrics.AttemptMetrics(registry)
        self.executor = Executor(
            store, registry, self.settings, self.slots, self.completer.record, self.attempt_metrics
        )
        self.producer = Producer(
            store, registry, self.settings, self.owner, self.slots, self.executor.start
        )
        self.rescuer = Rescuer(
            store, self.settings.lease_seconds, keep=lambda: [e.lease for e in self.slots.alive()]
        )
        self.heartbeat = Heartbeat(
            store, self.settings, self.slots, self.executor.take, self.executor.cancel
        )
        self.watchdog = Watchdog(
            self.settings,
            self.slots,
            self.executor.take,
            self._hung,
            database_away=lambda: self.heartbeat.database_away,
        )
        self.unhandled = UnhandledKinds(store, registry)
        self.unblocker = Unblocker(store, on_due=lambda: self.producer.wake())
        self.registration = Registration(
            store,
            self.owner,
            kinds=lambda: tuple(self.registry.names()),
            slots=self.settings.workers,
            busy=lambda: len(self.slots.running),
        )
        # Periodic kinds need `enqueue` (the service's, so their jobs are
        # made as every other job is); a pool built without it schedules nothing.
        self.scheduler = (
            Scheduler(
                store,
                registry,
                enqueue,
                catchup_seconds=self.settings.cron_catchup_seconds,
            )
            if enqueue is not None
            else None
        )
        self._started = False
        self._stopping = False
        # Heartbeats go on while a stopping pool waits for its jobs: set last.
        self._maintenance_stop = Event()
        # Each role's greenlet, by name.
        self.roles: dict[str, Greenlet] = {}

    def active_jobs(self) -> list[str]:
        return [lease.job_id for lease in self.slots.running]

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            raise PoolAlreadyStarted()
        self._started = True
        self.registry.close()
        try:
            # The first look: what it reads starts being watched for renewals.
            self.rescuer.run_once()
        except Exception:
            logger.exception("rescue at pool start failed; the periodic rescue will retry")
        try:
            self.registration.register()
        except Exception:
            logger.exception("could not register this process; its renewal will retry")
        if self.settings.max_blocking_seconds:
            hub_monitor.watch(self.slots.job_of, self.settings.max_blocking_seconds)
        every, settings = self._every, self.settings
        for name, run, *args in (
            ("producer", self.producer.run),
            ("completer", self.completer.run),
            ("unblocker", self.unblocker.run),
            ("heartbeat", every, settings.heartbeat_seconds, self.heartbeat_once),
            ("watchdog", every, settings.watchdog_seconds, self.watch_once),
            ("rescuer", every, settings.rescue_seconds, self.rescue_once),
            (
                "unhandled-kinds report",
                every,
                settings.unhandled_report_seconds,
                self.unhandled.run_once,
            ),
            ("registration", every, settings.heartbeat_seconds, self.registration.run_once),
            ("metrics", every, metrics.APPLY_SECONDS, self.attempt_metrics.apply),
        ):
            self.roles[name] = self._supervise(name, run, *args)
        if self.scheduler is not None and self.registry.periodic():
            self.roles["scheduler"] = self._supervise(
                "scheduler", run_forever, self.scheduler, self._maintenance_stop.wait
            )
        logger.info(
            "job pool started with %d workers (owner %s)", self.settings.workers, self.owner
        )

    def wake(self) -> None:
        """Tell an idle producer that this process enqueued a job, and the
        unblocker, in case it waits for jobs already final (greenlet code only)."""
        self.producer.wake()
        self.unblocker.nudge()

    def cancel(self, job_id: str) -> int:
        """Tell this process's handlers of `job_id` that it was cancelled (the
        cancel is already committed); how many were told. Other processes
        learn it at their next heartbeat."""
        return self.executor.cancel(job_id)

    def stop(self, timeout: float, *, kill_grace: float | None = None) -> StopReport:
        """Stop claiming, let running jobs finish for up to `timeout` seconds, then
        stop the rest, give them `kill_grace` seconds (the setting's by default)
        to die, and record them as interrupted before returning.

        A handler that will not die even then is recorded failed `interrupted
        by restart` (re-queued, it would run beside the live greenlet) and
        left to die with the process.
        """
        if not self._started or self._stopping:
            return StopReport()
        self._stopping = True
        self.producer.stop()
        # A claim in flight (the producer's, or the one the completer makes for
        # it) places its jobs (or puts them back, once it sees the stop)
        # before its reservation ends; a batch may wait there for slots its
        # finishing jobs free. Wait for that, so that no job starts unseen.
        settled = time.monotonic() + _CLAIMS_SETTLE_SECONDS
        while self.slots.claims_in_flight() and time.monotonic() < settled:
            gevent.sleep(0.01)
        entries = [e for e in self.slots.running.values() if not e.abandoned]
        gevent.joinall([e.greenlet for e in entries if e.greenlet], timeout=timeout)
        left = [e for e in entries if e.alive()]
        # A handler that has returned is only waiting for its outcome's write:
        # it is let finish, since killing it could put an interruption ahead
        # of its success.
        for entry in left:
            if not entry.recording:
                self.executor.take(entry, STOPPING, PoolStopping)
        grace = self.settings.kill_grace_seconds if kill_grace is None else kill_grace
        gevent.joinall([e.greenlet for e in left if e.greenlet], timeout=grace)
        stopped = [e for e in left if not e.alive() and e.taken == STOPPING]
        hung = [e for e in left if e.alive() and not e.recording]
        for entry in left:
            if entry.alive() and entry.recording:
                logger.warning(
                    "job's outcome not written before the stop; its lease will expire",
                    extra=entry.extra,
                )
        for entry in hung:
            entry.abandoned = True
            logger.error("handler will not die: it ignored the stop", extra=entry.extra)
        recovered = Recovered()
        if stopped or hung:
            try:
                recovered = self.store.write(self._record_stopped, stopped, hung)
                metrics.interrupted(stopped + hung, recovered)
            except Exception:
                logger.exception("could not record stopped jobs; their leases will expire")
        self._maintenance_stop.set()
        gevent.killall(list(self.roles.values()), block=True, timeout=5)
        # What the metrics role had not applied yet, the last outcomes' included.
        self.attempt_metrics.apply()
        try:
            self.registration.remove()
        except Exception:
            logger.exception("could not remove this process's entry; it expires after a lease")
        report = StopReport(
            len(entries) - len(left), recovered.requeued, recovered.failed, recovered.cancelled
        )
        for job_id in report.requeued:
            logger.warning("re-queued a job stopped by shutdown", extra={"job_id": job_id})
        for job_id in report.failed:
            logger.error("job stopped by shutdown: interrupted", extra={"job_id": job_id})
        for job_id in report.cancelled:
            logger.info("cancelled job stopped by shutdown: cancelled", extra={"job_id": job_id})
        logger.info("job pool stopped (owner %s)", self.owner)
        return report

    def _record_stopped(
        self, tx: Transaction, stopped: list[Running], hung: list[Running]
    ) -> Recovered:
        jobs = self.store.jobs
        recovered = jobs.interrupt(tx, [e.lease for e in stopped])
        failed_ids, cancelled = [], []
        for entry in hung:
            if entry.cancelled_at is not None:
                if jobs.transition(tx, Transition(entry.lease, to=Status.CANCELLED)):
                    cancelled.append(entry.job.id)
            elif jobs.transition(
                tx, Transition(entry.lease, to=Status.FAILED, error=MESSAGE_INTERRUPTED)
            ):
                failed_ids.append(entry.job.id)
        return recovered + Recovered(failed=tuple(failed_ids), cancelled=tuple(cancelled))

    # -- supervision ------------------------------------------------------------

    def _supervise(self, name: str, run: Callable[..., object], *args: object) -> Greenlet:
        greenlet = gevent.spawn(run, *args)
        greenlet.link(lambda ended: self._role_ended(name, ended))
        return greenlet

    def _role_ended(self, name: str, ended: Greenlet) -> None:
        if self._maintenance_stop.is_set() or (name == "producer" and self._stopping):
            return  # stopped on purpose
        if ended.successful():
            self.fatal(f"the pool's {name} ended unexpectedly")
        else:
            logger.error("the pool's %s died", name, exc_info=ended.exception)
            self.fatal(f"the pool's {name} died")

    def fatal(self, reason: str) -> None:
        """This pool cannot go on: log it and ask (once) for a graceful restart."""
        if self.fatal_reason is not None:
            return
        self.fatal_reason = reason
        logger.error("job pool cannot continue (%s); restarting the process", reason)
        if self.on_fatal is not None:
            self.on_fatal(reason)

    def _hung(self, entry: Running, reason: str) -> None:
        # The restart first; the record in a greenlet of its own, since it may
        # wait on the database and the watchdog has other handlers to watch.
        self.fatal(f"a handler will not die (job {entry.job.id}, kind {entry.job.kind})")
        gevent.spawn(self.record_hung, entry)

    def record_hung(self, entry: Running) -> bool:
        """Record a job whose handler was given up on while its lease is still ours:
        cancelled if it was, else failed `timed out` (final: re-queued, it would
        run beside the live handler)."""
        if entry.taken is not None:
            return False  # taken: its lease is lost or its stop records it
        outcome = CANCELLED if entry.cancelled_at is not None else failed(MESSAGE_TIMED_OUT)
        recorded = self.completer.record(entry.lease, outcome, entry.extra)
        if recorded:
            metrics.given_up(entry.job.kind, outcome)
        return recorded

    # -- maintenance ------------------------------------------------------------

    def _every(self, interval: float, task: Callable[[], object]) -> None:
        while not self._maintenance_stop.wait(interval):
            try:
                task()
            except StoreUnavailable:
                # Passing; the next round tries again (the watchdog acts on
                # leases that cannot be renewed in time).
                logger.warning("job pool maintenance: database unavailable")
            except Exception:
                logger.exception("job pool maintenance failed")

    def heartbeat_once(self) -> int:
        return self.heartbeat.run_once()

    def watch_once(self) -> list[Running]:
        if self.store.broken:
            self.fatal("the store's writer thread died")
        return self.watchdog.run_once()

    def rescue_once(self, now: datetime | None = None) -> Recovered:
        recovered = self.rescuer.run_once(now)
        if recovered.requeued:
            self.producer.wake()
        return recovered
