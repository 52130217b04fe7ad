"""What a job kind's author calls: register a kind with an app, enqueue its jobs.

Thin on purpose: each function finds the app's jobs service and calls it, so
that a kind module needs one import (`mealquest.jobs`) and no knowledge of
where the service keeps its registry. Everything they accept and raise is
the service's (`JobService.enqueue`, `Registry.register`). The service is
found by what it must do (`AppJobs`), not imported: the kind author's API
loads nothing of the service, the runner or the web.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, Unpack

from flask import Flask, current_app
from marshmallow import Schema

from mealquest.db.driver import Transaction
from mealquest.jobs.enqueueing import Enqueued, JobRequest
from mealquest.jobs.options import EnqueueOptions
from mealquest.jobs.registry import Handler, Kind, KindOptions, Registry
from mealquest.model.batches import Batched

# Where an app keeps its jobs service (`app.extensions`).
JOBS_KEY = "mealquest.jobs"


class AppJobs(Protocol):
    """What these functions need of the app's jobs service."""

    registry: Registry

    def enqueue(
        self,
        kind_name: str,
        payload: Mapping[str, Any],
        *,
        household_id: int,
        tx: Transaction | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> str: ...

    def enqueue_many(
        self, requests: Sequence[JobRequest], *, tx: Transaction | None = None
    ) -> list[Enqueued]: ...

    def enqueue_batch(
        self,
        requests: Sequence[JobRequest],
        *,
        on_complete: JobRequest | None = None,
        tx: Transaction | None = None,
        unique_key: str | None = None,
    ) -> Batched: ...


def get_jobs(app: Flask | None = None) -> AppJobs:
    """The app's jobs service (of the current app without one)."""
    jobs: AppJobs = (app or current_app).extensions[JOBS_KEY]
    return jobs


def register(
    app: Flask,
    name: str,
    handler: Handler,
    *,
    payload: Schema | type[Schema],
    result: Schema | type[Schema],
    partial: Schema | type[Schema] | None = None,
    options: KindOptions | None = None,
) -> Kind:
    """Make the kind `name` known to `app`'s pool, before the pool starts.

    `handler(payload, ctx)` gets the payload as `payload` loaded it and a
    `JobContext`; what it returns is dumped by `result` and stored. A handler
    raises `Failure(message)` to end the job with a message the household
    may read, or `Snooze(seconds)` to run again later without spending an
    attempt; anything else it raises is retried with `options.backoff` while
    `options.max_attempts` last, and stored as `internal error`. `partial`
    types what `ctx.publish` stores meanwhile (default: `result`).
    Raises `RegistrationError` for a name taken, a pool already started, or
    options that do not fit.
    """
    return get_jobs(app).registry.register(
        name, handler, payload=payload, result=result, partial=partial, options=options
    )


def enqueue(
    kind: str,
    payload: Mapping[str, Any],
    *,
    household_id: int,
    tx: Transaction | None = None,
    **options: Unpack[EnqueueOptions],
) -> str:
    """Store a queued job of `kind` for the household; answers its id.

    In a request or an app context. Validates first and stores nothing when
    `payload` does not fit the kind (marshmallow's `ValidationError`), the
    kind is unknown (`UnknownKind`) or the household is at its quota
    (`TooManyJobs`). See `JobService.enqueue` for `tx`, `run_at`, `delay`,
    `priority`, `unique_key` and `depends_on` (jobs it waits for). Inside
    a handler, use `ctx.enqueue`: its follow-up is written only if the
    attempt succeeds.
    """
    return get_jobs().enqueue(kind, payload, household_id=household_id, tx=tx, **options)


def enqueue_many(
    requests: Sequence[JobRequest], *, tx: Transaction | None = None
) -> list[Enqueued]:
    """Store every request's job in one transaction, all or nothing (see
    `JobService.enqueue_many`); answers in the requests' order."""
    return get_jobs().enqueue_many(requests, tx=tx)


def enqueue_batch(
    requests: Sequence[JobRequest],
    *,
    on_complete: JobRequest | None = None,
    tx: Transaction | None = None,
    unique_key: str | None = None,
) -> Batched:
    """Store a household's jobs as one batch, with the job that runs once
    every one of them is final, idempotent with `unique_key` (see
    `JobService.enqueue_batch`)."""
    return get_jobs().enqueue_batch(requests, on_complete=on_complete, tx=tx, unique_key=unique_key)
