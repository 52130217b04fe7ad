"""The jobs service of one app: its kinds, enqueueing, reading, and the process's pool."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

import gevent
from flask import Flask, current_app
from marshmallow import ValidationError

from mealquest import tracing
from mealquest.db import migrations
from mealquest.db.driver import Store, Transaction
from mealquest.db.errors import (
    StorageFault,
    StoreBroken,
    StoreBusy,
    StoreUnavailable,
    WriteOutcomeUnknown,
)
from mealquest.extensions import get_store
from mealquest.jobs import enqueueing, quota, retention
from mealquest.jobs.enqueueing import Enqueued, JobRequest
from mealquest.jobs.errors import IdempotencyKeyReused, PoolAlreadyStarted, TooManyJobs
from mealquest.jobs.options import EnqueueOptions
from mealquest.jobs.registry import Registry
from mealquest.jobs.runner.pool import Pool
from mealquest.jobs.runner.settings import PoolSettings
from mealquest.model.batches import MAX_BATCH_JOBS, Batch, NewBatch
from mealquest.model.households import Household
from mealquest.model.jobs import Job, LogLine, NewJob, Status

logger = logging.getLogger(__name__)

# An enqueue whose connection the database dropped is tried again on a new one
# for this long (a PostgreSQL restart or failover takes a few seconds), the
# pauses between tries doubling from the first to the last.
_REENQUEUE_SECONDS = 10.0
_REENQUEUE_FIRST_DELAY_SECONDS = 0.05
_REENQUEUE_MAX_DELAY_SECONDS = 1.0

__all__ = ["Batched", "Enqueued", "JobRequest", "JobService", "get_jobs", "init_app"]

JOBS_KEY = "mealquest.jobs"


@dataclass(frozen=True)
class Batched:
    """What `enqueue_batch` made: the batch, its jobs in order, its callback."""

    batch_id: str
    job_ids: list[str]
    callback_job_id: str | None = None
    # False: a repeat of the request that made it, with the same idempotency key.
    created: bool = True


class _AtQuota(Exception):
    """Raised inside the enqueue's transaction to roll it back."""


class _BatchRepeated(Exception):
    """Raised inside a batch's transaction to roll it back: its key's holder
    (the job named) is the first member of the batch the same request made."""


def _batch_digest(jobs: Sequence[NewJob]) -> str:
    """What tells a repeat of a batch's request from another: its jobs' kinds
    and canonical payloads, in order."""
    request = "\n".join(f"{job.kind}\n{job.payload}" for job in jobs)
    return hashlib.sha256(f"batch\n{request}".encode()).hexdigest()


