"""The executor: runs each claimed job's handler in its own greenlet, in a fixed
number of slots, and decides how the attempt ended.

A slot is a place in a `gevent.pool.Pool`: it frees only when the job's
greenlet is dead, so a handler that will not die keeps its slot (and the
watchdog restarts the process) instead of running beside the job's next
attempt. Outcomes are written by the completer; the executor only decides
them.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import ModuleType
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

import gevent
import gevent.pool
from gevent.event import Event
from gevent.greenlet import Greenlet
from marshmallow import ValidationError

from mealquest.jobs import enqueueing
from mealquest.jobs.enqueueing import NewJob
from mealquest.jobs.errors import JobCancelled, LeaseLost, PoolStopping
from mealquest.jobs.model import (
    DEFAULT_PRIORITY,
    MESSAGE_INTERNAL,
    MESSAGE_TIMED_OUT,
    Attempt,
    Failure,
    Job,
    Lease,
    Status,
    Transition,
)
from mealquest.jobs.registry import Kind, Registry
from mealquest.jobs.settings import PoolSettings
from mealquest.masking import URL_IN_TEXT, mask
from mealquest.metrics import runs as job_metrics
from mealquest.storable import storable_text
from mealquest.store import Store, StoreUnavailable, Transaction

if TYPE_CHECKING:
    from mealquest.jobs.completer import Completer

logger = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

# `Running.taken` of the jobs a stopping pool cut short.
STOPPING = "stopping"


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended: the state change its worker writes, fenced on the lease."""

    to: Status
    attempt: Attempt = Attempt.SPEND
    result: str | None = None
    error: str | None = None
    delay_seconds: float | None = None
    # Jobs the handler enqueued (`JobContext.enqueue`): inserted only with a
    # success, in the same transaction, and only if the fence matched.
    follow_ups: tuple[NewJob, ...] = ()

    def transition(self, lease: Lease) -> Transition:
        """The fenced state change this outcome writes for `lease`."""
        return Transition(
            lease,
            to=self.to,
            attempt=self.attempt,
            result=self.result,
            error=self.error,
            delay_seconds=self.delay_seconds,
        )

    def write_follow_ups(self, jobs: ModuleType, tx: Transaction) -> None:
        """Insert the follow-ups once the success's fenced write matched."""
        if self.to is Status.SUCCEEDED:
            for job in self.follow_ups:
                # A follow-up whose key another job holds is that job: the
                # success must not fail over it.
                enqueueing.insert(tx, jobs, job, on_reused_key="keep")

    def write(self, jobs: ModuleType, tx: Transaction, lease: Lease) -> bool:
        """This outcome alone, through `jobs` (the driver's job statements):
        whether the fence matched; the follow-ups are written only then."""
        matched = jobs.transition_many(tx, [self.transition(lease)])[0]
        if matched:
            self.write_follow_ups(jobs, tx)
        return matched


CANCELLED = Outcome(Status.CANCELLED)


# A `Failure` message is for a person to read in a job's answer: one longer
# than this (a page's whole text, say) is cut, not stored and served in full.
MAX_FAILURE_MESSAGE = 2_000
_CUT = "…"


def _bounded(message: str) -> str:
    """`message` cut to `MAX_FAILURE_MESSAGE` characters, never inside a URL:
    a URL's credentials are masked where jobs are shown only when the URL
    is whole (a cut one might have lost the `@` that marks them)."""
    if len(message) <= MAX_FAILURE_MESSAGE:
        return message
    end = MAX_FAILURE_MESSAGE - len(_CUT)
    for url in URL_IN_TEXT.finditer(message, 0, end + 1):
        if url.end() > end:
            end = url.start()
    return message[:end] + _CUT


def failed(error: str) -> Outcome:
    return Outcome(Status.FAILED, error=error)


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


