"""The jobs service of one app: its kinds, enqueueing, reading, and the process's pool."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack

from flask import Flask, current_app
from marshmallow import ValidationError

from mealquest import tracing
from mealquest.db import migrations
from mealquest.db.driver import Store, Transaction
from mealquest.extensions import get_store
from mealquest.jobs import enqueueing
from mealquest.jobs.authoring import JOBS_KEY
from mealquest.jobs.enqueueing import Enqueued, JobRequest
from mealquest.jobs.errors import IdempotencyKeyReused, PoolAlreadyStarted, UnknownSignal
from mealquest.jobs.options import EnqueueOptions
from mealquest.jobs.registry import Registry
from mealquest.jobs.runner.pool import Pool
from mealquest.jobs.runner.settings import PoolSettings
from mealquest.jobs.service import retention
from mealquest.jobs.service.batch_rules import prepare_batch
from mealquest.jobs.service.writing import BatchRepeated, JobWriter
from mealquest.model.batches import Batch, Batched
from mealquest.model.households import Household
from mealquest.model.jobs import MAX_RESULT_BYTES, Job, LogLine, Status
from mealquest.model.signals import Signaled, SignalResult


class JobService:
    """What the web, the CLI and kinds' authors call: enqueue (the rows
    checked by `enqueueing` and `batch_rules`, written by `JobWriter`),
    read, cancel, retry, and start this process's pool."""

    def __init__(
        self, store: Store, settings: PoolSettings, *, max_pending_per_household: int = 100
    ) -> None:
        self.store = store
        self.settings = settings
        self.registry = Registry()
        self.pool: Pool | None = None
        self.writer = JobWriter(
            store, max_pending_per_household=max_pending_per_household, wake=self._wake_pool
        )

    @property
    def max_pending_per_household(self) -> int:
        """A household's quota: jobs it may have queued or running at once."""
        return self.writer.max_pending_per_household

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
            return self.writer.write([job], tx, within_quota=within_quota)[0]
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
        return self.writer.write(jobs, tx, within_quota=within_quota)

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
        prepared = prepare_batch(self.registry, requests, on_complete, unique_key)
        try:
            written = self.writer.write(
                prepared.jobs, tx, within_quota=within_quota, batch=prepared.batch
            )
        except BatchRepeated as repeated:
            return self._made_batch(str(repeated.args[0]), prepared.batch.household_id)
        return Batched(
            prepared.batch.batch_id,
            [e.job_id for e in written[: len(prepared.members)]],
            prepared.batch.callback_job_id,
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

    def batch(self, batch_id: str, *, household_id: int | None = None) -> Batch | None:
        """The batch (of that household; any household's with None), or None."""
        return self.store.read(self.store.batches.get_batch, batch_id, household_id)

    def quota_retry_after(self, household_id: int) -> int:
        """Seconds after which a household at its quota may find a place free (an estimate)."""
        return self.writer.quota_retry_after(household_id)

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

    def signal(
        self,
        job_id: str,
        name: str,
        answer: Any,
        *,
        household_id: int | None,
        idempotency_key: str | None = None,
    ) -> SignalResult:
        """Give a job (of that household; any household's with None, for
        operators) its household's answer to the signal `name`: validated by
        the schema its kind declares for it (ValidationError, nothing
        stored; `UnknownSignal` for a name the kind does not declare), then
        stored. A job waiting for it is due at once (this process's pool is
        woken); one that has not reached its wait yet finds it there. A
        final job, one that waits for another signal, or one answered
        already is refused (`Signaled.NOT_WAITING`), unless it is the same
        request again (`idempotency_key`: `Signaled.REPEATED`)."""
        job = self.get(job_id, household_id=household_id)
        if job is None:
            return SignalResult(Signaled.NO_JOB, None)
        kind = self.registry.get(job.kind)
        schema = None if kind is None else kind.options.signal_schema(name)
        if schema is None:
            raise UnknownSignal()
        payload = json.dumps(schema.dump(schema.load(answer)), separators=(",", ":"))
        if len(payload.encode()) > MAX_RESULT_BYTES:
            raise ValidationError({"_schema": ["the answer is larger than a job may keep"]})
        result = self.store.write(
            self.store.signals.signal,
            job_id,
            name,
            payload,
            household_id=household_id,
            idempotency_key=idempotency_key,
        )
        if result.signaled is Signaled.RESUMED:
            self._wake_pool()
        return result

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
