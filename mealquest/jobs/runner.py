"""The worker pool: greenlets that claim queued jobs, run them, and record outcomes.

One pool per process. A dispatcher greenlet claims as many due jobs as there
are free workers (one `UPDATE ... RETURNING` statement) and runs each in its
own greenlet; an idle dispatcher wakes on an enqueue in this process, on a
commit by another process (`PRAGMA data_version`, checked every few
milliseconds), or on the poll interval. A completer greenlet records the
outcomes of jobs that finish together in one write transaction (each write
still fenced on its own lease), which also claims the jobs for the slots they
free. Claims in flight reserve their slots, so the two never claim more jobs
than there are free workers. A heartbeat greenlet renews the leases of the
jobs this process runs, and a rescuer greenlet takes back jobs whose lease
expired anywhere.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Concatenate, ParamSpec, TypeVar

import gevent
from gevent.event import AsyncResult, Event
from gevent.greenlet import Greenlet
from marshmallow import ValidationError

from mealquest.clock import seconds, to_text, utc_now
from mealquest.jobs import queries
from mealquest.jobs.errors import LeaseLost, PoolAlreadyStarted, PoolStopping
from mealquest.jobs.maintenance import Rescuer
from mealquest.jobs.model import (
    MESSAGE_INTERNAL,
    MESSAGE_TIMED_OUT,
    Failure,
    Job,
    message_no_handler,
)
from mealquest.jobs.registry import Kind, Registry
from mealquest.store import Store, StoreUnavailable, Transaction

logger = logging.getLogger(__name__)

# A final write that met a locked database is tried again after this, doubling.
_RECORD_RETRY_FIRST_SECONDS = 0.1
_RECORD_RETRY_MAX_SECONDS = 5.0

T = TypeVar("T")
P = ParamSpec("P")


@dataclass(frozen=True)
class PoolSettings:
    workers: int = 4
    poll_seconds: float = 1.0
    change_check_seconds: float = 0.005
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    rescue_seconds: float = 15.0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError("a pool needs at least 1 worker")
        intervals = (
            self.poll_seconds,
            self.change_check_seconds,
            self.lease_seconds,
            self.heartbeat_seconds,
            self.rescue_seconds,
        )
        if min(intervals) <= 0:
            raise ValueError("pool intervals and the lease must be positive")
        if self.heartbeat_seconds >= self.lease_seconds:
            raise ValueError("heartbeats must come more often than the lease lasts")

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> PoolSettings:
        return cls(
            workers=int(config["JOB_WORKERS"]),
            poll_seconds=float(config["JOB_POLL_SECONDS"]),
            change_check_seconds=float(config["JOB_CHANGE_CHECK_SECONDS"]),
            lease_seconds=float(config["JOB_LEASE_SECONDS"]),
            heartbeat_seconds=float(config["JOB_HEARTBEAT_SECONDS"]),
            rescue_seconds=float(config["JOB_RESCUE_SECONDS"]),
        )


@dataclass(frozen=True)
class StopReport:
    """What `Pool.stop` did: jobs that finished in time, and those it had to stop."""

    finished: int = 0
    requeued: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()


class JobContext:
    """What a handler gets besides its payload: who it is, and fenced writes."""

    def __init__(self, pool: Pool, job: Job, kind: Kind, lease: queries.Lease) -> None:
        self.job_id = job.id
        self.household_id = job.household_id
        self.kind = job.kind
        self.attempt = job.attempt
        self.max_attempts = job.max_attempts
        self._pool = pool
        self._kind = kind
        self._lease = lease

    def publish(self, partial: Any) -> None:
        """Store a partial result (typed by the kind's partial schema); GET shows it at once."""
        encoded = self._kind.encode_partial(partial)
        published = self._pool.store.write(
            queries.publish, self._lease, result=encoded, now=to_text(utc_now())
        )
        if not published:
            raise LeaseLost(LeaseLost.__doc__)

    def write(
        self, fn: Callable[Concatenate[Transaction, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """Run `fn(tx, ...)` in a write transaction that commits only while this
        worker still holds the job's lease, so a rescued job's old worker cannot
        write domain rows behind the new one.

        `fn` runs in the store's native writer thread: SQL only, no gevent
        calls, no I/O, nothing slow (every other write of the process waits).
        """

        def fenced(tx: Transaction) -> T:
            if not queries.owns(tx, self._lease):
                raise LeaseLost(LeaseLost.__doc__)
            return fn(tx, *args, **kwargs)

        return self._pool.store.write(fenced)


@dataclass
class _Running:
    lease: queries.Lease
    greenlet: Greenlet | None = field(default=None)


@dataclass
class _Outcome:
    """A finished job's final write, waiting for the completer; `recorded` gets
    whether the fenced write matched the job (or the write's exception)."""

    lease: queries.Lease
    write: Callable[..., bool]
    values: dict[str, str]
    recorded: AsyncResult = field(default_factory=AsyncResult)


def _write_outcomes(
    tx: Transaction, outcomes: list[_Outcome], now: str, claim: dict[str, Any] | None
) -> tuple[list[bool], list[Job]]:
    """The completer's transaction: the outcomes, then (with `claim`) the next jobs
    for the slots they free. Runs in the writer thread: no gevent objects."""
    recorded = [outcome.write(tx, outcome.lease, now=now, **outcome.values) for outcome in outcomes]
    return recorded, queries.claim(tx, **claim) if claim else []


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
    ) -> None:
        self.store = store
        self.registry = registry
        self.settings = settings or PoolSettings()
        # A fresh random id per boot: pids and host names get reused, and a
        # reused owner would let a new process renew or finish a dead one's jobs.
        self.owner = owner or secrets.token_hex(16)
        self.rescuer = Rescuer(store)
        self._running: dict[str, _Running] = {}
        self._wake = Event()
        self._slot_free = Event()
        self._stop_event = Event()
        # Heartbeats go on while a stopping pool waits for its jobs: set last.
        self._maintenance_stop = Event()
        self._started = False
        self._dispatcher: Greenlet | None = None
        self._services: list[Greenlet] = []
        self._outcomes: list[_Outcome] = []
        self._outcome_waiting = Event()
        # Slots a claim in flight (the dispatcher's or the completer's) may fill.
        self._reserved = 0

    def active_jobs(self) -> list[str]:
        return list(self._running)

    # -- lifecycle --------------------------------------------------------------

    def start(self) -> None:
        if self._started:
            raise PoolAlreadyStarted(PoolAlreadyStarted.__doc__)
        self._started = True
        self.registry.close()
        try:
            self.rescuer.run_once(utc_now())
        except Exception:
            logger.exception("rescue at pool start failed; the periodic rescue will retry")
        self._dispatcher = gevent.spawn(self._dispatch)
        self._services = [
            gevent.spawn(self._complete),
            gevent.spawn(self._every, self.settings.heartbeat_seconds, self.heartbeat_once),
            gevent.spawn(self._every, self.settings.rescue_seconds, self.rescue_once),
        ]
        logger.info(
            "job pool started with %d workers (owner %s)", self.settings.workers, self.owner
        )

    def wake(self) -> None:
        """Tell an idle dispatcher that this process enqueued a job (greenlet code only)."""
        self._wake.set()

    def stop(self, timeout: float) -> StopReport:
        """Stop claiming, let running jobs finish for up to `timeout` seconds, then
        stop the rest and record them (re-queued or interrupted) before returning."""
        if not self._started or self._stop_event.is_set():
            return StopReport()
        self._stop_event.set()
        self._wake.set()
        self._slot_free.set()
        if self._dispatcher is not None:
            self._dispatcher.join()
        entries = list(self._running.values())
        gevent.joinall([e.greenlet for e in entries if e.greenlet], timeout=timeout)
        left = [e for e in entries if e.greenlet is not None and not e.greenlet.dead]
        gevent.killall([e.greenlet for e in left], PoolStopping, block=True, timeout=5)
        recovered = queries.Recovered()
        if left:
            try:
                recovered = self.store.write(
                    queries.release, [e.lease for e in left], now=to_text(utc_now())
                )
            except Exception:
                logger.exception("could not record stopped jobs; their leases will expire")
        self._maintenance_stop.set()
        gevent.killall(self._services, block=True, timeout=5)
        report = StopReport(len(entries) - len(left), recovered.requeued, recovered.failed)
        for job_id in report.requeued:
            logger.warning("re-queued a job stopped by shutdown", extra={"job_id": job_id})
        for job_id in report.failed:
            logger.error("job stopped by shutdown: interrupted", extra={"job_id": job_id})
        logger.info("job pool stopped (owner %s)", self.owner)
        return report

    # -- claiming ---------------------------------------------------------------

    def _dispatch(self) -> None:
        while not self._stop_event.is_set():
            free = self.settings.workers - len(self._running) - self._reserved
            if free <= 0:
                self._slot_free.wait()
                self._slot_free.clear()
                continue
            self._wake.clear()
            try:
                jobs = self.claim(free)
            except Exception:
                logger.exception("claiming jobs failed; trying again after the poll interval")
                self._stop_event.wait(self.settings.poll_seconds)
                continue
            if len(jobs) < free:
                self._wait_for_work()

    def claim(self, limit: int) -> list[Job]:
        """Claim up to `limit` due jobs and start running them."""
        self._reserved += limit
        try:
            jobs = self.store.write(queries.claim, **self._claim_values(limit))
        finally:
            self._reserved -= limit
        self._start(jobs)
        return jobs

    def _claim_values(self, limit: int) -> dict[str, Any]:
        now = utc_now()
        return {
            "owner": self.owner,
            "now": to_text(now),
            "lease_expires_at": to_text(now + seconds(self.settings.lease_seconds)),
            "limit": limit,
        }

    def _start(self, jobs: list[Job]) -> None:
        if jobs and self._stop_event.is_set():
            # Claimed by a write that was in flight when `stop` began (the
            # completer's): `stop` may already have counted what it waits for,
            # so these never start; they go back to the queue as they were.
            self._unclaim(jobs)
            return
        for job in jobs:
            self._stop_stale_handler(job.id)
            entry = _Running(queries.Lease(job.id, self.owner, job.attempt))
            self._running[job.id] = entry
            entry.greenlet = gevent.spawn(self._execute, job, entry)

    def _unclaim(self, jobs: list[Job]) -> None:
        leases = [queries.Lease(job.id, self.owner, job.attempt) for job in jobs]
        try:
            self.store.write(queries.unclaim, leases, now=to_text(utc_now()))
        except Exception:
            logger.exception("could not put back jobs claimed while stopping; leases will expire")

    def _wait_for_work(self) -> None:
        """Idle until woken, another process commits something due, or the poll interval."""
        deadline = time.monotonic() + self.settings.poll_seconds
        try:
            version = self.store.data_version()
            while not self._stop_event.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                if self._wake.wait(min(self.settings.change_check_seconds, remaining)):
                    return
                current = self.store.data_version()
                if current == version:
                    continue
                version = current
                # Something committed (maybe only a heartbeat): claim only if a job is due.
                if self.store.read(queries.has_due_job, to_text(utc_now())):
                    return
        except Exception:
            logger.exception("checking for new jobs failed; waiting for the poll")
            self._wake.wait(max(deadline - time.monotonic(), 0))

    # -- running ----------------------------------------------------------------

    def _execute(self, job: Job, entry: _Running) -> None:
        extra = {"job_id": job.id, "kind": job.kind, "attempt": job.attempt}
        try:
            self._execute_claimed(job, entry, extra)
        except LeaseLost:
            logger.warning("job lost its lease; its outcome is not recorded", extra=extra)
        except PoolStopping:
            pass  # `stop` records the job
        finally:
            if self._running.get(job.id) is entry:
                del self._running[job.id]
            self._slot_free.set()

    def _execute_claimed(self, job: Job, entry: _Running, extra: dict[str, Any]) -> None:
        kind = self.registry.get(job.kind)
        if kind is None:
            logger.error("no handler for job kind", extra=extra)
            self._record(entry.lease, queries.fail, extra, error=message_no_handler(job.kind))
            return
        try:
            payload = kind.load_payload(job.payload)
        except (ValueError, ValidationError) as error:
            fields = sorted(error.messages) if isinstance(error, ValidationError) else []
            logger.error("stored payload no longer loads (fields %s)", fields, extra=extra)
            self._record(entry.lease, queries.fail, extra, error=MESSAGE_INTERNAL)
            return
        self._run_handler(job, kind, payload, entry.lease, extra)

    def _run_handler(
        self, job: Job, kind: Kind, payload: Any, lease: queries.Lease, extra: dict[str, Any]
    ) -> None:
        context = JobContext(self, job, kind, lease)
        timer = gevent.Timeout(kind.options.timeout_seconds)
        try:
            with timer:  # cancelled however the handler ends
                value = kind.handler(payload, context)
            result = kind.encode_result(value)
        except Failure as failure:
            logger.info("job failed: %s", failure.message, extra=extra)
            self._record(lease, queries.fail, extra, error=failure.message)
        except gevent.Timeout as timeout:
            if timeout is not timer:  # the handler's own timeout, not the kind's
                self._unexpected_error(job, kind, lease, extra, timeout)
                return
            logger.warning("job timed out", extra=extra)
            self._retry_or_fail(job, kind, lease, extra, MESSAGE_TIMED_OUT)
        except Exception as error:
            self._unexpected_error(job, kind, lease, extra, error)
        else:
            if self._record(lease, queries.succeed, extra, result=result):
                logger.info("job succeeded", extra=extra)

    def _unexpected_error(
        self,
        job: Job,
        kind: Kind,
        lease: queries.Lease,
        extra: dict[str, Any],
        error: BaseException,
    ) -> None:
        if job.attempt < job.max_attempts:
            # Below ERROR only the type: the text may quote a URL or a token.
            logger.warning("job attempt failed (%s)", type(error).__name__, extra=extra)
        else:
            logger.error("job failed", exc_info=error, extra=extra)
        self._retry_or_fail(job, kind, lease, extra, MESSAGE_INTERNAL)

    def _retry_or_fail(
        self, job: Job, kind: Kind, lease: queries.Lease, extra: dict[str, Any], message: str
    ) -> None:
        if job.attempt < job.max_attempts:
            now = utc_now()
            run_at = now + seconds(kind.options.backoff.delay(job.attempt))
            if self._record(lease, queries.retry, extra, run_at=to_text(run_at)):
                logger.info("job re-queued for attempt %d", job.attempt + 1, extra=extra)
        else:
            self._record(lease, queries.fail, extra, error=message)

    def _record(
        self,
        lease: queries.Lease,
        write: Callable[..., bool],
        extra: dict[str, Any],
        **values: str,
    ) -> bool:
        """Make a final (fenced) write; returns whether it was recorded.

        The write goes to the completer, which commits the outcomes of jobs
        that finish together in one transaction (one hop to the writer thread
        and one commit instead of one each); this waits until it is committed,
        so the worker's slot frees only once the outcome is stored.

        A database that stays locked past the deadline (a long migration, say)
        does not cost a finished job its outcome: the write is tried again with
        backoff while the job stays in `_running`, so the heartbeat keeps its
        lease, and the fence makes a repeated write harmless. A write that
        matches no row means the job is no longer ours: logged, not retried.
        """
        delay = _RECORD_RETRY_FIRST_SECONDS
        while True:
            outcome = _Outcome(lease, write, values)
            self._outcomes.append(outcome)
            self._outcome_waiting.set()
            try:
                recorded = outcome.recorded.get()
            except StoreUnavailable:
                logger.warning(
                    "database busy while recording the job's outcome; trying again in %.1fs",
                    delay,
                    extra=extra,
                )
                gevent.sleep(delay)
                delay = min(delay * 2, _RECORD_RETRY_MAX_SECONDS)
                continue
            except Exception:
                logger.exception(
                    "recording the job's outcome failed; its lease will expire", extra=extra
                )
                return False
            if not recorded:
                logger.warning("job was no longer ours when its outcome was recorded", extra=extra)
            return recorded

    def _complete(self) -> None:
        """The completer: records every waiting outcome in one write, then the next batch."""
        while True:
            self._outcome_waiting.wait()
            self._outcome_waiting.clear()
            batch, self._outcomes = self._outcomes, []
            if batch:
                self._record_batch(batch)

    def _record_batch(self, batch: list[_Outcome]) -> None:
        # The slots these outcomes free are claimed in the same transaction:
        # measured, a separate claim after each batch was a second hop to the
        # writer thread and a second commit for the same handful of jobs.
        limit = 0
        if not self._stop_event.is_set():
            finishing = sum(1 for outcome in batch if outcome.lease.job_id in self._running)
            limit = max(0, self.settings.workers - len(self._running) - self._reserved + finishing)
        claim = self._claim_values(limit) if limit else None
        self._reserved += limit
        try:
            recorded, jobs = self.store.write(_write_outcomes, batch, to_text(utc_now()), claim)
        except StoreUnavailable as error:
            # The database, not one outcome: splitting would only wait again per job.
            for outcome in batch:
                outcome.recorded.set_exception(error)
            return
        except Exception as error:
            if len(batch) == 1:
                batch[0].recorded.set_exception(error)
                return
            # One outcome's failure must not cost the others theirs: one by one.
            for outcome in batch:
                self._record_batch([outcome])
            return
        finally:
            self._reserved -= limit
        for outcome, matched in zip(batch, recorded, strict=True):
            outcome.recorded.set(matched)
        self._start(jobs)

    # -- maintenance ------------------------------------------------------------

    def _every(self, interval: float, task: Callable[[datetime], object]) -> None:
        while not self._maintenance_stop.wait(interval):
            try:
                task(utc_now())
            except Exception:
                logger.exception("job pool maintenance failed")

    def heartbeat_once(self, now: datetime) -> int:
        """Renew this process's leases; stop the handlers whose lease was lost. Returns how many."""
        entries = list(self._running.values())
        if not entries:
            return 0
        renewed = self.store.write(
            queries.renew_leases,
            [e.lease for e in entries],
            lease_expires_at=to_text(now + seconds(self.settings.lease_seconds)),
        )
        lost = 0
        for entry in entries:
            lease = entry.lease
            if (lease.job_id, lease.attempt) in renewed:
                continue
            if self._running.get(lease.job_id) is entry and entry.greenlet is not None:
                lost += 1
                logger.warning(
                    "job lost its lease; stopping its handler",
                    extra={"job_id": lease.job_id, "attempt": lease.attempt},
                )
                entry.greenlet.kill(LeaseLost, block=False)
        return lost

    def rescue_once(self, now: datetime) -> queries.Recovered:
        recovered = self.rescuer.run_once(now)
        # A job of ours among them lost its lease (our heartbeats did not get
        # through in time): its handler must stop, or it would run on beside
        # the job's next attempt.
        for job_id in (*recovered.requeued, *recovered.failed):
            self._stop_stale_handler(job_id)
        if recovered.requeued:
            self._wake.set()
        return recovered

    def _stop_stale_handler(self, job_id: str) -> None:
        entry = self._running.pop(job_id, None)
        if entry is not None and entry.greenlet is not None:
            logger.warning(
                "job lost its lease; stopping its handler",
                extra={"job_id": job_id, "attempt": entry.lease.attempt},
            )
            entry.greenlet.kill(LeaseLost, block=False)
