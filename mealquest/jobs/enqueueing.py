"""Turning requests for jobs into rows: validation first, then the inserts.

`prepare` checks everything a job needs before anything is written (its kind,
its payload against the kind's schema, when it runs, its priority, its
idempotency key), so that a bad request stores nothing; `prepare_all` does
the same for a bulk enqueue, every item before any is written. `insert`
writes a prepared job inside an open transaction, through the driver's
statements; with an idempotency key, the driver's unique index decides which
of two concurrent inserts makes the job. `insert_all` writes a bulk
enqueue's, each run of jobs without a key by one statement.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Unpack

from marshmallow import ValidationError

from mealquest import tracing
from mealquest.db.driver import JobStatements, Transaction
from mealquest.jobs.errors import IdempotencyKeyReused, UnknownKind
from mealquest.jobs.options import EnqueueOptions
from mealquest.jobs.registry import Kind, Registry
from mealquest.model.batches import MAX_BATCH_JOBS
from mealquest.model.jobs import (
    DEFAULT_PRIORITY,
    MAX_DELAY_SECONDS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    WAITING_RUN_AT,
    NewJob,
)

# How long an idempotency key names its job: a repeat within the window is
# answered with the same job; after it, the key may name a new one.
IDEMPOTENCY_WINDOW_SECONDS = 24 * 60 * 60
# 1 to 255 visible ASCII characters (no space, no control character).
UNIQUE_KEY_PATTERN = re.compile(r"^[\x21-\x7e]{1,255}$")
UNIQUE_KEY_RULE = "must be 1 to 255 visible ASCII characters"
# A bulk insert's rows travel as one value (SQLite's JSON text, PostgreSQL's
# array of each column), which each database caps at 1 GB: a run of jobs goes
# in statements of at most this many rows and about this much payload.
BULK_MAX_ROWS = 5_000
BULK_MAX_PAYLOAD_CHARS = 64 * 2**20


# A version 4 UUID's fixed bits: the version (4) and the variant (RFC 4122).
_UUID4_FIXED_MASK = (0xF << 76) | (0x3 << 62)
_UUID4_FIXED_BITS = (0x4 << 76) | (0x2 << 62)


def new_job_id() -> str:
    """A random version 4 UUID's 32 hex digits, as `uuid.uuid4().hex` gives,
    without building a `UUID` on the way (half the cost, which was a fifth
    of a small job's validation in a bulk enqueue)."""
    value = int.from_bytes(os.urandom(16))
    return f"{(value & ~_UUID4_FIXED_MASK) | _UUID4_FIXED_BITS:032x}"


@dataclass(frozen=True)
class Enqueued:
    """What an enqueue did: `created` is False when an idempotency key named a
    job that already existed, which `job_id` is then."""

    job_id: str
    created: bool = True


def check_unique_key(key: str) -> str:
    if not isinstance(key, str) or not UNIQUE_KEY_PATTERN.match(key):
        raise ValidationError({"unique_key": [UNIQUE_KEY_RULE]})
    return key


@dataclass(frozen=True)
class JobRequest:
    """One job of a bulk enqueue (`JobService.enqueue_many`): `enqueue`'s arguments."""

    kind: str
    payload: Mapping[str, Any]
    household_id: int
    run_at: datetime | None = None
    delay: float | None = None
    priority: int = DEFAULT_PRIORITY
    unique_key: str | None = None
    # Ids of the household's jobs this one waits for: it runs once they all
    # succeeded, and is cancelled if one fails or is cancelled.
    depends_on: Sequence[str] = ()


def prepare(
    registry: Registry,
    kind_name: str,
    payload: Mapping[str, Any],
    *,
    household_id: int,
    **options: Unpack[EnqueueOptions],
) -> NewJob:
    """Validate one job request; raises UnknownKind, or ValidationError naming
    each bad field (the payload's own fields as the kind's schema names them).
    Whether the jobs of `depends_on` exist is the insert's to check."""
    request = JobRequest(kind_name, payload, household_id, **options)
    kind = _kind(registry, kind_name)
    errors = _option_errors(request)
    if errors:
        raise ValidationError(errors)
    return _new_job(request, kind, kind.canonical_payload(payload))


def prepare_all(registry: Registry, requests: Sequence[JobRequest]) -> list[NewJob]:
    """Validate a bulk enqueue's requests, each as `prepare` does; raises
    UnknownKind, or ValidationError with each bad request's errors under its
    index (`{2: {"value": [...]}}`).

    The payloads of one kind are validated together (`Kind.canonical_payloads`:
    by one call of its schema when that answers as one call each would)."""
    kinds = [_kind(registry, request.kind) for request in requests]
    errors: dict[int, Any] = {}
    batches: dict[str, list[int]] = {}
    for index, request in enumerate(requests):
        found = _option_errors(request)
        if found:
            errors[index] = found
        else:
            batches.setdefault(request.kind, []).append(index)
    payloads: dict[int, str] = {}
    for indexes in batches.values():
        kind = kinds[indexes[0]]
        try:
            texts = kind.canonical_payloads([requests[index].payload for index in indexes])
        except ValidationError as error:
            for position, messages in error.normalized_messages().items():
                errors[indexes[position]] = messages
        else:
            payloads.update(zip(indexes, texts, strict=True))
    if errors:
        raise ValidationError(dict(sorted(errors.items())))
    return [
        _new_job(request, kind, payloads[index])
        for index, (request, kind) in enumerate(zip(requests, kinds, strict=True))
    ]


def _kind(registry: Registry, name: str) -> Kind:
    kind = registry.get(name)
    if kind is None:
        raise UnknownKind(f"{str(UnknownKind()).rstrip('.')}: {name}")
    return kind


def _option_errors(request: JobRequest) -> dict[str, list[str]]:
    """What is wrong with a request's options (all but its payload), by field."""
    run_at, delay, priority = request.run_at, request.delay, request.priority
    errors: dict[str, list[str]] = {}
    if isinstance(request.household_id, bool) or not isinstance(request.household_id, int):
        errors["household_id"] = ["must be an integer"]
    if run_at is not None and delay is not None:
        errors["run_at"] = ["give run_at or delay, not both"]
    if run_at is not None and (not isinstance(run_at, datetime) or run_at.tzinfo is None):
        errors["run_at"] = ["must be a timezone-aware datetime"]
    elif run_at is not None and not _in_utc_range(run_at):
        errors["run_at"] = ["must fall within the years 1 to 9999 in UTC"]
    if delay is not None and (
        isinstance(delay, bool)
        or not isinstance(delay, int | float)
        or not 0 <= delay <= MAX_DELAY_SECONDS
    ):
        errors["delay"] = [f"must be a number of seconds from 0 to {MAX_DELAY_SECONDS:,}"]
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not MIN_PRIORITY <= priority <= MAX_PRIORITY
    ):
        errors["priority"] = [f"must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}"]
    if request.unique_key is not None:
        try:
            check_unique_key(request.unique_key)
        except ValidationError as error:
            errors.update(error.normalized_messages())
    depends_on = request.depends_on
    if isinstance(depends_on, str) or not all(isinstance(i, str) for i in depends_on):
        errors["depends_on"] = ["must be a list of job ids"]
    elif len(depends_on) > MAX_BATCH_JOBS:
        errors["depends_on"] = [f"must name at most {MAX_BATCH_JOBS:,} jobs"]
    elif depends_on and (run_at is not None or delay is not None):
        errors["depends_on"] = [
            "a job that waits for others runs when they end: no run_at, no delay"
        ]
    return errors