@dataclass(eq=False)
class Running:
    """A job this process runs, from its claim until its greenlet is dead.

    Times are monotonic. `deadline` is when the kind's timeout ends the
    handler; `lease_deadline` when the lease expires as far as this process
    knows (the claim's or the last renewal's start plus the lease).
    """

    job: Job
    lease: Lease
    deadline: float
    lease_deadline: float
    greenlet: Greenlet | None = None
    # The handler returned or raised; its outcome is being written.
    recording: bool = False
    # Why the pool took the job from its handler (stop, lost lease), and when:
    # the handler was killed and the pool, not the handler, records the job.
    taken: str | None = None
    taken_at: float = 0.0
    # The pool gave up on a handler that would not die: nothing renews,
    # records or waits for this job any more.
    abandoned: bool = False
    # A cancel reached the job (monotonic time; None: none did), and when the
    # handler, still running after the kill grace, was killed for it.
    cancelled_at: float | None = None
    cancel_killed_at: float | None = None
    # Jobs the handler enqueued, written with its success (`JobContext.enqueue`).
    follow_ups: list[NewJob] = field(default_factory=list)
    # A write of the handler's (`JobContext`) found the lease gone.
    lease_found_lost: bool = False

    @property
    def extra(self) -> dict[str, Any]:
        return {"job_id": self.job.id, "kind": self.job.kind, "attempt": self.job.attempt}

    def alive(self) -> bool:
        return self.greenlet is not None and not self.greenlet.dead


class JobContext:
    """What a handler gets besides its payload: who it is, and fenced writes."""

    def __init__(
        self, store: Store, kind: Kind, entry: Running, registry: Registry | None = None
    ) -> None:
        job = entry.job
        self.job_id = job.id
        self.household_id = job.household_id
        self.kind = job.kind
        self.attempt = job.attempt
        self.max_attempts = job.max_attempts
        # The database: handlers write their domain rows through its SQL
        # (`ctx.store.recipes`, ...) inside `ctx.write`.
        self.store = store
        self._store = store
        self._kind = kind
        self._lease = entry.lease
        self._entry = entry
        self._registry = registry

    @property
    def cancelled(self) -> bool:
        """Whether the job was cancelled while it ran. A cooperative handler
        checks it between steps and returns (or raises) as soon as it is True:
        the job ends cancelled whatever the handler does then. One that does
        not stop is killed after the pool's kill grace."""
        return self._entry.cancelled_at is not None

    def enqueue(
        self,
        kind_name: str,
        payload: Mapping[str, Any],
        *,
        run_at: datetime | None = None,
        delay: float | None = None,
        priority: int = DEFAULT_PRIORITY,
        unique_key: str | None = None,
    ) -> str:
        """Enqueue a follow-up job for this job's household, fenced on this job's lease.

        Validated now (ValidationError or UnknownKind here, as from
        `JobService.enqueue`), written later: the follow-up is inserted in
        the transaction that records this attempt's success, and only if that
        fenced write matches. So if the attempt fails, is retried, times out,
        is cancelled or interrupted, or its lease was lost to another process,
        no follow-up of it exists, and a retried attempt enqueues its own. A
        `unique_key` another job of the household holds makes no new job (and
        does not fail the success): the id returned, the one the follow-up
        will have, then names no job. Follow-ups are the handler's own
        chaining, not a household's request: the household's quota does not
        refuse them (a handler that fans out bounds its own fan-out).
        """
        if self._registry is None:
            raise RuntimeError("this context cannot enqueue")
        job = enqueueing.prepare(
            self._registry,
            kind_name,
            payload,
            household_id=self.household_id,
            run_at=run_at,
            delay=delay,
            priority=priority,
            unique_key=unique_key,
        )
        self._entry.follow_ups.append(job)
        return job.job_id

    def publish(self, partial: Any) -> None:
        """Store a partial result (typed by the kind's partial schema); GET shows it at once."""
        encoded = self._kind.encode_partial(partial)
        published = self._store.write(self._store.jobs.publish, self._lease, result=encoded)
        if not published:
            self._entry.lease_found_lost = True
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
            if not self._store.jobs.owns(tx, self._lease):
                # Marked here, not where it arrives: a LeaseLost that `fn`
                # raises on its own is the handler's failure.
                self._entry.lease_found_lost = True
                raise LeaseLost(LeaseLost.__doc__)
            return fn(tx, *args, **kwargs)

        return self._store.write(fenced)


