"""The executor: runs each claimed job's handler in a slot of its own, and decides
how the attempt ended.

Outcomes are written by whatever the pool gives it as `record` (the
completer); the executor only decides them. A handler it must stop (a lost
lease, a stopping pool, a cancel past the grace) is killed with one of the
runner's own interrupts, which a handler's `except Exception` cannot catch.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import gevent
from marshmallow import ValidationError

from mealquest import tracing
from mealquest.db.driver import Store
from mealquest.db.errors import StoreUnavailable
from mealquest.jobs import enqueueing
from mealquest.jobs.context import JobContext
from mealquest.jobs.errors import JobCancelled, LeaseLost, PoolStopping
from mealquest.jobs.registry import Kind, Registry
from mealquest.jobs.runner.metrics import AttemptMetrics
from mealquest.jobs.runner.outcome import (
    CANCELLED,
    PUT_BACK_AFTER_OUTAGE,
    Outcome,
    failed,
    snoozed,
)
from mealquest.jobs.runner.running import DATABASE_AWAY, Running
from mealquest.jobs.runner.settings import PoolSettings
from mealquest.jobs.runner.slots import Slots
from mealquest.masking import bounded_failure_message, mask
from mealquest.model.jobs import (
    MAX_RESULT_BYTES,
    MESSAGE_INTERNAL,
    MESSAGE_SNOOZED_TOO_OFTEN,
    MESSAGE_TIMED_OUT,
    Attempt,
    Failure,
    Job,
    Lease,
    Snooze,
    Status,
)
from mealquest.model.signals import WaitForHousehold
from mealquest.storable import storable_text

logger = logging.getLogger(__name__)

# Writes an attempt's outcome, fenced on its lease, and waits for its commit;
# whether the fence matched (the completer's `record`).
Record = Callable[[Lease, Outcome, dict[str, Any]], bool]


def _not_the_handlers_failure(entry: Running, error: BaseException) -> bool:
    """Whether `error` ends the handler's attempt without being its failure:
    how the pool ended it, or the process stopping.

    SystemExit and KeyboardInterrupt are what signal handlers raise, in
    whichever greenlet runs when the signal arrives: gunicorn's worker
    timeout raises SystemExit in the handler that held the event loop. Let
    through, they stop the process, whose jobs are then interrupted (a
    handler that exits its process is a poison pill). The pool's own
    exceptions pass when the pool threw them (`LeaseLost` also when a write
    of `ctx` found the lease gone): raised by the handler on its own, they
    are its failure like any other.
    """
    if isinstance(error, SystemExit | KeyboardInterrupt):
        return True
    if isinstance(error, LeaseLost):
        return entry.taken is not None or entry.lease_found_lost
    if isinstance(error, PoolStopping):
        return entry.taken is not None
    if isinstance(error, JobCancelled):
        return entry.cancel_killed_at is not None
    return False


class Executor:
    """Runs handlers in the pool's slots and hands their outcomes to `record`."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        settings: PoolSettings,
        slots: Slots,
        record: Record,
        attempt_metrics: AttemptMetrics,
    ) -> None:
        self.store = store
        self.registry = registry
        self.settings = settings
        self.slots = slots
        self.record = record
        self.attempt_metrics = attempt_metrics

    # -- running ----------------------------------------------------------------

    def start(self, jobs: list[Job], lease_deadline: float) -> None:
        """Run claimed jobs, each in a slot of its own (reserved by the claim)."""
        traces = self._traceparents(jobs) if self.settings.tracing else {}
        for job in jobs:
            self.attempt_metrics.started(job)
            kind = self.registry.get(job.kind)
            timeout = kind.options.timeout_seconds if kind else 0.0
            entry = Running(
                job,
                job.lease,
                deadline=time.monotonic() + timeout,
                lease_deadline=lease_deadline,
                traceparent=traces.get(job.id),
            )
            self.slots.place(entry, self._execute)

    def take(self, entry: Running, reason: str, exception: type[LeaseLost | PoolStopping]) -> None:
        """Take a job from its handler: the handler is killed (without waiting)
        and the pool, not the handler, records the job. Only with the pool's
        own exceptions: the handler's attempt takes any other for its own.
        A handler that has returned is left alone: its outcome is being
        written, fenced on its lease, which decides whether it stands."""
        if entry.taken is not None or entry.abandoned or entry.recording:
            return
        entry.taken = reason
        entry.taken_at = time.monotonic()
        if entry.alive():
            assert entry.greenlet is not None
            entry.greenlet.kill(exception, block=False)

    def cancel(self, job_id: str) -> int:
        """Tell the handlers of `job_id` running here that the job was cancelled
        (`ctx.cancelled`), and kill each that still runs after the kill grace.
        Returns how many were told. A handler whose outcome is already being
        written finished first: its outcome stands."""
        told = 0
        for entry in list(self.slots.running.values()):
            if entry.job.id != job_id or entry.cancelled_at is not None:
                continue
            if entry.recording or entry.taken is not None or entry.abandoned:
                continue
            entry.cancelled_at = time.monotonic()
            told += 1
            logger.info("job cancelled while running; telling its handler", extra=entry.extra)
            gevent.spawn_later(self.settings.kill_grace_seconds, self._kill_cancelled, entry)
        return told

    def _kill_cancelled(self, entry: Running) -> None:
        if not entry.alive() or entry.recording or entry.taken is not None or entry.abandoned:
            return
        logger.warning(
            "handler did not stop after its job was cancelled; killing it", extra=entry.extra
        )
        entry.cancel_killed_at = time.monotonic()
        assert entry.greenlet is not None
        entry.greenlet.kill(JobCancelled, block=False)

    def _execute(self, entry: Running) -> None:
        try:
            if not self.settings.tracing:
                self._run_and_record(entry)
                return
            job = entry.job
            with tracing.attempt_span(
                job.kind, job.id, job.attempt, job.household_id, entry.traceparent
            ) as span:
                tracing.end_attempt(span, self._run_and_record(entry))
        finally:
            # The context refers back to the entry (its handler asks whether
            # the job was cancelled): left so, the entry, its greenlet and all
            # they hold formed a cycle, which only the cyclic collector frees.
            # A drain's thousands of them made its young collections take ~10
            # ms each, 23 µs a job (bench/NOTES.md, round 5, ninth session).
            entry.context = None

    def _traceparents(self, jobs: list[Job]) -> dict[str, str]:
        """The spans the claimed jobs were enqueued under, in one read; none if
        they cannot be read now (each attempt then has a trace of its own:
        never a reason to hold a job back)."""
        try:
            return self.store.read(self.store.jobs.traceparents, [job.id for job in jobs])
        except Exception as error:
            logger.warning("could not read the claimed jobs' traces (%s)", type(error).__name__)
            return {}

    def _run_and_record(self, entry: Running) -> str:
        """Run the attempt and record its outcome; how it ended, in a word
        for its span."""
        extra = entry.extra
        if not self._earlier_attempts_ended(entry):
            logger.error("an earlier attempt's handler is still alive; job put back", extra=extra)
            outcome = Outcome(
                Status.QUEUED, Attempt.REFUND, delay_seconds=self.settings.kill_grace_seconds
            )
            entry.recording = True
            self.record(entry.lease, outcome, extra)
            return "put back"
        try:
            outcome = self._attempt(entry)
        except LeaseLost:
            if entry.taken != DATABASE_AWAY:
                logger.warning("job lost its lease; its outcome is not recorded", extra=extra)
                return "lease lost"
            # Stopped only because the database was away: the job goes back
            # uncounted, written once the database answers (the heartbeat
            # renews the lease meanwhile, if nobody has taken it).
            entry.taken = None
            outcome = PUT_BACK_AFTER_OUTAGE
        except PoolStopping:
            return "pool stopping"  # the stopping pool records the job
        except JobCancelled:
            outcome = CANCELLED
        except Exception:
            # A bug of the runner's, or of the kind's code that it calls: the
            # job fails now, rather than stay running until its lease expires
            # and then run again.
            logger.exception("running the job failed", extra=extra)
            outcome = failed(MESSAGE_INTERNAL)
        if entry.taken is not None or entry.abandoned:
            # The handler swallowed the pool's kill and returned: whoever took
            # the job records it.
            logger.warning("handler ended after its job was taken (%s)", entry.taken, extra=extra)
            return "taken"
        if entry.cancelled_at is not None:
            # However the handler ended once it was told: the job was cancelled.
            outcome = CANCELLED
        elif outcome.to is Status.SUCCEEDED and entry.context and entry.context.follow_ups:
            outcome = replace(outcome, follow_ups=tuple(entry.context.follow_ups))
        entry.recording = True
        if outcome.to is not Status.SUCCEEDED:
            self._keep_ending(entry, outcome)
        if not self.record(entry.lease, outcome, extra):
            return "lease lost"
        self.attempt_metrics.attempt_recorded(entry, outcome)
        if outcome.to is Status.CANCELLED:
            logger.info("job cancelled", extra=extra)
            return "cancelled"
        if outcome.to is Status.SUCCEEDED:
            logger.info("job succeeded", extra=extra)
            return "succeeded"
        if outcome.snoozed:
            logger.info("job snoozed for %.1fs", outcome.delay_seconds or 0.0, extra=extra)
            return "snoozed"
        if outcome.waiting is not None:
            logger.info("job waits for its household (signal %s)", outcome.waiting[0], extra=extra)
            return "waiting"
        if outcome.to is Status.QUEUED and outcome.attempt is Attempt.SPEND:
            logger.info("job re-queued for attempt %d", entry.job.attempt + 1, extra=extra)
            return "retried"
        if outcome.to is Status.QUEUED:
            logger.warning("job re-queued, its attempt not spent", extra=extra)
            return "put back"
        return "failed"

    def _keep_log(self, entry: Running) -> None:
        """Store the lines the handler logged (`ctx.log`) with its attempt,
        fenced on its lease: a handler whose job was taken back keeps none.
        Never fails the attempt: the lines are for operators."""
        context = entry.context
        lines = context.log.kept() if context is not None else []
        if context is None or not lines:
            return
        try:
            context.write(self.store.jobs.add_log_lines, entry.job.id, lines)
        except LeaseLost:
            logger.warning("job lost its lease; its log lines are not kept", extra=entry.extra)
        except Exception as error:
            logger.warning(
                "could not keep the job's log lines (%s)", type(error).__name__, extra=entry.extra
            )

    def _keep_ending(self, entry: Running, outcome: Outcome) -> None:
        """A last line in the attempt's log saying how it ended, when it did
        not succeed: the dashboard tells a job's story by its attempts' lines.
        A success writes none (its row says it, and the drain pays nothing).
        Never fails the attempt: the line is for operators."""
        context = entry.context
        if context is None:
            return
        level, text = _ending(entry.job.attempt, outcome)
        try:
            context.write(
                self.store.jobs.add_log_lines, entry.job.id, [context.log.ending(level, text)]
            )
        except LeaseLost:
            pass  # the outcome's fenced write finds it gone too, and says so
        except Exception as error:
            logger.warning(
                "could not keep how the attempt ended (%s)", type(error).__name__, extra=entry.extra
            )

    def _earlier_attempts_ended(self, entry: Running) -> bool:
        """Whether no earlier claim of the same job still runs a handler here.

        That happens only when another process took the job's lease (its clock
        ran ahead, or this process froze) and this process claimed the job
        again before its heartbeat noticed: the earlier handler is stopped and
        this attempt waits for it to die, or does not run at all.
        """
        if self.slots.attempts_at(entry.job.id) <= 1:
            return True
        earlier = [
            other
            for other in list(self.slots.running.values())
            if other.job.id == entry.job.id and other is not entry and other.alive()
        ]
        if not earlier:
            return True
        for other in earlier:
            if other.recording:
                # Its handler returned: its outcome's write, fenced, ends it.
                logger.warning("job lost its lease; its outcome will not stand", extra=other.extra)
            else:
                logger.warning("job lost its lease; stopping its handler", extra=other.extra)
                self.take(other, "lease lost", LeaseLost)
        gevent.joinall(
            [other.greenlet for other in earlier if other.greenlet],
            timeout=self.settings.kill_grace_seconds,
        )
        return not any(other.alive() for other in earlier)

    def _attempt(self, entry: Running) -> Outcome:
        """Run the handler once and say how the attempt ended (nothing written here)."""
        job, extra = entry.job, entry.extra
        kind = self.registry.get(job.kind)
        if kind is None:  # never claimed: the claim names the registered kinds
            raise RuntimeError(f"claimed a job of an unregistered kind {job.kind!r}")
        if job.result_undecodable:
            logger.error("stored result of the job is not JSON", extra=extra)
            return failed(MESSAGE_INTERNAL)
        try:
            payload = kind.load_payload(job.payload)
        except Exception as error:
            _log_unloadable_payload(error, extra)
            return failed(MESSAGE_INTERNAL)
        context = JobContext(
            self.store,
            job,
            entry.lease,
            encode_partial=kind.encode_partial,
            prepare=functools.partial(enqueueing.prepare, self.registry),
            is_cancelled=lambda: entry.cancelled_at is not None,
            signal_schema=kind.options.signal_schema,
        )
        entry.context = context
        value, ended, timed_out = self._run_handler(entry, kind, payload, context)
        if context.result_too_large:
            # However the handler went on: it published what no job may store.
            logger.error("handler published a partial result past the bound", extra=extra)
            return failed(MESSAGE_INTERNAL)
        if timed_out or time.monotonic() >= entry.deadline:
            # Past its timeout, however it ended: a handler that caught the
            # timeout and returned (or failed) anyway is still timed out.
            if not timed_out:
                logger.error("handler ignored its timeout", extra=extra)
            else:
                logger.warning("job timed out", extra=extra)
            return self._retry_or_fail(job, kind, MESSAGE_TIMED_OUT)
        if ended is not None:
            return self._raised(job, kind, extra, ended)
        return _succeeded(kind, value, extra)

    def _run_handler(
        self, entry: Running, kind: Kind, payload: Any, context: JobContext
    ) -> tuple[Any, BaseException | None, bool]:
        """Call the handler under its timeout: what it returned, what it raised
        (None: nothing), and whether its timeout ended it."""
        timeout = kind.options.timeout_seconds
        timer = gevent.Timeout(timeout)
        entry.deadline = time.monotonic() + timeout
        ended: BaseException | None = None
        value: Any = None
        timer.start()
        try:
            value = kind.handler(payload, context)
        except BaseException as error:
            if _not_the_handlers_failure(entry, error):
                raise
            # Whatever else the handler raised is its own doing: GreenletExit
            # included, which would end the greenlet quietly and leave the job
            # running until its lease expired.
            ended = error
        finally:
            timer.close()
            self._keep_log(entry)
        return value, ended, ended is timer

    def _raised(self, job: Job, kind: Kind, extra: dict[str, Any], ended: BaseException) -> Outcome:
        """The outcome of a handler that raised `ended` (not its timeout)."""
        if isinstance(ended, Failure) and not isinstance(ended.message, str):
            # A handler's bug, and not known to be safe to show.
            kind_of = type(ended.message).__name__
            logger.error("handler's Failure message is not text (%s)", kind_of, extra=extra)
            return failed(MESSAGE_INTERNAL)
        if isinstance(ended, Failure):
            # As stored: a message neither database could store would leave
            # the job running until its lease expired.
            message = bounded_failure_message(storable_text(ended.message))
            logger.info("job failed: %s", mask(message), extra=extra)
            return failed(message)
        if isinstance(ended, Snooze):
            return self._snooze(job, ended, extra)
        if isinstance(ended, WaitForHousehold):
            # Not the job's doing: its attempt is not spent, however long it waits.
            return Outcome(
                Status.QUEUED,
                Attempt.REFUND,
                delay_seconds=ended.seconds,
                waiting=(ended.name, ended.prompt),
            )
        if isinstance(ended, StoreUnavailable):
            # The database, not the job: another attempt is owed, not spent.
            logger.warning("job stopped by a storage fault; re-queued", extra=extra)
            delay = kind.options.backoff.delay(1)
            return Outcome(Status.QUEUED, Attempt.REFUND, delay_seconds=delay)
        return self._unexpected_error(job, kind, extra, ended)

    def _unexpected_error(
        self, job: Job, kind: Kind, extra: dict[str, Any], error: BaseException
    ) -> Outcome:
        if job.attempt < job.max_attempts:
            # Below ERROR only the type: the text may quote a URL or a token.
            logger.warning("job attempt failed (%s)", type(error).__name__, extra=extra)
        else:
            logger.error("job failed", exc_info=error, extra=extra)
        outcome = self._retry_or_fail(job, kind, MESSAGE_INTERNAL)
        if outcome.to is Status.QUEUED:
            # For the operators' story of the job (its log, masked), not the
            # household's: what the handler raised, since it was retried.
            outcome = replace(outcome, reason=f"{type(error).__name__}: {error}")
        return outcome

    def _snooze(self, job: Job, snooze: Snooze, extra: dict[str, Any]) -> Outcome:
        """Back to the queue in `snooze.seconds`, the attempt not spent; a
        job snoozed as often as it may fails instead, so none comes back
        forever. (A cancel that reached the job meanwhile wins either way.)"""
        if job.snoozes >= self.settings.max_snoozes:
            logger.warning("job snoozed %d times; failed", job.snoozes + 1, extra=extra)
            return failed(MESSAGE_SNOOZED_TOO_OFTEN)
        return snoozed(snooze.seconds)

    @staticmethod
    def _retry_or_fail(job: Job, kind: Kind, message: str) -> Outcome:
        if job.attempt < job.max_attempts:
            delay = kind.options.backoff.delay(job.attempt)
            return Outcome(Status.QUEUED, delay_seconds=delay, reason=message)
        return failed(message)