def _in_utc_range(moment: datetime) -> bool:
    """Whether `moment` has a UTC time (the edges of the calendar, in an
    offset that takes them past it, have none)."""
    try:
        moment.astimezone(UTC)
    except OverflowError:
        return False
    return True


def _new_job(request: JobRequest, kind: Kind, payload: str) -> NewJob:
    """The job of a request found valid, with `payload` as stored."""
    return NewJob(
        job_id=new_job_id(),
        household_id=request.household_id,
        kind=request.kind,
        payload=payload,
        max_attempts=kind.options.max_attempts,
        on_interrupt=kind.options.interrupt_policy,
        priority=request.priority,
        run_at=WAITING_RUN_AT if request.depends_on else request.run_at,
        delay_seconds=None if request.delay is None else float(request.delay),
        unique_key=request.unique_key,
        partition_key=kind.partition_key(payload),
        depends_on=tuple(request.depends_on),
        traceparent=tracing.current_traceparent(),
    )


def insert_all(tx: Transaction, jobs: JobStatements, new_jobs: Sequence[NewJob]) -> list[Enqueued]:
    """Insert prepared jobs in their order, as `insert` does each: the jobs
    without an idempotency key that come one after another go in one
    `insert_jobs` call (a run at a time, see `runs`), since nothing about
    them can answer otherwise than "created"."""
    done: list[Enqueued] = []
    for run in runs(new_jobs):
        if len(run) == 1:
            # One row: the plain statement, without the bulk one's JSON or arrays.
            done.append(insert(tx, jobs, run[0]))
        else:
            jobs.insert_jobs(tx, run)
            _keep_traces(tx, jobs, run)
            done.extend(Enqueued(job.job_id) for job in run)
    return done