class Executor:
    """Runs handlers in `settings.workers` slots and hands their outcomes to the completer."""

    def __init__(self, store: Store, registry: Registry, settings: PoolSettings) -> None:
        self.store = store
        self.registry = registry
        self.settings = settings
        self.completer: Completer | None = None  # set by the pool before any job starts
        # By lease: a job taken from a handler that has not died yet may be
        # claimed again here under a new lease.
        self.running: dict[Lease, Running] = {}
        self.slot_freed = Event()
        self._slots = gevent.pool.Pool(settings.workers)
        # Slots a claim in flight (the producer's, the completer's, or one made
        # along an enqueue) may fill,
        # and of those, how many it may fill with each capped kind.
        self._reserved = 0
        self._reserved_kinds: Counter[str] = Counter()

    # -- slots ------------------------------------------------------------------

    def free_slots(self) -> int:
        """Slots neither running a greenlet nor reserved by a claim in flight."""
        return self._slots.free_count() - self._reserved

    def kind_room(
        self, caps: Mapping[str, int], finishing: Counter[str] | None = None
    ) -> dict[str, int]:
        """How many more jobs of each capped kind this process may start: its cap
        less the jobs of the kind it runs (a greenlet not dead yet counts),
        less what claims in flight may bring, plus `finishing` (jobs whose
        handlers returned and whose outcomes the claiming transaction writes)."""
        running = Counter(entry.job.kind for entry in list(self.running.values()))
        finishing = finishing or Counter()
        return {
            kind: max(0, cap - running[kind] - self._reserved_kinds[kind] + finishing[kind])
            for kind, cap in caps.items()
        }

    @contextmanager
    def reserving(self, slots: int, kinds: Mapping[str, int] | None = None) -> Iterator[None]:
        """Hold `slots` (and up to `kinds[kind]` of each capped kind) for a claim in flight."""
        kinds = dict(kinds or {})
        self._reserved += slots
        self._reserved_kinds.update(kinds)
        try:
            yield
        finally:
            self._reserved -= slots
            self._reserved_kinds.subtract(kinds)
            if slots:
                # A claim that took fewer jobs than it reserved leaves slots
                # free that no ending greenlet will announce.
                self.slot_freed.set()

    def claims_in_flight(self) -> bool:
        """Whether a claim has reserved slots and not yet handed out its jobs."""
        return self._reserved > 0

    def greenlets(self) -> list[Greenlet]:
        return list(self._slots)

    def job_of(self, greenlet: object) -> Running | None:
        """The job a greenlet runs (for the hub monitor, from its own thread: reads only)."""
        for entry in list(self.running.values()):
            if entry.greenlet is greenlet:
                return entry
        return None

    # -- running ----------------------------------------------------------------

    def start(self, jobs: list[Job], lease_deadline: float) -> None:
        """Run claimed jobs, each in a slot of its own (reserved by the claim)."""
        for job in jobs:
            kind = self.registry.get(job.kind)
            timeout = kind.options.timeout_seconds if kind else 0.0
            entry = Running(
                job,
                job.lease,
                deadline=time.monotonic() + timeout,
                lease_deadline=lease_deadline,
            )
            self.running[entry.lease] = entry
            greenlet = Greenlet(self._execute, entry)
            entry.greenlet = greenlet
            greenlet.rawlink(lambda _, entry=entry: self._ended(entry))
            self._slots.start(greenlet)

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
        for entry in list(self.running.values()):
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

    def _ended(self, entry: Running) -> None:
        if self.running.get(entry.lease) is entry:
            del self.running[entry.lease]
        self.slot_freed.set()

    def _execute(self, entry: Running) -> None:
        extra = entry.extra
        if not self._earlier_attempts_ended(entry):
            logger.error("an earlier attempt's handler is still alive; job put back", extra=extra)
            outcome = Outcome(
                Status.QUEUED, Attempt.REFUND, delay_seconds=self.settings.kill_grace_seconds
            )
            entry.recording = True
            assert self.completer is not None
            self.completer.record(entry.lease, outcome, extra)
            return
        try:
            outcome = self._attempt(entry)
        except LeaseLost:
            logger.warning("job lost its lease; its outcome is not recorded", extra=extra)
            return
        except PoolStopping:
            return  # the stopping pool records the job
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
            return
        if entry.cancelled_at is not None:
            # However the handler ended once it was told: the job was cancelled.
            outcome = CANCELLED
        elif outcome.to is Status.SUCCEEDED and entry.follow_ups:
            outcome = replace(outcome, follow_ups=tuple(entry.follow_ups))
        entry.recording = True
        assert self.completer is not None
        if not self.completer.record(entry.lease, outcome, extra):
            return
        job_metrics.attempt_recorded(entry, outcome, self.registry)
        if outcome.to is Status.CANCELLED:
            logger.info("job cancelled", extra=extra)
        elif outcome.to is Status.SUCCEEDED:
            logger.info("job succeeded", extra=extra)
        elif outcome.to is Status.QUEUED and outcome.attempt is Attempt.SPEND:
            logger.info("job re-queued for attempt %d", entry.job.attempt + 1, extra=extra)
        elif outcome.to is Status.QUEUED:
            logger.warning("job re-queued, its attempt not spent", extra=extra)

    def _earlier_attempts_ended(self, entry: Running) -> bool:
        """Whether no earlier claim of the same job still runs a handler here.

        That happens only when another process took the job's lease (its clock
        ran ahead, or this process froze) and this process claimed the job
        again before its heartbeat noticed: the earlier handler is stopped and
        this attempt waits for it to die, or does not run at all.
        """
        earlier = [
            other
            for other in list(self.running.values())
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
            # The kind's schema code may raise anything; only field names are
            # logged (the text may quote the payload).
            if isinstance(error, ValidationError):
                fields = sorted(error.messages) if isinstance(error.messages, dict) else []
                logger.error("stored payload no longer loads (fields %s)", fields, extra=extra)
            else:
                logger.error(
                    "stored payload no longer loads (%s)", type(error).__name__, extra=extra
                )
            return failed(MESSAGE_INTERNAL)
        context = JobContext(self.store, kind, entry, self.registry)
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
        if ended is timer or time.monotonic() >= entry.deadline:
            # Past its timeout, however it ended: a handler that caught the
            # timeout and returned (or failed) anyway is still timed out.
            if ended is not timer:
                logger.error("handler ignored its timeout", extra=extra)
            else:
                logger.warning("job timed out", extra=extra)
            return self._retry_or_fail(job, kind, MESSAGE_TIMED_OUT)
        if isinstance(ended, Failure) and not isinstance(ended.message, str):
            # A handler's bug, and not known to be safe to show.
            kind_of = type(ended.message).__name__
            logger.error("handler's Failure message is not text (%s)", kind_of, extra=extra)
            return failed(MESSAGE_INTERNAL)
        if isinstance(ended, Failure):
            # As stored: a message neither database could store would leave
            # the job running until its lease expired.
            message = _bounded(storable_text(ended.message))
            logger.info("job failed: %s", mask(message), extra=extra)
            return failed(message)
        if isinstance(ended, StoreUnavailable):
            # The database, not the job: another attempt is owed, not spent.
            logger.warning("job stopped by a storage fault; re-queued", extra=extra)
            delay = kind.options.backoff.delay(1)
            return Outcome(Status.QUEUED, Attempt.REFUND, delay_seconds=delay)
        if ended is not None:
            return self._unexpected_error(job, kind, extra, ended)
        try:
            return Outcome(Status.SUCCEEDED, result=kind.encode_result(value))
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

    def _unexpected_error(
        self, job: Job, kind: Kind, extra: dict[str, Any], error: BaseException
    ) -> Outcome:
        if job.attempt < job.max_attempts:
            # Below ERROR only the type: the text may quote a URL or a token.
            logger.warning("job attempt failed (%s)", type(error).__name__, extra=extra)
        else:
            logger.error("job failed", exc_info=error, extra=extra)
        return self._retry_or_fail(job, kind, MESSAGE_INTERNAL)

    @staticmethod
    def _retry_or_fail(job: Job, kind: Kind, message: str) -> Outcome:
        if job.attempt < job.max_attempts:
            delay = kind.options.backoff.delay(job.attempt)
            return Outcome(Status.QUEUED, delay_seconds=delay)
        return failed(message)