def _ending(attempt: int, outcome: Outcome) -> tuple[str, str]:
    """The level and words of an attempt's last log line, for an outcome other
    than success (the failure's message is the household's own, safe to show)."""
    if outcome.to is Status.CANCELLED:
        return "WARNING", f"attempt {attempt} ended: the job was cancelled"
    if outcome.snoozed:
        delay = _seconds(outcome.delay_seconds or 0.0)
        return "INFO", f"attempt {attempt} snoozed for {delay} s (not counted)"
    if outcome.waiting is not None:
        return (
            "INFO",
            f"attempt {attempt} waits for its household's {outcome.waiting[0]} (not counted)",
        )
    if outcome.to is Status.QUEUED and outcome.attempt is Attempt.SPEND:
        why = f": {outcome.reason}" if outcome.reason else ""
        delay = _seconds(outcome.delay_seconds or 0.0)
        return "WARNING", f"attempt {attempt} failed{why}; retried in {delay} s"
    if outcome.to is Status.QUEUED:
        why = f": {outcome.reason}" if outcome.reason else ""
        return "WARNING", f"attempt {attempt} put back (not counted){why}"
    return "ERROR", f"attempt {attempt} failed: {outcome.error or 'no message'}"


def _seconds(seconds: float) -> str:
    """A delay as a person reads it: two significant figures (0.01, 4, 120)."""
    return f"{float(f'{seconds:.2g}'):g}"


