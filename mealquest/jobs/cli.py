"""`flask jobs list | show | enqueue | cancel | pause | resume | prune`: the
operator's view of the queue, its hands on it, and retention now. `flask jobs
work`, which owns a whole process, is an entry point (`mealquest.serving.work`)."""

from __future__ import annotations

import json
import math
from typing import Any

import click
from flask import current_app
from marshmallow import ValidationError

from mealquest import audit, households
from mealquest.command_group import CommandGroup
from mealquest.db import migrations
from mealquest.db.errors import StoreError
from mealquest.jobs.errors import JobsError
from mealquest.jobs.service import flow, get_jobs, retention
from mealquest.masking import mask
from mealquest.model.batches import Batch
from mealquest.model.jobs import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY, Job, Status
from mealquest.model.signals import Signaled

jobs_cli = CommandGroup("jobs", help="The job queue.")


def _summary(job: Job) -> str:
    error = f"  error={mask(job.error)}" if job.error else ""
    return (
        f"{job.id}  {job.status.value:<9}  {job.kind}  household={job.household_id}  "
        f"attempt={job.attempt}/{job.max_attempts}  created={job.created_at}{error}"
    )


@jobs_cli.command("list")
@click.option("--status", type=click.Choice([s.value for s in Status]), default=None)
@click.option("--kind", default=None)
@click.option("--household", "household_id", type=int, default=None)
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
@click.option(
    "--batch",
    "batch_id",
    default=None,
    help="a batch: its line, then its jobs in their order and its callback",
)
def jobs_list(
    status: str | None,
    kind: str | None,
    household_id: int | None,
    limit: int,
    batch_id: str | None,
) -> None:
    """Jobs newest first (or a batch's, in their order)."""
    if batch_id is not None:
        _list_batch(batch_id, status, kind, household_id)
        return
    jobs = get_jobs().list_jobs(
        household_id=household_id,
        status=Status(status) if status else None,
        kind=kind,
        limit=limit,
    )
    for job in jobs:
        click.echo(_summary(job))


def _batch_line(batch: Batch) -> str:
    counts = "  ".join(f"{status.value}={batch.count(status)}" for status in Status)
    return (
        f"batch {batch.id}  {batch.status.value}  household={batch.household_id}  "
        f"total={batch.total}  {counts}  callback={batch.callback_job_id or '-'}  "
        f"created={batch.created_at}"
    )


def _list_batch(
    batch_id: str, status: str | None, kind: str | None, household_id: int | None
) -> None:
    jobs = get_jobs()
    batch = jobs.batch(batch_id, household_id=household_id)
    if batch is None:
        raise click.ClickException(f"no batch {batch_id}")
    click.echo(_batch_line(batch))
    ids = [member.job_id for member in batch.members]
    if batch.callback_job_id is not None:
        ids.append(batch.callback_job_id)
    for job_id in ids:
        job = jobs.get(job_id)
        if job is None or (status and job.status.value != status) or (kind and job.kind != kind):
            continue
        click.echo(("callback  " if job_id == batch.callback_job_id else "") + _summary(job))


@jobs_cli.command("batches")
@click.option("--household", "household_id", type=int, required=True)
@click.option("--limit", type=click.IntRange(1, 1_000), default=20, show_default=True)
def jobs_batches(household_id: int, limit: int) -> None:
    """A household's batches, newest first: each one's progress and callback."""
    store = get_jobs().store
    for batch in store.read(store.batches.household_batches, household_id, limit=limit):
        click.echo(_batch_line(batch))


@jobs_cli.command("show")
@click.argument("job_id")
def jobs_show(job_id: str) -> None:
    """Every column of one job, as JSON, with the secrets URLs may carry masked."""
    jobs = get_jobs()
    job = jobs.get(job_id)
    if job is None:
        raise click.ClickException(f"no job {job_id}")
    _echo_job(
        job,
        log=[line.__dict__ for line in jobs.log_lines(job_id)],
        trace_id=jobs.trace_id(job_id),
    )


