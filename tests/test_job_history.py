"""The charts' history and its percentiles, on both databases: the figures
are within 19 % of the true nearest-rank percentile (the docs' promise,
from the buckets the migration defines), and what the real runner did shows
per kind and period: outcomes counted exactly, wait and run times as
percentiles of the real durations. The prune job deletes history the charts
no longer show."""

from __future__ import annotations

import itertools
import math
import random
from datetime import timedelta

import pytest

from mealquest.clock import from_text
from mealquest.job_history import ChartsReader, Range, bucket_figure, read_charts
from mealquest.jobs.service.retention import prune
from mealquest.model.jobs import Status
from tests.conftest import wait_for
from tests.support import sql

pytestmark = pytest.mark.both_databases

WITHIN = 2**0.25


def bucket_of(seconds: float, bounds: list[float]) -> int:
    """The bucket the migration's triggers count a duration in."""
    return max(index for index, lower in enumerate(bounds) if lower <= max(seconds, 0.0))


def nearest_rank(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(share * len(ordered))) - 1]


def test_a_percentile_is_within_19_percent_of_the_true_one(store):
    """The figure of the bucket that holds a nearest-rank percentile (which the
    history read finds: tests/drivers) against the percentile itself."""
    bounds = store.read(store.history.duration_bounds)
    assert bounds[0] == 0.0
    assert bounds[1] == 0.01
    # Each bucket √2 as wide as the one before.
    assert all(abs(b / a - 2**0.5) < 1e-6 for a, b in itertools.pairwise(bounds[1:]))
    chosen = random.Random(31)
    for _ in range(200):
        values = [10 ** chosen.uniform(-2, 4.9) for _ in range(chosen.randint(1, 40))]
        for share in (0.5, 0.95):
            true = nearest_rank(values, share)
            # The nearest rank's value is the nearest rank's bucket's.
            figure = bucket_figure(bucket_of(true, bounds), bounds)
            assert true / WITHIN <= figure <= true * WITHIN, (values, share)
    assert bucket_figure(None, bounds) is None
    assert bucket_figure(0, bounds) == 0.005  # "under 10 ms"
    assert bucket_figure(len(bounds) - 1, bounds) == bounds[-1]  # "at least"


def test_the_charts_count_what_the_runner_did_and_time_it(jobs, store, household):
    household_id = household.household_id
    sleeps = [0.02, 0.05, 0.05, 0.3, 0.6]
    ids = [jobs.enqueue("sleep", {"seconds": s}, household_id=household_id) for s in sleeps]
    failed = jobs.enqueue("fail_with_failure", {"message": "no"}, household_id=household_id)
    jobs.start_pool()
    final = (Status.SUCCEEDED, Status.FAILED)
    wait_for(lambda: all(jobs.get(j).status in final for j in [*ids, failed]))

    rows = [jobs.get(j) for j in ids]
    runs = [
        (from_text(job.finished_at) - from_text(job.started_at)).total_seconds() for job in rows
    ]
    waits = [(from_text(job.started_at) - from_text(job.run_at)).total_seconds() for job in rows]
    for chart_range in Range:
        charts = read_charts(store, chart_range)
        assert len(charts.starts) == chart_range.periods
        by_kind = {kind.kind: kind for kind in charts.kinds}
        assert set(by_kind) == {"sleep", "fail_with_failure"}
        sleep = by_kind["sleep"]
        assert (sleep.total("succeeded"), sleep.total("failed")) == (5, 0)
        assert by_kind["fail_with_failure"].total("failed") == 1
        periods = [p for p in sleep.periods if p.run_p50 is not None]
        if len(periods) == 1:  # the runs ended within one period: compare them whole
            [period] = periods
            for share, figure in ((0.5, period.run_p50), (0.95, period.run_p95)):
                true = nearest_rank(runs, share)
                # (1 % more: SQLite's julianday times a duration to about 50 us,
                # which may put one at a bucket's edge in the next bucket.)
                assert true / WITHIN / 1.01 <= figure <= true * WITHIN * 1.01, (runs, figure)
        started = [p for p in sleep.periods if p.started]
        if len(started) == 1:
            true = nearest_rank(waits, 0.5)
            figure = started[0].wait_p50
            assert figure <= max(true, 0.01) * WITHIN * 1.01, (waits, figure)
        assert sum(p.started for p in sleep.periods) == 5


def test_prune_deletes_the_history_the_charts_no_longer_show(jobs, store, household):
    job_id = jobs.enqueue("succeed", {"value": 1}, household_id=household.household_id)
    jobs.start_pool()
    wait_for(lambda: jobs.get(job_id).status is Status.SUCCEEDED)
    store.write(store.history.fold_history)
    rows = sql.scalar(store, "SELECT count(*) FROM job_history")
    assert rows == 4  # its wait and its success, per minute and per ten minutes

    now = store.read(store.periodic.current_time)
    assert prune(store, older_than_days=14, catchup_seconds=3600, now=now).history == 0
    later = prune(store, older_than_days=14, catchup_seconds=3600, now=now + timedelta(hours=3))
    assert later.history == 2
    assert sql.scalar(store, "SELECT count(*) FROM job_history WHERE width = 10") == 2
    gone = prune(store, older_than_days=14, catchup_seconds=3600, now=now + timedelta(days=3))
    assert gone.history == 2


def test_a_process_keeps_the_final_periods_and_reads_only_the_latest(store):
    now = store.read(store.periodic.current_time).replace(second=30, microsecond=0)
    minute = now.replace(second=0)

    def add(start, count):
        period = start if store.name == "postgresql" else start.strftime("%Y-%m-%dT%H:%M")
        sql.execute(
            store,
            "INSERT INTO job_history (width, period, kind, series, bucket, count) "
            "VALUES (1, ?, 'succeed', 'succeeded', 5, ?) "
            + (
                "ON CONFLICT (width, period, kind, series, bucket) "
                "DO UPDATE SET count = job_history.count + excluded.count"
            ),
            (period, count),
        )

    def succeeded(charts):
        [kind] = charts.kinds
        return {p.start: p.succeeded for p in kind.periods if p.succeeded}

    old, recent = minute - timedelta(minutes=5), minute
    add(old, 2)
    add(recent, 1)
    reader = ChartsReader(store)
    assert succeeded(reader.read(Range.HOUR, now=now)) == {old: 2, recent: 1}

    # Written into a period that ended minutes ago (no real write can): the
    # process keeps what it read; into the current one: it reads it.
    add(old, 10)
    add(recent, 10)
    assert succeeded(reader.read(Range.HOUR, now=now)) == {old: 2, recent: 11}
    assert succeeded(read_charts(store, Range.HOUR, now=now)) == {old: 12, recent: 11}
    # An hour on, the old period is out of the range and forgotten.
    later = reader.read(Range.HOUR, now=now + timedelta(minutes=58))
    assert succeeded(later) == {recent: 11}