class JobService:
    def __init__(
        self, store: Store, settings: PoolSettings, *, max_pending_per_household: int = 100
    ) -> None:
        self.store = store
        self.settings = settings
        # A household's quota: jobs it may have queued or running at once.
        self.max_pending_per_household = max_pending_per_household
        self.registry = Registry()
        self.pool: Pool | None = None

    def enqueue(
        self,
        kind_name: str,
        payload: Mapping[str, Any],
        *,
        household_id: int,
        tx: Transaction | None = None,
        within_quota: bool = True,
        **options: Unpack[EnqueueOptions],
    ) -> str:
        """Validate `payload` for the kind and store a queued job; returns its id
        (with `unique_key`, the id of the job the key names, new or not: see
        `insert`).

        Due at `run_at` (a timezone-aware datetime), `delay` seconds from now
        (the database's now), or now. Claims take due jobs by `priority`,
        lower first (as Oban and River do; default 0), then oldest due first,
        then in insertion order. With `tx`, the job joins that open
        transaction and commits (or not) with the caller's own writes; the
        pool is woken only after the commit. A bad payload or argument raises
        marshmallow's ValidationError and stores nothing.
        A household past its quota raises `TooManyJobs` and stores nothing
        (with `tx`, the caller's transaction is then to be rolled back);
        `within_quota=False` is for the service's own jobs, which no household
        posted.

        `depends_on` names jobs of the same household that this one waits for
        (`queue.waiting_for` "dependencies"): it runs once they have all
        succeeded, and is cancelled (`a job it depends on did not succeed`)
        if one fails or is cancelled. A job can only depend on jobs that
        exist, so there are no cycles; an unknown id is a ValidationError.
        """
        return self.insert(
            kind_name,
            payload,
            household_id=household_id,
            tx=tx,
            within_quota=within_quota,
            **options,
        ).job_id

    def insert(
        self,
        kind_name: str,
        payload: Mapping[str, Any],
        *,
        household_id: int,
        tx: Transaction | None = None,
        within_quota: bool = True,
        **options: Unpack[EnqueueOptions],
    ) -> Enqueued:
        """`enqueue`, saying whether a job was made.

        `unique_key` (1 to 255 visible ASCII characters) makes the enqueue
        idempotent per household: while a job made with that key is less than
        24 hours old, the same request again makes nothing and answers that
        job (`created` False), and another request with it (another kind or
        payload) raises IdempotencyKeyReused. Concurrent repeats make one
        job: the database's unique index decides. After 24 hours the key may
        name a new job.
        """
        job = enqueueing.prepare(
            self.registry, kind_name, payload, household_id=household_id, **options
        )
        try:
            return self._write([job], tx, within_quota=within_quota)[0]
        except ValidationError as error:
            # One job: its errors are its own, not an item's of a bulk.
            raise ValidationError(error.normalized_messages().get(0, {})) from None

    def enqueue_many(
        self,
        requests: Sequence[JobRequest],
        *,
        tx: Transaction | None = None,
        within_quota: bool = True,
    ) -> list[Enqueued]:
        """Enqueue every request in one transaction, all or nothing.

        Every request is validated before anything is written: one bad item
        raises ValidationError with its index (`{2: {"value": [...]}}`), or
        UnknownKind, and stores nothing; so does an idempotency key reused
        with another request, or a household the batch would take past its
        quota (TooManyJobs). Answers in the requests' order.
        """
        jobs = enqueueing.prepare_all(self.registry, requests)
        return self._write(jobs, tx, within_quota=within_quota)

    def enqueue_batch(
        self,
        requests: Sequence[JobRequest],
        *,
        on_complete: JobRequest | None = None,
        tx: Transaction | None = None,
        within_quota: bool = True,
        unique_key: str | None = None,
    ) -> Batched:
        """Enqueue a household's jobs as one batch, in one transaction, all or
        nothing (as `enqueue_many`), with `on_complete`, its callback: a job
        that waits for every member to be final, whatever their outcomes, and
        then runs once (its handler reads `ctx.batch()`: the members' ids by
        outcome). It is the service's own follow-up, so the quota does not
        count it. Members take no idempotency key and no `depends_on` (the
        batch is what they are enqueued as).

        With `unique_key`, the batch is idempotent as a keyed job is: the
        same batch again (its members' and callback's kinds and payloads, in
        order) answers the batch it made (`created` False) and makes nothing;
        another request with the key is IdempotencyKeyReused. Its first member
        holds the key, for the whole batch.
        """
        if not 1 <= len(requests) <= MAX_BATCH_JOBS:
            raise ValidationError({"jobs": [f"a batch holds 1 to {MAX_BATCH_JOBS:,} jobs"]})
        household_id = requests[0].household_id
        errors: dict[int | str, Any] = {}
        for index, request in enumerate(requests):
            if request.household_id != household_id:
                errors[index] = {"household_id": ["a batch's jobs are one household's"]}
            elif request.unique_key is not None or request.depends_on:
                errors[index] = {"unique_key": ["a batch's jobs take no idempotency key"]}
                if request.depends_on:
                    errors[index] = {"depends_on": ["a batch's jobs depend on nothing"]}
        if on_complete is not None and on_complete.household_id != household_id:
            errors["on_complete"] = {"household_id": ["a batch's jobs are one household's"]}
        if errors:
            raise ValidationError(errors)
        jobs = enqueueing.prepare_all(self.registry, requests)
        callback = None
        if on_complete is not None:
            try:
                callback = enqueueing.prepare_all(
                    self.registry,
                    [dataclasses.replace(on_complete, depends_on=[job.job_id for job in jobs])],
                )[0]
            except ValidationError as error:
                raise ValidationError(
                    {"on_complete": error.normalized_messages().get(0, {})}
                ) from None
            callback = dataclasses.replace(callback, needs_success=False)
        if unique_key is not None:
            jobs[0] = dataclasses.replace(
                jobs[0],
                unique_key=enqueueing.check_unique_key(unique_key),
                request_digest=_batch_digest([*jobs, *([callback] if callback else [])]),
            )
        batch = NewBatch(
            enqueueing.new_job_id(),
            household_id,
            tuple(job.job_id for job in jobs),
            None if callback is None else callback.job_id,
        )
        try:
            written = self._write(
                [*jobs, *([callback] if callback else [])],
                tx,
                within_quota=within_quota,
                batch=batch,
            )
        except _BatchRepeated as repeated:
            return self._made_batch(str(repeated.args[0]), household_id)
        return Batched(
            batch.batch_id, [e.job_id for e in written[: len(jobs)]], batch.callback_job_id
        )

    def _made_batch(self, first_member: str, household_id: int) -> Batched:
        """The batch whose first member holds a repeated request's key."""
        batch_id = self.store.read(self.store.batches.batch_of_member, first_member)
        batch = (
            None
            if batch_id is None
            else self.store.read(self.store.batches.get_batch, batch_id, household_id)
        )
        if batch is None:  # pruned since: the key went with it
            raise IdempotencyKeyReused()
        return Batched(
            batch.id,
            [member.job_id for member in batch.members],
            batch.callback_job_id,
            created=False,
        )

    def _write(
        self,
        jobs: list[NewJob],
        tx: Transaction | None,
        *,
        within_quota: bool = True,
        batch: NewBatch | None = None,
    ) -> list[Enqueued]:
        """Insert the jobs in one transaction (with what they depend on, and
        their batch), then hold each household that got a new job to its
        quota in that same transaction: a repeat that an idempotency key
        answers makes nothing and so is never refused. This process's pool
        is woken once the jobs are committed."""

        def insert(tx: Transaction) -> list[Enqueued]:
            done = enqueueing.insert_all(tx, self.store.jobs, jobs)
            if batch is not None and not done[0].created:
                # Its first member's key is held: the batch was made already.
                raise _BatchRepeated(done[0].job_id)
            waiting = [
                job
                for job, enqueued in zip(jobs, done, strict=True)
                if enqueued.created and job.depends_on
            ]
            if waiting:
                self._add_dependencies(tx, jobs, waiting)
            if batch is not None:
                self.store.batches.insert_batch(tx, batch)
            if within_quota:
                grown = {
                    job.household_id
                    for job, enqueued in zip(jobs, done, strict=True)
                    if enqueued.created
                }
                for household_id in sorted(grown):  # one lock order for every writer
                    # A batch's callback is the service's own job.
                    spared = int(batch is not None and batch.callback_job_id is not None)
                    self._check_quota(tx, household_id, spared)
            if any(enqueued.created for enqueued in done):
                tx.after_commit(self._wake_pool)
            return done

        try:
            return insert(tx) if tx is not None else self._write_again_if_dropped(insert, jobs)
        except _AtQuota as error:
            raise TooManyJobs(self.quota_retry_after(error.args[0])) from None

    def _write_again_if_dropped(
        self, insert: Callable[[Transaction], list[Enqueued]], jobs: list[NewJob]
    ) -> list[Enqueued]:
        """The enqueue's transaction, tried again on a new connection when
        the database dropped the one it had (a killed backend, a restart, a
        failover), for `_REENQUEUE_SECONDS` at most; then StoreUnavailable
        goes to the caller (`503`).

        Safe because the job ids are made before the insert: a transaction
        that failed before its COMMIT wrote nothing, and one whose COMMIT's
        answer was lost (WriteOutcomeUnknown) is looked for by its ids: found,
        it is answered as it committed, never inserted twice. A lock that
        stayed taken (StoreBusy: its wait is already spent), a storage fault
        and a store that can no longer write are not tried again."""
        deadline = time.monotonic() + _REENQUEUE_SECONDS
        delay = _REENQUEUE_FIRST_DELAY_SECONDS
        unsure = False  # a COMMIT's answer was lost: look for the jobs first
        while True:
            try:
                if unsure:
                    committed = self._committed(jobs)
                    if committed is not None:
                        return committed
                if len(jobs) == 1:
                    # A single enqueue, what a request waits for: at once where
                    # the driver can (SQLite: on the hub, the lock free).
                    return self.store.write_now(insert)
                return self.store.write(insert)
            except (StoreBusy, StorageFault, StoreBroken):
                raise
            except WriteOutcomeUnknown:
                unsure, why = True, "its commit's answer was lost"
            except StoreUnavailable:
                why = "the database dropped its connection"
            if time.monotonic() + delay > deadline:
                raise StoreUnavailable()
            logger.warning("an enqueue of %d jobs: %s; trying again", len(jobs), why)
            gevent.sleep(delay)
            delay = min(delay * 2, _REENQUEUE_MAX_DELAY_SECONDS)

    def _committed(self, jobs: list[NewJob]) -> list[Enqueued] | None:
        """What an enqueue whose COMMIT's answer was lost did, if it committed:
        None if none of its new jobs exists (then it wrote nothing that a
        second try could repeat: a job with an idempotency key that a holder
        answered makes no row, and answers the same again)."""
        found = self.store.read(self.store.jobs.changed_jobs, {job.job_id: 0 for job in jobs})
        present = {job_id for job_id, job in found.items() if job is not None}
        if not present:
            return None

        def holders(tx: Transaction) -> list[Enqueued]:
            answers = []
            for job in jobs:
                if job.job_id in present or job.unique_key is None:
                    answers.append(Enqueued(job.job_id))
                    continue
                holder = self.store.jobs.holder_of_key(
                    tx, household_id=job.household_id, unique_key=job.unique_key
                )
                answers.append(
                    Enqueued(job.job_id) if holder is None else Enqueued(holder[0], created=False)
                )
            return answers

        return self.store.write(holders)

    def _add_dependencies(self, tx: Transaction, jobs: list[NewJob], waiting: list[NewJob]) -> None:
        """Record what the waiting jobs depend on, once each of those is found
        to be a job of their household (ValidationError under the item's
        index otherwise, which rolls the whole enqueue back)."""
        errors: dict[int, Any] = {}
        index = {job.job_id: position for position, job in enumerate(jobs)}
        for job in waiting:
            missing = self.store.batches.missing_jobs(tx, job.household_id, job.depends_on)
            if missing:
                errors[index[job.job_id]] = {
                    "depends_on": [
                        f"no job {job_id} in this household" for job_id in sorted(missing)
                    ]
                }
        if errors:
            raise ValidationError(errors)
        self.store.batches.insert_dependencies(tx, waiting)

    def batch(self, batch_id: str, *, household_id: int | None = None) -> Batch | None:
        """The batch (of that household; any household's with None), or None."""
        return self.store.read(self.store.batches.get_batch, batch_id, household_id)

    def _check_quota(self, tx: Transaction, household_id: int, spared: int = 0) -> None:
        """Refuse (rolling the transaction back) a household past its quota,
        not counting `spared` of its jobs (the service's own follow-ups).

        Counted after the household's new jobs were inserted, in their
        transaction, once the driver has made the count hold until it
        commits (see `count_pending`)."""
        allowed = self.max_pending_per_household + spared
        pending = self.store.jobs.count_pending(tx, household_id, allowed + 1)
        if pending > allowed:
            raise _AtQuota(household_id)

    def quota_retry_after(self, household_id: int) -> int:
        """Seconds after which a household at its quota may find a place free (an estimate)."""
        running, mean = self.store.read(self.store.jobs.household_load, household_id)
        return quota.retry_after(running, mean)

    def cancel(self, job_id: str, household_id: int | None = None) -> Job | None:
        """Cancel a job (of that household; any household's with None, for operators).

        Returns the job as it now is, or None if there is no such job:
        `cancelled` (now, or already before: cancelling is idempotent);
        `running` when it runs: its process stops the handler (at once in
        this process, at its next heartbeat in another; `ctx.cancelled`
        first, killed after the kill grace) and records it cancelled, unless
        it finishes first, which keeps its outcome; `succeeded` or `failed`
        when it was too late (nothing changed).
        """
        job = self.store.write(self.store.jobs.cancel_job, job_id, household_id)
        if job is not None and job.status is Status.RUNNING and self.pool is not None:
            self.pool.cancel(job.id)
        return job

    def retry(self, job_id: str, household_id: int | None = None) -> Job | None:
        """Queue a failed or cancelled job again, due now, with a fresh attempt
        budget (of that household; any household's with None, for operators).

        Returns the job as it now is (`queued` if it was retried; any other
        status means it was not failed or cancelled, and nothing changed), or
        None if there is no such job. Its result and error are cleared.
        """
        job = self.store.write(self.store.jobs.retry_job, job_id, household_id)
        if job is not None and job.status is Status.QUEUED:
            self._wake_pool()
        return job

    def _wake_pool(self) -> None:
        if self.pool is not None:
            self.pool.wake()

    def get(self, job_id: str, *, household_id: int | None = None) -> Job | None:
        return self.store.read(self.store.jobs.get_job, job_id, household_id)

    def log_lines(self, job_id: str) -> list[LogLine]:
        """The lines the job's handler logged (`ctx.log`), attempt by attempt:
        for operators only, never in a household's answer."""
        return self.store.read(self.store.jobs.log_lines, job_id)

    def trace_id(self, job_id: str) -> str | None:
        """The id of the trace the job was enqueued in (tracing on), for
        operators to find its spans; None if it was enqueued untraced."""
        traceparent = self.store.read(self.store.jobs.traceparents, [job_id]).get(job_id)
        return None if traceparent is None else tracing.trace_id_of(traceparent)

    def get_with_token(self, job_id: str, token_sha256: str) -> tuple[Household, Job | None] | None:
        """The household of a live token (by digest) with its job of that id, in
        one read; None if the token is not live (revocation shows at once)."""
        return self.store.read(self.store.jobs.get_job_with_token, job_id, token_sha256)

    def list_jobs(
        self,
        *,
        household_id: int | None = None,
        status: Status | None = None,
        kind: str | None = None,
        before_seq: int | None = None,
        limit: int = 50,
    ) -> list[Job]:
        return self.store.read(
            lambda conn: self.store.jobs.list_jobs(
                conn,
                household_id=household_id,
                status=status,
                kind=kind,
                before_seq=before_seq,
                limit=limit,
            )
        )

    def start_pool(self, on_fatal: Callable[[str], None] | None = None) -> Pool:
        """Start this process's pool (once). Refuses a database behind the migrations.

        `on_fatal(reason)` is called (once) when the pool cannot go on, to have
        the process stopped gracefully and replaced.
        """
        if self.pool is not None:
            raise PoolAlreadyStarted()
        migrations.require_migrated(self.store)
        pool = Pool(
            self.store.for_runner(),
            self.registry,
            self.settings,
            on_fatal=on_fatal,
            enqueue=functools.partial(self.enqueue, within_quota=False),
        )
        pool.start()
        self.pool = pool
        return pool


def init_app(app: Flask) -> JobService:
    service = JobService(
        get_store(app),
        PoolSettings.from_config(app.config),
        max_pending_per_household=app.config["JOB_MAX_PENDING_PER_HOUSEHOLD"],
    )
    retention.register(
        service.registry,
        retention_days=app.config["JOB_RETENTION_DAYS"],
        catchup_seconds=service.settings.cron_catchup_seconds,
    )
    app.extensions[JOBS_KEY] = service
    return service


def get_jobs(app: Flask | None = None) -> JobService:
    """The app's jobs service (of the current app without one)."""
    service: JobService = (app or current_app).extensions[JOBS_KEY]
    return service