def _echo_job(
    job: Job, *, log: list[dict[str, Any]] | None = None, trace_id: str | None = None
) -> None:
    """The job as JSON, masked; with `log`, the lines its handler logged; with
    `trace_id`, the trace it was enqueued in."""
    row = {**job.__dict__, "status": job.status.value, "payload": _decoded(job.payload)}
    if log is not None:
        row["log"] = log
    if trace_id is not None:
        row["trace_id"] = trace_id
    click.echo(json.dumps(mask(row), indent=2, sort_keys=True))


@jobs_cli.command("prune")
@click.option(
    "--older-than",
    "older_than",
    metavar="DAYS",
    default=None,
    help="Delete finished jobs older than this many days (0: every finished job); "
    "default MEALQUEST_JOB_RETENTION_DAYS.",
)
def jobs_prune(older_than: str | None) -> None:
    """Delete finished jobs now, in small batches; prints how many went.

    Queued and running jobs are never deleted, and recipes stay.
    """
    click.echo(prune_now(older_than))


def prune_now(older_than: str | None) -> str:
    """What `flask jobs prune` does and prints; ClickException (one line) on bad input."""
    config = current_app.config
    if older_than is None:
        days: float = config["JOB_RETENTION_DAYS"]
        if not days:
            return "retention is off (MEALQUEST_JOB_RETENTION_DAYS=0): deleted 0 jobs"
    else:
        days = _days(older_than)
    store = get_jobs().store
    try:
        migrations.require_migrated(store)
        # Recorded first and counted up after: a prune cut short by a crash is
        # still in the log.
        entry = audit.record(store, None, "prune", f"finished jobs older than {days:g} days", 0)
        pruned = retention.prune(
            store,
            older_than_days=days,
            catchup_seconds=float(config["JOB_CRON_CATCHUP_SECONDS"]),
            # The audit log by the setting only: `--older-than 0` is about jobs.
            audit_days=config["JOB_RETENTION_DAYS"] or None,
        )
        store.write(audit.add, store, entry, pruned.jobs)
    except (migrations.MigrationError, StoreError) as error:
        raise click.ClickException(str(error)) from None
    return f"deleted {pruned.jobs} finished jobs older than {days:g} days"


def _days(text: str) -> float:
    try:
        days = float(text)
    except ValueError:
        days = math.nan
    if not (math.isfinite(days) and days >= 0):
        raise click.ClickException(
            f"--older-than: must be a number of days, 0 or more (got {text!r})"
        )
    return days


def _one_line(messages: Any, prefix: str = "") -> str:
    """A ValidationError's messages as `field: message; other.field: message`."""
    if isinstance(messages, dict):
        return "; ".join(
            _one_line(value, f"{prefix}{key}." if key != "_schema" else prefix)
            for key, value in messages.items()
        )
    if isinstance(messages, list):
        return f"{prefix.rstrip('.') or 'payload'}: {' '.join(str(m) for m in messages)}"
    return f"{prefix.rstrip('.') or 'payload'}: {messages}"


@jobs_cli.command("enqueue")
@click.argument("kind")
@click.argument("payload_json")
@click.option("--household", "household_id", type=int, required=True)
@click.option(
    "--delay", type=click.FloatRange(min=0), default=None, help="seconds from now until it is due"
)
@click.option(
    "--priority",
    type=click.IntRange(MIN_PRIORITY, MAX_PRIORITY),
    default=DEFAULT_PRIORITY,
    show_default=True,
    help="lower runs first",
)
@click.option("--key", default=None, help="idempotency key: a repeat within 24 h makes nothing")
def jobs_enqueue(
    kind: str,
    payload_json: str,
    household_id: int,
    delay: float | None,
    priority: int,
    key: str | None,
) -> None:
    """Enqueue a job of KIND with the payload PAYLOAD_JSON (checked by the kind's
    schema) for a household; prints the job (the existing one for a repeated key)."""
    service = get_jobs()
    try:
        payload = json.loads(payload_json)
    except ValueError:
        raise click.ClickException("PAYLOAD_JSON is not valid JSON") from None
    if not isinstance(payload, dict):
        raise click.ClickException("PAYLOAD_JSON must be a JSON object")
    try:
        if not any(h.id == household_id for h, _ in households.list_households(service.store)):
            raise click.ClickException(f"no household {household_id}")
        enqueued = service.insert(
            kind,
            payload,
            household_id=household_id,
            delay=delay,
            priority=priority,
            unique_key=key,
        )
    except ValidationError as error:
        raise click.ClickException(f"invalid: {_one_line(error.messages)}") from None
    except (JobsError, StoreError) as error:
        raise click.ClickException(str(error)) from None
    if enqueued.created:
        target = f"job {enqueued.job_id} ({kind}) of household {household_id}"
        audit.record(service.store, None, "enqueue", target)
    job = service.get(enqueued.job_id)
    assert job is not None
    _echo_job(job)


