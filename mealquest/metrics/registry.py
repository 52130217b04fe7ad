"""The service's Prometheus metrics, and one scrape's text.

Counters and histograms live in prometheus_client's objects. Under gunicorn
they are counted across every worker of the host by prometheus_client's
multiprocess mode: `gunicorn.conf.py` sets `PROMETHEUS_MULTIPROC_DIR` in the
master before any worker imports prometheus_client (which picks its storage
when imported), each worker writes its values to files there, and a scrape
reads them all through a `MultiProcessCollector` in a registry built for
that scrape (a shared one would repeat every series). Without the variable
(`flask jobs work`, tests) the values stay in this process and `REGISTRY`
holds them.

Queue figures (rows by kind and status, the oldest due job's age) are read
from the database, not counted: they go in the scrape's own registry, as
multiprocess mode allows no custom collector in a shared one.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator
from contextlib import suppress

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from mealquest.model.queue import QueueFigures

MULTIPROC_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"

# Only the series the service documents: no `_created` companions.
disable_created_metrics()

REGISTRY = CollectorRegistry(auto_describe=True)

JOB_RUNS = Counter(
    "mealquest_job_runs",
    "Job attempts that ended, by kind and outcome "
    "(succeeded, failed, retried, snoozed, cancelled, interrupted).",
    ["kind", "outcome"],
    registry=REGISTRY,
)
JOB_RUN_DURATION = Histogram(
    "mealquest_job_run_duration_seconds",
    "How long job handlers ran, by kind.",
    ["kind"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
    registry=REGISTRY,
)
JOB_WAIT = Histogram(
    "mealquest_job_wait_seconds",
    "How long jobs waited to start, from their due time (their enqueue, unless "
    "delayed or a retry's backoff), by kind.",
    ["kind"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
    registry=REGISTRY,
)
JOB_RESCUES = Counter(
    "mealquest_job_rescues",
    "Running jobs whose lease expired, taken back by a rescuer of this host.",
    registry=REGISTRY,
)
HTTP_REQUESTS = Counter(
    "mealquest_http_requests",
    "HTTP requests answered, by URL rule, method and status.",
    ["route", "method", "status"],
    registry=REGISTRY,
)
HTTP_REQUEST_DURATION = Histogram(
    "mealquest_http_request_duration_seconds",
    "Time to answer HTTP requests, by URL rule.",
    ["route"],
    registry=REGISTRY,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def multiprocess() -> bool:
    return bool(os.environ.get(MULTIPROC_DIR_VARIABLE))


class _QueueCollector(Collector):
    """The database's figures, as gauges of one scrape."""

    def __init__(self, figures: QueueFigures) -> None:
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
        rows = GaugeMetricFamily(
            "mealquest_jobs",
            "Jobs in the table now, by kind and status.",
            labels=["kind", "status"],
        )
        for (kind, status), count in sorted(self.figures.counts.items()):
            rows.add_metric([kind, status], count)
        yield rows
        oldest = GaugeMetricFamily(
            "mealquest_job_oldest_due_age_seconds",
            "How long the oldest queued job whose time has come has waited, by kind.",
            labels=["kind"],
        )
        for kind, due in sorted(self.figures.oldest_due.items()):
            oldest.add_metric([kind], due.age_seconds)
        yield oldest
        paused = GaugeMetricFamily(
            "mealquest_kind_paused",
            "1 for a kind paused for the whole deployment (no claim takes its jobs), "
            "0 for the other kinds with jobs.",
            labels=["kind"],
        )
        for kind in sorted(set(self.figures.kinds()) | set(self.figures.paused)):
            paused.add_metric([kind], 1.0 if kind in self.figures.paused else 0.0)
        yield paused
        yield GaugeMetricFamily(
            "mealquest_jobs_waiting_for_household",
            "Queued jobs waiting for their household's answer (`ctx.wait_for`).",
            value=self.figures.waiting_for_household,
        )
        next_timeout = GaugeMetricFamily(
            "mealquest_jobs_waiting_for_household_next_timeout_seconds",
            "Seconds until the soonest wait for a household's answer times out "
            "(absent while none waits).",
        )
        if self.figures.next_wait_timeout_seconds is not None:
            next_timeout.add_metric([], self.figures.next_wait_timeout_seconds)
        yield next_timeout


class _SizedFilesCollector(MultiProcessCollector):
    """prometheus_client's multiprocess collector, leaving out empty files.

    A worker creates its file empty and sizes it a moment later. A scrape in
    between failed whole (a `struct.error` reading the empty file), and a
    worker killed in between left the empty file behind, failing every
    scrape after it. An empty file holds no value, so nothing is lost.
    """

    def collect(self) -> Iterable[Metric]:
        files = []
        for path in glob.glob(os.path.join(self._path, "*.db")):
            with suppress(FileNotFoundError):  # its worker's exit removed it
                if os.path.getsize(path) > 0:
                    files.append(path)
        return self.merge(files, accumulate=True)


def render(figures: QueueFigures) -> bytes:
    """One scrape: the counted metrics (every worker's under gunicorn) and the
    queue's gauges."""
    if multiprocess():
        counted = CollectorRegistry()
        _SizedFilesCollector(counted)
    else:
        counted = REGISTRY
    queue = CollectorRegistry()
    queue.register(_QueueCollector(figures))
    return generate_latest(counted) + generate_latest(queue)
