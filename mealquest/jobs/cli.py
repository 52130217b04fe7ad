"""`flask jobs list | show | work`: the operator's view of the queue, and a foreground pool."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import click
import gevent
from flask import current_app
from flask.cli import AppGroup
from gevent import monkey

from mealquest import migrations
from mealquest.extensions import get_jobs
from mealquest.jobs.model import Job, Status
from mealquest.masking import mask
from mealquest.metrics.standalone import serve_configured as serve_metrics
from mealquest.store import StoreError

jobs_cli = AppGroup("jobs", help="The job queue.")


def _summary(job: Job) -> str:
    error = f"  error={job.error}" if job.error else ""
    return (
        f"{job.id}  {job.status.value:<9}  {job.kind}  household={job.household_id}  "
        f"attempt={job.attempt}/{job.max_attempts}  created={job.created_at}{error}"
    )


@jobs_cli.command("list")
@click.option("--status", type=click.Choice([s.value for s in Status]), default=None)
@click.option("--kind", default=None)
@click.option("--household", "household_id", type=int, default=None)
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True)
def jobs_list(status: str | None, kind: str | None, household_id: int | None, limit: int) -> None:
    """Jobs newest first."""
    jobs = get_jobs().list_jobs(
        household_id=household_id,
        status=Status(status) if status else None,
        kind=kind,
        limit=limit,
    )
    for job in jobs:
        click.echo(_summary(job))


@jobs_cli.command("show")
@click.argument("job_id")
def jobs_show(job_id: str) -> None:
    """Every column of one job, as JSON, with the secrets URLs may carry masked."""
    job = get_jobs().get(job_id)
    if job is None:
        raise click.ClickException(f"no job {job_id}")
    row = {**job.__dict__, "status": job.status.value, "payload": _decoded(job.payload)}
    click.echo(json.dumps(mask(row), indent=2, sort_keys=True))


def _decoded(payload: Any) -> Any:
    """The payload as JSON values (so its URLs are found whole), or as stored
    if it is not JSON text."""
    if not isinstance(payload, str):
        return payload
    try:
        return json.loads(payload)
    except ValueError:
        return payload


def _run_from_flask_cli() -> bool:
    program = os.path.normpath(sys.argv[0]) if sys.argv else ""
    return os.path.basename(program) == "flask" or program.endswith(
        os.path.join("flask", "__main__.py")
    )


def _restart_monkey_patched() -> None:
    """Re-execute this command under `python -m gevent.monkey`.

    Handlers may do blocking standard-library I/O (sockets, DNS, `time.sleep`),
    which is cooperative only in a monkey-patched process, and patching now,
    with Flask, ssl and threading already imported, would leave unpatched
    locks behind (SPEC 3a). gevent's launcher patches before anything is
    imported, as gunicorn's gevent worker does before it loads the app.
    """
    if monkey.is_module_patched("socket") or not _run_from_flask_cli():
        return
    # Not MEALQUEST_*: that prefix is the app's configuration.
    if os.environ.get("MQ_JOBS_WORK_REEXECUTED"):
        raise click.ClickException("could not start the pool monkey-patched")
    os.environ["MQ_JOBS_WORK_REEXECUTED"] = "1"
    launcher = [sys.executable, "-m", "gevent.monkey", "--module", "flask", *sys.argv[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, launcher)  # noqa: S606 - our own interpreter and arguments


@jobs_cli.command("work")
def jobs_work() -> None:
    """Run a job pool in the foreground until Ctrl-C or SIGTERM, then stop gracefully.

    Exits 1 after the same graceful stop if the pool finds it cannot go on,
    so that a supervisor (systemd's `Restart=on-failure`) starts a new one.
    """
    _restart_monkey_patched()
    service = get_jobs()
    stop_requested = gevent.event.Event()
    fatal: list[str] = []

    def on_fatal(reason: str) -> None:
        # Called from the pool's greenlets; the pool has logged why at ERROR.
        fatal.append(reason)
        stop_requested.set()

    # Before the pool starts: a signal during its start must stop it
    # gracefully once started, not kill the process mid-way.
    for signum in (signal.SIGINT, signal.SIGTERM):
        gevent.signal_handler(signum, stop_requested.set)
    try:
        migrations.require_migrated(service.store)
        pool = service.start_pool(on_fatal=on_fatal)
    except (migrations.MigrationError, StoreError) as error:
        raise click.ClickException(str(error)) from None
    # GET /metrics on MEALQUEST_METRICS_PORT, or not served at all when unset.
    metrics_server = serve_metrics(current_app)
    patched = "monkey-patched" if monkey.is_module_patched("socket") else "not monkey-patched"
    click.echo(
        f"working with {service.settings.workers} workers ({patched}); Ctrl-C stops", err=True
    )
    stop_requested.wait()
    click.echo("stopping: waiting for running jobs", err=True)
    report = pool.stop(float(current_app.config["JOB_STOP_TIMEOUT_SECONDS"]))
    if metrics_server is not None:
        metrics_server.stop()
    click.echo(
        f"stopped: {report.finished} finished, {len(report.requeued)} re-queued, "
        f"{len(report.failed)} interrupted",
        err=True,
    )
    if fatal:
        raise click.ClickException(f"the job pool could not go on ({fatal[0]}); stopped")