@jobs_cli.command("cancel")
@click.argument("job_id")
def jobs_cancel(job_id: str) -> None:
    """Cancel a job of any household: a queued one at once; a running one is
    stopped by the process running it. Prints the job; fails for a job that
    has already succeeded or failed."""
    try:
        job = get_jobs().cancel(job_id)
        cancelled = job is not None and job.status in (Status.CANCELLED, Status.RUNNING)
        audit.record(get_jobs().store, None, "cancel", f"job {job_id}", int(cancelled))
    except StoreError as error:
        raise click.ClickException(str(error)) from None
    if job is None:
        raise click.ClickException(f"no job {job_id}")
    if job.status in (Status.SUCCEEDED, Status.FAILED):
        raise click.ClickException(f"job {job_id} has already {job.status.value}")
    if job.status is Status.RUNNING:
        click.echo("running: its process stops it and records it cancelled", err=True)
    _echo_job(job)


@jobs_cli.command("signal")
@click.argument("job_id")
@click.argument("name")
@click.option(
    "--json", "answer_json", required=True, help="the answer, as the kind's schema takes it"
)
def jobs_signal(job_id: str, name: str, answer_json: str) -> None:
    """Answer for a household the job JOB_ID that waits for its signal NAME
    (checked by the schema its kind declares): the job is due at once; one
    that has not reached its wait yet finds the answer there. Prints the job."""
    try:
        answer = json.loads(answer_json)
    except ValueError:
        raise click.ClickException("--json is not valid JSON") from None
    service = get_jobs()
    try:
        result = service.signal(job_id, name, answer, household_id=None)
    except ValidationError as error:
        raise click.ClickException(f"invalid: {_one_line(error.messages)}") from None
    except (JobsError, StoreError) as error:
        raise click.ClickException(str(error)) from None
    if result.job is None:
        raise click.ClickException(f"no job {job_id}")
    if result.signaled is Signaled.NOT_WAITING:
        raise click.ClickException(
            f"job {job_id} does not wait for {name}: it has ended, waits for another "
            "signal, or has its answer"
        )
    audit.record(service.store, None, "signal", f"job {job_id}: {name}")
    _echo_job(result.job)


@jobs_cli.command("pause")
@click.argument("kind")
def jobs_pause(kind: str) -> None:
    """Pause KIND in the whole deployment: no process claims its jobs (each
    within a poll interval), which stay queued; running ones finish."""
    service = get_jobs()
    try:
        migrations.require_migrated(service.store)
        change = flow.pause(service.store, service.registry, kind, None)
    except (migrations.MigrationError, JobsError, StoreError) as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"{kind}: {change.value}")


@jobs_cli.command("resume")
@click.argument("kind")
def jobs_resume(kind: str) -> None:
    """Resume a paused KIND: its queued jobs are claimed again."""
    store = get_jobs().store
    try:
        migrations.require_migrated(store)
        change = flow.resume(store, kind, None)
    except (migrations.MigrationError, StoreError) as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"{kind}: {change.value}")


def _decoded(payload: Any) -> Any:
    """The payload as JSON values (so its URLs are found whole), or as stored
    if it is not JSON text."""
    if not isinstance(payload, str):
        return payload
    try:
        return json.loads(payload)
    except ValueError:
        return payload
