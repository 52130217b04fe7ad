"""`flask jobs work`: a process that runs a job pool and serves no HTTP.

It lives with the other entry points because it owns a whole process: it
re-executes itself monkey-patched (`work_launch`), installs the signal
handlers, and starts the native watchdog (`blocked_exit`) that ends the
process when its event loop stays blocked. The `jobs` command group adds it (`create_app`).
"""

from __future__ import annotations

import signal

import click
import gevent
from flask import current_app
from flask.cli import with_appcontext
from gevent import monkey

from mealquest.db import migrations
from mealquest.db.errors import StoreError
from mealquest.jobs.service import JobService, get_jobs
from mealquest.metrics.standalone import serve_configured as serve_metrics
from mealquest.serving import collector
from mealquest.serving.blocked_exit import BlockedLoopExit
from mealquest.serving.work_launch import restart_monkey_patched


def _restart_monkey_patched() -> None:
    """Re-execute this command monkey-patched (`mealquest.serving.work_launch`),
    if the app module Flask loaded did not already."""
    try:
        restart_monkey_patched()
    except RuntimeError as error:
        raise click.ClickException(str(error)) from None


# A server, checked as servers are: a database ahead of it is served during a
# rolling deploy (`migrations.require_migrated`).
@click.command("work")
@with_appcontext
def jobs_work() -> None:
    """Run a job pool in the foreground until Ctrl-C or SIGTERM, then stop gracefully.

    Exits 1 after the same graceful stop if the pool finds it cannot go on,
    so that a supervisor (systemd's `Restart=on-failure`) starts a new one;
    and 1 at once, without one, if its event loop stays blocked past
    MEALQUEST_JOB_BLOCKED_EXIT_SECONDS, before its jobs' leases can expire.
    """
    _restart_monkey_patched()
    service = get_jobs()
    # Before the first claim: no lease of this process may outlive a block.
    blocked_exit = BlockedLoopExit(float(current_app.config["JOB_BLOCKED_EXIT_SECONDS"]))
    blocked_exit.start()
    try:
        _work(service)
    finally:
        blocked_exit.stop()


def _work(service: JobService) -> None:
    """The pool's life in this process: started, run until a signal or its own
    failure, then stopped gracefully."""
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
    # As a gunicorn worker does once its pool has started.
    collector.settle()
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