def _log_unloadable_payload(error: Exception, extra: dict[str, Any]) -> None:
    """The kind's schema code may raise anything; only field names are
    logged (the text may quote the payload)."""
    if isinstance(error, ValidationError):
        fields = sorted(error.messages) if isinstance(error.messages, dict) else []
        logger.error("stored payload no longer loads (fields %s)", fields, extra=extra)
    else:
        logger.error("stored payload no longer loads (%s)", type(error).__name__, extra=extra)


def _succeeded(kind: Kind, value: Any, extra: dict[str, Any]) -> Outcome:
    """The outcome of a handler that returned `value`: succeeded with it
    stored, unless it does not fit its schema or its bound."""
    try:
        result = kind.encode_result(value)
    except Exception as error:
        # A handler's bug (or its schema's: any exception, a RecursionError
        # of a result nested too deep included): another attempt would
        # only repeat its side effects.
        logger.error(
            "handler's result does not match its schema (%s)",
            type(error).__name__,
            extra=extra,
        )
        return failed(MESSAGE_INTERNAL)
    size = len(result.encode())
    if size > MAX_RESULT_BYTES:
        # A handler's bug too: its result has no bound.
        logger.error("handler's result is too large (%d bytes)", size, extra=extra)
        return failed(MESSAGE_INTERNAL)
    return Outcome(Status.SUCCEEDED, result=result)