def _keep_traces(tx: Transaction, jobs: JobStatements, created: Sequence[NewJob]) -> None:
    """Store the span each created job was enqueued under (`mealquest.tracing`)."""
    traces = [(job.job_id, job.traceparent) for job in created if job.traceparent is not None]
    if traces:
        jobs.add_traceparents(tx, traces)


def runs(
    new_jobs: Sequence[NewJob],
    *,
    max_rows: int = BULK_MAX_ROWS,
    max_payload_chars: int = BULK_MAX_PAYLOAD_CHARS,
) -> Iterator[list[NewJob]]:
    """`new_jobs` in order, cut into what one statement each inserts: a job
    with an idempotency key alone (its key's holder may answer for it);
    consecutive jobs without one together, up to `max_rows` of them and
    about `max_payload_chars` of payload (a run's first job whatever its
    size)."""
    run: list[NewJob] = []
    size = 0
    for job in new_jobs:
        keyed = job.unique_key is not None
        if run and (keyed or len(run) == max_rows or size + len(job.payload) > max_payload_chars):
            yield run
            run, size = [], 0
        if keyed:
            yield [job]
        else:
            run.append(job)
            size += len(job.payload)
    if run:
        yield run


def insert(
    tx: Transaction, jobs: JobStatements, job: NewJob, *, on_reused_key: str = "raise"
) -> Enqueued:
    """Insert a prepared job in the open transaction `tx` through `jobs`, the
    driver's job statements.

    With an idempotency key: a key whose window is over is taken from its old
    job first; then the insert does nothing if the household's key is still
    held (the unique index decides, also against a concurrent insert). The
    holder is then the answer if it was made by the same request; if not,
    IdempotencyKeyReused (`on_reused_key="raise"`), or the holder all the same
    (`"keep"`).
    """
    if job.unique_key is None:
        jobs.insert_job(tx, job)
        _keep_traces(tx, jobs, [job])
        return Enqueued(job.job_id)
    jobs.release_unique_key(
        tx,
        household_id=job.household_id,
        unique_key=job.unique_key,
        older_than_seconds=IDEMPOTENCY_WINDOW_SECONDS,
    )
    # Twice at most: the holder's key may be released between the insert and
    # the look (its window ending just then), and the next insert then wins.
    for _ in range(2):
        if jobs.insert_job(tx, job):
            _keep_traces(tx, jobs, [job])
            return Enqueued(job.job_id)
        holder = jobs.holder_of_key(tx, household_id=job.household_id, unique_key=job.unique_key)
        if holder is not None:
            holder_id, digest = holder
            if digest != job.unique_digest and on_reused_key == "raise":
                raise IdempotencyKeyReused()
            return Enqueued(holder_id, created=False)
    raise RuntimeError("an idempotency key kept changing hands")
